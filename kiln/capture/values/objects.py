"""Objects that exist before the call: user objects, nn.Modules, Python modules, classes,
``super()``, and grad-mode context managers.

Attributes are resolved statically (instance dict, then the class's MRO, as Python does), and
each value read is wrapped with a source so that guards protect it.
"""
from __future__ import annotations

import abc
import collections
import collections.abc
import copyreg
import types
from typing import Any

import torch

from ... import _torch
from ...config import config
from ...errors import Unsupported
from .. import regions
from . import module_hooks, optimizer_groups
from ..guards import Guard, GuardKind
from ..sources import AttrSource, ConstSource, ItemSource, TypeSource
from .attributes import user_hook
from .base import ConstantValue, MadeInOrder, Value
from .containers import DictValue, IteratorValue, TupleValue
from .functions import BaseMethodValue, BoundMethodValue, MethodValue, UserFunctionValue
from .grad_mode_functions import decorate_with_grad_mode
from .truth import checked_bool, checked_len

from .attributes import (_MISSING, RawAttrSource, del_attribute, descriptor_delete,
                         descriptor_set, generic_method, get_attribute, guard_attribute_absent,
                         guard_classes_lack, has_user_getattribute,
                         set_attribute, static_lookup, storage_setter)


# object's own rich comparisons, which call_method models (identity for ==, ``not __eq__``
# for !=, NotImplemented for the orderings)
_OBJECT_COMPARISONS = (object.__eq__, object.__ne__, object.__lt__, object.__le__, object.__gt__, object.__ge__)


def is_object_comparison(attr) -> bool:
    return any(attr is c for c in _OBJECT_COMPARISONS)


