"""A ``functools.lru_cache``-wrapped callee: called at capture time with Python constants (the
body runs once, as eager's first call; the constant result is folded)."""
from __future__ import annotations

import functools

import torch

from ...errors import Unsupported
from ..guards import GuardKind
from .base import ConstantValue, RealCallableValue, Value, is_constant_object, is_type_annotation


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
        return tx.wrap_pure_result(result)

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
