"""More builtins captured without a break: ``dict.fromkeys`` (dict, OrderedDict,
defaultdict), ``min``/``max`` over one-element tensors, ``functools.lru_cache``-wrapped
callees, and grad-mode decorators applied inside the compiled function."""
from __future__ import annotations

import collections
import functools
import operator

import torch

from ...errors import Unsupported
from ..guards import GuardKind
from .base import ConstantValue, RealCallableValue, Value
from .builtins import _HANDLERS, handles
from .containers import DictValue


# -- dict.fromkeys ---------------------------------------------------------------------------

def _fromkeys(tx, fn, args, kwargs):
    if kwargs or not 1 <= len(args) <= 2:
        raise tx.user_exception(TypeError("fromkeys expected 1 or 2 arguments"))
    cls = fn.__self__
    value = args[1] if len(args) > 1 else ConstantValue(None)
    d = DictValue({}, None, cls)
    for k in tx.unpack_iterable(args[0]):
        d.items[tx.dict_key(k)] = value     # one object for every key, as eager
    return d


for _cls in (dict, collections.OrderedDict, collections.defaultdict):
    _HANDLERS[_cls.fromkeys] = _fromkeys    # (defaultdict.fromkeys: default_factory None)


# -- min / max over tensors -------------------------------------------------------------------

_builtin_minmax = _HANDLERS[min]


@handles(min, max)
def _minmax(tx, fn, args, kwargs):
    """``max(a, b)`` of tensors is eager's ``b if b > a else a`` (first best wins): a select
    of the chosen tensor, exact for the one-element tensors eager accepts, computed in the
    graph. Eager returns the chosen object itself, so tensors that require grad, inputs, and
    in-place writes afterwards to any of them are refused (each would tell the select from
    the object). A mix of tensors and numbers returns a tensor or a number depending on the
    data: that is a break."""
    from .tensor import TensorValue

    items = tx.unpack_iterable(args[0]) if len(args) == 1 else list(args)
    if not any(isinstance(i, TensorValue) for i in items):
        return _builtin_minmax(tx, fn, args, kwargs)
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


# -- functools.lru_cache --------------------------------------------------------------------

class LruCacheValue(RealCallableValue):
    """A ``functools.lru_cache``-wrapped function (guarded by identity where it was read).

    Called with Python constants only, the real wrapper is called at capture time: it is
    what eager does on the first call (the body runs once, the cache is filled), and the
    constant result is folded, as a later eager call would get it from the cache. This
    assumes what lru_cache already assumes: the function is pure. A call with tensors or
    other symbolic values, or one whose result is not an immutable constant (eager returns
    the cached object itself), breaks the graph and runs natively."""

    def describe(self):
        return f"lru_cache({getattr(self.fn, '__qualname__', self.fn)})"

    def truthy(self, tx):
        return True

    def call(self, tx, args, kwargs):
        from .base import is_constant_object, is_type_annotation
        from .builder import wrap_pure_result

        def constant(c) -> bool:     # (classes and typing constructs too: typing's cached [])
            return is_constant_object(c) or isinstance(c, type) or is_type_annotation(c) or (
                type(c) is tuple and all(map(constant, c)))

        vals = [*args, *kwargs.values()]
        if not all((v.is_constant() and constant(v.as_constant())) or _keyed_by_identity(tx, v) for v in vals):
            raise Unsupported(f"call to {self.describe()} with arguments that are not Python "
                              "constants (runs natively)")

        def real(v):
            return v.as_constant() if v.is_constant() else v.real_object()
        try:
            result = self.fn(*[real(a) for a in args], **{k: real(v) for k, v in kwargs.items()})
        except Exception as e:
            raise tx.user_exception(e)
        if not (is_constant_object(result) or is_type_annotation(result)):
            raise Unsupported(f"{self.describe()} returned a {type(result).__name__} (eager "
                              "shares the cached object; runs natively)")
        return wrap_pure_result(result)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantValue(getattr(self.fn, name))
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.bind(self.fn)


def _keyed_by_identity(tx, v: Value) -> bool:
    """An existing object that lru_cache keys by identity (``object``'s hash and ``==``: a
    logger, as ``logger.warning_once(...)`` passes it), read through a source: guarded by
    identity, it is the same cache key on every call."""
    if v.is_constant() or isinstance(v, RealCallableValue):
        return False
    obj, source = v.real_object(), getattr(v, "source", None)
    if obj is None or source is None or isinstance(obj, torch.Tensor):
        return False
    cls = type(obj)
    if cls.__hash__ is not object.__hash__ or cls.__eq__ is not object.__eq__:
        return False
    tx.output.builder.guard(GuardKind.ID_MATCH, source, obj)
    return tx.output.guards_enabled_for(source)


LRU_CACHE_WRAPPER = functools._lru_cache_wrapper


# -- @torch.no_grad() / @torch.enable_grad() on a function defined inside ---------------------

class GradModeFunctionValue(Value):
    """``torch.no_grad()(fn)``: calling it runs ``fn`` inlined under the grad mode, and
    restores the previous mode after (also when the call raises)."""

    def __init__(self, mode, fn: Value):
        self.mode = mode        # the GradModeValue that decorated it
        self.fn = fn

    def python_type(self):
        return type(lambda: None)

    def describe(self):
        return f"{self.mode.cls.__name__}()({self.fn.describe()})"

    def truthy(self, tx):
        return True

    def call(self, tx, args, kwargs):
        prev = torch.is_grad_enabled()
        tx.output.set_grad_enabled(self.mode.enabled)
        try:
            return tx.call(self.fn, args, kwargs)
        finally:
            tx.output.set_grad_enabled(prev)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__wrapped__"):
            return self.fn if name == "__wrapped__" else self.fn.getattr(tx, name)
        raise Unsupported(f"attribute {name!r} of a grad-mode decorated function")

    def reconstruct(self, cg):
        return cg.stash(self, lambda: f"{self.mode.reconstruct(cg)}({self.fn.reconstruct(cg)})")


def decorate_with_grad_mode(tx, mode, args, kwargs) -> Value:
    """``GradModeValue.__call__``: the decorator applied to a function."""
    from .functions import UserFunctionValue

    if kwargs or len(args) != 1 or not isinstance(args[0], UserFunctionValue):
        raise Unsupported(f"{mode.cls.__name__}() called on {[a.describe() for a in args]}")
    code = args[0].code()
    if code.co_flags & 0x2A0:   # generator, coroutine, async generator: eager wraps differently
        raise Unsupported(f"{mode.cls.__name__}() decorating a generator or coroutine")
    return GradModeFunctionValue(mode, args[0])


# -- torch.overrides.has_torch_function ------------------------------------------------------
# torch._assert(cond, msg) (timm checks input sizes with it) and other torch functions written
# in Python ask first whether an argument overrides __torch_function__. For plain tensors,
# parameters, symbolic numbers and Python constants the answer is no, unless a torch function
# mode is active.

_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter) + \
    ((torch.nn.Buffer,) if isinstance(getattr(torch.nn, "Buffer", None), type) else ())


def _no_torch_function(tx, values) -> ConstantValue:
    from .base import is_constant_object
    from .symbolic import SymNodeValue
    from .tensor import TensorValue

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
