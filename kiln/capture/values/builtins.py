"""Python builtins, ``operator``, ``math`` and ``functools`` called during capture.

Pure functions of constants are evaluated at capture time. Those that take symbolic values
(``len``, ``isinstance``, ``getattr``, ``sum``, ``zip``, ...) are modelled here. Anything else
raises Unsupported: never a guess.
"""
from __future__ import annotations

import abc
import collections
import functools
import inspect
import math
import operator
import sys
import types
from typing import Any, Callable

import torch

from ...errors import Unsupported
from ..guards import Guard, GuardKind, _autocast_state
from ..sources import TypeSource
from . import backward_capture
from .attributes import _MISSING, call_modelled
from .base import ConstantValue, RealCallableValue, Value, is_constant_object
from .containers import (DictValue, IteratorValue, ListValue, NamedTupleValue, SetValue, identity_free, iterator_at,
                         TupleValue, set_members)
from .containers import NewDictObjectValue, RangeIteratorValue, enumerate_kind, reversed_kind
from .exceptions import ExceptionValue
from .functions import BoundMethodValue, MethodValue, PartialValue, TorchOpValue, UserFunctionValue
from .grad_mode_functions import decorate_with_grad_mode
from .objects import AutocastValue, NewModuleListValue, NNModuleValue, ObjectValue
from .symbolic import (SymNodeValue, SymRangeValue, SymSliceValue, size_value, specialize,
                       sym_call)
from .objects import (ClassValue, can_allocate_symbolically, GradModeValue, NewObjectValue, ProfilerRangeValue,
                      SuperValue,
                      can_create_symbolically, static_lookup, user_layers_define)
from .tensor import TensorValue
from .truth import checked_len

_HANDLERS: dict[Any, Callable] = {}
_SYMBOLIC = (SymNodeValue, SymRangeValue, SymSliceValue)
_CONTAINER_BASES = (list, dict, tuple, collections.OrderedDict)


def handles(*fns):
    def deco(h):
        for f in fns:
            _HANDLERS[f] = h
        return h
    return deco


# Pure functions of constants: evaluated at capture time when every argument is a constant.
PURE_FUNCTIONS = frozenset([
    abs, all, any, bin, bool, callable, chr, complex, divmod, float, format, hash, hex, int,
    len, max, min, oct, ord, pow, repr, round, sorted, str, sum, isinstance, issubclass,
    tuple, frozenset, range, slice, reversed, enumerate, zip, list, set, dict, type,
    *[getattr(math, n) for n in dir(math) if callable(getattr(math, n)) and not n.startswith("_")],
    *[getattr(operator, n) for n in dir(operator) if callable(getattr(operator, n))
      and not n.startswith("_") and n not in ("attrgetter", "itemgetter", "methodcaller")],
])


# builtins without a signature to check that take no keyword arguments
_NO_KEYWORDS = frozenset([getattr, iter, next, vars, dir])


@functools.lru_cache(maxsize=None)
def _signature(fn):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _check_arguments(tx, fn, args, kwargs) -> None:
    """A call the function's signature rejects raises eager's TypeError (the handlers below
    read their arguments by position and would answer it)."""
    sig = _signature(fn)
    if sig is None:
        if not (kwargs and fn in _NO_KEYWORDS):
            return
    else:
        try:
            sig.bind(*args, **kwargs)
            return
        except TypeError:
            pass
    try:    # (argument parsing fails before the function looks at the arguments)
        fn(*[object() for _ in args], **{k: object() for k in kwargs})
    except TypeError as e:
        raise tx.user_exception(e) from None
    except Exception:       # noqa: BLE001 - not an argument error: the handler decides
        return


class BuiltinValue(RealCallableValue):
    """A builtin function (``len``, ``math.sqrt``, ``operator.add``...)."""

    def is_constant(self):
        return True

    def as_constant(self):
        return self.fn

    def describe(self):
        return f"Builtin({getattr(self.fn, '__name__', self.fn)})"

    def truthy(self, tx):
        return True

    def call(self, tx, args, kwargs):
        return call_builtin(tx, self.fn, args, kwargs)

    def reconstruct(self, cg):
        return cg.bind(self.fn)


