"""``kiln.compile`` and the call path.

Entries live in one cache per Python function object, shared by every ``kiln.compile`` of that
function (so the same function compiled with two backends keeps both, told apart by the
BACKEND_MATCH check), and cleared by ``kiln.reset()``. The hot path::

    for entry in cache.entries:           # most recently hit first
        if entry.key is key:              # BACKEND_MATCH
            result = entry.fn(*args, **kwargs)   # generated: guards, graph, outputs
            if result is not MISS:
                return result
    return self._miss(args, kwargs)
"""
from __future__ import annotations

import functools
import types
import warnings
import weakref
from typing import Any, Callable

import torch

from . import explain as _explain
from . import logs
from .backends.registry import lookup_backend
from .capture.codegen import MISS
from .capture.frame import Entry, capture, eager_entry
from .config import config
from .errors import Unsupported

_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class FunctionCache:
    """All compiled entries of one Python function."""

    __slots__ = ("entries", "limit_warned", "recompile_reasons", "__weakref__")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.limit_warned = False
        self.recompile_reasons: list[str] = []   # why each capture after the first happened

    def promote(self, entry: Entry) -> None:
        self.entries.remove(entry)
        self.entries.insert(0, entry)

    def clear(self) -> None:
        self.entries.clear()
        self.limit_warned = False
        self.recompile_reasons.clear()


_caches: "weakref.WeakKeyDictionary[Callable, FunctionCache]" = weakref.WeakKeyDictionary()


def cache_for(fn: Callable) -> FunctionCache:
    c = _caches.get(fn)
    if c is None:
        c = _caches[fn] = FunctionCache()
    return c


def reset() -> None:
    """Drop every compiled entry of every function (the next call captures again) and the
    in-memory dynamic-shape profiles (those on disk stay: delete ``KILN_CACHE_DIR`` for that)."""
    for c in list(_caches.values()):
        c.clear()
    from .capture.frame import clear_resume_caches

    clear_resume_caches()
    from .shapes.profile import clear_profiles

    clear_profiles()
    _canonical_functions.clear()
    _callee_objects.clear()


class CompileKey:
    """What an entry was compiled for. Interned, so BACKEND_MATCH is an identity test."""

    _interned: dict = {}

    def __init__(self, backend, backend_name, fullgraph, mode, options, dynamic=None):
        self.backend = backend
        self.backend_name = backend_name
        self.fullgraph = fullgraph
        self.mode = mode
        self.options = options
        self.dynamic = dynamic

    @classmethod
    def get(cls, backend, backend_name, fullgraph, mode, options, dynamic=None) -> "CompileKey":
        opts = tuple(sorted((options or {}).items(), key=lambda kv: kv[0]))
        try:
            k = (id(backend), backend_name, fullgraph, mode, opts, dynamic)
            hash(k)
        except TypeError:
            return cls(backend, backend_name, fullgraph, mode, options, dynamic)
        hit = cls._interned.get(k)
        if hit is None or hit.backend is not backend:
            hit = cls._interned[k] = cls(backend, backend_name, fullgraph, mode, options, dynamic)
        return hit

    def __repr__(self):
        extra = "".join([", fullgraph=True" if self.fullgraph else "",
                         f", mode={self.mode!r}" if self.mode else "",
                         f", options={self.options!r}" if self.options else "",
                         f", dynamic={self.dynamic}" if self.dynamic is not None else ""])
        return f"{self.backend_name!r}{extra}"


class _CompiledFactory:
    """Compiles, for one compile key, the functions a graph break hands control to: the
    continuations (resume functions) and a callee whose body broke while being inlined."""

    def __init__(self, key: "CompileKey", dynamic):
        self.key = key
        self.dynamic = dynamic

    def __call__(self, fn: types.FunctionType) -> "CompiledFunction":
        per_key = _compiled_functions.setdefault(fn, {})
        cf = per_key.get(self.key)
        if cf is None:
            cf = per_key[self.key] = CompiledFunction(fn, self.key, self.dynamic)
        return cf

    def callee(self, obj):
        if isinstance(obj, (CompiledFunction, CompiledMethod, CompiledModule)):
            return obj
        if isinstance(obj, types.FunctionType):
            if obj.__closure__ is None and not obj.__defaults__ and not obj.__kwdefaults__:
                # code + globals determine it: nested functions made anew on every call
                # (3.11 comprehensions, lambdas) share one cache through a canonical object
                return self(_canonical_functions.setdefault((obj.__code__, id(obj.__globals__)), obj))
            # a closure: compiled per function object. A code that keeps producing new ones (a
            # closure made on every call) stops being compiled after recompile_limit of them.
            seen = _callee_objects.setdefault(obj.__code__, weakref.WeakSet())
            if obj not in seen:
                if len(seen) >= config.recompile_limit:
                    return obj
                seen.add(obj)
            return self(obj)
        if isinstance(obj, types.MethodType) and isinstance(obj.__func__, types.FunctionType):
            return CompiledMethod(self(obj.__func__), obj.__self__)
        if isinstance(obj, torch.nn.Module):
            # the module's own hooks were checked (NO_HOOKS) where the call was captured
            forward = type(obj).forward
            if isinstance(forward, types.FunctionType):
                return CompiledMethod(self(forward), obj)
        return obj