class ObjectValue(Value):
    """An existing Python object read through a source."""

    def __init__(self, obj: Any, source=None):
        self.value = obj
        self.source = source

    def python_type(self):
        return type(self.value)

    def real_object(self):
        return self.value

    def describe(self):
        return f"{type(self.value).__name__}" + (f"({self.source.describe()})" if self.source else "")

    def truthy(self, tx):
        cls = self.python_type()
        if static_lookup(cls, "__bool__") is _MISSING and static_lookup(cls, "__len__") is _MISSING:
            return True
        if static_lookup(cls, "__bool__") is not _MISSING:
            return checked_bool(tx, self.call_method(tx, "__bool__", [], {}))
        n = checked_len(tx, self.call_method(tx, "__len__", [], {}))
        return tx.truthy(n) if not isinstance(n, int) else n > 0


    def instance_dict(self) -> dict | None:
        try:
            return object.__getattribute__(self.value, "__dict__")
        except AttributeError:
            return None

    def _refuse_mixed_writes(self, tx, name: str) -> None:
        """A Python descriptor's ``__get__`` is read on the real object (guarded): after this
        capture changed the object's attributes it would read the old state, so it runs
        natively (after a break, where the writes are done)."""
        if self.value is None or name == "__dict__":
            return
        effects = tx.output.side_effects
        if (effects.stores_on(self) or self.dict_wrapper(tx) is not None) and \
                _has_python_get(static_lookup(type(self.value), name)):
            raise Unsupported(f"a descriptor's __get__ ({self.describe()}.{name}) after setting attributes of it")

    def dict_wrapper(self, tx):
        """The value of ``obj.__dict__`` where this capture read it: from then on the one place
        the instance's attributes live (stores and reads go through it, so ``obj.a = 1`` and
        ``obj.__dict__["a"]`` see each other as in eager). None before."""
        d = self.instance_dict()
        if d is None:
            return None
        hit = tx.output.builder.by_id.get(id(d))
        return hit[1] if hit is not None and hit[0] is d else None

    def _instance_dict_value(self, tx):
        """``obj.__dict__``: the attribute stores this capture made so far move into it."""
        self._require_source("__dict__")
        wrapper = tx.wrap(self.instance_dict(), self._attr_source("__dict__"))
        effects = tx.output.side_effects
        for key, (obj, attr, value, setter) in list(effects.attrs.items()):
            if obj is not self or isinstance(static_lookup(type(self.value), attr), types.MemberDescriptorType):
                continue        # (a __slots__ member is stored in its slot, not in __dict__)
            if setter not in (setattr, object.__setattr__) or value is None:
                raise Unsupported(f"{self.describe()}.__dict__ after setting {attr!r} through {setter!r}")
            wrapper.call_method(tx, "__setitem__", [ConstantValue(attr), value], {})
            del effects.attrs[key]
        return wrapper

    def _require_source(self, name):
        if self.source is None:
            raise Unsupported(f"attribute {name!r} of an object that cannot be guarded")

    def getattr(self, tx, name):
        if self.value is not None and self.source is not None and _own_c_getattribute(self.value) \
                and tx.output.side_effects.attr_value(self, name) is None:
            # a C type with its own attribute lookup (``threading.local``: one dict per
            # thread): read as the type reads it, guarded where it is read from
            _refuse_native_read_after_stores(tx, f"attribute {name!r} of a {type(self.value).__name__} "
                                                 "(a C type with its own attribute lookup, as a weakref proxy)")
            try:
                value = getattr(self.value, name)
            except AttributeError as e:
                raise tx.user_exception(e)
            return tx.wrap(value, AttrSource(self.source, name))
        return get_attribute(tx, self, name, self.object_getattr)

    def object_getattr(self, tx, name):
        """``object.__getattribute__(obj, name)``: a store made by this capture, data
        descriptors, the instance dict, then class attributes."""
        pending = tx.output.side_effects.attr_value(self, name)
        if pending is not None:
            return pending
        self._refuse_mixed_writes(tx, name)
        obj = self.value
        cls = type(obj)
        cls_attr = static_lookup(cls, name)
        if isinstance(cls_attr, property):
            if cls_attr.fget is None:
                raise tx.user_exception(AttributeError(f"property {name!r} of {cls.__name__!r} object has no getter"))
            tx.output.guard_class_attribute(cls, name, cls_attr)
            if not isinstance(cls_attr.fget, types.FunctionType) and self.value is not None:
                # a getter implemented in C (a pybind11 class's property): its value, read
                # now and guarded where the object is read from
                self._require_source(name)
                _refuse_native_read_after_stores(tx, f"property {name!r} of {cls.__name__!r} (a getter "
                                                     "implemented in C)")
                try:
                    value = cls_attr.fget(self.value)
                except Exception as e:  # noqa: BLE001 - the getter's own error is the user's
                    raise tx.user_exception(e)
                return tx.wrap(value, self._attr_source(name))
            return tx.call(UserFunctionValue(cls_attr.fget), [self], {})
        d = self.instance_dict()
        wrapper = self.dict_wrapper(tx) if d is not None else None
        if wrapper is not None and not _is_data_descriptor(cls_attr):
            if name == "__dict__":
                return self._instance_dict_value(tx)
            if name in wrapper.items:       # (what this capture wrote there, or read)
                return wrapper.items[name]
            d = {}                          # (deleted through the dict: the class's, or none)
        if d is not None and name in d and not _is_data_descriptor(cls_attr):
            self._require_source(name)
            value = tx.wrap(d[name], self._attr_source(name))
            if name == "param_groups" and optimizer_groups.is_optimizer(obj):
                return optimizer_groups.read_as_capturable(obj, value)
            return value
        if name == "__dict__" and d is not None and self.value is not None:
            return self._instance_dict_value(tx)
        if cls_attr is not _MISSING:
            if d is not None and self.source is not None and not _is_data_descriptor(cls_attr) \
                    and wrapper is None:
                # found on the class, past the instance dict: an instance attribute set later
                # (``obj.method = other``) would shadow it
                tx.output.builder.guard(GuardKind.NOT_IN_INSTANCE_DICT, self.source, name)
            return self._class_attribute(tx, name, cls_attr)
        guard_attribute_absent(tx, self, cls, name, instance_dict=d is not None)
        raise tx.user_exception(AttributeError(f"'{cls.__name__}' object has no attribute '{name}'"))

    def _attr_source(self, name):
        """Where guards read what ``object.__getattribute__`` found: ``obj.name``, or past a
        class's own ``__getattribute__``."""
        if has_user_getattribute(self.python_type()):
            return RawAttrSource(self.source, name)
        return AttrSource(self.source, name)

    def _class_attribute(self, tx, name, cls_attr):
        tx.output.guard_class_attribute(self.python_type(), name, cls_attr)
        if isinstance(cls_attr, types.FunctionType):
            return BoundMethodValue(UserFunctionValue(cls_attr), self)
        if isinstance(cls_attr, staticmethod):
            return tx.wrap(cls_attr.__func__, None)
        if isinstance(cls_attr, classmethod):
            return BoundMethodValue(tx.wrap(cls_attr.__func__, None),
                                    ClassValue(self.python_type(), TypeSource(self.source) if self.source else None))
        if _is_data_descriptor(cls_attr) or hasattr(cls_attr, "__get__") and not isinstance(
                cls_attr, (types.BuiltinFunctionType, type)):
            if isinstance(cls_attr, (types.WrapperDescriptorType, types.MethodDescriptorType,
                                     types.MethodWrapperType)):
                return MethodValue(self, name)
            self._require_source(name)
            try:
                value = object.__getattribute__(self.value, name)
            except AttributeError as e:
                if isinstance(cls_attr, types.MemberDescriptorType):
                    # an unset __slots__ member: guard that it stays unset
                    cls = self.python_type()
                    if static_lookup(cls, "__getattr__") is not _MISSING or has_user_getattribute(cls):
                        raise Unsupported(f"an unset __slots__ member {name!r} of a class with __getattr__")
                    tx.output.builder.guard(GuardKind.HASATTR, self.source, (name, False))
                raise tx.user_exception(e)
            return tx.wrap(value, self._attr_source(name))
        # A plain class attribute: guard it where the instance reads it.
        if self.source is None:
            return tx.wrap(cls_attr, None)
        return tx.wrap(cls_attr, self._attr_source(name))

    def call_method(self, tx, name, args, kwargs):
        cls_attr = static_lookup(self.python_type(), name)
        if isinstance(cls_attr, types.FunctionType):
            tx.output.guard_class_attribute(self.python_type(), name, cls_attr)
            return tx.call(UserFunctionValue(cls_attr), [self, *args], kwargs)
        if is_object_comparison(cls_attr) and cls_attr is getattr(object, name, None):
            tx.output.guard_class_attribute(self.python_type(), name, cls_attr)
        if name == "__eq__" and cls_attr in (object.__eq__, _MISSING) and len(args) == 1 and not kwargs:
            # identity; an object created during the capture has no real object to compare.
            # object.__eq__ answers only for the object itself; for another, NotImplemented
            # (then ``==`` tries the other side, and falls back to identity)
            same = args[0] is self if self.value is None else args[0].real_object() is self.value
            return ConstantValue(True if same else NotImplemented)
        if name == "__ne__" and cls_attr is object.__ne__ and len(args) == 1 and not kwargs:
            # object.__ne__ inverts the class's __eq__ (a dataclass defines only __eq__)
            eq = self.call_method(tx, "__eq__", args, {})
            if eq.is_constant() and eq.as_constant() is NotImplemented:
                return eq
            return ConstantValue(not tx.truthy(eq))
        if name in ("__lt__", "__le__", "__gt__", "__ge__") and cls_attr is getattr(object, name) \
                and len(args) == 1 and not kwargs:
            return ConstantValue(NotImplemented)
        if name == "__reduce_ex__" and cls_attr is object.__reduce_ex__ and len(args) == 1 and not kwargs:
            return default_reduce_ex(tx, self, args[0])
        attr = self.getattr(tx, name)
        if isinstance(attr, MethodValue) and attr.obj is self and attr.name == name:
            # a method implemented in C (ContextVar.set, a C type's __bool__): this value
            # cannot model it, and MethodValue.call would come straight back here
            raise Unsupported(f"call to {type(self.value).__name__}.{name} (a method implemented "
                              "in C, its effects unknown)")
        return attr.call(tx, args, kwargs)

    def call(self, tx, args, kwargs):
        call_fn = static_lookup(self.python_type(), "__call__")
        if isinstance(call_fn, types.FunctionType):
            tx.output.guard_class_attribute(self.python_type(), "__call__", call_fn)
            return tx.call(UserFunctionValue(call_fn), [self, *args], kwargs)
        raise Unsupported(f"calling {self.describe()}")

    def unpack(self, tx):
        it = static_lookup(type(self.value), "__iter__")
        if isinstance(it, types.FunctionType):
            return tx.unpack_iterable(tx.call(UserFunctionValue(it), [self], {}))
        raise Unsupported(f"iterating over {self.describe()}")

    def setattr(self, tx, name, value):
        set_attribute(tx, self, name, value, self.object_setattr)

    def object_setattr(self, tx, name, value):
        """``object.__setattr__(obj, name, value)``: a data descriptor's setter, else a store
        into the instance dict (or a ``__slots__`` member), replayed after the graph with
        the C-level store (the class's own Python ``__setattr__`` already ran, inlined)."""
        cls = type(self.value)
        found = static_lookup(cls, name)
        if descriptor_set(tx, self, cls, name, found, value):
            return
        wrapper = self.dict_wrapper(tx)
        # (the instance's attributes live in its __dict__ value now; a __slots__ member, a
        # data descriptor of its class, never does)
        if wrapper is not None and not isinstance(found, types.MemberDescriptorType):
            wrapper.call_method(tx, "__setitem__", [ConstantValue(name), value], {})
            return
        if self.source is None:
            raise Unsupported(f"setting attribute {name!r} on an object without a source")
        if self.instance_dict() is None and not isinstance(static_lookup(cls, name), types.MemberDescriptorType):
            raise Unsupported(f"setting {name!r} on a {cls.__name__} without an instance dict")
        tx.output.side_effects.store_attr(self, name, value, storage_setter(cls))

    def delattr(self, tx, name):
        del_attribute(tx, self, name, self.object_delattr)

    def object_delattr(self, tx, name):
        cls = type(self.value)
        if descriptor_delete(tx, self, cls, name, static_lookup(cls, name)):
            return
        wrapper = self.dict_wrapper(tx)
        if wrapper is not None:
            wrapper.call_method(tx, "__delitem__", [ConstantValue(name)], {})
            return
        raise Unsupported(f"del of attribute {name!r} of an object that existed before the call")


