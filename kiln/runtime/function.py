"""A compiled function and its call path.

The hot path::

    for entry in cache.entries:           # most recently hit first
        if entry.key is key:              # BACKEND_MATCH
            result = entry.fn(*args, **kwargs)   # generated: guards, graph, outputs
            if result is not MISS:
                return result
    return self._miss(args, kwargs)

A miss captures the frame (``kiln.capture``) into a new entry; the functions a graph break
hands control to (continuations, a callee whose body broke) are compiled for the same key by
``CompiledFactory``.
"""
from __future__ import annotations

import functools
import inspect
import types
import warnings
import weakref
from typing import Callable

import torch

from .. import _torch
from .. import logs
from ..capture.codegen import MISS
from ..capture.entry import ArgumentsDoNotBind, Entry, break_fields
from ..config import config
from ..cudagraphs.steps import run_in_step
from ..errors import KilnError, Unsupported
from ..compile_lock import compile_scope
from ..internal_errors import failed_before_effects, internal_error, is_users
from ..lazy_imports import LazyModule
from ..user_lines import at_users_line
from . import recording
from .artifacts import Artifacts
from .callees import callee_objects, canonical_functions, compiled_per_key, walks_the_stack
from .compile_key import CompileKey
from ..cache.compiling import compiling
from .function_cache import cache_for
from .method import CompiledMethod
from .ddp import DDPForward, call_plainly
from .hooked_module import HookedModuleCall
from .tensor_parallel import DTensorModuleCall
from .module import CompiledModule, module_caller

# the bytecode tracer, imported at the first capture: a warm process whose entries come from
# the cache or a package runs without it
_frame = LazyModule("kiln.capture.frame")


def capture(fn: types.FunctionType, args: tuple, kwargs: dict, **how) -> Entry:
    """The entry ``capture/frame.py`` captures for this call (its bytecode traced into graphs)."""
    return _frame.capture(fn, args, kwargs, **how)

_FAILED = object()   # the generated code failed before any effect (see CompiledFunction._recover)


class CompiledFactory:
    """Compiles, for one compile key, the functions a graph break hands control to: the
    continuations (resume functions) and a callee whose body broke while being inlined."""

    def __init__(self, key: "CompileKey", dynamic, artifacts: Artifacts):
        self.key = key
        self.dynamic = dynamic
        self.artifacts = artifacts

    def __call__(self, fn: types.FunctionType) -> "CompiledFunction":
        per_key = compiled_per_key(fn)
        cf = per_key.get(self.key)
        if cf is None:      # (setdefault: threads that get here at once share one)
            cf = per_key.setdefault(self.key, CompiledFunction(fn, self.key, self.dynamic, self.artifacts))
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
                return self(canonical_functions.setdefault((obj.__code__, id(obj.__globals__)), obj))
            # a closure: compiled per function object. A code that keeps producing new ones (a
            # closure made on every call) stops being compiled after recompile_limit of them.
            seen = callee_objects.setdefault(obj.__code__, weakref.WeakSet())
            if obj not in seen:
                if len(seen) >= config.recompile_limit:
                    return obj
                seen.add(obj)
            return self(obj)
        if isinstance(obj, types.MethodType) and isinstance(obj.__func__, types.FunctionType):
            if walks_the_stack(obj.__func__.__code__):
                return obj
            return CompiledMethod(self(obj.__func__), obj.__self__)
        if _torch.is_ddp(obj):
            # DDP's bookkeeping runs as torch runs it; the module it wraps is compiled (with
            # its own hooks: through the caller of its class)
            inner = obj.module
            if isinstance(inner, CompiledModule):
                return DDPForward(obj, call_plainly)
            return DDPForward(obj, self(module_caller(type(inner))))
        if isinstance(obj, torch.nn.Module) and _torch.holds_dtensors(obj):
            return DTensorModuleCall(obj)   # (DTensor parameters: it runs as it is, hooks included)
        if isinstance(obj, torch.nn.Module):
            return self._module_call(obj)
        return obj

    def _module_call(self, obj: torch.nn.Module) -> Callable:
        """What calling the module ``obj`` runs, compiled where that is its class's Python code:
        the class's own ``__call__`` (bound to it), else its class ``forward`` (hooks natively
        around it). Anything else ``nn.Module.__call__`` would not reach that way (a
        ``forward`` set on the instance, a torch.compile'd or disabled module, an overridden
        ``_call_impl``) is called as it is."""
        cls = type(obj)
        call = inspect.getattr_static(obj, "__call__", None)
        if call is not torch.nn.Module.__call__:
            if isinstance(call, types.FunctionType) and not walks_the_stack(call.__code__):
                return CompiledMethod(self(call), obj)
            return obj
        if any(inspect.getattr_static(obj, name, None) is not getattr(torch.nn.Module, name)
               for name in ("_call_impl", "_wrapped_call_impl")) or "forward" in obj.__dict__:
            return obj
        forward = inspect.getattr_static(obj, "forward", None)
        if isinstance(forward, types.FunctionType) and not walks_the_stack(forward.__code__):
            if _torch.module_hooks_empty(obj):
                return CompiledMethod(self(forward), obj)
            # hooks the capture could not inline (the break may be inside one): they run
            # natively around the compiled forward
            return HookedModuleCall(obj, CompiledMethod(self(forward), obj))
        return obj


