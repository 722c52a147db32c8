"""Python's attribute protocol over symbolic objects.

``obj.name`` runs ``type(obj).__getattribute__(obj, name)`` and, when that raises
AttributeError, ``type(obj).__getattr__(obj, name)``; ``obj.name = v`` runs
``type(obj).__setattr__``; ``del obj.name`` runs ``type(obj).__delattr__``. A value class
models the generic implementations (``object.__getattribute__``: data descriptors, then the
instance dict, then class attributes; ``object.__setattr__``: a data descriptor's setter,
else the instance dict), and these helpers run a class's own hooks around them: a hook
written in Python is inlined (its ``object.__setattr__(self, ...)`` or
``super().__setattr__(...)`` comes back to the generic model). The value stored is then the
object's only as the object's own methods say, a read after a store sees it through the
same methods, and the write back after the graph calls only the storage step (never the
user's hook a second time). Guards read what the generic lookup found past the class's own
``__getattribute__`` (``RawAttrSource``).
"""
from __future__ import annotations

import dataclasses
import types

from ...errors import Unsupported
from ..guards import Guard, GuardKind
from ..sources import AttrSource, ConstSource
from .base import ConstantValue, Value
from .functions import BoundMethodValue, UserFunctionValue

_MISSING = object()


def static_lookup(cls: type, name: str):
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _MISSING


def user_hook(tx, cls: type, name: str, generic) -> types.FunctionType | None:
    """``cls``'s own ``name`` hook (``__getattribute__``, ``__setattr__``, ``__delattr__``)
    written in Python, when it is not ``generic`` (what the value models); guarded to stay
    the class's. A C type's own slot (``dict``, ``SimpleNamespace`` and most C types restate
    the generic one) is the storage step, see ``storage_setter``."""
    fn = static_lookup(cls, name)
    if fn is _MISSING or fn is generic or not isinstance(fn, types.FunctionType):
        return None
    tx.output.guard_class_attribute(cls, name, fn)
    return fn


@dataclasses.dataclass(frozen=True)
class RawAttrSource(AttrSource):
    """``object.__getattribute__(base, name)``: where ``object.__getattribute__`` found a value,
    read again without the class's own ``__getattribute__`` (which guards must not run: it
    may compute something else, ``box.k`` + 10)."""

    def render(self, ctx):
        return f"{ctx.bind(object.__getattribute__, 'getattribute')}({self.base.render(ctx)}, {self.name!r})"

    def describe(self):
        return f"object.__getattribute__({self.base.describe()}, {self.name!r})"


def has_user_getattribute(cls: type) -> bool:
    return isinstance(static_lookup(cls, "__getattribute__"), types.FunctionType)


def storage_setter(cls: type):
    """The C-level ``__setattr__`` under a class's Python ones: what stores the value once
    the Python hooks ran (``object.__setattr__`` for plain classes)."""
    for klass in cls.__mro__:
        fn = klass.__dict__.get("__setattr__")
        if fn is not None and not isinstance(fn, types.FunctionType):
            return fn
    return object.__setattr__


def guard_attribute_absent(tx, obj: Value, cls: type, name: str, instance_dict: bool = True) -> None:
    """``object.__getattribute__(obj, name)`` raised AttributeError and the capture goes on
    (a user ``except AttributeError``, or ``__getattr__``): guard that the lookup still
    fails, else a later call that finds the attribute would replay the missing branch."""
    plain = static_lookup(cls, "__getattr__") is _MISSING and not has_user_getattribute(cls)
    if obj.source is not None and plain:
        # nothing else answers: hasattr() is exactly object.__getattribute__'s answer
        tx.output.builder.guard(GuardKind.HASATTR, obj.source, (name, False))
        return
    if instance_dict and obj.source is not None:
        tx.output.builder.guard(GuardKind.NOT_IN_INSTANCE_DICT, obj.source, name)
    guard_classes_lack(tx, cls.__mro__, name)


# (a type whose attributes cannot be set: the builtins)
_IMMUTABLE_TYPE = 1 << 8


def guard_classes_lack(tx, classes, name: str) -> None:
    """Guard that none of ``classes`` gains ``name`` in its own ``__dict__``: a lookup that
    found it missing in them would find it there later (builtin types cannot gain it)."""
    for owner in classes:
        if not owner.__flags__ & _IMMUTABLE_TYPE:
            tx.output.guards.add(Guard(GuardKind.NOT_IN_INSTANCE_DICT, ConstSource(owner), name))


