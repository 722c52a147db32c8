"""Python semantics over symbolic values: operators, identity, equality, iteration, item
access and argument binding. ``FrameInterpreter`` inherits these; value classes call them
through the interpreter they are given (``tx``)."""
from __future__ import annotations

import collections
import operator
import types
from typing import Any, Callable

import torch

from ..errors import Unsupported
from .guards import GuardKind
from .numpy.values import NdarrayValue, numpy_binary, numpy_unary
from .sources import AttrSource, ConstSource, ItemSource, TypeSource
from .values.attributes import _MISSING
from .values.base import ConstantValue, LazyArgument, NullValue, Value, is_constant_object
from .values.builder import wrap_pure_result
from .values.containers import (BaseSequenceValue, DictValue, DictViewValue, IteratorValue, ListValue,
                                RangeIteratorValue, SetValue, TupleValue, set_members, str_iterator_kind)
from .values.functions import BoundMethodValue, NestedFunctionValue, UserFunctionValue
from .values.identity import CaptureIdValue
from .values.objects import ClassValue, NewObjectValue, ObjectValue, is_object_comparison, static_lookup
from .values.symbolic import (SizeValue, SymNodeValue, SymRangeValue, SymSliceValue, size_value, specialize,
                              sym_binary, sym_unary)
from .values.tensor import TensorValue
from .values.user_iterators import UserIteratorValue

_SYMBOLIC = (SymNodeValue, SymSliceValue, SymRangeValue)
from . import bytecode_utils


class UserException(Unsupported):
    """The user's code raised ``exc`` during capture. Capture stops (the frame runs eagerly,
    where the exception is raised, or caught, for real) unless a handler inside kiln catches
    it (``getattr`` with a default, ``hasattr``, ``next`` with a default)."""

    def __init__(self, exc: BaseException):
        self.exc = exc
        super().__init__(f"the function raised {type(exc).__name__}: {exc}")


_BINARY = {
    "ADD": operator.add, "AND": operator.and_, "FLOOR_DIVIDE": operator.floordiv,
    "LSHIFT": operator.lshift, "MATRIX_MULTIPLY": operator.matmul, "MULTIPLY": operator.mul,
    "REMAINDER": operator.mod, "OR": operator.or_, "POWER": operator.pow,
    "RSHIFT": operator.rshift, "SUBTRACT": operator.sub, "TRUE_DIVIDE": operator.truediv,
    "XOR": operator.xor,
    "INPLACE_ADD": operator.iadd, "INPLACE_AND": operator.iand,
    "INPLACE_FLOOR_DIVIDE": operator.ifloordiv, "INPLACE_LSHIFT": operator.ilshift,
    "INPLACE_MATRIX_MULTIPLY": operator.imatmul, "INPLACE_MULTIPLY": operator.imul,
    "INPLACE_REMAINDER": operator.imod, "INPLACE_OR": operator.ior, "INPLACE_POWER": operator.ipow,
    "INPLACE_RSHIFT": operator.irshift, "INPLACE_SUBTRACT": operator.isub,
    "INPLACE_TRUE_DIVIDE": operator.itruediv, "INPLACE_XOR": operator.ixor,
}
_COMPARE = {"LT": operator.lt, "LE": operator.le, "EQ": operator.eq, "NE": operator.ne,
            "GT": operator.gt, "GE": operator.ge}
# in-place operator -> its out-of-place twin and the dunder names Python tries
_SET_INPLACE = {operator.ior: "update", operator.iand: "intersection_update",
                operator.isub: "difference_update", operator.ixor: "symmetric_difference_update"}
_INPLACE_TO_BINARY = {
    operator.iadd: operator.add, operator.iand: operator.and_, operator.ifloordiv: operator.floordiv,
    operator.ilshift: operator.lshift, operator.imatmul: operator.matmul, operator.imul: operator.mul,
    operator.imod: operator.mod, operator.ior: operator.or_, operator.ipow: operator.pow,
    operator.irshift: operator.rshift, operator.isub: operator.sub,
    operator.itruediv: operator.truediv, operator.ixor: operator.xor,
}
_DUNDER = {
    operator.add: "add", operator.and_: "and", operator.floordiv: "floordiv",
    operator.lshift: "lshift", operator.matmul: "matmul", operator.mul: "mul", operator.mod: "mod",
    operator.or_: "or", operator.pow: "pow", operator.rshift: "rshift", operator.sub: "sub",
    operator.truediv: "truediv", operator.xor: "xor",
}
_COMPARE_DUNDER = {operator.lt: ("__lt__", "__gt__"), operator.le: ("__le__", "__ge__"),
                   operator.eq: ("__eq__", "__eq__"), operator.ne: ("__ne__", "__ne__"),
                   operator.gt: ("__gt__", "__lt__"), operator.ge: ("__ge__", "__le__")}