_compiled_functions: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()
_canonical_functions: dict = {}
_callee_objects: dict = {}


class CompiledFunction:
    """A function compiled by kiln. Call it like the original."""

    def __init__(self, fn: types.FunctionType, key: CompileKey, dynamic):
        self._fn = fn
        self._key = key
        self._cache = cache_for(fn)
        self.dynamic = dynamic
        self._factory = None if key.fullgraph else _CompiledFactory(key, dynamic)
        functools.update_wrapper(self, fn)

    @property
    def original(self) -> Callable:
        return self._fn

    @property
    def entries(self) -> list[Entry]:
        """This function's entries compiled for this backend and options."""
        return [e for e in self._cache.entries if e.key is self._key]

    @property
    def recompile_reasons(self) -> list[str]:
        """The failing guard behind each recompile of this function (all backends)."""
        return list(self._cache.recompile_reasons)

    def __call__(self, *args, **kwargs):
        key = self._key
        entries = self._cache.entries
        for entry in entries:
            if entry.key is key:
                result = entry.fn(*args, **kwargs)
                if result is not MISS:
                    if entry is not entries[0]:
                        self._cache.promote(entry)
                    return result
        return self._miss(args, kwargs)

    def _miss(self, args: tuple, kwargs: dict):
        fn, key, cache = self._fn, self._key, self._cache
        mine = [e for e in cache.entries if e.key is key]
        others = [e for e in cache.entries if e.key is not key]
        reason = None
        if mine:
            reason = mine[0].failure_reason(args, kwargs) or "guards passed on re-check (a guard with side effects?)"
        elif others:
            reason = (f"BACKEND_MATCH failed: entries exist for backend {others[0].key!r}, "
                      f"called with {key!r}")
        if len(cache.entries) >= config.recompile_limit:
            if not cache.limit_warned:
                cache.limit_warned = True
                warnings.warn(
                    f"kiln: {fn.__qualname__} reached config.recompile_limit="
                    f"{config.recompile_limit} entries; it now runs eagerly for new inputs. "
                    f"Last failing guard: {reason}. Raise kiln.config.recompile_limit or make the "
                    "inputs more uniform.", RuntimeWarning, stacklevel=3)
            return fn(*args, **kwargs)
        if reason is not None:
            cache.recompile_reasons.append(reason)
        if reason is not None and logs.enabled.recompiles:
            logs.log("recompiles", f"Recompiling {fn.__qualname__} "
                     f"({fn.__code__.co_filename}:{fn.__code__.co_firstlineno}): {reason}")
        try:
            entry = capture(fn, args, kwargs, key=key, backend=key.backend, backend_name=key.backend_name,
                            compiled_factory=self._factory, dynamic=self.dynamic)
        except RecursionError:
            e = Unsupported(f"capture of {fn.__qualname__} recursed too deeply")
            if key.fullgraph:
                raise e
            entry = eager_entry(fn, e, key, key.backend_name)
        except Unsupported as e:
            if key.fullgraph:
                raise
            if logs.enabled.graph_breaks:
                logs.log("graph_breaks", f"{fn.__qualname__} runs eagerly: {e}")
            entry = eager_entry(fn, e, key, key.backend_name)
        cache.entries.insert(0, entry)
        if _explain._recorder.stack:
            _explain.record_entry(cache, entry)
        result = entry.fn(*args, **kwargs)
        if result is MISS:  # the guards do not hold for the arguments they were built from
            return fn(*args, **kwargs)
        return result

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return CompiledMethod(self, obj)

    def __repr__(self):
        return f"<kiln.CompiledFunction {self._fn.__qualname__} backend={self._key!r}>"


class CompiledMethod:
    """A CompiledFunction bound to ``self`` (``kiln.compile(obj.method)``)."""

    __slots__ = ("_compiled", "_self")

    def __init__(self, compiled: CompiledFunction, obj: Any):
        self._compiled = compiled
        self._self = obj

    def __call__(self, *args, **kwargs):
        return self._compiled(self._self, *args, **kwargs)

    @property
    def entries(self):
        return self._compiled.entries

    @property
    def recompile_reasons(self):
        return self._compiled.recompile_reasons

    @property
    def original(self):
        return types.MethodType(self._compiled.original, self._self)

    def __repr__(self):
        return f"<kiln.CompiledMethod {self._compiled._fn.__qualname__} of {type(self._self).__name__}>"


_module_callers: "weakref.WeakKeyDictionary[type, Callable]" = weakref.WeakKeyDictionary()


def _module_caller(cls: type) -> Callable:
    """One tiny function per module class, so all instances of a class share its entries and
    module hooks are honoured (calling the module goes through the NO_HOOKS guard)."""
    fn = _module_callers.get(cls)
    if fn is None:
        def call_module(module, *args, **kwargs):
            return module(*args, **kwargs)
        call_module.__qualname__ = f"{cls.__qualname__}.__call__"
        call_module.__module__ = cls.__module__   # (also names its dynamic-shape profile)
        fn = _module_callers[cls] = call_module
    return fn