def default_reduce_ex(tx, obj: ObjectValue, protocol: Value) -> Value:
    """``object.__reduce_ex__(obj, protocol)`` for a plain Python class, as CPython builds it
    (``reduce_newobj``): ``(copyreg.__newobj__, (cls,), state, None, None)``, where the state is
    what ``__getstate__`` returns (by default the instance ``__dict__``, or None if it is
    empty). ``copy`` and ``pickle`` then run in Python, inlined. Anything CPython does in C
    beyond that (slots, ``__getnewargs__``, container subclasses, old protocols) is refused."""
    cls = obj.python_type()
    if not protocol.is_constant() or not isinstance(protocol.as_constant(), int) or protocol.as_constant() < 2:
        raise Unsupported("object.__reduce_ex__ with a protocol below 2")
    if static_lookup(cls, "__reduce__") is not object.__reduce__:
        return obj.call_method(tx, "__reduce__", [], {})
    if any(k.__module__ == "builtins" for k in cls.__mro__[:-1]) or type(cls) not in (type, abc.ABCMeta) or \
            user_layers_define(cls, ("__slots__", "__getnewargs__", "__getnewargs_ex__")):
        raise Unsupported(f"object.__reduce_ex__ of a {cls.__name__} (slots, new-args or a builtin base)")
    if static_lookup(cls, "__getstate__") is not object.__getstate__:
        state = obj.call_method(tx, "__getstate__", [], {})
    elif isinstance(obj, NewObjectValue):
        state = obj.object_getattr(tx, "__dict__") if obj.attrs else ConstantValue(None)
    else:
        if obj.source is None or tx.output.side_effects.stores_on(obj):
            raise Unsupported(f"the state of a {cls.__name__} that this capture changed or cannot guard")
        state = obj.object_getattr(tx, "__dict__")
        if not state.truthy(tx):
            state = ConstantValue(None)
    newobj = tx.wrap(copyreg.__newobj__, None)
    return TupleValue([newobj, TupleValue([ClassValue(cls)]), state, ConstantValue(None), ConstantValue(None)])


def store_on_new_object(tx, obj, name, value) -> None:
    """``object.__setattr__`` on an object created during the capture (``obj.cls``,
    ``obj.attrs``): a descriptor of the class sets it, else it goes in the instance dict."""
    cls_attr = static_lookup(obj.cls, name)
    if descriptor_set(tx, obj, obj.cls, name, cls_attr, value):
        return
    if _is_data_descriptor(cls_attr):
        raise Unsupported(f"setting {name!r} through a descriptor on a new {obj.cls.__name__}")
    obj.attrs[name] = value


def _is_data_descriptor(attr) -> bool:
    return attr is not _MISSING and hasattr(type(attr), "__set__")