_UNARY = {operator.neg: "__neg__", operator.pos: "__pos__", operator.invert: "__invert__",
          operator.abs: "__abs__"}


# Values that are objects of their own: two different ones are never the same object (one
# object reached twice is one value: the builder and the interpreter keep aliases).
_NEW_OBJECTS = (TensorValue, BaseSequenceValue, DictValue, NestedFunctionValue, NewObjectValue)


_ORDERINGS = (operator.lt, operator.le, operator.gt, operator.ge)

def _c_operator_result(tx, fn, x: Value, y: Value) -> Value | None:
    """``fn(x, y)`` for a method of a builtin type written in C, on the real objects (or
    constants) the values stand for, each read from the outside guarded by identity (an
    Enum member is one object); None when either is not known."""
    if not isinstance(fn, (types.WrapperDescriptorType, types.MethodDescriptorType, types.BuiltinFunctionType)):
        return None
    if getattr(fn, "__objclass__", None) not in (str, int, float, bytes, tuple, frozenset, complex, bool):
        return None
    operands = []
    for v in (x, y):
        real = v.as_constant() if v.is_constant() else v.real_object()
        if real is None and not v.is_constant():
            return None
        operands.append(real)
    for v, real in zip((x, y), operands):
        if not v.is_constant() and getattr(v, "source", None) is not None:
            tx.output.builder.guard(GuardKind.ID_MATCH, v.source, real)
    try:
        return ConstantValue(fn(*operands))
    except Exception:       # (its TypeError is eager's too: left to the native run)
        return None


def _dict_union(a: DictValue, b: DictValue) -> DictValue:
    """``a | b`` of dicts: the class whose ``__or__``/``__ror__`` answers makes the result
    (OrderedDict and defaultdict make their own; a plain dict subclass's is dict's, a dict),
    a subclass's reflected one first."""
    own = (collections.OrderedDict, collections.defaultdict)
    for d in (a, b):
        if issubclass(d.cls, own) and d.cls not in own:
            raise Unsupported(f"| of a {d.cls.__name__} (its class's constructor makes the result)")
    if b.cls in own and b.cls is not a.cls and issubclass(b.cls, a.cls):
        maker = b
    else:
        maker = a if a.cls in own else None
    result = DictValue({**a.items, **b.items}, None, maker.cls if maker is not None else dict)
    if maker is not None and maker.cls is collections.defaultdict:
        result.default_factory = maker.default_factory
    return result


def _user_types(a: Value, b: Value) -> tuple[type, type] | None:
    if isinstance(a, ObjectValue) and isinstance(b, ObjectValue) and not isinstance(a, ClassValue) \
            and not isinstance(b, ClassValue):
        return a.python_type(), b.python_type()
    return None


def _same_user_type(a: Value, b: Value) -> bool:
    types_ = _user_types(a, b)
    return types_ is not None and types_[0] is types_[1]


def _reflected_first(a: Value, b: Value, rev: str, comparison: bool) -> bool:
    """Python calls the right operand's reflected method first when its type is a proper
    subclass of the left's: always for a comparison, and for an arithmetic operator when the
    subclass defines that reflected method differently."""
    types_ = _user_types(a, b)
    if types_ is None:
        return False
    ta, tb = types_
    if ta is tb or not issubclass(tb, ta):
        return False
    if comparison:
        return True
    mine = static_lookup(tb, rev)
    return mine is not _MISSING and mine is not static_lookup(ta, rev)


_CONTAINERS = (BaseSequenceValue, DictValue, SetValue)


def _refuse_container_overrides(op, a: Value, b: Value) -> None:
    """An operator on a list, tuple, dict or set subclass whose class defines it (``+`` of a
    list subclass with ``__add__``): the storage's operator would not be eager's, so it runs
    natively."""
    base = _INPLACE_TO_BINARY.get(op, op)
    if base in _COMPARE_DUNDER:
        names = _COMPARE_DUNDER[base]
    elif base in _DUNDER:
        names = (f"__{_DUNDER[base]}__", f"__r{_DUNDER[base]}__")
    else:
        return
    if op in _INPLACE_TO_BINARY:
        names = (*names, f"__i{_DUNDER[base]}__")
    for v in (a, b):
        if isinstance(v, _CONTAINERS) and v.python_type() not in (list, tuple, dict, set, frozenset) \
                and any(v.override(n) is not None for n in names):
            raise Unsupported(f"operator {op.__name__} of {v.describe()}, whose class overrides it")



def _overrides_ordering(a, b) -> bool:
    return any(static_lookup(v.python_type(), f"__{op}__") is not static_lookup(v.base_type, f"__{op}__")
               for v in (a, b) for op in ("lt", "le", "gt", "ge"))