class CompiledModule(torch.nn.Module):
    """The module returned by ``kiln.compile(module)``: forward is compiled; parameters,
    buffers, submodules and the state_dict are the original module's (same keys)."""

    def __init__(self, module: torch.nn.Module, compiled: CompiledFunction):
        super().__init__()
        self._orig_mod = module
        object.__setattr__(self, "_kiln_compiled", compiled)

    def __call__(self, *args, **kwargs):
        return self._kiln_compiled(self._modules["_orig_mod"], *args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._kiln_compiled(self._orig_mod, *args, **kwargs)

    def __getattr__(self, name):
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    # The original module's view of its state: no "_orig_mod." prefix.
    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        return self._orig_mod.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self._orig_mod.named_buffers(*args, **kwargs)

    def named_modules(self, *args, **kwargs):
        return self._orig_mod.named_modules(*args, **kwargs)

    def named_children(self):
        return self._orig_mod.named_children()

    # Container protocol of the original (Sequential, ModuleList, ...).
    def __getitem__(self, idx):
        return self._orig_mod[idx]

    def __len__(self):
        return len(self._orig_mod)

    def __iter__(self):
        return iter(self._orig_mod)

    @property
    def entries(self):
        return self._kiln_compiled.entries

    @property
    def recompile_reasons(self):
        return self._kiln_compiled.recompile_reasons

    def __repr__(self):
        return f"kiln.CompiledModule({self._orig_mod!r})"


def compile(fn=None, *, backend="eager", mode=None, fullgraph=False, dynamic=None, options=None):
    """Compile a function, a bound method or an nn.Module.

    ``kiln.compile(fn)``, ``@kiln.compile`` and ``@kiln.compile(backend=...)`` all work.

    Args:
        backend: a registered backend name (``"eager"``) or a callable
            ``(gm: torch.fx.GraphModule, example_inputs) -> callable``.
        mode: ``None``/``"default"``, ``"reduce-overhead"``, ``"max-autotune"`` (recorded in
            the compile key; backends that use it read ``key.mode``).
        fullgraph: raise ``kiln.Unsupported`` instead of running a frame eagerly when
            something cannot be captured.
        dynamic: the dynamic-shape policy. ``None`` (default): static first; when a call
            brings a new size for a dim (or a new value for an int argument), the recompile
            makes exactly the dims that changed symbolic, and that one graph serves the later
            sizes ("automatic dynamic"; the dims found are remembered under
            ``KILN_CACHE_DIR`` for the next process). ``True``: every dim of every tensor
            argument and every int argument symbolic from the first call (sizes 0 and 1 are
            still specialized). ``False``: always static. ``kiln.mark_dynamic`` and
            ``kiln.mark_static`` override the policy per tensor dim; parameters and buffers
            stay static unless marked.
        options: a dict of backend options (part of the compile key).

    Returns a ``CompiledFunction`` (or ``CompiledModule`` for an nn.Module) that returns what
    eager would, and runs eagerly where it cannot compile.
    """
    if mode not in _MODES:
        raise ValueError(f"kiln.compile: unknown mode {mode!r}; use one of {_MODES}")
    if dynamic not in (None, True, False):
        raise ValueError(f"kiln.compile: dynamic must be None, True or False, not {dynamic!r}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"kiln.compile: options must be a dict, not {type(options).__name__}")
    if not isinstance(fullgraph, bool):
        raise TypeError(f"kiln.compile: fullgraph must be a bool, not {type(fullgraph).__name__}")
    backend_fn, backend_name = lookup_backend(backend)
    key = CompileKey.get(backend_fn, backend_name, fullgraph, mode, options, dynamic)

    def wrap(target):
        if isinstance(target, (CompiledFunction, CompiledMethod, CompiledModule)):
            raise TypeError("kiln.compile: this object is already compiled by kiln; "
                            "compile the original (`.original`) instead")
        if isinstance(target, functools.partial):
            return functools.partial(wrap(target.func), *target.args, **target.keywords)
        if isinstance(target, torch.nn.Module):
            return CompiledModule(target, CompiledFunction(_module_caller(type(target)), key, dynamic))
        if isinstance(target, types.MethodType) and isinstance(target.__func__, types.FunctionType):
            return CompiledMethod(CompiledFunction(target.__func__, key, dynamic), target.__self__)
        if isinstance(target, types.FunctionType):
            return CompiledFunction(target, key, dynamic)
        if isinstance(target, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            raise TypeError(f"kiln.compile: {target!r} is a builtin; kiln compiles Python functions, "
                            "methods and nn.Modules")
        if callable(target) and isinstance(getattr(type(target), "__call__", None), types.FunctionType):
            return CompiledMethod(CompiledFunction(type(target).__call__, key, dynamic), target)
        raise TypeError(f"kiln.compile expects a Python function, a bound method or an nn.Module, "
                        f"got {type(target).__name__} ({target!r:.60})")

    if fn is None:
        return wrap
    return wrap(fn)
