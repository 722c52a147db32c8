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

from . import _torch
from . import explain as _explain
from . import logs
from .backends.registry import lookup_backend
from .cache import frames as _frames
from .capture.codegen import MISS
from .capture.frame import ArgumentsDoNotBind, Entry, capture, eager_entry, eager_entry_for
from .config import config
from .cudagraphs import steps as _steps
from .errors import KilnError, Unsupported
from .compile_lock import COMPILE_LOCK
from .internal_errors import failed_before_effects, internal_error, is_users
from .user_lines import at_users_line

_FAILED = object()   # the generated code failed before any effect (see CompiledFunction._recover)

_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class FunctionCache:
    """All compiled entries of one Python function."""

    __slots__ = ("entries", "limit_warned", "recompile_reasons", "frames_tried", "__weakref__")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.limit_warned = False
        self.recompile_reasons: list[str] = []   # why each capture after the first happened
        # compile keys whose frame records (kiln.cache.frames) were loaded: once per process,
        # not again after reset() (whose next call captures)
        self.frames_tried: set = set()

    def promote(self, entry: Entry) -> None:
        self.entries.remove(entry)
        self.entries.insert(0, entry)

    def clear(self) -> None:
        self.entries.clear()
        self.limit_warned = False
        self.recompile_reasons.clear()


_caches: "weakref.WeakSet[FunctionCache]" = weakref.WeakSet()   # for reset()
_CACHE_ATTR = "__kiln_cache__"


def cache_for(fn: Callable) -> FunctionCache:
    """The entries of ``fn``, kept in the function's own ``__dict__``: entries may hold ``fn``
    (an eager entry calls it), and a global table weak in ``fn`` would then keep ``fn``, its
    closure cells and whatever they hold alive for good; in ``fn.__dict__`` they form a cycle
    that the garbage collector frees with the function."""
    held = fn.__dict__.get(_CACHE_ATTR)
    if held is None or held[0] is not fn:   # (functools.wraps copies __dict__ to wrappers)
        held = (fn, FunctionCache())
        fn.__dict__[_CACHE_ATTR] = held
        _caches.add(held[1])
    return held[1]


def reset() -> None:
    """Drop every compiled entry of every function (the next call captures again) and the
    in-memory dynamic-shape profiles (those on disk stay: delete ``KILN_CACHE_DIR`` for that)."""
    for c in list(_caches):
        c.clear()
    from .capture.frame import clear_resume_caches

    clear_resume_caches()
    from .shapes.profile import clear_profiles

    clear_profiles()
    _canonical_functions.clear()
    _callee_objects.clear()
    _stack_walkers.clear()
    from .cudagraphs.tree import reset_trees

    reset_trees()


class CompileKey:
    """What an entry was compiled for. Interned, so BACKEND_MATCH is an identity test."""

    # weak: a key lives as long as an entry or a compiled function uses it (a backend object
    # the user drops, with the graphs it may keep, is not kept here)
    _interned: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()

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
        per_key = _compiled_per_key(fn)
        cf = per_key.get(self.key)
        if cf is None:
            cf = per_key[self.key] = CompiledFunction(fn, self.key, self.dynamic)
        return cf

    def callee(self, obj):
        if isinstance(obj, (CompiledFunction, CompiledMethod, CompiledModule)):
            return obj
        if isinstance(obj, types.FunctionType):
            if walks_the_stack(obj.__code__):
                return obj
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
            if walks_the_stack(obj.__func__.__code__):
                return obj
            return CompiledMethod(self(obj.__func__), obj.__self__)
        if isinstance(obj, torch.nn.Module):
            # the module's own hooks were checked (NO_HOOKS) where the call was captured
            forward = type(obj).forward
            if isinstance(forward, types.FunctionType) and not walks_the_stack(forward.__code__):
                return CompiledMethod(self(forward), obj)
        return obj


# Names that read the caller's frame: sys._getframe(1), inspect.stack(), warnings' stacklevel...
_STACK_NAMES = frozenset({"_getframe", "_getframemodulename", "currentframe", "getouterframes",
                          "extract_stack", "format_stack", "print_stack", "walk_stack", "f_back",
                          "stacklevel"})
_stack_walkers: dict = {}


def walks_the_stack(code: types.CodeType) -> bool:
    """Whether a function's code may look at its callers' frames. Such a callee of a graph
    break runs as it is, not as its own compiled function: a compiled function is entered
    through kiln's frames, so ``sys._getframe(1)`` would see those instead of the caller (the
    module namedtuple() names, the line a warning with stacklevel=2 points at)."""
    hit = _stack_walkers.get(code)
    if hit is None:
        names = set(code.co_names)
        for c in code.co_consts:   # keyword names of calls (stacklevel=2) are constants
            if type(c) is tuple and all(type(x) is str for x in c):
                names.update(c)
        hit = _stack_walkers[code] = bool(names & _STACK_NAMES) or {"inspect", "stack"} <= names
    return hit