def get_attribute(tx, obj: Value, name: str, generic_get, generic_hook=object.__getattribute__) -> Value:
    """``obj.name``: the class's ``__getattribute__`` (``generic_get`` when it is the
    generic one), then ``__getattr__`` if that raised AttributeError."""
    cls = obj.python_type()
    hook = user_hook(tx, cls, "__getattribute__", generic_hook)
    try:
        if hook is not None:
            return tx.call(UserFunctionValue(hook), [obj, ConstantValue(name)], {})
        return generic_get(tx, name)
    except tx.UserException as e:
        if not isinstance(e.exc, AttributeError):
            raise
        fallback = static_lookup(cls, "__getattr__")
        if fallback is _MISSING:
            raise
        if not isinstance(fallback, types.FunctionType):
            raise Unsupported(f"{cls.__qualname__}.__getattr__ is implemented in C")
        tx.output.guard_class_attribute(cls, "__getattr__", fallback)
        return tx.call(UserFunctionValue(fallback), [obj, ConstantValue(name)], {})


def set_attribute(tx, obj: Value, name: str, value: Value, generic_set, generic_hook=object.__setattr__) -> None:
    """``obj.name = value``: the class's ``__setattr__``, or ``generic_set``."""
    hook = user_hook(tx, obj.python_type(), "__setattr__", generic_hook)
    if hook is not None:
        tx.call(UserFunctionValue(hook), [obj, ConstantValue(name), value], {})
        return
    generic_set(tx, name, value)


def del_attribute(tx, obj: Value, name: str, generic_del, generic_hook=object.__delattr__) -> None:
    """``del obj.name``: the class's ``__delattr__``, or ``generic_del``."""
    hook = user_hook(tx, obj.python_type(), "__delattr__", generic_hook)
    if hook is not None:
        tx.call(UserFunctionValue(hook), [obj, ConstantValue(name)], {})
        return
    generic_del(tx, name)


def descriptor_set(tx, obj: Value, cls: type, name: str, desc, value: Value) -> bool:
    """``object.__setattr__``'s first step: a data descriptor on the class takes the store.
    True when it did (a property's setter, inlined); False when there is none (or a
    ``__slots__`` member, whose storage the caller models like the instance dict)."""
    if desc is _MISSING or not hasattr(type(desc), "__set__"):
        return False
    if isinstance(desc, types.MemberDescriptorType):
        return False
    if isinstance(desc, property):
        if desc.fset is None:
            raise tx.user_exception(AttributeError(
                f"property {name!r} of {cls.__name__!r} object has no setter"))
        tx.output.guard_class_attribute(cls, name, desc)
        tx.call(UserFunctionValue(desc.fset), [obj, value], {})
        return True
    raise Unsupported(f"setting {name!r} through a {type(desc).__name__} descriptor")


def descriptor_delete(tx, obj: Value, cls: type, name: str, desc) -> bool:
    """``object.__delattr__``'s first step (see ``descriptor_set``)."""
    if desc is _MISSING or not (hasattr(type(desc), "__set__") or hasattr(type(desc), "__delete__")):
        return False
    if isinstance(desc, property):
        if desc.fdel is None:
            raise tx.user_exception(AttributeError(
                f"property {name!r} of {cls.__name__!r} object has no deleter"))
        tx.output.guard_class_attribute(cls, name, desc)
        tx.call(UserFunctionValue(desc.fdel), [obj], {})
        return True
    raise Unsupported(f"deleting {name!r} through a {type(desc).__name__} descriptor")


def generic_method(obj: Value, fn) -> Value:
    """``object.__setattr__`` (or ``__getattribute__``/``__delattr__``) bound to ``obj``, as
    ``super().__setattr__`` returns it."""
    from .builtins import BuiltinValue  # cycle: builtins model attribute lookup through here
    return BoundMethodValue(BuiltinValue(fn), obj)


def _modelled() -> dict:
    import torch

    return {object.__getattribute__: ("object_getattr", 1), object.__setattr__: ("object_setattr", 2),
            object.__delattr__: ("object_delattr", 1),
            torch.nn.Module.__setattr__: ("module_setattr", 2),
            torch.nn.Module.__delattr__: ("module_delattr", 1)}


# the generic attribute functions -> (the method of a value class that models them, arity)
MODELLED = _modelled()


def call_modelled(tx, fn, args: list[Value], kwargs: dict) -> Value:
    """``object.__setattr__(obj, name, value)``, ``nn.Module.__setattr__(...)`` and their
    siblings called on a value (directly, or as ``super().__setattr__``)."""
    method, arity = MODELLED[fn]
    impl = getattr(args[0], method, None) if args else None
    if impl is None or kwargs or len(args) != arity + 1:
        raise Unsupported(f"{getattr(fn, '__qualname__', fn)} on these arguments")
    name = args[1]
    if not (name.is_constant() and isinstance(name.as_constant(), str)):
        raise tx.user_exception(TypeError(
            f"attribute name must be string, not '{name.python_type().__name__}'"))
    result = impl(tx, name.as_constant(), *args[2:])
    return result if result is not None else ConstantValue(None)