def call_builtin(tx, fn, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if not _HANDLERS.get("__state_readers_registered__"):
        _HANDLERS["__state_readers_registered__"] = True
        _register_state_readers()
    owner = getattr(fn, "__objclass__", None)
    if owner in _CONTAINER_BASES and args and hasattr(args[0], "base_method"):
        # list.__getitem__(self, i), dict.update(self, ...): act on the storage, bypassing
        # the subclass overrides (what the base-class call does in eager).
        return args[0].base_method(tx, fn.__name__, list(args[1:]), kwargs)
    handler = _HANDLERS.get(fn)
    if handler is not None:
        _check_arguments(tx, fn, args, kwargs)
        result = handler(tx, fn, args, kwargs)
        if result is not NotImplemented:
            return result
    op = tx.operator_handler(fn)
    if op is not None:
        return op(args, kwargs)
    if fn in PURE_FUNCTIONS and (any(isinstance(a, _SYMBOLIC) for a in args)
                                 or any(isinstance(v, _SYMBOLIC) for v in kwargs.values())):
        # a function of Python numbers kiln does not model symbolically: decided for the
        # current sizes, which the ShapeEnv then guards
        args = [specialize(a) for a in args]
        kwargs = {k: specialize(v) for k, v in kwargs.items()}
    if fn in PURE_FUNCTIONS and all(a.is_constant() for a in args) and all(
            v.is_constant() for v in kwargs.values()):
        try:
            res = fn(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
        except Exception as e:
            raise tx.user_exception(e)
        return tx.wrap_pure_result(res)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    e = Unsupported(f"call to builtin {getattr(fn, '__module__', None) or 'builtins'}.{name}"
                    + ("" if fn not in PURE_FUNCTIONS else " with non-constant arguments"))
    if fn in FRAME_READERS:
        e.reads_frames = True
    raise e


# Builtins that read the frames of their callers. Reached inside an inlined callee, the
# callee's call in the compiled frame runs as it is (``inline_function``): its callers are
# then real frames, as eager's (typing.NamedTuple names its module after ``sys._getframe(2)``).
FRAME_READERS = frozenset(f for f in (getattr(sys, "_getframe", None), getattr(sys, "_getframemodulename", None))
                          if f is not None)


def _state_reader(tx, fn, args, kwargs):
    # guarded by GLOBAL_STATE, or constant in eager execution, or constant during capture
    from .builder import STATE_READERS  # cycle: the builder wraps every kind of value

    folded = STATE_READERS.get(fn)
    if folded is not None:
        return ConstantValue(folded)
    if fn is torch.is_grad_enabled:
        backward_capture.note_grad_mode_read()
    return tx.wrap_pure_result(fn(*[a.as_constant() for a in args]))


def _register_state_readers():
    from .builder import STATE_READERS  # cycle: the builder wraps every kind of value

    for f in STATE_READERS:
        _HANDLERS.setdefault(f, _state_reader)   # autocast readers keep their guarding handler


def _autocast_reader(tx, fn, args, kwargs):
    # read at capture time; the autocast state becomes a guard (AUTOCAST_STATE)
    tx.output.guards.add(Guard(GuardKind.AUTOCAST_STATE, None, _autocast_state()))
    return tx.wrap_pure_result(fn(*[a.as_constant() for a in args],
                                  **{k: v.as_constant() for k, v in kwargs.items()}))


for _fn in (torch.is_autocast_enabled, torch.get_autocast_dtype,
            getattr(torch, "is_autocast_cpu_enabled", None), getattr(torch, "get_autocast_gpu_dtype", None),
            getattr(torch, "get_autocast_cpu_dtype", None)):
    if _fn is not None:
        _HANDLERS[_fn] = _autocast_reader


@handles(torch._C._set_grad_enabled)
def _set_grad_enabled_fn(tx, fn, args, kwargs):
    tx.output.set_grad_enabled(bool(args[0].as_constant()))
    return ConstantValue(None)


@handles(torch.is_tensor)
def _is_tensor(tx, fn, args, kwargs):
    return ConstantValue(issubclass(args[0].python_type(), torch.Tensor))


@handles(delattr)
def _delattr(tx, fn, args, kwargs):
    obj, name = args
    if not hasattr(obj, "delattr"):
        raise Unsupported(f"delattr on {obj.describe()}")
    obj.delattr(tx, name.as_constant())
    return ConstantValue(None)


def _exact_type(v: Value):
    try:
        return v.python_type()
    except Exception:
        return None


@handles(tuple.__new__)
def _tuple_new(tx, fn, args, kwargs):
    cls = args[0].as_constant()
    if cls is tuple and len(args) == 2 and not kwargs and _exact_type(args[1]) is tuple:
        return args[1]
    items = tx.unpack_iterable(args[1]) if len(args) > 1 else []
    if _is_namedtuple(cls):
        return NamedTupleValue(items, None, cls)
    if cls is tuple:
        return TupleValue(items)
    raise Unsupported(f"tuple.__new__ of {cls.__name__}")


@handles(object.__new__)
def _object_new(tx, fn, args, kwargs):
    """``object.__new__(cls)`` (``copyreg.__newobj__`` of a copy): a new instance of a plain
    Python class, its attributes symbolic, as ``cls(...)`` gives one."""
    cls = args[0].as_constant() if args and isinstance(args[0], ClassValue) else None
    if cls is None or len(args) > 1 or kwargs or not can_allocate_symbolically(cls):
        raise Unsupported(f"object.__new__ of {args[0].describe() if args else 'nothing'}")
    return NewObjectValue(cls)


@handles(print)
def _print(tx, fn, args, kwargs):
    raise Unsupported("print() (a side effect on stdout)")


@handles(len)
def _len(tx, fn, args, kwargs):
    (v,) = args
    if isinstance(v, TensorValue):
        if v.fake.dim() == 0:
            raise tx.user_exception(TypeError("len() of a 0-d tensor"))
        return v._metadata(tx, "__len__", (), v.fake.shape[0])
    if isinstance(v, SymRangeValue):
        return v.length(tx)
    if v.is_constant() and not isinstance(v, (ListValue, TupleValue)):
        return ConstantValue(len(v.as_constant()))
    n = checked_len(tx, tx.call_method(v, "__len__", [], {}))
    return ConstantValue(n) if isinstance(n, int) else n


@handles(isinstance)
def _isinstance(tx, fn, args, kwargs):
    obj, classes = args
    cls = _classes(classes)
    custom = [c for c in _flat_classes(cls) if type(c).__instancecheck__ not in _CLASS_CHECKS]
    if custom:
        # a metaclass that decides from the instance itself (a runtime-checkable Protocol
        # reads its attributes; torch's legacy storage classes its dtype): not a fact of the
        # object's class, which is all a guard here would hold
        raise Unsupported(f"isinstance() with {custom[0].__qualname__}, whose metaclass "
                          f"{type(custom[0]).__qualname__} has its own __instancecheck__")
    return ConstantValue(issubclass(obj.python_type(), cls))


# metaclass hooks whose answer follows from the instance's class (``ABCMeta`` also consults
# the registry and ``__subclasshook__``, on classes); torch's Parameter also admits a tensor
# that says ``_is_param``, which kiln's tensors do not
_CLASS_CHECKS = (type.__instancecheck__, abc.ABCMeta.__instancecheck__,
                 torch.nn.parameter._ParameterMeta.__instancecheck__)


def _flat_classes(cls) -> list:
    if isinstance(cls, tuple):
        return [c for x in cls for c in _flat_classes(x)]
    if isinstance(cls, types.UnionType):
        return _flat_classes(cls.__args__)
    return [cls]


@handles(issubclass)
def _issubclass(tx, fn, args, kwargs):
    a, classes = args
    return ConstantValue(issubclass(a.as_constant(), _classes(classes)))


def _classes(v: Value):
    if isinstance(v, TupleValue):
        return tuple(_classes(x) for x in v.items)
    c = v.as_constant()
    if not isinstance(c, (type, tuple, types.UnionType)):
        raise Unsupported(f"isinstance() with {v.describe()}")
    return c


@handles(getattr)
def _getattr(tx, fn, args, kwargs):
    obj, name = args[0], args[1].as_constant()
    if len(args) == 3:
        try:
            return tx.getattr(obj, name)
        except tx.UserException as e:
            if isinstance(e.exc, AttributeError):
                if obj.source is not None:  # the default is used while the attribute is absent
                    tx.output.builder.guard(GuardKind.HASATTR, obj.source, (name, False))
                return args[2]
            raise
    return tx.getattr(obj, name)


@handles(hasattr)
def _hasattr(tx, fn, args, kwargs):
    obj, name = args[0], args[1].as_constant()
    return ConstantValue(tx.hasattr(obj, name))


@handles(setattr)
def _setattr(tx, fn, args, kwargs):
    obj, name, value = args
    tx.setattr(obj, name.as_constant(), value)
    return ConstantValue(None)


@handles(locals)
def _locals(tx, fn, args, kwargs):
    if args or kwargs:
        raise tx.user_exception(TypeError("locals() takes no arguments"))
    return tx.frame_locals()


@handles(vars)
def _vars(tx, fn, args, kwargs):
    if kwargs or len(args) > 1:
        raise tx.user_exception(TypeError("vars expected at most 1 argument"))
    if not args:
        return tx.frame_locals()
    try:
        return tx.getattr(args[0], "__dict__")
    except tx.UserException as e:
        if isinstance(e.exc, AttributeError):
            raise tx.user_exception(TypeError("vars() argument must have __dict__ attribute"))
        raise


@handles(dir)
def _dir(tx, fn, args, kwargs):
    if args or kwargs:
        return NotImplemented   # dir(obj): a pure function of constants, or Unsupported
    return ListValue([ConstantValue(k) for k in sorted(tx.frame_locals().items)])


@handles(object.__getattribute__, object.__setattr__, object.__delattr__)
def _object_attribute_slot(tx, fn, args, kwargs):
    return call_modelled(tx, fn, args, kwargs)


@handles(type)
def _type(tx, fn, args, kwargs):
    if len(args) != 1:
        raise Unsupported("type() with 3 arguments (creating a class)")
    src = None
    if args[0].source is not None:
        src = TypeSource(args[0].source)
    return ClassValue(args[0].python_type(), src)


@handles(callable)
def _callable(tx, fn, args, kwargs):
    v = args[0]
    if v.is_constant():
        return ConstantValue(callable(v.as_constant()))
    if isinstance(v, (UserFunctionValue, BoundMethodValue, MethodValue, PartialValue,
                      TorchOpValue, BuiltinValue, NNModuleValue, ClassValue)):
        return ConstantValue(True)
    if isinstance(v, ObjectValue) and v.value is not None:
        return ConstantValue(callable(v.value))
    # callable() asks the type: an object made in the capture, a container, a tensor
    t = v.python_type()
    if not isinstance(t, type):
        raise Unsupported(f"callable() of {v.describe()}")
    return ConstantValue(any("__call__" in vars(k) for k in t.__mro__))


@handles(iter)
def _iter(tx, fn, args, kwargs):
    if len(args) != 1:
        raise Unsupported("iter() with a sentinel")
    return tx.get_iter(args[0])


@handles(next)
def _next(tx, fn, args, kwargs):
    it = args[0]
    if not isinstance(it, IteratorValue):
        return tx.call_method(it, "__next__", [], {})
    v = it.next(tx)
    if v is None:
        if len(args) > 1:
            return args[1]
        stop = it.stop_iteration() if hasattr(it, "stop_iteration") else StopIteration()
        raise tx.user_exception(stop)
    return v


@handles(sum)
def _sum(tx, fn, args, kwargs):
    items = tx.unpack_iterable(args[0])
    start = args[1] if len(args) > 1 else kwargs.get("start", ConstantValue(0))
    acc = start
    for item in items:
        acc = tx.binary(operator.add, acc, item)
    return acc


@handles(min, max)
def _minmax(tx, fn, args, kwargs):
    items = tx.unpack_iterable(args[0]) if len(args) == 1 else list(args)
    if any(isinstance(i, TensorValue) for i in items):
        return _minmax_of_tensors(tx, fn, items, kwargs)
    key = kwargs.get("key")
    default = kwargs.get("default")
    if not items:
        if default is not None:
            return default
        raise tx.user_exception(ValueError(f"{fn.__name__}() arg is an empty sequence"))
    if key is not None and not (key.is_constant() and key.as_constant() is None):
        keys = [tx.call(key, [i], {}).as_constant() for i in items]
    else:
        if any(isinstance(i, SymNodeValue) for i in items) and not kwargs:
            # max(s0, 8) stays symbolic (torch.sym_max); it is not decided now
            sym = torch.sym_max if fn is max else torch.sym_min
            out = items[0]
            for i in items[1:]:
                out = sym_call(tx.output, sym, [out, i])
            return out
        if not all(i.is_constant() for i in items):
            raise Unsupported(f"{fn.__name__}() of values that are not Python constants")
        keys = [i.as_constant() for i in items]
    best = fn(range(len(items)), key=lambda j: keys[j])
    return items[best]


def _minmax_of_tensors(tx, fn, items, kwargs):
    """``max(a, b)`` of tensors is eager's ``b if b > a else a`` (first best wins): a select
    of the chosen tensor, exact for the one-element tensors eager accepts, computed in the
    graph. Eager returns the chosen object itself, so tensors that require grad, inputs, and
    in-place writes afterwards to any of them are refused (each would tell the select from
    the object). A mix of tensors and numbers returns a tensor or a number depending on the
    data: that is a break."""
    if kwargs:
        raise Unsupported(f"{fn.__name__}() of tensors with key= or default=")
    if not all(isinstance(i, TensorValue) for i in items):
        raise Unsupported(f"{fn.__name__}() of tensors and numbers (its result's type depends "
                          "on the data)")
    first = items[0].fake
    for i in items:
        f = i.fake
        if f.shape != first.shape or f.dtype != first.dtype or f.requires_grad != first.requires_grad:
            raise Unsupported(f"{fn.__name__}() of tensors that differ in shape, dtype or "
                              "requires_grad (eager returns one of them as it is)")
    if first.requires_grad:
        # eager's result is one of them: the other gets no grad at all (None), a select gives
        # it zeros; under no_grad eager's result still requires grad, a select's does not
        raise Unsupported(f"{fn.__name__}() of tensors that require grad (the tensor not "
                          "chosen would get a zero grad instead of none)")
    from torch.multiprocessing.reductions import StorageWeakRef

    inputs = {StorageWeakRef(i.value_fake.untyped_storage()) for i in tx.output.tensor_inputs}
    storages = [StorageWeakRef(i.fake.untyped_storage()) for i in items]
    if any(s in inputs for s in storages):
        # eager returns the caller's own tensor (or a view of it): a select is a new one
        raise Unsupported(f"{fn.__name__}() of tensors one of which is an input or a view of one")
    if first.numel() != 1:
        raise tx.user_exception(RuntimeError(
            "Boolean value of Tensor with more than one value is ambiguous"))
    better = operator.gt if fn is max else operator.lt
    best = items[0]
    for item in items[1:]:
        cond = tx.compare(better, item, best)
        best = tx.output.call_op("call_function", torch.where, (cond, item, best), {})
    # an in-place write to the result or to a candidate would reach the other in eager only
    # when it was the one chosen: refused for the rest of the capture
    tx.output.frozen_storages.extend([*storages, StorageWeakRef(best.fake.untyped_storage())])
    return best


@handles(abs)
def _abs(tx, fn, args, kwargs):
    if args[0].is_constant():
        return NotImplemented
    if isinstance(args[0], SymNodeValue):
        return tx.unary(abs, args[0])
    return tx.call_method(args[0], "__abs__", [], {})


@handles(any, all)
def _anyall(tx, fn, args, kwargs):
    # (short-circuits as eager: a generator's items past the deciding one are never computed)
    decides = fn is any
    for v in tx.each_item(args[0]):
        if tx.truthy(v) == decides:
            return ConstantValue(decides)
    return ConstantValue(not decides)


class DerivedIteratorValue(IteratorValue):
    """``map``, ``filter``, ``enumerate`` or ``zip`` computed as its items are taken, as eager
    computes them: a ``map`` that is never consumed calls nothing, ``any(map(f, xs))`` stops
    calling ``f`` at the deciding item, and a generator source runs no further than its
    consumer. At a graph break it is handed over as a real iterator of its kind, over what is
    left of its sources."""

    lazy = True

    def __init__(self, cls: type, produce, fn: Value | None = None, sources: list | None = None, start: int = 0,
                 own_sources: bool = False):
        super().__init__([])
        self.cls = cls
        self.fn = fn
        self.sources = sources or []
        self.start = start
        self.taken = 0
        self._tx = None
        self._produced = produce(lambda: self._tx)     # (a Python generator of Values)
        self.done = False
        # ``own_sources``: an ``enumerate``/``zip`` over containers it made its own iterators of
        # (no one else takes their items, and taking them calls nothing). A loop over it that
        # a graph break interrupts hands what is left over as a tuple of rows, which the
        # continuation's loop compiles; anything else is handed over as itself
        self.own_sources = own_sources

    @property
    def infinite(self) -> bool:
        return not self.own_sources

    def python_type(self):
        return self.cls

    def describe(self):
        return f"{self.cls.__name__} iterator"

    def next(self, tx):
        if self.done:
            return None
        self._tx = tx
        try:
            v = next(self._produced)
        except StopIteration:
            self.done = True
            return None
        self.taken += 1
        return v

    def unpack(self, tx):
        return self.take_all(tx)

    def reconstruct_remaining(self, cg) -> str:
        if not self.own_sources:
            return self.reconstruct(cg)
        rows = [r.reconstruct(cg) for r in self.take_all(self._tx)]
        return "(" + ", ".join(rows) + ("," if len(rows) == 1 else "") + ")"

    def reconstruct(self, cg):
        def build():
            sources = ", ".join(s.reconstruct(cg) for s in self.sources)
            if self.cls is enumerate:
                return f"{cg.bind(enumerate)}({sources}, {self.start + self.taken})"
            if self.cls in (map, filter):
                return f"{cg.bind(self.cls)}({self.fn.reconstruct(cg)}, {sources})"
            return f"{cg.bind(self.cls)}({sources})"
        return cg.stash(self, build)


def is_shared_iterator(v: Value) -> bool:
    """Whether ``v`` is an iterator (a generator, ``iter(xs)``, a user object with
    ``__next__``) rather than an iterable: its items are shared with every other holder of it,
    so a consumer must take them one at a time, when eager does."""
    if isinstance(v, IteratorValue):
        return True
    return isinstance(v, ObjectValue) and not isinstance(v, ClassValue) and \
        static_lookup(v.python_type(), "__next__") is not _MISSING


def reads_lazily(v: Value) -> bool:
    """Whether an iterator made over ``v`` must take ``v``'s items when eager does, not when it
    is made: ``v`` is an iterator (its items are shared with every other holder of it), or a
    container that may change before they are taken (``e = enumerate(xs); xs.append(3)``:
    eager's ``e`` yields the new item). Tuples, ranges, strings and frozensets may be read at
    once."""
    return is_shared_iterator(v) or (isinstance(v, (ListValue, DictValue, SetValue))
                                     and v.python_type() is not frozenset)


def _lazy_sources(tx, iterables) -> list | None:
    """The iterators of ``iterables`` when one of them must be read lazily (``reads_lazily``:
    ``zip(it, it)``, a loop that breaks out, a list appended to), else None. The others are
    read whole now, as when none is lazy: a generator that a user class's ``__iter__`` makes
    (``collections.abc.Sequence``'s) is finished, not left suspended for a later graph break
    to hand over."""
    if not any(reads_lazily(a) for a in iterables):
        return None
    return [tx.get_iter(a) if reads_lazily(a) else IteratorValue(tx.unpack_iterable(a)) for a in iterables]


def _rows(get_tx, its):
    """One item of each iterator per row, until the shortest ends (none: no rows)."""
    while its:
        row = []
        for it in its:
            v = it.next(get_tx())
            if v is None:
                return
            row.append(v)
        yield row


@handles(enumerate)
def _enumerate(tx, fn, args, kwargs):
    start = (args[1] if len(args) > 1 else kwargs.get("start", ConstantValue(0))).as_constant()
    lazy = _lazy_sources(tx, args[:1])
    if lazy is not None:
        return DerivedIteratorValue(enumerate, lambda get_tx: (
            TupleValue([ConstantValue(i + start), row[0]]) for i, row in enumerate(_rows(get_tx, lazy))),
            sources=lazy, start=start, own_sources=not is_shared_iterator(args[0]))
    items = tx.unpack_iterable(args[0])
    return IteratorValue([TupleValue([ConstantValue(i + start), v]) for i, v in enumerate(items)],
                         kind=enumerate_kind(start))


# zip and itertools: itertools_fns.py (zip steps lazily through an infinite count/cycle)


@handles(map)
def _map(tx, fn, args, kwargs):
    if len(args) < 2:
        raise tx.user_exception(TypeError("map() must have at least two arguments."))
    f, sources = args[0], [tx.get_iter(a) for a in args[1:]]
    return DerivedIteratorValue(map, lambda get_tx: (
        get_tx().call(f, row, {}) for row in _rows(get_tx, sources)), fn=f, sources=sources)


@handles(filter)
def _filter(tx, fn, args, kwargs):
    if len(args) != 2:
        raise tx.user_exception(TypeError(f"filter expected 2 arguments, got {len(args)}"))
    f, sources = args[0], [tx.get_iter(args[1])]
    keep_truthy = f.is_constant() and f.as_constant() is None
    return DerivedIteratorValue(filter, lambda get_tx: (
        row[0] for row in _rows(get_tx, sources)
        if get_tx().truthy(row[0] if keep_truthy else get_tx().call(f, [row[0]], {}))), fn=f, sources=sources)


@handles(reversed)
def _reversed(tx, fn, args, kwargs):
    override = getattr(args[0], "override", None) if args else None
    if override is not None and override("__reversed__") is not None:
        raise Unsupported(f"reversed() of {args[0].describe()}, whose class defines __reversed__")
    if isinstance(args[0], ListValue) and args[0].python_type() is list:
        return ReversedListIteratorValue(args[0])
    if args[0].is_constant() and type(args[0].as_constant()) is range:
        return RangeIteratorValue(args[0].as_constant()[::-1])     # (a range_iterator, as eager's)
    return IteratorValue(list(reversed(tx.unpack_iterable(args[0]))), kind=reversed_kind())


class ReversedListIteratorValue(IteratorValue):
    """``reversed(xs)`` of a list, read as it goes as CPython's: each step takes the item at
    its index if the list still has one there (a list cleared meanwhile ends it), and once it
    ended it stays ended. Across a graph break it is a real one over the list at its index."""

    def __init__(self, lst: ListValue, index: int | None = None, real=None, source=None):
        super().__init__(lst, live=True, real=real, source=source)
        self.index = len(lst.items) - 1 if index is None else index

    def python_type(self):
        return type(reversed([]))

    def describe(self):
        return "list_reverseiterator"

    def next(self, tx):
        items = self.seq.items
        if self.exhausted or not 0 <= self.index < len(items):
            if not self.exhausted and self.real is not None:
                tx.output.side_effects.mutated(self)
            self.exhausted = True
            return None
        v = items[self.index]
        self.index -= 1
        self.pos += 1           # (a real one passed in is advanced by as many steps)
        if self.real is not None:
            tx.output.side_effects.mutated(self)
        return v

    def unpack(self, tx):
        return self.take_all(tx)

    def reconstruct_remaining(self, cg) -> str:
        if self.real is None and not self.exhausted and not identity_free(self.seq.items):
            # (see ``identity_free``: what is left of it, as a tuple)
            rest = [self.seq.items[i].reconstruct(cg) for i in range(min(self.index, len(self.seq.items) - 1), -1, -1)]
            return "(" + ", ".join(rest) + ("," if len(rest) == 1 else "") + ")"
        return self.reconstruct(cg)

    def reconstruct(self, cg):
        if self.real is not None and self.source is not None:
            return cg.source_expr(self.source)     # (advanced as far as the capture took it)
        if self.exhausted:
            return cg.stash(self, lambda: f"{cg.bind(reversed)}([])")
        return cg.stash(self, lambda: f"{cg.bind(iterator_at)}({cg.bind(reversed)}({self.seq.reconstruct(cg)}), {self.index})")


@handles(sorted)
def _sorted(tx, fn, args, kwargs):
    lst = ListValue(tx.unpack_iterable(args[0]))
    lst.base_method(tx, "sort", [], kwargs)
    return lst


@handles(functools.reduce)
def _reduce(tx, fn, args, kwargs):
    f, items = args[0], tx.unpack_iterable(args[1])
    if len(args) > 2:
        acc = args[2]
    else:
        if not items:
            raise tx.user_exception(TypeError("reduce() of empty iterable with no initial value"))
        acc, items = items[0], items[1:]
    for item in items:
        acc = tx.call(f, [acc, item], {})
    return acc


@handles(super)
def _super(tx, fn, args, kwargs):
    if args:
        cls, obj = args[0].as_constant(), args[1]
    else:
        cls, obj = tx.zero_arg_super()
    return SuperValue(cls, obj)


# -- classes -------------------------------------------------------------------------------

def construct_class(tx, cls_value: ClassValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    cls = cls_value.value
    meta_call = static_lookup(type(cls), "__call__") if isinstance(cls, type) and type(cls) is not type else _MISSING
    if meta_call is not _MISSING and meta_call is not type.__call__ and not isinstance(meta_call, types.FunctionType):
        # a metaclass whose __call__ is not Python (typing's TypedDict: ``__call__ = dict``):
        # CPython calls it without the class when it is no descriptor (a class is none)
        tx.output.guard_class_attribute(type(cls), "__call__", meta_call)
        if isinstance(meta_call, type) and not hasattr(type(meta_call), "__get__"):
            return construct_class(tx, ClassValue(meta_call), args, kwargs)
        raise Unsupported(f"creating {cls.__qualname__}: its metaclass's __call__ is a "
                          f"{type(meta_call).__name__}")
    container = cls if cls in (list, tuple, set, frozenset) else \
        next((b for b in (list, tuple) if isinstance(cls, type) and issubclass(cls, b) and not _is_namedtuple(cls)
              and _plain_init(cls)), None)
    if container is not None and (len(args) > 1 or kwargs):
        # (a subclass without its own __init__/__new__ takes what its base takes)
        raise tx.user_exception(TypeError(f"{container.__name__}() takes no keyword arguments" if kwargs
                                          else f"{container.__name__} expected at most 1 argument, got {len(args)}"))
    if cls in (tuple, frozenset) and len(args) == 1 and _exact_type(args[0]) is cls:
        return args[0]          # (eager returns the very object: it is immutable)
    if cls in (list, tuple) or (isinstance(cls, type) and issubclass(cls, (list, tuple))
                                and not _is_namedtuple(cls) and _plain_init(cls)):
        items = tx.unpack_iterable(args[0]) if args else []
        base = list if issubclass(cls, list) else tuple
        return (ListValue if base is list else TupleValue)(items, None, cls)
    if _is_namedtuple(cls):
        return _make_namedtuple(tx, cls, args, kwargs)
    if cls in (dict, collections.OrderedDict) or (isinstance(cls, type) and issubclass(cls, dict)
                                                  and _plain_init(cls) and cls is not collections.defaultdict):
        d = DictValue({}, None, cls)
        if args or kwargs:
            d.base_method(tx, "update", args, kwargs)
        return d
    if cls in (set, frozenset):
        if args and isinstance(args[0], SetValue):     # (eager copies the other set's table)
            keys = cls(args[0].keys)
            return SetValue(set_members(keys, [args[0].items]), cls, keys=keys)
        return SetValue.of(tx, tx.unpack_iterable(args[0]) if args else [], cls)
    if cls in _HANDLERS:
        return call_builtin(tx, cls, args, kwargs)
    if cls in (bool, int, float, str, complex, range, slice, bytes, torch.Size, torch.device):
        symbolic = [a for a in args if isinstance(a, _SYMBOLIC)]
        if symbolic and not kwargs:
            if cls is int and len(args) == 1 and isinstance(args[0], SymNodeValue) \
                    and args[0].python_type() is int:
                return args[0]
            if cls is range and all(isinstance(a, SymNodeValue) or a.is_constant() for a in args):
                return SymRangeValue(list(args))
            if cls is slice:
                return SymSliceValue(list(args))
            if cls is bool and len(args) == 1:
                return ConstantValue(tx.truthy(args[0]))   # guards `!= 0`, not the value
            args = [specialize(a) for a in args]
        if cls is torch.Size and len(args) == 1 and not args[0].is_constant():
            return size_value(tx.unpack_iterable(args[0]))
        if all(a.is_constant() for a in args) and all(v.is_constant() for v in kwargs.values()):
            try:
                return tx.wrap_pure_result(cls(*[a.as_constant() for a in args],
                                         **{k: v.as_constant() for k, v in kwargs.items()}))
            except Exception as e:
                raise tx.user_exception(e)
        if cls is bool and len(args) == 1:
            return ConstantValue(tx.truthy(args[0]))
        if cls is str and len(args) == 1 and not kwargs and isinstance(args[0], ExceptionValue):
            exc = args[0].exc      # (str() of a caught exception: its message, from its constant args)
            if not isinstance(static_lookup(type(exc), "__str__"), types.FunctionType) and \
                    all(is_constant_object(a) for a in exc.args):
                return ConstantValue(str(exc))
        if cls is torch.Size and len(args) == 1:
            return tx.wrap_pure_result(torch.Size([i.as_constant() for i in tx.unpack_iterable(args[0])]))
        raise Unsupported(f"{cls.__name__}() of a value that is not a Python constant")
    if cls is torch.autocast or (isinstance(cls, type) and issubclass(cls, torch.autocast)
                                 and cls.__init__ is torch.autocast.__init__):
        names = ("device_type", "dtype", "enabled", "cache_enabled")
        bound = dict(zip(names, args))
        bound.update(kwargs)
        vals = tuple(bound[n].as_constant() if n in bound else d
                     for n, d in zip(names, (None, None, True, None)))
        if vals[0] is None:
            raise tx.user_exception(TypeError("autocast() missing device_type"))
        return AutocastValue(cls, vals)
    if cls is torch.autograd.profiler.record_function:
        bound = dict(zip(("name", "args"), args))
        bound.update(kwargs)
        if not all(v.is_constant() for v in bound.values()) or "name" not in bound:
            raise Unsupported("record_function with a name that is not a constant")
        return ProfilerRangeValue(cls, bound["name"].as_constant(),
                                  bound["args"].as_constant() if "args" in bound else None)
    if cls in (torch.no_grad, torch.enable_grad):
        mode = GradModeValue(cls is torch.enable_grad, cls)
        if args:   # torch.no_grad(fn): the bare decorator
            return decorate_with_grad_mode(tx, mode, args, kwargs)
        return mode
    if cls is torch.set_grad_enabled:
        mode = args[0].as_constant() if args else kwargs["mode"].as_constant()
        v = GradModeValue(bool(mode), cls)
        # set_grad_enabled acts on construction; as a context manager it restores on exit.
        v.prev = torch.is_grad_enabled()
        tx.output.set_grad_enabled(bool(mode))
        v.call_method = _set_grad_enabled_method(v)
        return v
    if cls is collections.defaultdict:
        d = DictValue({}, None, cls)
        d.default_factory = args[0] if args and not (args[0].is_constant() and args[0].as_constant() is None) else None
        if len(args) > 1 or kwargs:
            d.base_method(tx, "update", list(args[1:]), kwargs)
        return d
    if cls is torch.nn.ModuleList and len(args) <= 1 and not kwargs:
        items = tx.unpack_iterable(args[0]) if args else []
        if all(isinstance(i, NNModuleValue) for i in items):
            return NewModuleListValue(items)  # module_list[a:b] (ModuleList.__getitem__)
    if _dict_subclass_with_init(cls):
        obj = NewDictObjectValue(cls)
        result = tx.call(UserFunctionValue(static_lookup(cls, "__init__")), [obj, *args], kwargs)
        if not (result.is_constant() and result.as_constant() is None):
            raise tx.user_exception(TypeError("__init__() should return None"))
        return obj
    if can_create_symbolically(cls):
        obj = NewObjectValue(cls)
        init = static_lookup(cls, "__init__")
        if isinstance(init, types.FunctionType):
            result = tx.call(UserFunctionValue(init), [obj, *args], kwargs)
            if not (result.is_constant() and result.as_constant() is None):
                raise tx.user_exception(TypeError("__init__() should return None"))
        elif args or kwargs:
            raise tx.user_exception(TypeError(f"{cls.__name__}() takes no arguments"))
        return obj
    if cls is functools.partial:
        return PartialValue(args[0], TupleValue(list(args[1:])), DictValue(dict(kwargs)))
    if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
        from .new_objects import create_module  # cycle: new objects are built by builtins

        return create_module(tx, cls, args, kwargs)
    if cls in (torch.finfo, torch.iinfo):
        return tx.wrap_pure_result(cls(*[a.as_constant() for a in args]))
    if cls is object and not args:
        raise Unsupported("object() sentinel creation")
    if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == "builtins" \
            and all(a.is_constant() for a in args) and not kwargs:
        return ExceptionValue(cls(*[a.as_constant() for a in args]))
    raise Unsupported(f"creating an instance of {cls.__module__}.{cls.__qualname__} "
                      "inside a compiled function")


def _set_grad_enabled_method(v: GradModeValue):
    def call_method(tx, name, args, kwargs):
        if name == "__enter__":
            return ConstantValue(None)
        if name == "__exit__":
            tx.output.set_grad_enabled(v.prev)
            return ConstantValue(None)
        raise Unsupported(f"set_grad_enabled.{name}")
    return call_method


def _dict_subclass_with_init(cls) -> bool:
    """A dict/OrderedDict subclass with its own Python __init__ (no metaclass, __new__, slots)."""
    if not (isinstance(cls, type) and type(cls) is type and issubclass(cls, dict)):
        return False
    if cls in (dict, collections.OrderedDict, collections.defaultdict) or issubclass(cls, collections.defaultdict):
        return False
    if user_layers_define(cls, ("__slots__", "__new__"), (dict, collections.OrderedDict, object)):
        return False
    return isinstance(static_lookup(cls, "__init__"), types.FunctionType)


def _is_namedtuple(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def _plain_init(cls) -> bool:
    """A container subclass whose construction is the base class's (no user __init__/__new__)."""
    return not user_layers_define(cls, ("__init__", "__new__"),
                                  (list, tuple, dict, collections.OrderedDict, object))


def _make_namedtuple(tx, cls, args, kwargs):
    fields = cls._fields
    if len(args) > len(fields) or any(k not in fields or k in fields[:len(args)] for k in kwargs):
        # (more arguments than fields, an unknown or a repeated name: the class's own __new__
        # says what eager raises, called on placeholders)
        try:
            cls(*[None] * len(args), **dict.fromkeys(kwargs))
        except TypeError as e:
            raise tx.user_exception(e) from None
    values: dict[str, Value] = {}
    for f, a in zip(fields, args):
        values[f] = a
    values.update(kwargs)
    defaults = getattr(cls, "_field_defaults", {})
    items = []
    for f in fields:
        if f in values:
            items.append(values[f])
        elif f in defaults:
            items.append(tx.wrap(defaults[f], None))
        else:
            raise tx.user_exception(TypeError(f"{cls.__name__}() missing argument {f!r}"))
    return NamedTupleValue(items, None, cls)


# -- dict.fromkeys ---------------------------------------------------------------------------

def _fromkeys(tx, fn, args, kwargs):
    cls = fn.__self__
    if kwargs and cls is collections.OrderedDict:     # (its signature: iterable, value=None)
        args = list(args)
        for name, position in (("iterable", 0), ("value", 1)):
            if name in kwargs:
                if len(args) > position:
                    raise tx.user_exception(TypeError(f"fromkeys() got multiple values for argument {name!r}"))
                if len(args) < position:
                    raise tx.user_exception(TypeError("fromkeys() missing required argument 'iterable'"))
                args.append(kwargs[name])
        kwargs = {k: v for k, v in kwargs.items() if k not in ("iterable", "value")}
        if kwargs:
            raise tx.user_exception(TypeError(f"fromkeys() got an unexpected keyword argument {next(iter(kwargs))!r}"))
    elif kwargs:
        raise tx.user_exception(TypeError(f"{cls.__name__}.fromkeys() takes no keyword arguments"))
    if not 1 <= len(args) <= 2:
        raise tx.user_exception(TypeError(f"fromkeys expected 1 or 2 arguments, got {len(args)}"))
    value = args[1] if len(args) > 1 else ConstantValue(None)
    d = DictValue({}, None, cls)
    for k in tx.unpack_iterable(args[0]):
        d.items[tx.dict_key(k)] = value     # one object for every key, as eager
    return d


for _cls in (dict, collections.OrderedDict, collections.defaultdict):
    _HANDLERS[_cls.fromkeys] = _fromkeys    # (defaultdict.fromkeys: default_factory None)


# -- torch.overrides.has_torch_function ------------------------------------------------------
# torch._assert(cond, msg) (timm checks input sizes with it) and other torch functions written
# in Python ask first whether an argument overrides __torch_function__. For plain tensors,
# parameters, symbolic numbers and Python constants the answer is no, unless a torch function
# mode is active.

_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter) + \
    ((torch.nn.Buffer,) if isinstance(getattr(torch.nn, "Buffer", None), type) else ())


def _no_torch_function(tx, values) -> ConstantValue:
    if torch._C._is_torch_function_mode_enabled():
        raise Unsupported("torch.overrides.has_torch_function under a torch function mode")
    for v in values:
        plain = (isinstance(v, TensorValue) and v.python_type() in _PLAIN_TENSOR_TYPES) or \
            isinstance(v, SymNodeValue) or (v.is_constant() and is_constant_object(v.as_constant()))
        if not plain:
            raise Unsupported(f"torch.overrides.has_torch_function of {v.describe()}")
    return ConstantValue(False)


@handles(torch._C._has_torch_function)
def _has_torch_function(tx, fn, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported("torch._C._has_torch_function with other than one argument")
    return _no_torch_function(tx, tx.unpack_iterable(args[0]))


@handles(torch._C._has_torch_function_unary)
def _has_torch_function_unary(tx, fn, args, kwargs):
    if len(args) != 1 or kwargs:
        raise Unsupported("torch._C._has_torch_function_unary with other than one argument")
    return _no_torch_function(tx, args)


@handles(torch._C._has_torch_function_variadic)
def _has_torch_function_variadic(tx, fn, args, kwargs):
    if kwargs:
        raise Unsupported("torch._C._has_torch_function_variadic with keyword arguments")
    return _no_torch_function(tx, args)