_COMPILED_ATTR = "__kiln_compiled__"


def _compiled_per_key(fn: types.FunctionType) -> dict:
    """The CompiledFunctions of a continuation or callee ``fn``, per compile key. Kept in the
    function's own ``__dict__``: a cycle the garbage collector frees with the function (a
    global table weak in ``fn`` would still hold its values, and they hold ``fn``)."""
    held = fn.__dict__.get(_COMPILED_ATTR)
    if held is None or held[0] is not fn:   # (functools.wraps copies __dict__ to wrappers)
        held = (fn, {})
        fn.__dict__[_COMPILED_ATTR] = held
    return held[1]


_canonical_functions: dict = {}
_callee_objects: dict = {}


class CompiledFunction:
    """A function compiled by kiln. Call it like the original."""

    _records_frames = False   # kiln.compile's functions keep frame records (not continuations)
    _frame_key = None         # their key, once computed ("" when they are not kept)

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
        _steps.count += 1       # (CUDA graphs record in call order: kiln/cudagraphs/steps.py)
        key = self._key
        entries = self._cache.entries
        for entry in entries:
            if entry.key is key:
                try:
                    result = entry.fn(*args, **kwargs)
                except Exception as e:
                    # (free when nothing is raised) the generated code failed before any effect:
                    # the call runs eagerly instead, out of this handler (see _recover)
                    if not failed_before_effects(entry.fn.__code__, e):
                        raise at_users_line(e)
                    result, why = _FAILED, f"{type(e).__name__}: {e}"
                if result is not MISS:
                    if result is _FAILED:
                        return self._recover(entry, why, args, kwargs)
                    if entry is not entries[0]:
                        self._cache.promote(entry)
                    return result
        return self._miss(args, kwargs)

    def _retry_entries(self, args: tuple, kwargs: dict):
        """The lookup of ``__call__`` once more (after frame records added entries): the
        result of the first entry whose guards hold, or MISS. (``__call__`` keeps its own copy
        of this loop inline: it is the per-call hot path, and a call more costs there.)"""
        key = self._key
        for entry in list(self._cache.entries):
            if entry.key is key:
                try:
                    result = entry.fn(*args, **kwargs)
                except Exception as e:
                    if not failed_before_effects(entry.fn.__code__, e):
                        raise at_users_line(e)
                    return self._recover(entry, f"{type(e).__name__}: {e}", args, kwargs)
                if result is not MISS:
                    self._cache.promote(entry)
                    return result
        return MISS

    def _miss(self, args: tuple, kwargs: dict):
        if not config.cache:
            return self._capture_and_run(args, kwargs)
        with _frames.compiling(self):     # (what the cache stores now may grow at a backward())
            return self._capture_and_run(args, kwargs)

    def _capture_and_run(self, args: tuple, kwargs: dict):
        fn, key, cache = self._fn, self._key, self._cache
        if self._records_frames and config.cache and key not in cache.frames_tried and not _explain._recorder.stack:
            # a warm process: the entries a former process recorded, before any capture
            result = _frames.lookup(self, args, kwargs)
            if result is not MISS:
                return result
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
                    "inputs more uniform.", RuntimeWarning, stacklevel=4)
            return fn(*args, **kwargs)
        if reason is not None:
            cache.recompile_reasons.append(reason)
        if reason is not None and logs.enabled.recompiles:
            logs.log("recompiles", f"Recompiling {fn.__qualname__} "
                     f"({fn.__code__.co_filename}:{fn.__code__.co_firstlineno}): {reason}")
        # Everything capture raises is kiln's (the frame then runs eagerly), except what the
        # user's own code raised (their backend, a comptime callback), a ConstraintViolation
        # (their mark_dynamic contradicted) and arguments that do not fit the signature.
        try:
            # the user's saved-tensor hooks must not see capture's fake tensors (they run on
            # the real saved tensors when the entry runs)
            with _torch.saved_tensors_hooks_paused(), COMPILE_LOCK:
                entry = capture(fn, args, kwargs, key=key, backend=key.backend, backend_name=key.backend_name,
                                compiled_factory=self._factory, dynamic=self.dynamic)
        except ArgumentsDoNotBind:
            return fn(*args, **kwargs)        # raises the user's TypeError, exactly as eager
        except RecursionError:
            e = Unsupported(f"capture of {fn.__qualname__} recursed too deeply")
            if key.fullgraph:
                raise e
            entry = self._eager_entry(e)
        except Unsupported as e:
            if key.fullgraph:
                raise
            entry = self._eager_entry(e)
        except KilnError:
            raise
        except Exception as e:
            if is_users(e):
                raise
            u = internal_error(e, f"compiling {fn.__qualname__}").located(
                fn.__code__.co_filename, fn.__code__.co_firstlineno, None)
            if key.fullgraph:
                raise u from e
            entry = self._eager_entry(u)
        if entry is None:   # not even an eager entry could be built
            return fn(*args, **kwargs)
        cache.entries.insert(0, entry)
        if _explain._recorder.stack:
            _explain.record_entry(cache, entry)
        try:
            result = entry.fn(*args, **kwargs)
        except Exception as e:
            if not failed_before_effects(entry.fn.__code__, e):
                raise at_users_line(e)
            result, why = _FAILED, f"{type(e).__name__}: {e}"
        if result is _FAILED:
            return self._recover(entry, why, args, kwargs)
        if result is MISS:  # the guards do not hold for the arguments they were built from
            return fn(*args, **kwargs)
        if config.cache:
            _frames.record(self)     # (a function's own record, or its owner's for a continuation)
        return result

    def _eager_entry(self, e: Unsupported) -> Entry | None:
        """The entry that runs the frame eagerly (logged under graph_breaks)."""
        fn = self._fn
        if logs.enabled.graph_breaks:
            logs.log("graph_breaks", f"{fn.__qualname__} runs eagerly: {e}")
        try:
            return eager_entry(fn, e, self._key, self._key.backend_name)
        except Exception:
            return None

    def _recover(self, entry: Entry, why: str, args: tuple, kwargs: dict):
        """``entry``'s generated code failed before any effect: run the call eagerly. If eager
        raises, that was the user's error (raised as eager raises it; the entry stays). If it
        succeeds, the failure was kiln's: from now on the entry's guards run the frame eagerly."""
        fn = self._fn
        result = fn(*args, **kwargs)
        u = Unsupported(f"kiln internal error in the generated code of {fn.__qualname__} at run time "
                        f"({why}); it runs eagerly from now on (please report this as a kiln bug)",
                        fn.__code__.co_filename, fn.__code__.co_firstlineno)
        u.internal = True
        if logs.enabled.graph_breaks:
            logs.log("graph_breaks", f"{fn.__qualname__} runs eagerly: {u}")
        try:
            eager = eager_entry_for(fn, entry.program, entry.guards, entry.key, entry.backend_name, u)
        except Exception:
            eager = None
        entries = self._cache.entries
        if entry in entries:
            if eager is None:
                entries.remove(entry)
            else:
                entries[entries.index(entry)] = eager
                entry.replaced_by = eager
                if _explain._recorder.stack:
                    _explain.record_entry(self._cache, eager)
        return result

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return CompiledMethod(self, obj)

    def save_package(self, path: str):
        """Save every entry compiled so far (and those of the continuations after graph
        breaks) to the file ``path``, for ``kiln.load_package``. Returns a
        ``kiln.package.SaveReport``: entries saved, and entries left out with the reason."""
        from .package import save_package

        return save_package(self, path)

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

    def save_package(self, path: str):
        """Save every entry compiled so far (and those of the continuations after graph
        breaks) to the file ``path``, for ``kiln.load_package``. Returns a
        ``kiln.package.SaveReport``: entries saved, and entries left out with the reason."""
        from .package import save_package

        return save_package(self, path)

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