class CompiledFunction:
    """A function compiled by kiln. Call it like the original."""

    records_frames = False    # kiln.compile's functions keep frame records (not continuations)
    records_key = None        # (the settings it was computed under, their key: "" when they are not kept)
    records_owner = None      # a continuation: the function whose frame record holds its entries
    counts_steps = False      # its graphs run as CUDA graphs: its calls are steps (counting_steps)

    def __init__(self, fn: types.FunctionType, key: CompileKey, dynamic, artifacts: Artifacts):
        self._fn = fn
        self._key = key
        self._cache = cache_for(fn)
        self.dynamic = dynamic
        self.artifacts = artifacts     # (saves and records the entries: kiln.package)
        self._factory = None if key.fullgraph else CompiledFactory(key, dynamic, artifacts)
        functools.update_wrapper(self, fn)
        if uses_cudagraphs(key):
            self.count_cudagraph_steps()

    def count_cudagraph_steps(self) -> None:
        """Count this function's calls as steps of CUDA graphs (``counting_steps``)."""
        if not self.counts_steps:
            self.__class__ = counting_steps(type(self))

    @property
    def original(self) -> Callable:
        return self._fn

    @property
    def key(self) -> CompileKey:
        return self._key

    @property
    def cache(self):
        """The entries of the original function, for every compile key (``FunctionCache``)."""
        return self._cache

    @property
    def factory(self) -> CompiledFactory | None:
        """What compiles the functions a graph break hands control to (None: fullgraph)."""
        return self._factory

    @property
    def entries(self) -> list[Entry]:
        """This function's entries compiled for this backend and options."""
        return [e for e in self._cache.entries if e.key is self._key]

    @property
    def recompile_reasons(self) -> list[str]:
        """The failing guard behind each recompile of this function (all backends)."""
        return list(self._cache.recompile_reasons)

    def __call__(self, /, *args, **kwargs):
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
                if entry is entries[0] and len(entries) > 2 and args and isinstance(args[0], torch.nn.Module):
                    # the layers of a model, each compiled, call one function in turn: each
                    # finds its own entries first, not after those of every other layer
                    return self._lookup_own_first(entry, args, kwargs)
        return self._miss(args, kwargs)

    def _lookup_own_first(self, tried: Entry, args: tuple, kwargs: dict):
        """The lookup of ``__call__`` after its first entry (``tried``) missed, for a module
        first argument: the entries captured for that module first, then the others."""
        owner, entries = args[0], self._cache.entries
        own = [e for e in entries if e.captured_for is not None and e.captured_for() is owner]
        mine = {id(e) for e in own}
        rest = [e for e in (*own, *(e for e in entries if id(e) not in mine)) if e is not tried]
        result = self._first_hit(rest, args, kwargs)
        return result if result is not MISS else self._miss(args, kwargs)

    def retry_entries(self, args: tuple, kwargs: dict):
        """The lookup of ``__call__`` once more (after frame records added entries): the
        result of the first entry whose guards hold, or MISS. (``__call__`` keeps its own copy
        of this loop inline: it is the per-call hot path, and a call more costs there.)"""
        return self._first_hit(list(self._cache.entries), args, kwargs)

    def _first_hit(self, entries: list, args: tuple, kwargs: dict):
        """The result of the first of ``entries`` (this compile key's) whose guards hold,
        promoted to be tried first next time; MISS if none."""
        key = self._key
        for entry in entries:
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
        if torch._C._get_tracing_state() is not None:
            # torch.jit.trace records the ops this call runs (its sizes are traced values):
            # the function runs as it is, for the tracer, and nothing is captured
            return self._fn(*args, **kwargs)
        if _torch.active_modes() is None:
            # a torch function or dispatch mode of the user's may change what every op
            # returns: the call runs as written, under it (no entry: the next call may have none)
            if logs.enabled.graph_breaks:
                logs.log("graph_breaks", f"{self._fn.__qualname__} runs eagerly for this call: a torch "
                                         "function or dispatch mode is active")
            return self._fn(*args, **kwargs)
        if not self.counts_steps and uses_cudagraphs(self._key):
            # compiled with CUDA graphs (kiln.config.cudagraphs on now): its calls count steps
            # from now on, this one too
            self.count_cudagraph_steps()
            return run_in_step(CompiledFunction._miss, self, args, kwargs)
        if not config.cache:
            return self._capture_and_run(args, kwargs)
        with compiling(self):     # (what the cache stores now may grow at a backward())
            return self._capture_and_run(args, kwargs)

    def _capture_and_run(self, args: tuple, kwargs: dict):
        fn, key, cache = self._fn, self._key, self._cache
        if self.records_frames and config.cache and key not in cache.frames_tried and not recording.recorder.stack:
            # a warm process: the entries a former process recorded, before any capture
            result = self.artifacts.lookup(self, args, kwargs)
            if result is not MISS:
                return result
        owner = args[0] if args and isinstance(args[0], torch.nn.Module) else None
        limit = _limit_reached(cache.entries, owner)
        if limit is not None:
            # (the failing guard is explained once, for the warning: a call past the limit
            # runs eagerly at the cost of the guards alone)
            if not cache.limit_warned:
                cache.limit_warned = True
                warnings.warn(
                    f"kiln: {fn.__qualname__} reached {limit}; it now runs eagerly for new inputs. "
                    f"Last failing guard: {self._failing_guard(args, kwargs)}. Raise the limit or "
                    "make the inputs more uniform.", RuntimeWarning, stacklevel=4)
            return fn(*args, **kwargs)
        reason = self._failing_guard(args, kwargs)
        if reason is not None:
            cache.recompile_reasons.append(reason)
        if reason is not None and logs.enabled.recompiles:
            logs.event("recompiles", "recompile", f"Recompiling {fn.__qualname__} "
                       f"({fn.__code__.co_filename}:{fn.__code__.co_firstlineno}): {reason}",
                       **logs.where(fn), reason=str(reason), entries=len(cache.entries))
        before_capture = getattr(key.backend, "before_capture", None)
        if before_capture is not None:
            before_capture()
        # Everything capture raises is kiln's (the frame then runs eagerly), except what the
        # user's own code raised (their backend, a comptime callback), a ConstraintViolation
        # (their mark_dynamic contradicted) and arguments that do not fit the signature.
        try:
            # the user's saved-tensor hooks must not see capture's fake tensors (they run on
            # the real saved tensors when the entry runs)
            with _torch.saved_tensors_hooks_paused(), compile_scope(config.pause_gc_while_compiling):
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
        if owner is not None:
            entry.captured_for = weakref.ref(owner)
        cache.add(entry)
        if recording.recorder.stack:
            recording.record_entry(cache, entry)
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
            with compile_scope(config.pause_gc_while_compiling):
                self.record_frames()
        return result

    def _failing_guard(self, args: tuple, kwargs: dict) -> str | None:
        """Why no entry of this function ran the call (None: it has none)."""
        key, entries = self._key, self._cache.entries
        mine = [e for e in entries if e.key is key]
        if mine:
            return mine[0].failure_reason(args, kwargs) or "guards passed on re-check (a guard with side effects?)"
        if entries:
            return (f"BACKEND_MATCH failed: entries exist for backend {entries[0].key!r}, "
                    f"called with {key!r}")
        return None

    def _eager_entry(self, e: Unsupported) -> Entry | None:
        """The entry that runs the frame eagerly (logged under graph_breaks)."""
        fn = self._fn
        if logs.enabled.graph_breaks:
            logs.event("graph_breaks", "eager", f"{fn.__qualname__} runs eagerly: {e}", **logs.where(fn),
                       **break_fields(e))
        try:
            return _frame.eager_entry(fn, e, self._key, self._key.backend_name)
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
            logs.event("graph_breaks", "eager", f"{fn.__qualname__} runs eagerly: {u}", **logs.where(fn),
                       **break_fields(u))
        try:
            eager = _frame.eager_entry_for(fn, entry.program, entry.guards, entry.key, entry.backend_name, u)
        except Exception:
            eager = None
        if eager is not None:
            eager.captured_for = entry.captured_for
        if self._cache.replace(entry, eager) and eager is not None:
            entry.replaced_by = eager
            if recording.recorder.stack:
                recording.record_entry(self._cache, eager)
        return result

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return CompiledMethod(self, obj)

    def record_frames(self) -> None:
        """Rewrite this process's frame record of this function, or for a continuation, of
        the function whose record holds its entries (none yet: nothing to do)."""
        owner = self if self.records_frames else self.records_owner
        if owner is not None:
            owner.artifacts.record(owner)

    def save_package(self, path: str):
        """Save every entry compiled so far (and those of the continuations after graph
        breaks) to the file ``path``, for ``kiln.load_package``. Returns a
        ``kiln.package.SaveReport``: entries saved, and entries left out with the reason."""
        return self.artifacts.save_package(self, path)

    def __repr__(self):
        return f"<kiln.CompiledFunction {self._fn.__qualname__} backend={self._key!r}>"


