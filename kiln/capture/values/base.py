"""The symbolic value protocol and the simplest values (constants, NULL).

Every Python object the interpreter handles is a ``Value``. A value that came from the outside
world carries its ``source``; guards on that source were installed when it was wrapped
(``builder.wrap``). Operations a value cannot model raise ``Unsupported``: the frame then runs
eagerly (or the user sees the error under ``fullgraph=True``), never a wrong answer.
"""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import torch

from ...errors import Unsupported

if TYPE_CHECKING:  # pragma: no cover
    from ..interpreter import FrameInterpreter
    from ..sources import Source


class Value:
    source: "Source | None" = None

    # -- identity and type -------------------------------------------------------------
    def python_type(self) -> type:
        raise Unsupported(f"type of {self.describe()} is unknown at capture time")

    def is_constant(self) -> bool:
        return False

    def as_constant(self) -> Any:
        raise Unsupported(f"{self.describe()} is not a Python constant")

    def real_object(self) -> Any:
        """The real object behind a value that stands for an existing object, else None."""
        return None

    def describe(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return self.describe()

    # -- operations ----------------------------------------------------------------------
    def getattr(self, tx: "FrameInterpreter", name: str) -> "Value":
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def setattr(self, tx: "FrameInterpreter", name: str, value: "Value") -> None:
        raise Unsupported(f"setting attribute {name!r} on {self.describe()}")

    def call(self, tx: "FrameInterpreter", args: list["Value"], kwargs: dict[str, "Value"]) -> "Value":
        raise Unsupported(f"calling {self.describe()}")

    def call_method(self, tx, name: str, args: list["Value"], kwargs: dict[str, "Value"]) -> "Value":
        return self.getattr(tx, name).call(tx, args, kwargs)

    def unpack(self, tx) -> list["Value"]:
        """The items of an iterable of known length."""
        raise Unsupported(f"iterating over {self.describe()}")

    def truthy(self, tx) -> bool:
        raise Unsupported(f"truth value of {self.describe()}")


    # -- output ----------------------------------------------------------------------------
    def reconstruct(self, cg) -> str:
        """A Python expression that rebuilds this value after the graph has run."""
        if self.source is not None:
            return cg.source_expr(self.source)
        raise Unsupported(f"returning {self.describe()} from a compiled function")


# Python values that are immutable and can be folded at capture time.
CONSTANT_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis),
                  type(NotImplemented), torch.dtype, torch.device, torch.Size, range, slice,
                  frozenset, torch.layout, torch.memory_format)


def is_type_annotation(v: Any) -> bool:
    """A typing construct (``List[torch.Tensor]``, ``list[Any]``, ``Optional``, a TypeVar):
    immutable and hashable, built at capture time as eager builds it (``typing`` caches them)."""
    import types
    import typing

    t = type(v)     # (by type: isinstance could run a user's __getattribute__)
    if issubclass(t, (types.GenericAlias, typing.TypeVar, typing.ForwardRef)):
        return True
    if issubclass(t, getattr(typing, "_SpecialForm", ())):    # Union, Optional, Literal (a subclass)
        return True
    return type(v).__module__ == "typing" and type(v).__name__ in (
        "_GenericAlias", "_SpecialGenericAlias", "_UnionGenericAlias", "_LiteralGenericAlias",
        "_CallableGenericAlias", "_SpecialForm", "_AnnotatedAlias", "_TupleType")


def is_constant_object(v: Any) -> bool:
    if isinstance(v, tuple) and not isinstance(v, torch.Size):
        return type(v) is tuple and all(is_constant_object(x) for x in v)
    if isinstance(v, slice):
        return all(is_constant_object(x) for x in (v.start, v.stop, v.step))
    return type(v) in CONSTANT_TYPES


class RealCallableValue(Value):
    """A real callable object the capture models (a builtin, a torch op, a NumPy function...):
    the object itself, where it was read from, and its type."""

    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return type(self.fn)

    def real_object(self):
        return self.fn


class ConstantValue(Value):
    """A Python constant. One read from an input carries ``on_use``: the guard on its value
    (EQUALS_MATCH) is installed the first time the value is used; until then only its type is
    guarded, so a number that is only passed along or type-tested does not specialize."""

    def __init__(self, value: Any, source=None, on_use=None):
        self._value = value
        self.source = source
        self._on_use = on_use

    @property
    def value(self):
        if self._on_use is not None:
            on_use, self._on_use = self._on_use, None
            on_use()
        return self._value

    def python_type(self):
        return type(self._value)

    def is_constant(self):
        return True

    def as_constant(self):
        return self.value

    def real_object(self):
        return self.value

    def describe(self):
        return f"Constant({self._value!r})"

    def truthy(self, tx):
        return bool(self.value)


    def unpack(self, tx):
        try:
            items = list(self.value)
        except TypeError:
            raise Unsupported(f"iterating over {self.value!r}")
        return [ConstantValue(v) for v in items]

    def getattr(self, tx, name):
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            raise tx.user_exception(e)
        if isinstance(attr, type) or is_type_annotation(attr):
            # a class or typing construct (``Optional[int].__origin__`` is ``typing.Union``):
            # immutable, the same object eager reads; not a method to call
            return tx.wrap_pure_result(attr)
        if callable(attr):
            from .functions import PureMethodValue  # cycle: function values are Values

            return PureMethodValue(attr, f"{type(self.value).__name__}.{name}")
        return tx.wrap_pure_result(attr)

    def reconstruct(self, cg):
        if self._on_use is not None and self.source is not None:
            return cg.source_expr(self.source)  # passed along unread: the caller's object
        v = self.value
        if _one_object_per_value(v):
            return cg.constant_expr(v)
        # (the very object: a literal would merge equal values that eager keeps apart, as
        # ``c = a[:3] + a[3:]; c is a``, or part ones eager shares)
        return cg.bind(v, "c")


def _one_object_per_value(v: Any) -> bool:
    """Values CPython keeps one object of (``is`` between equal ones is always True)."""
    t = type(v)
    if v is None or v is Ellipsis or v is NotImplemented or t is bool:
        return True
    if t is int:
        return -5 <= v <= 256
    if t is str:
        return len(v) <= 1 and (not v or ord(v) < 256)
    return t is tuple and not v


class LazyArgument(Value):
    """An argument of the compiled function not read yet. It is wrapped, and its guards
    installed, when the code first loads it: an argument the function never reads (or only
    passes through) adds no guard."""

    def __init__(self, obj, source):
        self.obj = obj
        self.source = source

    def realize(self, tx) -> Value:
        return tx.wrap(self.obj, self.source)

    def describe(self):
        return f"Lazy({self.source.describe()})"


class NullValue(Value):
    """The NULL that PUSH_NULL / LOAD_GLOBAL / LOAD_ATTR push below a callable."""

    def describe(self):
        return "NULL"


NULL = NullValue()


class UnboundValue(Value):
    """What LOAD_FAST_AND_CLEAR pushes for an unbound local (3.12 inlined comprehensions)."""


UNBOUND = UnboundValue()


_MADE = itertools.count()


def next_serial() -> int:
    """A number above every ``serial`` given so far: values made from now on get higher ones."""
    return next(_MADE)


class MadeInOrder:
    """A mutable value that knows when the capture made it (``serial``): a higher-order op's
    body may change what it made itself, never what existed before it ran (torch's control
    flow has no Python effects)."""

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self.serial = next(_MADE)
        return self