class EagerCallable:
    """What ``kiln.compile`` returns for a callable that has no Python bytecode of its own to
    capture (``len``, ``getattr``, ``torch.add``, a class, a C method): it calls the original
    as it is. ``kiln.explain`` and ``KILN_LOGS=graph_breaks`` say why nothing is captured."""

    def __init__(self, target: Callable):
        self._target = target
        self._logged = False
        functools.update_wrapper(self, target, updated=())

    @property
    def reason(self) -> str:
        t = self._target
        if isinstance(t, type):
            what = "a class"
        elif isinstance(t, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            what = "a builtin function"
        elif isinstance(t, (types.MethodWrapperType, types.WrapperDescriptorType,
                            types.MethodDescriptorType, types.ClassMethodDescriptorType)):
            what = "a method implemented in C"
        else:
            what = f"a {type(t).__name__} object whose __call__ is not Python code"
        name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or type(t).__name__
        return f"{name} is {what}: there is no Python bytecode to capture, it runs as it is"

    @property
    def original(self) -> Callable:
        return self._target

    @property
    def entries(self) -> list:
        return []

    @property
    def recompile_reasons(self) -> list:
        return []

    def __call__(self, *args, **kwargs):
        if _explain._recorder.stack:
            _explain.record_uncompiled(self.reason)
        if not self._logged and logs.enabled.graph_breaks:
            self._logged = True
            logs.log("graph_breaks", self.reason)
        return self._target(*args, **kwargs)

    def __repr__(self):
        return f"<kiln.EagerCallable {self._target!r}>"


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

    def save_package(self, path: str):
        """Save every entry compiled so far (and those of the continuations after graph
        breaks) to the file ``path``, for ``kiln.load_package``. Returns a
        ``kiln.package.SaveReport``: entries saved, and entries left out with the reason."""
        from .package import save_package

        return save_package(self, path)

    @property
    def recompile_reasons(self):
        return self._kiln_compiled.recompile_reasons

    def __repr__(self):
        return f"kiln.CompiledModule({self._orig_mod!r})"


def compile(fn=None, *, backend="inductor", mode=None, fullgraph=False, dynamic=None, options=None):
    """Compile a function, a bound method or an nn.Module.

    ``kiln.compile(fn)``, ``@kiln.compile`` and ``@kiln.compile(backend=...)`` all work.

    Args:
        backend: a registered backend name or a callable
            ``(gm: torch.fx.GraphModule, example_inputs) -> callable``. ``"inductor"``
            (default, as for torch.compile): fused kernels generated by Inductor, after kiln's
            AOT autograd. ``"aot_eager"``: kiln's AOT autograd, graphs run as ATen ops (to
            tell an AOT problem from an Inductor one). ``"eager"``: the captured graph runs
            as it is (to debug capture; compiles nothing).
        mode: ``None``/``"default"``, ``"reduce-overhead"``, ``"max-autotune"`` (recorded in
            the compile key; backends that use it read ``key.mode``). ``"reduce-overhead"``
            (inductor backend) replays the compiled graphs as CUDA graphs (``kiln.cudagraphs``):
            a replay's outputs stay valid until the next call of the same function; reading
            one after that raises.
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
    eager would, and runs eagerly where it cannot compile. A callable with no Python bytecode
    (a builtin such as ``len`` or ``torch.add``, a class, a C method) is accepted and runs as
    it is (an ``EagerCallable``).

    Errors: an error inside kiln while compiling (or in its generated code, before the call
    has changed anything) never reaches the caller: the frame runs eagerly, with the reason
    under ``KILN_LOGS=graph_breaks`` and in ``kiln.explain``; with ``fullgraph=True`` it
    raises ``kiln.Unsupported`` chained to the original. An exception raised by a ``backend``
    callable you pass (or by compilers given to ``kiln.backends.aot_backend``) is yours and
    propagates unchanged, as does a backend's result that is not callable (TypeError).
    """
    if mode not in _MODES:
        raise ValueError(f"kiln.compile: unknown mode {mode!r}; use one of {_MODES}")
    if dynamic not in (None, True, False):
        raise ValueError(f"kiln.compile: dynamic must be None, True or False, not {dynamic!r}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"kiln.compile: options must be a dict, not {type(options).__name__}")
    if not isinstance(fullgraph, bool):
        raise TypeError(f"kiln.compile: fullgraph must be a bool, not {type(fullgraph).__name__}")
    backend_fn, backend_name = lookup_backend(backend, mode=mode, options=options)
    key = CompileKey.get(backend_fn, backend_name, fullgraph, mode, options, dynamic)

    def compiled(fn):
        cf = CompiledFunction(fn, key, dynamic)
        cf._records_frames = True
        return cf

    def wrap(target):
        if isinstance(target, (CompiledFunction, CompiledMethod, CompiledModule, EagerCallable)):
            raise TypeError("kiln.compile: this object is already compiled by kiln; "
                            "compile the original (`.original`) instead")
        if isinstance(target, functools.partial):
            return functools.partial(wrap(target.func), *target.args, **target.keywords)
        if isinstance(target, torch.nn.Module):
            return CompiledModule(target, compiled(_module_caller(type(target))))
        if isinstance(target, types.MethodType) and isinstance(target.__func__, types.FunctionType):
            return CompiledMethod(compiled(target.__func__), target.__self__)
        if isinstance(target, types.FunctionType):
            return compiled(target)
        if not isinstance(target, type) and isinstance(getattr(type(target), "__call__", None),
                                                       types.FunctionType):
            return CompiledMethod(compiled(type(target).__call__), target)
        if callable(target):
            # a builtin, a class, a C function or method: no Python bytecode to capture
            return EagerCallable(target)
        raise TypeError(f"kiln.compile expects a Python function, a bound method or an nn.Module, "
                        f"got {type(target).__name__} ({target!r:.60})")

    if fn is None:
        return wrap
    return wrap(fn)