def _limit_reached(entries: list, owner) -> str | None:
    """The recompile limit a new entry would pass (its description), or None. Entries captured
    for another module instance than ``owner`` do not count against ``recompile_limit``: the
    separately compiled layers of a model may each need their own (a layer index they read)."""
    if len(entries) >= config.accumulated_recompile_limit:
        return f"config.accumulated_recompile_limit={config.accumulated_recompile_limit} entries"
    if len(entries) < config.recompile_limit:
        return None
    if owner is None:
        return f"config.recompile_limit={config.recompile_limit} entries"
    counted = 0
    for e in entries:
        ref = e.captured_for
        if ref is None or ref() is owner:
            counted += 1
    if counted >= config.recompile_limit:
        return (f"config.recompile_limit={config.recompile_limit} entries for this "
                f"{type(owner).__name__} instance")
    return None


def uses_cudagraphs(key: CompileKey) -> bool:
    """Whether the graphs compiled now for ``key`` may run as CUDA graphs (the inductor
    backend reads the mode, kiln.config.cudagraphs turns them on for any AOT backend; a
    backend of the user's may use ``kiln.cudagraphs`` for the mode too)."""
    return key.mode == "reduce-overhead" or config.cudagraphs


_counting: dict = {}     # a CompiledFunction class -> its subclass that counts steps


def counting_steps(cls: type) -> type:
    """``cls`` (a CompiledFunction class) for a function whose graphs run as CUDA graphs: a
    call that no other such call (in this thread) encloses is a step
    (``kiln/cudagraphs/steps.py``). A subclass, so that the call path of the other compiled
    functions stays without it; the same layout, so that a function becomes one in place."""
    if cls.counts_steps:
        return cls
    counting = _counting.get(cls)
    if counting is not None:
        return counting
    call = cls.__call__

    def __call__(self, /, *args, **kwargs):
        return run_in_step(call, self, *args, **kwargs)
    return _counting.setdefault(cls, type(cls.__name__, (cls,), {
        "__call__": __call__, "counts_steps": True, "__module__": cls.__module__,
        "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}))