class PythonSemantics:
    """Mixin of FrameInterpreter: the meaning of Python operations on symbolic values."""

    # -- values: helpers used by value classes ---------------------------------------------
    def wrap(self, obj: Any, source, static: bool = False) -> Value:
        return self.output.builder.wrap(obj, source, static)

    def wrap_pure_result(self, v: Any) -> Value:
        """A value computed at capture time from constants (``builder.wrap_pure_result``)."""
        return self.output.builder.wrap_pure_result(v)

    def wrap_attribute(self, value: Value, name: str) -> Value:
        if value.source is None:
            raise Unsupported(f"attribute {name!r} of {value.describe()} without a source")
        real = _real_of(self, value)
        try:
            attr = getattr(real, name)
        except AttributeError as e:
            raise self.user_exception(e)
        return self.wrap(attr, AttrSource(value.source, name))

    def wrap_function_part(self, fn_value: UserFunctionValue, attr: str, key, v) -> Value:
        src = fn_value.source
        if src is None:
            # a function reached through a guarded class: its defaults are read through it
            return self.wrap(v, ItemSource(AttrSource(ConstSource(fn_value.fn), attr), key))
        return self.wrap(v, ItemSource(AttrSource(src, attr), key))

    def bind_user_attribute(self, self_value: Value, fn, name: str) -> Value:
        if isinstance(fn, types.FunctionType):
            return BoundMethodValue(UserFunctionValue(fn), self_value)
        if isinstance(fn, staticmethod):
            return self.wrap(fn.__func__, None)
        if isinstance(fn, classmethod):
            return BoundMethodValue(self.wrap(fn.__func__, None), ClassValue(self_value.python_type()))
        if isinstance(fn, property):
            return self.call(UserFunctionValue(fn.fget), [self_value], {})
        raise Unsupported(f"attribute {name!r} of type {type(fn).__name__}")

    def call(self, fn: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return fn.call(self, args, kwargs)

    def call_function_value(self, fn, args: list[Value], kwargs: dict[str, Value] | None = None) -> Value:
        """Inline a real Python function (a method found on a class) on symbolic arguments."""
        return UserFunctionValue(fn).call(self, args, kwargs or {})

    def call_method(self, obj: Value, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return obj.call_method(self, name, args, kwargs)

    def getattr(self, obj: Value, name: str) -> Value:
        if name == "__class__":
            cls = exact_class(obj)
            if cls is not None:
                return cls
        return obj.getattr(self, name)

    def setattr(self, obj: Value, name: str, value: Value) -> None:
        obj.setattr(self, name, value)

    def hasattr(self, obj: Value, name: str) -> bool:
        try:
            obj.getattr(self, name)
            return True
        except UserException as e:
            if not isinstance(e.exc, AttributeError):
                raise
            if obj.source is not None:
                self.output.builder.guard(GuardKind.HASATTR, obj.source, (name, False))
            return False

    def truthy(self, v: Value) -> bool:
        return v.truthy(self)

    def get_iter(self, v: Value) -> Value:
        if isinstance(v, IteratorValue):
            return v
        if isinstance(v, (ListValue, DictValue, DictViewValue, TupleValue, SetValue)):
            it = v.call_method(self, "__iter__", [], {})
            return it if isinstance(it, IteratorValue) else self.get_iter(it)
        if isinstance(v, ObjectValue) and not isinstance(v, ClassValue):
            fn = static_lookup(v.python_type(), "__iter__")
            if isinstance(fn, types.FunctionType):
                self.output.guard_class_attribute(v.python_type(), "__iter__", fn)
                it = self.call(UserFunctionValue(fn), [v], {})
                nxt = static_lookup(it.python_type(), "__next__") if isinstance(it, ObjectValue) else None
                if isinstance(nxt, types.FunctionType):
                    self.output.guard_class_attribute(it.python_type(), "__next__", nxt)
                    return UserIteratorValue(it, nxt)
                if it is v:
                    raise Unsupported(f"iterating over {v.describe()}, whose __iter__ returns it and whose "
                                      "__next__ is not Python")
                return self.get_iter(it)
            nxt = static_lookup(v.python_type(), "__next__")
            if isinstance(nxt, types.FunctionType):
                raise Unsupported(f"iterating over a user iterator object {v.describe()}")
        if isinstance(v, SymRangeValue) or (v.is_constant() and type(v.as_constant()) is range):
            return RangeIteratorValue(v.as_constant())      # (a symbolic bound specializes here)
        if v.is_constant() and type(v.as_constant()) is str:
            return IteratorValue(v.unpack(self), kind=str_iterator_kind(v.as_constant()))
        return IteratorValue(v.unpack(self))

    def unpack_iterable(self, v: Value) -> list[Value]:
        if isinstance(v, IteratorValue):
            return v.unpack(self)
        if isinstance(v, (BaseSequenceValue,)) and v.override("__iter__") is None:
            return list(v.items)
        return self.get_iter(v).unpack(self)

    def each_item(self, v: Value):
        """The items of the iterable ``v``, one at a time: a lazy iterator (a generator) is
        advanced only as the consumer takes each item, so the consumer's own effects in
        between (``lst.extend(gen)`` appending) are seen by the generator as in eager."""
        if isinstance(v, IteratorValue) and v.lazy:
            while (item := v.next(self)) is not None:
                yield item
        else:
            yield from self.unpack_iterable(v)

    def contains(self, items: list[Value], x: Value) -> bool:
        return any(self.values_equal(i, x) for i in items)

    def values_equal(self, a: Value, b: Value) -> bool:
        if a is b:
            return True
        if isinstance(a, _SYMBOLIC) or isinstance(b, _SYMBOLIC):
            return self.truthy(self.compare(operator.eq, a, b))
        if a.is_constant() and b.is_constant():
            ca, cb = a.as_constant(), b.as_constant()
            return ca is cb or ca == cb      # (CPython's containers: the same object is equal, a NaN too)
        ra, rb = a.real_object(), b.real_object()
        if ra is not None and rb is not None and not isinstance(ra, torch.Tensor):
            if ra is rb:
                return True
            return ra == rb if type(ra).__eq__ is object.__eq__ else bool(ra == rb)
        if isinstance(a, TensorValue) or isinstance(b, TensorValue):
            raise Unsupported("comparing tensors by value (needs data)")
        if (a.is_constant() and a.as_constant() is None) or (b.is_constant() and b.as_constant() is None):
            return False
        raise Unsupported(f"equality of {a.describe()} and {b.describe()}")

    def dict_key(self, v: Value):
        if isinstance(v, (TensorValue, CaptureIdValue)):
            return v  # hash by identity: values preserve tensor identity, id() tokens are interned
        if isinstance(v, _SYMBOLIC):
            v = specialize(v)
        if v.is_constant():
            c = v.as_constant()
            try:
                hash(c)
            except TypeError as e:
                raise self.user_exception(e)
            return c
        r = v.real_object()
        if r is not None and not isinstance(r, torch.Tensor):
            try:
                hash(r)
                return r
            except TypeError:
                pass
        raise Unsupported(f"a dict key that is not a Python constant ({v.describe()})")

    def key_value(self, k) -> Value:
        if isinstance(k, Value):
            return k
        prior = self.output.builder.by_id.get(id(k))
        if prior is not None and prior[0] is k and not is_constant_object(k):
            return prior[1]         # (an object key read from the outside: its guarded value)
        return self.wrap(k, None)

    def zero_arg_super(self) -> tuple[type, Value]:
        cell = self.cells.get("__class__")
        if cell is None or self.code.co_argcount == 0:
            raise Unsupported("super() without arguments outside a method")
        cls = cell.get(self).as_constant()
        first = self.code.co_varnames[0]
        obj = self.locals.get(first)
        if isinstance(obj, LazyArgument):
            obj = self.locals[first] = obj.realize(self)
        if obj is None and first in self.cells:
            obj = self.cells[first].get(self)
        return cls, obj

    # -- operators --------------------------------------------------------------------------
    def operator_handler(self, fn) -> Callable | None:
        if fn in _DUNDER or fn in _INPLACE_TO_BINARY or fn in _COMPARE_DUNDER:
            return lambda args, kwargs: self.binary(fn, *args)
        if fn in _UNARY:
            return lambda args, kwargs: self.unary(fn, args[0])
        if fn is operator.getitem:
            return lambda args, kwargs: self.getitem(*args)
        if fn is operator.setitem:
            return lambda args, kwargs: (self.setitem(*args), ConstantValue(None))[1]
        if fn is operator.not_:
            return lambda args, kwargs: ConstantValue(not self.truthy(args[0]))
        if fn is operator.truth:
            return lambda args, kwargs: ConstantValue(self.truthy(args[0]))
        if fn in (operator.is_, operator.is_not):
            return lambda args, kwargs: ConstantValue(self.is_same(*args) == (fn is operator.is_))
        if fn is operator.contains:
            return lambda args, kwargs: ConstantValue(self.contains_op(args[1], args[0]))
        if fn is operator.index:
            return lambda args, kwargs: (args[0] if isinstance(args[0], SymNodeValue)
                                         and args[0].python_type() is int
                                         else ConstantValue(operator.index(args[0].as_constant())))
        return None

    def binary(self, op, a: Value, b: Value) -> Value:
        if isinstance(a, NdarrayValue) or isinstance(b, NdarrayValue):
            return numpy_binary(self, op, a, b)   # NumPy semantics (torch._numpy)
        _refuse_container_overrides(op, a, b)
        if isinstance(a, TensorValue) or isinstance(b, TensorValue):
            if isinstance(a, ObjectValue) or isinstance(b, ObjectValue):
                raise Unsupported("operator between a tensor and a user object")
            if op in _INPLACE_TO_BINARY:
                inplace = self._tensor_inplace(op, a, b)
                if inplace is not None:
                    return inplace
                op = _INPLACE_TO_BINARY[op]
            return self.output.call_op("call_function", op, (a, b), {})
        if isinstance(a, _SYMBOLIC) or isinstance(b, _SYMBOLIC):
            r = sym_binary(self, op, a, b)
            return r if r is not None else self.binary(op, specialize(a), specialize(b))
        if op in _SET_INPLACE and isinstance(a, SetValue) and a.cls is set and isinstance(b, SetValue):
            # ``s |= t`` mutates s (every alias sees it; an input set is written back)
            a.call_method(self, _SET_INPLACE[op], [b], {})
            return a
        if a.is_constant() and b.is_constant() and not isinstance(a, (ListValue, DictValue)) \
                and not isinstance(b, (ListValue, DictValue)):
            try:
                return _wrap_result(op(a.as_constant(), b.as_constant()))
            except Exception as e:
                raise self.user_exception(e)
        base_op = _INPLACE_TO_BINARY.get(op, op)
        if base_op in (operator.or_, operator.and_, operator.sub, operator.xor) and (
                isinstance(a, DictViewValue) or isinstance(b, DictViewValue)):
            view, other = (a, b) if isinstance(a, DictViewValue) else (b, a)
            return view.set_operation(self, base_op, other, reflected=view is b)
        if isinstance(a, ObjectValue) and not isinstance(a, ClassValue) or \
                isinstance(b, ObjectValue) and not isinstance(b, ClassValue):
            return self._user_binary(op, base_op, a, b)
        if isinstance(a, ListValue) and op is operator.iadd:
            a.base_method(self, "extend", [b], {})
            return a
        if base_op is operator.add and (_constant_tuple(b) and isinstance(a, TupleValue)
                                        or _constant_tuple(a) and isinstance(b, TupleValue)):
            # ``(batch, heads) + mask.shape`` with a symbolic batch: item by item (a Size on
            # either side gives a Size: ``torch.Size`` defines ``__add__`` and ``__radd__``)
            items = [self._item_value(v) for v in (a, b)]
            if _is_size(a) or _is_size(b):
                return size_value(items[0] + items[1])
            return TupleValue(items[0] + items[1], None, tuple)
        if isinstance(a, BaseSequenceValue) and isinstance(b, BaseSequenceValue) and base_op is operator.add:
            if isinstance(a, TupleValue) and isinstance(b, TupleValue) and (_is_size(a) or _is_size(b)):
                return size_value(list(a.items) + list(b.items))
            if a.base_type is not b.base_type:
                raise self.user_exception(TypeError("can only concatenate list/tuple to same type"))
            return type(a)(a.items + b.items, None, a.base_type)
        if isinstance(a, BaseSequenceValue) and base_op is operator.mul and b.is_constant():
            n = self._repeat_count(b)
            if isinstance(a, ListValue) and op is operator.imul:
                a._mutate(self)
                a.items[:] = a.items * n
                return a
            return type(a)(a.items * n, None, a.base_type)
        if isinstance(b, BaseSequenceValue) and base_op is operator.mul and a.is_constant():
            return type(b)(b.items * self._repeat_count(a), None, b.base_type)
        if isinstance(a, DictValue) and isinstance(b, DictValue) and base_op is operator.or_:
            if op is operator.ior:
                a.base_method(self, "update", [b], {})
                return a
            return _dict_union(a, b)
        if op in _COMPARE_DUNDER:
            return self.compare(op, a, b)
        if isinstance(a, SetValue) and isinstance(b, SetValue):
            try:
                keys = base_op(a.keys, b.keys)      # (real sets: eager's order and members)
            except TypeError as e:
                raise self.user_exception(e)
            # (the left operand's kind: a frozenset's operators make frozensets)
            cls = frozenset if issubclass(a.cls, frozenset) else set
            return SetValue(set_members(keys, [a.items, b.items]), cls, keys=set(keys))
        raise Unsupported(f"operator {getattr(op, '__name__', op)} on {a.describe()} and {b.describe()}")

    def _repeat_count(self, v: Value) -> int:
        """``seq * v``: v must be an index (``[1] * 2.0`` raises TypeError, as in eager)."""
        n = v.as_constant()
        try:
            return operator.index(n)
        except TypeError:
            raise self.user_exception(TypeError(
                f"can't multiply sequence by non-int of type '{type(n).__name__}'"))

    def _tensor_inplace(self, op, a: Value, b: Value) -> Value | None:
        """``a op= b`` with a tensor on one side, as Python runs it: ``type(a).__iop__(a, b)``
        when ``a``'s type defines it (a tensor: mutated in place, the same value comes back);
        None when it does not (a number, a symbolic int, ``Tensor @=``), so that the caller
        computes ``a op b`` and the name is rebound to a new value.

        The graph records the dunder as a method call, never ``operator.iadd``: FX prints
        that as the statement ``a += b``, which is not Python for a constant ``a`` and
        rebinds the name of ``a`` for the rest of the graph's code."""
        name = f"__i{_DUNDER[_INPLACE_TO_BINARY[op]]}__"
        if isinstance(a, TensorValue) and callable(getattr(a.python_type(), name, None)):
            return self.output.call_op("call_method", name, (a, b), {})
        if isinstance(a, (ListValue, SetValue, DictValue)):
            return self._container_inplace(op, a, b)
        return None

    def _container_inplace(self, op, a, b):
        if isinstance(a, ListValue) and op is operator.iadd:
            a.base_method(self, "extend", [b], {})   # list += tensor: extends by its rows
            return a
        raise Unsupported(f"operator {op.__name__} on {a.describe()} and {b.describe()}")

    def _user_binary(self, op, base_op, a, b):
        name = _DUNDER.get(base_op)
        if op in _COMPARE_DUNDER:
            fwd, rev = _COMPARE_DUNDER[op]
        else:
            fwd, rev = f"__{name}__", f"__r{name}__"
        if op in _INPLACE_TO_BINARY and isinstance(a, ObjectValue):
            ifn = static_lookup(a.python_type(), f"__i{name}__")
            if isinstance(ifn, types.FunctionType):
                self.output.guard_class_attribute(a.python_type(), f"__i{name}__", ifn)
                r = self.call(UserFunctionValue(ifn), [a, b], {})
                if not (r.is_constant() and r.as_constant() is NotImplemented):
                    return r
        order = [(a, b, fwd), (b, a, rev)]
        comparison = op in _COMPARE_DUNDER
        if _reflected_first(a, b, rev, comparison):
            order.reverse()
        elif not comparison and _same_user_type(a, b):
            order.pop()     # Python tries no reflected operator between objects of one type
        unknown = False
        for x, y, meth in order:
            if not isinstance(x, ObjectValue) or isinstance(x, ClassValue):
                continue
            fn = static_lookup(x.python_type(), meth)
            if isinstance(fn, types.FunctionType) or is_object_comparison(fn):
                r = x.call_method(self, meth, [y], {})      # (guards the class's method)
                if not (r.is_constant() and r.as_constant() is NotImplemented):
                    return r
            elif fn is not _MISSING:
                # a builtin base's operator in C (a str or int mixin of an Enum): computed on
                # the objects themselves when both are known (guarded), else not known here
                known = _c_operator_result(self, fn, x, y)
                if known is not None:
                    if not (known.is_constant() and known.as_constant() is NotImplemented):
                        return known
                    continue
                unknown = True
        if op in (operator.eq, operator.ne) and not unknown:
            same = self.is_same(a, b)
            return ConstantValue(same if op is operator.eq else not same)
        raise Unsupported(f"operator {getattr(op, '__name__', op)} on {a.describe()} and {b.describe()}")

    def compare(self, op, a: Value, b: Value) -> Value:
        if isinstance(a, NdarrayValue) or isinstance(b, NdarrayValue):
            return numpy_binary(self, op, a, b)
        _refuse_container_overrides(op, a, b)
        if isinstance(a, TensorValue) or isinstance(b, TensorValue):
            other = b if isinstance(a, TensorValue) else a
            if other.is_constant() and other.as_constant() is None and op in (operator.eq, operator.ne):
                return ConstantValue(op is operator.ne)
            return self.binary(op, a, b)
        if isinstance(a, _SYMBOLIC) or isinstance(b, _SYMBOLIC):
            r = sym_binary(self, op, a, b)
            return r if r is not None else self.compare(op, specialize(a), specialize(b))
        if isinstance(a, (BaseSequenceValue,)) and isinstance(b, BaseSequenceValue) and op in (operator.eq, operator.ne):
            eq = a.base_type is b.base_type and len(a.items) == len(b.items) and all(
                self.values_equal(x, y) for x, y in zip(a.items, b.items))
            return ConstantValue(eq if op is operator.eq else not eq)
        if isinstance(a, BaseSequenceValue) and isinstance(b, BaseSequenceValue) and op in _ORDERINGS \
                and a.base_type is b.base_type and not _overrides_ordering(a, b):
            # lexicographic, as Python orders lists and tuples (sys.version_info >= (3, 12))
            for x, y in zip(a.items, b.items):
                if not self.values_equal(x, y):
                    return self.compare(op, x, y)
            return ConstantValue(op(len(a.items), len(b.items)))
        if op in (operator.eq, operator.ne) and (isinstance(a, DictViewValue) or isinstance(b, DictViewValue)):
            eq = a.equals(self, b) if isinstance(a, DictViewValue) else b.equals(self, a)
            return ConstantValue(eq if op is operator.eq else not eq)
        if a.is_constant() and b.is_constant():
            try:
                return _wrap_result(op(a.as_constant(), b.as_constant()))
            except Exception as e:
                raise self.user_exception(e)
        if op in (operator.eq, operator.ne):
            if isinstance(a, ObjectValue) or isinstance(b, ObjectValue):
                return self._user_binary(op, op, a, b)
            eq = self.values_equal(a, b)
            return ConstantValue(eq if op is operator.eq else not eq)
        raise Unsupported(f"comparison {op.__name__} of {a.describe()} and {b.describe()}")

    def unary(self, op, v: Value) -> Value:
        if isinstance(v, NdarrayValue):
            return numpy_unary(self, op, v)
        if isinstance(v, TensorValue):
            return self.output.call_op("call_function", op, (v,), {})
        if isinstance(v, _SYMBOLIC):
            r = sym_unary(self, op, v)
            return r if r is not None else self.unary(op, specialize(v))
        if v.is_constant():
            try:
                return _wrap_result(op(v.as_constant()))
            except Exception as e:
                raise self.user_exception(e)
        if isinstance(v, ObjectValue):
            fn = static_lookup(v.python_type(), _UNARY[op])
            if isinstance(fn, types.FunctionType):
                self.output.guard_class_attribute(v.python_type(), _UNARY[op], fn)
                return self.call(UserFunctionValue(fn), [v], {})
        raise Unsupported(f"unary {op.__name__} on {v.describe()}")

    def is_same(self, a: Value, b: Value) -> bool:
        if a is b:
            return True
        if isinstance(a, NullValue) or isinstance(b, NullValue):
            return False
        ac, bc = a.is_constant(), b.is_constant()
        if ac and bc and not isinstance(a, (BaseSequenceValue, SetValue)) and not isinstance(b, (BaseSequenceValue, SetValue)):
            return a.as_constant() is b.as_constant()
        ra, rb = a.real_object(), b.real_object()
        if ra is not None and rb is not None:
            # the answer holds while each object read from the outside is the same one
            for v, real in ((a, ra), (b, rb)):
                if not v.is_constant() and getattr(v, "source", None) is not None:
                    self.output.builder.guard(GuardKind.ID_MATCH, v.source, real)
            return ra is rb
        if (ac and a.as_constant() is None) or (bc and b.as_constant() is None):
            return False
        if isinstance(a, TensorValue) and isinstance(b, TensorValue) and \
                self.output.frozen_storages and self.output.is_frozen(a) and self.output.is_frozen(b):
            raise Unsupported("identity of a min()/max() of tensors and its candidates")
        if isinstance(a, _NEW_OBJECTS) or isinstance(b, _NEW_OBJECTS):
            return False  # distinct symbolic objects (in-place ops return their receiver's value)
        raise Unsupported(f"identity of {a.describe()} and {b.describe()}")

    def contains_op(self, container: Value, x: Value) -> bool:
        if isinstance(container, ConstantValue):
            if not x.is_constant():
                if isinstance(x, TensorValue):
                    raise Unsupported("`in` test of a tensor (compares values)")
                return self._contains_in_constant(container.as_constant(), x)
            try:
                return x.as_constant() in container.as_constant()
            except TypeError as e:
                raise self.user_exception(e)
        if isinstance(container, ObjectValue):
            fn = static_lookup(container.python_type(), "__contains__")
            if isinstance(fn, types.FunctionType):
                self.output.guard_class_attribute(container.python_type(), "__contains__", fn)
                return self.truthy(self.call(UserFunctionValue(fn), [container, x], {}))
            return self.contains(self.unpack_iterable(container), x)
        if isinstance(container, TensorValue):
            raise Unsupported("`in` test on a tensor (needs data)")
        return self.truthy(container.call_method(self, "__contains__", [x], {}))

    @staticmethod
    def _item_value(v: Value) -> list:
        return list(v.items) if isinstance(v, TupleValue) else [ConstantValue(i) for i in v.as_constant()]

    def _contains_in_constant(self, container, x: Value) -> bool:
        """``x in container`` for a value known only at run time (a symbolic size, an object):
        a range by its bounds (guarded as comparisons, no value specialized), another
        container item by item, as Python compares them."""
        if isinstance(container, range) and isinstance(x, SymNodeValue) and x.python_type() in (int, bool):
            if len(container) == 0:
                return False
            first, last = container[0], container[-1]
            low, high = (first, last) if container.step > 0 else (last, first)
            if not (self.truthy(self.compare(operator.le, ConstantValue(low), x))
                    and self.truthy(self.compare(operator.le, x, ConstantValue(high)))):
                return False
            if abs(container.step) == 1:
                return True
            offset = self.binary(operator.sub, x, ConstantValue(first))
            rest = self.binary(operator.mod, offset, ConstantValue(abs(container.step)))
            return self.truthy(self.compare(operator.eq, rest, ConstantValue(0)))
        if isinstance(container, (str, bytes, bytearray)):
            if not isinstance(x, SymNodeValue):
                raise Unsupported("`in` test of an object in a string")
            raise self.user_exception(TypeError(f"'in <{type(container).__name__}>' requires string as left "
                                                f"operand, not {x.python_type().__name__}"))
        try:
            items = list(container)
        except TypeError as e:
            raise self.user_exception(e)
        if len(items) > 256:
            raise Unsupported(f"`in` test of a value known at run time in {len(items)} constants")
        return self.contains([_wrap_result(i) for i in items], x)

    def getitem(self, obj: Value, index: Value) -> Value:
        if isinstance(obj, TensorValue):
            return obj.call_method(self, "__getitem__", [index], {})
        if isinstance(obj, (BaseSequenceValue, DictValue)):
            return obj.call_method(self, "__getitem__", [index], {})
        if isinstance(obj, ConstantValue):
            try:
                return _wrap_result(obj.as_constant()[index.as_constant()])
            except Exception as e:
                raise self.user_exception(e)
        if isinstance(obj, ClassValue):
            cg = static_lookup(obj.value, "__class_getitem__")
            if cg is not None:
                return _wrap_result(obj.value[index.as_constant()])
        return obj.call_method(self, "__getitem__", [index], {})

    def setitem(self, obj: Value, index: Value, value: Value) -> None:
        obj.call_method(self, "__setitem__", [index, value], {})


def _constant_tuple(v: Value) -> bool:
    return isinstance(v, ConstantValue) and isinstance(v.as_constant(), tuple)


def _is_size(v: Value) -> bool:
    return isinstance(v, SizeValue) or isinstance(v, ConstantValue) and isinstance(v.as_constant(), torch.Size)


def _wrap_result(v) -> Value:
    return wrap_pure_result(v)


def _real_of(tx, value: Value):
    r = value.real_object()
    if r is not None:
        return r
    raise Unsupported(f"no real object for {value.describe()}")


def bind_arguments(tx, code: types.CodeType, name: str, args: list[Value], kwargs: dict[str, Value],
                   defaults: list[Value], kwdefaults: dict[str, Value]) -> dict[str, Value]:
    """Python's argument binding, over symbolic values."""
    nargs = code.co_argcount
    nposonly = code.co_posonlyargcount
    nkwonly = code.co_kwonlyargcount
    names = code.co_varnames
    pos_names = names[:nargs]
    kwonly_names = names[nargs:nargs + nkwonly]
    i = nargs + nkwonly
    varargs_name = names[i] if code.co_flags & bytecode_utils.CO_VARARGS else None
    if varargs_name:
        i += 1
    varkw_name = names[i] if code.co_flags & bytecode_utils.CO_VARKEYWORDS else None

    def err(msg):
        return tx.user_exception(TypeError(f"{name}() {msg}"))

    bound: dict[str, Value] = {}
    for pname, v in zip(pos_names, args):
        bound[pname] = v
    extra = args[nargs:]
    if extra and varargs_name is None:
        raise err(f"takes {nargs} positional arguments but {len(args)} were given")
    if varargs_name:
        bound[varargs_name] = TupleValue(list(extra))
    varkw: dict[str, Value] = {}
    for k, v in kwargs.items():
        if k in pos_names[nposonly:] or k in kwonly_names:
            if k in bound:
                raise err(f"got multiple values for argument {k!r}")
            bound[k] = v
        elif varkw_name is not None:
            varkw[k] = v
        else:
            raise err(f"got an unexpected keyword argument {k!r}")
    first_default = nargs - len(defaults)
    for j, pname in enumerate(pos_names):
        if pname not in bound:
            if j >= first_default:
                bound[pname] = defaults[j - first_default]
            else:
                raise err(f"missing required positional argument {pname!r}")
    for pname in kwonly_names:
        if pname not in bound:
            if pname in kwdefaults:
                bound[pname] = kwdefaults[pname]
            else:
                raise err(f"missing required keyword-only argument {pname!r}")
    if varkw_name is not None:
        bound[varkw_name] = DictValue(varkw)
    return bound


def exact_class(obj: Value) -> Value | None:
    """``obj.__class__`` for values whose Python type is known exactly (the builtin containers
    and constants: their own attribute lookup found a method named ``__class__``), else None."""
    if not isinstance(obj, (BaseSequenceValue, DictValue, SetValue, ConstantValue)):
        return None
    cls = obj.python_type()
    if static_lookup(cls, "__class__") is not object.__dict__["__class__"]:
        return None
    return ClassValue(cls, TypeSource(obj.source) if obj.source is not None else None)