class NewObjectValue(MadeInOrder, ObjectValue):
    """An instance of a plain user class created during capture (``Point(x, y)``): its
    attributes are symbolic; it is rebuilt with ``cls.__new__`` + ``__dict__`` if it escapes."""

    def __init__(self, cls: type):
        self.cls = cls
        self.attrs: dict[str, Value] = {}
        self.value = None
        self.source = None
        self.dict_view: NewInstanceDict | None = None     # (``obj.__dict__``, once read)

    def python_type(self):
        return self.cls

    def real_object(self):
        return None

    def describe(self):
        return f"new {self.cls.__name__}"

    def instance_dict(self):
        return None

    def object_getattr(self, tx, name):
        cls_attr = static_lookup(self.cls, name)
        if isinstance(cls_attr, property):
            if cls_attr.fget is None:
                raise tx.user_exception(AttributeError(
                    f"property {name!r} of {self.cls.__name__!r} object has no getter"))
            return tx.call(UserFunctionValue(cls_attr.fget), [self], {})
        if name == "__class__":
            return ClassValue(self.cls)
        if name == "__dict__":
            if self.dict_view is None:
                self.dict_view = NewInstanceDict(self)
            return self.dict_view
        if name in self.attrs and not _is_data_descriptor(cls_attr):
            return self.attrs[name]
        if cls_attr is not _MISSING:
            return self._class_attribute(tx, name, cls_attr)
        guard_classes_lack(tx, self.cls.__mro__, name)     # (a later call's class may have it)
        raise tx.user_exception(AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'"))

    def _class_attribute(self, tx, name, cls_attr):
        if isinstance(cls_attr, (types.FunctionType, staticmethod, classmethod)):
            return super()._class_attribute(tx, name, cls_attr)
        if isinstance(cls_attr, (types.WrapperDescriptorType, types.MethodDescriptorType,
                                 types.MethodWrapperType)):
            # a method implemented in C (object.__reduce_ex__, __eq__...): bound to this object,
            # as the instance's attribute is; call_method models the ones it can
            return MethodValue(self, name)
        if _is_data_descriptor(cls_attr):
            raise Unsupported(f"descriptor {name!r} on a new {self.cls.__name__}")
        get = static_lookup(type(cls_attr), "__get__")
        if isinstance(get, types.FunctionType):
            # a descriptor written in Python (torch.distributions' lazy_property): inlined
            tx.output.guard_class_attribute(type(cls_attr), "__get__", get)
            desc = tx.wrap(cls_attr, class_dict_source(self.cls, name))
            return tx.call(UserFunctionValue(get), [desc, self, ClassValue(self.cls)], {})
        return tx.wrap(cls_attr, class_dict_source(self.cls, name))

    def object_setattr(self, tx, name, value):
        tx.output.side_effects.wrote(self)
        store_on_new_object(tx, self, name, value)

    def object_delattr(self, tx, name):
        tx.output.side_effects.wrote(self)
        if descriptor_delete(tx, self, self.cls, name, static_lookup(self.cls, name)):
            return
        if name not in self.attrs:
            raise tx.user_exception(AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'"))
        del self.attrs[name]

    def reconstruct(self, cg):
        def build():
            body = ", ".join(f"{n!r}: {v.reconstruct(cg)}" for n, v in self.attrs.items())
            return f"{cg.bind(_new_object)}({cg.bind(self.cls)}, {{{body}}})"
        return cg.stash(self, build)


class NewInstanceDict(DictValue):
    """``obj.__dict__`` of an object made in this capture: one value for every read, its items
    the object's attributes themselves (a write through either is seen by the other); rebuilt
    as the rebuilt object's own ``__dict__``, so that after a break, or returned beside the
    object, it is still that object's."""

    def __init__(self, owner: NewObjectValue):
        super().__init__({})
        self.items = owner.attrs
        self.owner = owner

    def reconstruct(self, cg):
        return cg.stash(self, lambda: f"{self.owner.reconstruct(cg)}.__dict__")


def class_dict_source(cls: type, name: str):
    """Where ``cls.name`` lives: the defining class's own ``__dict__`` entry."""
    for owner in cls.__mro__:
        if name in owner.__dict__:
            return ItemSource(AttrSource(ConstSource(owner), "__dict__"), name)
    return None


def _new_object(cls, attrs):
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def user_layers_define(cls: type, names: tuple[str, ...], stop: tuple[type, ...] = (object,)) -> bool:
    """Whether a class of ``cls``'s MRO before the first of ``stop`` defines one of ``names``
    in its own ``__dict__`` (an empty ``__slots__`` adds no storage and does not count)."""
    for klass in cls.__mro__:
        if klass in stop:
            return False
        for name in names:
            if name in klass.__dict__ and not (name == "__slots__" and klass.__dict__[name] in ((), [])):
                return True
    return False


def _own_c_getattribute(obj) -> bool:
    """``obj``'s class looks attributes up with a C ``__getattribute__`` of its own that keeps
    an instance dict object's lookup cannot see (``threading.local``: one dict per thread)."""
    hook = static_lookup(type(obj), "__getattribute__")
    if hook is object.__getattribute__ or hook is _MISSING or isinstance(hook, types.FunctionType):
        return False
    try:
        object.__getattribute__(obj, "__dict__")
        return False            # (the generic lookup reaches its dict: modelled as any object)
    except AttributeError:
        pass
    try:
        getattr(obj, "__dict__")
        return True
    except AttributeError:
        return False


def can_allocate_symbolically(cls) -> bool:
    """``object.__new__(cls)`` gives an instance that only its ``__dict__`` describes: a plain
    Python class (no metaclass, no slots, no builtin base, not a module or tensor)."""
    # ABCMeta only adds registration-based isinstance checks, which run on the real classes
    if not isinstance(cls, type) or type(cls) not in (type, abc.ABCMeta) or cls.__module__ == "builtins":
        return False
    if issubclass(cls, (torch.nn.Module, torch.Tensor, BaseException)):
        return False
    if getattr(cls, "__abstractmethods__", None):     # (object.__new__ raises eager's TypeError)
        return False
    if any(klass.__module__ == "builtins" for klass in cls.__mro__[:-1]):
        return False
    return not user_layers_define(cls, ("__slots__",))


def can_create_symbolically(cls) -> bool:
    """A plain Python class whose ``cls(...)`` runs only Python: no custom __new__ either."""
    if not can_allocate_symbolically(cls) or user_layers_define(cls, ("__new__",)):
        return False
    init = static_lookup(cls, "__init__")
    return isinstance(init, types.FunctionType) or init is object.__init__


def _changed_in_capture(tx, obj) -> bool:
    """Whether the capture mutated the symbolic value of the existing container ``obj``."""
    prior = tx.output.builder.by_id.get(id(obj))
    return prior is not None and prior[0] is obj and \
        any(c is prior[1] for c in tx.output.side_effects.containers)


class NNModuleValue(ObjectValue):
    """An nn.Module instance. Parameters and buffers become graph inputs (tagged static), so
    one compiled body serves every instance of the same layer class."""

    def describe(self):
        return f"Module({type(self.value).__name__}" + (f" {self.source.describe()})" if self.source else ")")

    def getattr(self, tx, name):
        if user_hook(tx, type(self.value), "__getattribute__", object.__getattribute__) is not None:
            return get_attribute(tx, self, name, self.object_getattr)
        pending = tx.output.side_effects.attr_value(self, name)
        if pending is not None:
            return pending
        m = self.value
        d = m.__dict__
        cls_attr = static_lookup(type(m), name)
        if cls_attr is not _MISSING and (name not in d or _is_data_descriptor(cls_attr)):
            # Python's own lookup finds the class's attribute (a method named as a submodule)
            # before ``Module.__getattr__`` reads the parameters, buffers and submodules
            return super().getattr(tx, name)
        if name in d:
            self._require_source(name)
            return tx.wrap(d[name], AttrSource(self.source, name))
        for store in ("_parameters", "_buffers", "_modules"):
            table = d.get(store)
            if table is not None and _changed_in_capture(tx, table):
                # (torch.func.functional_call swaps parameters by writing these dicts): the
                # real table, read below, no longer says what the module holds
                raise Unsupported(f"reading {name!r} of a module whose {store} were changed inside the "
                                  "compiled function")
            if table is not None and name in table:
                self._require_source(name)
                return tx.wrap(table[name], ItemSource(AttrSource(self.source, store), name),
                               static=store != "_modules")
        cls = type(m)
        if static_lookup(cls, name) is _MISSING and static_lookup(cls, "__getattr__") is torch.nn.Module.__getattr__:
            # what Module.__getattr__ does once the instance dict, parameters, buffers and
            # submodules (all searched above) lack the name; guarded to stay so
            if self.source is not None:
                tx.output.builder.guard(GuardKind.HASATTR, self.source, (name, False))
            raise tx.user_exception(AttributeError(f"'{cls.__name__}' object has no attribute '{name}'"))
        return super().getattr(tx, name)

    def setattr(self, tx, name, value):
        set_attribute(tx, self, name, value, self.module_setattr, torch.nn.Module.__setattr__)

    def module_setattr(self, tx, name, value):
        """``nn.Module.__setattr__``: buffers and plain attributes, written back with it after
        the graph runs; parameters and submodules are not assigned inside a capture."""
        m = self.value
        if name in m._parameters or isinstance(value, NNModuleValue) or name in m._modules:
            raise Unsupported(f"assigning {name!r} (a parameter or submodule) inside a compiled function")
        if descriptor_set(tx, self, type(m), name, static_lookup(type(m), name), value):
            return
        if self.source is None:
            raise Unsupported(f"setting {name!r} on a module without a source")
        tx.output.side_effects.store_attr(self, name, value, torch.nn.Module.__setattr__)

    def delattr(self, tx, name):
        del_attribute(tx, self, name, self.module_delattr, torch.nn.Module.__delattr__)

    def module_delattr(self, tx, name):
        raise Unsupported(f"del of module attribute {name!r} inside a compiled function")

    def call(self, tx, args, kwargs):
        if _torch.is_ddp(self.value):
            # DDP's bookkeeping (its reducer, the ranks) is no tensor program: the graph breaks
            # at the call, which runs DDP's forward with the wrapped module compiled on its own
            # (``kiln/runtime/ddp.py``)
            e = Unsupported("DistributedDataParallel's forward runs outside the graph (its wrapped "
                            "module is compiled on its own)")
            e.inside_callee = True
            raise e
        if _torch.holds_dtensors(self.value):
            # a module tensor parallelism distributed: its parameters are DTensors, and its
            # hooks redistribute its inputs and outputs over the ranks. kiln compiles no
            # DTensor program, so the call runs as it is (DTensor's own dispatch, its
            # collectives included) and the code around it is compiled
            # (``runtime/tensor_parallel.py``).
            e = Unsupported(f"{type(self.value).__name__} has DTensor parameters (tensor parallel): "
                            "its call runs outside the graph, with DTensor's own dispatch")
            e.inside_callee = True
            raise e
        cls = type(self.value)
        call_fn = static_lookup(cls, "__call__")
        if call_fn is not torch.nn.Module.__call__:
            # the class's own __call__ (Hugging Face's layers checkpoint themselves there, and
            # change their arguments): inlined, its ``super().__call__`` comes back below
            if not isinstance(call_fn, types.FunctionType):
                raise Unsupported(f"{cls.__name__}.__call__ is not a Python function")
            tx.output.guard_class_attribute(cls, "__call__", call_fn)
            return tx.call(UserFunctionValue(call_fn), [self, *args], kwargs)
        return self.module_call(tx, args, kwargs)

    def module_call(self, tx, args, kwargs):
        """``nn.Module.__call__``: forward pre-hooks, ``forward``, forward hooks."""
        cls = type(self.value)
        for name in ("_call_impl", "_wrapped_call_impl"):
            if static_lookup(cls, name) is not getattr(torch.nn.Module, name):
                raise Unsupported(f"{cls.__name__} overrides nn.Module.{name}")
        hooks = module_hooks.forward_hooks(tx, self)     # (guarded; none: the no-hooks guard)
        if tx.output.side_effects.attr_value(self, "forward") is not None or "forward" in self.value.__dict__:
            # ``module.forward = ...`` on the instance (accelerate's and PEFT's hooks, a
            # monkeypatch): ``self.forward`` in ``_call_impl`` finds it first
            instance_forward = self.getattr(tx, "forward")

            def call_forward(args, kwargs):
                return tx.call(instance_forward, list(args), kwargs)
            return self._with_hooks(tx, hooks, args, kwargs, call_forward)
        forward = static_lookup(type(self.value), "forward")
        if not isinstance(forward, types.FunctionType):
            raise Unsupported(f"{type(self.value).__name__}.forward is not a Python function")
        tx.output.guard_class_attribute(type(self.value), "forward", forward)
        if self.source is not None:
            tx.output.builder.guard(GuardKind.NOT_IN_INSTANCE_DICT, self.source, "forward")

        def call_forward(args, kwargs):
            if config.repeated_blocks and regions.is_repeated_block(self):
                return regions.record(tx, type(self.value).__name__, False,
                                      lambda: tx.call(UserFunctionValue(forward), [self, *args], kwargs))
            return tx.call(UserFunctionValue(forward), [self, *args], kwargs)
        return self._with_hooks(tx, hooks, args, kwargs, call_forward)

    def _with_hooks(self, tx, hooks, args, kwargs, call_forward):
        if hooks is None:
            return call_forward(args, kwargs)
        try:
            return module_hooks.call_with_hooks(tx, self, hooks, args, kwargs, call_forward)
        except Unsupported as e:
            # a hook that cannot be inlined (FSDP2's): a break at this call, where the hooks
            # run natively around the compiled forward (``runtime/hooked_module.py``)
            e.inside_callee = True
            raise


class NewModuleListValue(Value):
    """``nn.ModuleList(modules)`` built during capture from existing modules (what
    ``module_list[a:b]`` returns): iterated, indexed, sliced and measured symbolically; it is
    rebuilt as a new ModuleList over the same modules if it escapes."""

    def __init__(self, items: list[Value]):
        self.items = list(items)

    def python_type(self):
        return torch.nn.ModuleList

    def describe(self):
        return f"new ModuleList[{', '.join(i.describe() for i in self.items)}]"

    def unpack(self, tx):
        return list(self.items)


    def truthy(self, tx):
        return len(self.items) > 0

    def getattr(self, tx, name):
        if name in ("__len__", "__iter__", "__getitem__"):
            return MethodValue(self, name)
        raise Unsupported(f"attribute {name!r} of a ModuleList created in the compiled function")

    def call_method(self, tx, name, args, kwargs):
        import operator

        if name == "__len__" and not args and not kwargs:
            return ConstantValue(len(self.items))
        if name == "__iter__" and not args and not kwargs:
            return IteratorValue(list(self.items))
        if name == "__getitem__" and len(args) == 1 and not kwargs:
            idx = args[0].as_constant()
            if isinstance(idx, slice):
                return NewModuleListValue(self.items[idx])
            try:
                return self.items[operator.index(idx)]
            except IndexError:
                raise tx.user_exception(IndexError(f"index {idx} is out of range"))
        raise Unsupported(f"ModuleList.{name} on a ModuleList created in the compiled function")

    def reconstruct(self, cg):
        def build():
            return f"{cg.bind(torch.nn.ModuleList)}([{', '.join(i.reconstruct(cg) for i in self.items)}])"
        return cg.stash(self, build)


class PythonModuleValue(ObjectValue):
    """A Python module (``torch``, ``math``, a user module)."""

    def describe(self):
        return f"PyModule({self.value.__name__})"

    def getattr(self, tx, name):
        pending = tx.output.side_effects.global_value(self.value.__dict__, name)
        if pending is not None:   # assigned earlier in this capture
            return pending
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            if not tx.output.is_trusted_module(self.value):
                # guarded to stay missing: a later call would find what is added
                tx.output.guards.add(Guard(GuardKind.GLOBAL_ABSENT, None, (self.value.__dict__, name)))
            raise tx.user_exception(e)
        if tx.output.is_trusted_module(self.value):
            if not _mutable_container(attr):
                return tx.wrap(attr, None)
            # (a module's list or dict, even torch's or the standard library's: ``sys.path``,
            # ``gc.callbacks``, ``sys.modules``, changed in place by anyone, is read through a
            # source, guarded and written back as any container from outside)
            return tx.wrap(attr, AttrSource(self.source or ConstSource(self.value), name))
        self._require_source(name)
        return tx.wrap(attr, AttrSource(self.source, name))

    def truthy(self, tx):
        return True

    def setattr(self, tx, name, value):
        # a module global: written back after the graph, like STORE_GLOBAL (its functions
        # read it as a global, through the same dict). Modules that customize attribute
        # access (a class of their own, __setattr__ on it) run natively.
        if type(self.value) is not types.ModuleType or tx.output.is_trusted_module(self.value):
            raise Unsupported(f"assignment to module attribute {self.value.__name__}.{name}")
        tx.output.side_effects.store_global(self.value.__dict__, name, value)

    def delattr(self, tx, name):
        raise Unsupported(f"del of module attribute {self.value.__name__}.{name}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.bind(self.value)  # a module imported in the function (IMPORT_NAME): by identity


def _mutable_container(obj) -> bool:
    return isinstance(obj, (list, dict, set, bytearray, collections.deque, collections.abc.MutableMapping,
                            collections.abc.MutableSequence, collections.abc.MutableSet))


def _has_python_get(attr) -> bool:
    """A descriptor whose ``__get__`` is Python code (it may read the instance's state)."""
    return attr is not _MISSING and isinstance(getattr(type(attr), "__get__", None), types.FunctionType)


class ClassValue(ObjectValue):
    """A class. Calling it constructs builtin containers, namedtuples, torch constants and
    grad-mode context managers; instances of user classes are a later issue."""

    def describe(self):
        return f"Class({self.value.__qualname__})"

    def is_constant(self):
        return True

    def as_constant(self):
        return self.value

    def truthy(self, tx):
        meta = type(self.value)     # (a class's truth is its metaclass's __bool__ / __len__)
        for name in ("__bool__", "__len__"):
            fn = static_lookup(meta, name)
            if isinstance(fn, types.FunctionType):
                tx.output.guard_class_attribute(meta, name, fn)
                result = tx.call(UserFunctionValue(fn), [self], {})
                return checked_bool(tx, result) if name == "__bool__" else checked_len(tx, result) > 0
            if fn is not _MISSING:
                raise Unsupported(f"truth of {self.describe()} (its metaclass's {name} is not Python)")
        return True

    def getattr(self, tx, name):
        cls = self.value
        attr = static_lookup(cls, name)
        if attr is _MISSING:
            mattr = static_lookup(type(cls), name)
            if mattr is not _MISSING and name in ("__name__", "__qualname__", "__module__", "__mro__"):
                # (assignable: ``Cls.__name__ = ...`` after the capture is seen)
                return tx.wrap(getattr(cls, name), AttrSource(self.source or ConstSource(cls), name))
            try:
                real = getattr(cls, name)
            except AttributeError as e:
                # guarded to stay missing: the class, its bases and its metaclass's lack it
                guard_classes_lack(tx, (*cls.__mro__, *type(cls).__mro__), name)
                raise tx.user_exception(e)
            return tx.wrap(real, AttrSource(self.source, name) if self.source else None)
        if isinstance(attr, (staticmethod, classmethod, types.FunctionType)):
            # (what the class resolves the name to, guarded: a class attribute rebound after
            # the capture, ``Foo.m = ...``, is called as in eager)
            tx.output.guard_class_attribute(cls, name, attr)
        if isinstance(attr, staticmethod):
            return tx.wrap(attr.__func__, None)
        if isinstance(attr, classmethod):
            return BoundMethodValue(tx.wrap(attr.__func__, None), self)
        if isinstance(attr, types.FunctionType):
            return UserFunctionValue(attr)
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantValue(getattr(cls, name))
        return tx.wrap(getattr(cls, name), AttrSource(self.source, name) if self.source else None)

    def call(self, tx, args, kwargs):
        from .builtins import construct_class  # cycle: builtins build on objects

        return construct_class(tx, self, args, kwargs)

    def setattr(self, tx, name, value):
        # a class attribute is read through the class and through each instance (and
        # guarded as read): the store runs natively
        raise Unsupported(f"assignment to class attribute {self.value.__qualname__}.{name}")

    def delattr(self, tx, name):
        raise Unsupported(f"del of class attribute {self.value.__qualname__}.{name}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.bind(self.value)


class SuperValue(Value):
    def __init__(self, start_cls: type, obj: Value):
        self.start_cls = start_cls
        self.obj = obj

    def describe(self):
        return f"super({self.start_cls.__name__})"

    def getattr(self, tx, name):
        # super(C, obj) searches type(obj)'s MRO; super(C, cls), as in a classmethod, searches
        # cls's own MRO and binds what it finds to cls, or to nothing
        of_class = isinstance(self.obj, ClassValue) and isinstance(self.obj.value, type) \
            and issubclass(self.obj.value, self.start_cls)
        mro = (self.obj.value if of_class else self.obj.python_type()).__mro__
        if self.start_cls not in mro:
            raise tx.user_exception(TypeError("super(type, obj): obj must be an instance or subtype of type"))
        i = mro.index(self.start_cls)
        for klass in mro[i + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if of_class:
                    return self._class_attribute(tx, name, attr)
                if attr is torch.nn.Module.__init__ and getattr(self.obj, "under_construction", False):
                    return _ModuleInit(self.obj)   # (new_objects.py: a module being initialized)
                if attr in (torch.nn.Module.__call__, torch.nn.Module._call_impl) and \
                        isinstance(self.obj, NNModuleValue):
                    return _ModuleCall(self.obj)   # (a class's own __call__ calling nn.Module's)
                if isinstance(attr, types.FunctionType):
                    return BoundMethodValue(UserFunctionValue(attr), self.obj)
                if isinstance(attr, classmethod):
                    return BoundMethodValue(UserFunctionValue(attr.__func__),
                                            ClassValue(self.obj.python_type()))
                if isinstance(attr, staticmethod):
                    return tx.wrap(attr.__func__, None)
                if attr in (object.__setattr__, object.__getattribute__, object.__delattr__):
                    return generic_method(self.obj, attr)
                if klass in (list, dict, tuple, collections.OrderedDict) and hasattr(self.obj, "base_method"):
                    return BaseMethodValue(self.obj, name)
                if attr is object.__init__ and name == "__init__":
                    return _ObjectInit()   # super().__init__() reaching object: nothing to do
                raise Unsupported(f"super().{name} resolving to {type(attr).__name__}")
        raise tx.user_exception(AttributeError(f"'super' object has no attribute '{name}'"))

    def _class_attribute(self, tx, name, attr):
        if isinstance(attr, classmethod):
            return BoundMethodValue(UserFunctionValue(attr.__func__), self.obj)
        if isinstance(attr, staticmethod):
            return tx.wrap(attr.__func__, None)
        if isinstance(attr, types.FunctionType):
            return UserFunctionValue(attr)
        raise Unsupported(f"super().{name} of a class, resolving to {type(attr).__name__}")


class _ObjectInit(Value):
    """``object.__init__`` bound by ``super()``: a no-op without arguments (as in eager)."""

    def call(self, tx, args, kwargs):
        if args or kwargs:
            raise tx.user_exception(TypeError("object.__init__() takes exactly one argument "
                                              "(the instance to initialize)"))
        return ConstantValue(None)


class _ModuleCall(Value):
    """``nn.Module.__call__`` bound by ``super()`` to a module whose class overrides it: the
    module's hooks and forward."""

    def __init__(self, obj):
        self.obj = obj

    def describe(self):
        return f"nn.Module.__call__ of {self.obj.describe()}"

    def call(self, tx, args, kwargs):
        return self.obj.module_call(tx, args, kwargs)


class _ModuleInit(Value):
    """``nn.Module.__init__`` bound by ``super()`` to a module being initialized in the
    capture (``new_objects.ModuleUnderConstruction``)."""

    def __init__(self, obj):
        self.obj = obj

    def call(self, tx, args, kwargs):
        return self.obj.module_init(tx, args, kwargs)


class ContextManagerValue(Value):
    """A context manager the capture models (``self.cls`` is its class): its methods are read
    as bound methods, and a with-block open across a graph break is re-entered from a new
    object of the same kind (``reconstruct_entered``: entered, evaluates to its __exit__)."""

    cls: type

    def python_type(self):
        return self.cls

    def getattr(self, tx, name):
        return MethodValue(self, name)

    def reconstruct_entered(self, cg) -> str:
        return f"{cg.bind(_enter_context)}({self.reconstruct(cg)})"


class GradModeValue(ContextManagerValue):
    """``torch.no_grad()`` / ``torch.enable_grad()`` / ``torch.set_grad_enabled(b)``.

    Entering records ``torch._C._set_grad_enabled`` in the graph (so the graph itself runs
    under the right mode) and switches the capture's own grad mode so fake tensors get the
    right ``requires_grad``; exiting restores the previous mode in both."""

    def __init__(self, enabled: bool, cls: type):
        self.enabled = enabled
        self.cls = cls
        self.prev: bool | None = None

    def describe(self):
        return f"{self.cls.__name__}(grad={self.enabled})"

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__":
            self.prev = torch.is_grad_enabled()
            tx.output.set_grad_enabled(self.enabled)
            return ConstantValue(None)
        if name == "__exit__":
            tx.output.set_grad_enabled(self.prev)
            return ConstantValue(None)
        raise Unsupported(f"{self.cls.__name__}.{name}")

    def call(self, tx, args, kwargs):
        if self.cls is torch.set_grad_enabled:
            raise Unsupported("set_grad_enabled used as a decorator inside a compiled function")
        return decorate_with_grad_mode(tx, self, args, kwargs)   # @torch.no_grad() on a function

    def reconstruct(self, cg):
        # one new object of the same kind (shared with its re-entry at a break)
        if self.cls is torch.set_grad_enabled:
            raise Unsupported("a set_grad_enabled object held across a graph break (its "
                              "constructor changes the grad mode)")
        return cg.stash(self, lambda: f"{cg.bind(self.cls)}()")

    def reconstruct_entered(self, cg) -> str:
        """A new context manager of the same kind, entered; evaluates to its __exit__ (a
        with-block open across a graph break is re-entered before the continuation)."""
        ctx = f"{cg.bind(self.cls)}({self.enabled!r})" if self.cls is torch.set_grad_enabled \
            else self.reconstruct(cg)
        return f"{cg.bind(_enter_context)}({ctx})"


class AutocastValue(ContextManagerValue):
    """``torch.autocast(device_type, dtype=..., enabled=..., cache_enabled=...)``.

    Entering records ``_enter_autocast`` in the graph (exiting, ``_exit_autocast``) and
    enters autocast for real during capture, so fake tensors get autocast's dtypes."""

    def __init__(self, cls: type, args: tuple):
        self.cls = cls
        self.args = args          # (device_type, dtype, enabled, cache_enabled)
        self.node = None
        self.real = None

    def describe(self):
        return f"autocast{self.args}"

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__":
            tx.output.enter_autocast(self)
            return ConstantValue(None)
        if name == "__exit__":
            tx.output.exit_autocast(self)
            return ConstantValue(None)
        raise Unsupported(f"autocast.{name}")

    def reconstruct(self, cg):
        dev, dtype, enabled, cache = self.args
        return cg.stash(self, lambda: (
            f"{cg.bind(torch.autocast)}({dev!r}, dtype={cg.bind(dtype) if dtype is not None else None}, "
            f"enabled={enabled!r}, cache_enabled={cache!r})"))


class ProfilerRangeValue(ContextManagerValue):
    """``torch.autograd.profiler.record_function(name)``: a range in the profiler's trace.
    Inside a graph it marks nothing (the graph's kernels are in the trace under the graph's
    own name), as under torch.compile; a with-block left open at a graph break is re-entered
    as a real range, so the code that runs natively after the break is in it."""

    def __init__(self, cls: type, name: str, args: str | None):
        self.cls = cls
        self.name = name
        self.args = args

    def describe(self):
        return f"record_function({self.name!r})"

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__":
            return self
        if name == "__exit__":
            return ConstantValue(None)
        raise Unsupported(f"record_function.{name}")

    def reconstruct(self, cg):
        return cg.stash(self, lambda: f"{cg.bind(self.cls)}({self.name!r}, {self.args!r})")


def _enter_context(ctx):
    ctx.__enter__()
    return ctx.__exit__


def _refuse_native_read_after_stores(tx, what: str) -> None:
    """Native code about to read real objects (a C getter, a proxy's lookup) would miss the
    attribute stores this capture has not written back yet (``o.foo = 2`` then a read of
    ``o.foo`` through ``weakref.proxy(o)``): break the graph there instead, so that they are
    written first and the read runs natively."""
    if tx.output.side_effects.attrs:
        raise Unsupported(f"{what} read after this function set attributes (it may read them)")
