"""The one adapter over torch internals that kiln uses.

Everything kiln takes from torch beyond its public API is imported here, so that a torch
version difference is handled in one place. kiln never calls torch.compile, dynamo,
aot_autograd or torch's precompile APIs: those are the peer that kiln is measured against.
"""
from __future__ import annotations

import contextlib
import functools as _functools
import io as _io
import sys as _sys
import threading
from typing import Any, Callable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: F401  (re-exported)

# torch's symbolic shapes (ShapeEnv, fake modes with symbols): ``kiln/_torch_symbolic.py``,
# imported at the first use of one of these names (it imports sympy, which a warm start skips)
_SYMBOLIC = frozenset({"DATA_DEPENDENT_ERRORS", "DimDynamic", "ShapeEnv", "StatelessSymbolicContext",
                       "KilnShapeEnv", "SymbolSource", "SYMBOL_ID_SPACE", "symbol_id", "new_fake_mode",
                       "fake_from_real", "static_fake", "symbolic_int", "static_fake_mode"})


def __getattr__(name: str) -> Any:
    if name in _SYMBOLIC:
        from . import _torch_symbolic  # (sympy: only tracing needs it, never a warm start)
        return getattr(_torch_symbolic, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# C-level checks. TensorGuards compares, for several tensors at once, the Python type, dispatch
# keys, dtype, device, requires_grad, sizes and strides, and also that no two are the same
# object. GlobalStateGuard snapshots grad mode, torch-function mode, deterministic algorithms,
# TF32/reduced-precision flags, thread count and default dtype. kiln's guard semantics and code
# generation are its own; these are the fast primitives its generated code calls.
from torch._C._dynamo.guards import GlobalStateGuard, TensorGuards  # noqa: F401

Graph = torch.fx.Graph
GraphModule = torch.fx.GraphModule
Node = torch.fx.Node

def make_tensor_guards(tensors: list[torch.Tensor], dims: tuple[list, list] | None = None) -> Any:
    """A TensorGuards. ``dims``: (sizes, strides) per tensor with None where a size or stride
    is symbolic (checked by the shape guards instead); None compares all exactly."""
    if dims is None:
        return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
    return TensorGuards(*tensors, dynamic_dims_sizes=dims[0], dynamic_dims_strides=dims[1])


def tensor_guard_failure(tg: Any, tensors: list, names: list[str]) -> str | None:
    """The first failing tensor check as text, or None when all hold."""
    try:
        res = tg.check_verbose(*tensors, tensor_check_names=names)
    except TypeError as e:  # wrong arity or a non-tensor where a tensor was expected
        return str(e)
    return None if res is True else str(res)


def active_modes() -> tuple | None:
    """The user's torch function and dispatch modes now active, as a compiled entry depends
    on them: ``()`` when none; the devices of the ``DeviceContext`` modes on the function-mode
    stack (``with torch.device(d)``, ``torch.set_default_device(d)``: factory calls make
    tensors there, which a capture records and a guard re-checks); None when any other mode
    is active. A mode's ``__torch_function__``/``__torch_dispatch__`` may change any result,
    so kiln neither captures nor runs compiled code under one: the call runs as written."""
    if torch._C._len_torch_dispatch_stack():
        return None
    n = torch._C._len_torch_function_stack()
    if not n:
        return ()
    from torch.utils._device import DeviceContext

    devices = []
    for i in range(n):
        mode = torch._C._get_function_stack_at(i)
        if type(mode) is not DeviceContext:
            return None
        devices.append(str(mode.device))
    return tuple(devices)


@_functools.lru_cache(maxsize=1)
def side_effectful_functions() -> frozenset:
    """The functions and ops a graph keeps though nothing reads their result (asserts,
    prints, profiler ranges): FX's dead-code elimination's set, and ``_assert_async`` without
    a message and ``aten._print``, which it lacks."""
    from torch.fx.node import _side_effectful_functions

    extra = [torch.ops.aten._assert_async.default]
    if hasattr(torch.ops.aten, "_print"):
        extra.append(torch.ops.aten._print.default)
    return frozenset(_side_effectful_functions) | frozenset(extra)


def is_side_effectful(target: Any) -> bool:
    try:
        return target in side_effectful_functions()
    except TypeError:       # (an unhashable callable)
        return False


def is_device_constructor(target: Any) -> bool:
    """A torch function a ``DeviceContext`` mode gives its device when it is called without
    one (``torch.ones``, ``torch.tensor``, ``torch.arange``...)."""
    from torch.utils._device import _device_constructors

    try:
        return target in _device_constructors()
    except TypeError:
        return False


class GlobalState:
    """What ``GlobalStateGuard`` checks (grad mode, deterministic algorithms, torch-function
    enabling...) and the mode stacks of ``active_modes()``: an entry runs only where both are
    as they were at its capture. ``check()`` is the per-call test of every entry."""

    __slots__ = ("guard", "devices", "check")

    def __init__(self, guard: Any = None, devices: tuple = ()):
        self.guard = GlobalStateGuard() if guard is None else guard
        self.devices = tuple(devices)
        state, len_dispatch, len_function = self.guard.check, torch._C._len_torch_dispatch_stack, \
            torch._C._len_torch_function_stack
        if not self.devices:
            def check() -> bool:
                return state() and not len_function() and not len_dispatch()
        else:
            def check() -> bool:
                return state() and active_modes() == self.devices
        self.check = check

    def __getstate__(self) -> dict:
        return {"guard": self.guard.__getstate__(), "devices": list(self.devices)}

    @classmethod
    def from_state(cls, state: Any) -> "GlobalState":
        """Rebuilt from ``__getstate__`` (a bare string: a package written before the mode
        stacks were part of it, captured with none)."""
        guard = GlobalStateGuard()
        if isinstance(state, str):
            guard.__setstate__(state)
            return cls(guard)
        guard.__setstate__(state["guard"])
        return cls(guard, tuple(state["devices"]))


def global_state_snapshot() -> GlobalState:
    """The global state now (the modes must be ``active_modes()``'s devices or none)."""
    return GlobalState(devices=active_modes() or ())


def global_state_description() -> dict[str, Any]:
    """The global state that GlobalState covers, readable, for explaining a failure."""
    modes = active_modes()
    return {
        "grad_mode": torch.is_grad_enabled(),
        "default_dtype": torch.get_default_dtype(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "num_threads": torch.get_num_threads(),
        "torch_function_enabled": torch._C._is_torch_function_enabled(),
        "modes": "a torch function or dispatch mode of yours" if modes is None
        else ("none" if not modes else "default device " + ", ".join(modes)),
    }


def lazy_graph_module(root: Any, graph: torch.fx.Graph, class_name: str = "GraphModule") -> torch.fx.GraphModule:
    """A GraphModule whose Python code is generated when something first runs it or reads its
    ``code``, not when it is made or ``recompile()``d: the AOT stages build and rewrite large
    graphs that the kernel generator compiles without ever running their FX code (a
    transformer's joint graph costs ~50 ms per code generation)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    return _LazyGraphModule(root, graph, class_name)


def lazy_graph_modules():
    """Within: the GraphModules torch's tracers make (``make_fx``) are lazy ones too."""
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    return _use_lazy_graph_module(True)


def python_dispatcher():
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


def is_symbolic(v: Any) -> bool:
    return isinstance(v, (torch.SymInt, torch.SymBool, torch.SymFloat))


# torch.tensor(data) built from ops (its reference implementation), for data holding symbolic
# numbers or tensors: it traces where torch.tensor would read the values as Python numbers
import torch._refs  # noqa: E402

tensor_from_traced_values = torch._refs.tensor


def is_higher_order_op(target: Any) -> bool:
    """Whether ``target`` is a higher-order operator (``torch.ops.higher_order.cond``,
    ``while_loop``, ``scan``, ``flex_attention``...: ops whose arguments include subgraphs)."""
    return isinstance(target, torch._ops.HigherOrderOperator)


def higher_order_op_home(op: Any) -> tuple[str, str]:
    """(name, module defining its class): what finds ``op`` again in another process."""
    return op.name(), type(op).__module__


def higher_order_op(name: str, module: str | None = None) -> Any:
    """The higher-order operator ``torch.ops.higher_order.<name>``. One defined outside torch's
    own set (kiln's) is registered when the module defining it is imported: ``module`` is
    imported when the name is not registered yet (only torch's and kiln's modules)."""
    import importlib

    found = torch._ops._higher_order_ops.get(name)
    if found is None and module is not None and module.split(".")[0] in ("torch", "kiln"):
        importlib.import_module(module)
        found = torch._ops._higher_order_ops.get(name)
    if found is None:
        raise ValueError(f"this torch has no higher-order op {name!r}")
    return found


def is_fake(t: Any) -> bool:
    return isinstance(t, FakeTensor)


def module_hooks_empty(m: torch.nn.Module) -> bool:
    return not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or m._backward_pre_hooks)


_GLOBAL_MODULE_HOOKS = tuple(n for n in (
    "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
    "_global_backward_pre_hooks") if hasattr(torch.nn.modules.module, n))


@contextlib.contextmanager
def global_module_hooks_paused():
    """No global nn.Module hooks while kiln traces and compiles its own GraphModules: tracers
    and compilers call them as modules, and a user's ``register_module_forward_pre_hook`` would
    run on them (on fake tensors) and be baked into the graph. The user's modules are inlined
    by the capture, which refuses global hooks (they run natively, hooks and all)."""
    mm = torch.nn.modules.module
    saved = [(n, getattr(mm, n)) for n in _GLOBAL_MODULE_HOOKS]
    if not any(d for _, d in saved):
        yield
        return
    for n, d in saved:
        setattr(mm, n, type(d)())
    try:
        yield
    finally:
        for n, d in saved:
            added = getattr(mm, n)
            d.update(added)         # (one registered meanwhile is kept)
            setattr(mm, n, d)


def global_module_hooks() -> tuple:
    """The dicts of globally registered nn.Module hooks (torch.nn.modules.module; read each
    time: a guard on every call, and the dicts are torch's to replace)."""
    mm = torch.nn.modules.module
    return tuple(getattr(mm, n) for n in _GLOBAL_MODULE_HOOKS)


# -- Inductor, as a kernel generator only ---------------------------------------------------------
# kiln runs its own AOT stages and hands Inductor one ATen graph at a time: these are the pieces
# of torch._inductor it uses. Imported lazily (importing Inductor takes seconds). Never the
# dynamo-level ``compile_fx``.

def inductor_config():
    """``torch._inductor.config`` (``patch``, ``get_config_copy``, ``get_type``)."""
    import torch._inductor.config as inductor_config_module

    return inductor_config_module


def inductor_compile_graph(gm: torch.fx.GraphModule, example_inputs: list, **kwargs) -> Any:
    """Inductor's per-graph compiler (``compile_fx_inner``): one ATen FX graph returning a
    tuple -> generated code, a callable taking one list of arguments (boxed, it empties the
    list). kwargs: ``static_input_idxs``, ``is_inference``, ``is_backward``, ``graph_id``,
    ``cudagraphs`` (a boxed bool), ``cpp_wrapper``."""
    from torch._inductor.compile_fx import compile_fx_inner

    join_prefetch()
    return compile_fx_inner(gm, example_inputs, **kwargs)


_SKIPPED_PREFIXES: set = set()
_HOOK_LOCK = threading.Lock()


def inductor_skip_input_asserts_of_subgraphs(prefix: str) -> None:
    """From now on, Inductor generates a subgraph whose name starts with ``prefix`` without
    the size/stride asserts on its inputs. For subgraphs whose every caller already gives
    them the strides they were lowered for (``kiln.aot.regions.UNCHECKED_INPUTS_PREFIX``);
    other subgraphs, torch.compile's among them, and every graph's own inputs keep theirs.
    A torch whose subgraph code generator differs keeps every assert."""
    from torch._inductor.codegen import wrapper

    with _HOOK_LOCK:
        if prefix in _SKIPPED_PREFIXES:
            return
        cls = getattr(wrapper, "SubgraphPythonWrapperCodegen", None)
        original = getattr(cls, "codegen_input_size_asserts", None)
        if original is None:
            return
        if not _SKIPPED_PREFIXES:
            @_functools.wraps(original)
            def codegen_input_size_asserts(self, *args, **kwargs):
                name = getattr(self, "subgraph_name", None)
                if isinstance(name, str) and name.startswith(tuple(_SKIPPED_PREFIXES)):
                    return None
                return original(self, *args, **kwargs)

            cls.codegen_input_size_asserts = codegen_input_size_asserts
        _SKIPPED_PREFIXES.add(prefix)


def inductor_generated_code(compiled: Any) -> dict | None:
    """What a load needs of Inductor's result for one graph (a ``CompiledFxGraph``): its
    generated Python module's source and cache key, the constants the module reads, and what
    its call wrapper decided after compiling (the inputs whose alignment it checks). None for
    other results (AOTInductor, a graph with torchbind objects): those cannot be reloaded."""
    from torch._inductor.output_code import CompiledFxGraph

    if type(compiled) is not CompiledFxGraph or not getattr(compiled, "source_code", None):
        return None
    if compiled.torchbind_constants or compiled.opaque_value_type_classes or compiled.frozen_param_names:
        return None
    if getattr(compiled, "_wrap_compiled_regions", False) or getattr(compiled, "partition_maps", None):
        return None
    return {
        "cache_key": compiled.cache_key, "source_code": compiled.source_code,
        "linemap": [list(x) for x in (compiled.cache_linemap or [])],
        "constants": dict(compiled.constants or {}),
        "inputs_to_check": [int(i) for i in compiled.inputs_to_check],
        "mutated_input_idxs": sorted(int(i) for i in compiled.mutated_input_idxs),
        "defers_input_alignment": bool(getattr(compiled, "_defers_input_alignment", False)),
        "device_types": sorted(compiled.device_types),
    }


def inductor_module_globals(compiled: Any) -> dict | None:
    """The globals of the generated module behind an Inductor result (its kernels, built): the
    globals of its ``call``, found through the wrappers Inductor may put around it (the input
    realignment a CUDA graph gets)."""
    todo, seen = [getattr(compiled, "current_callable", None)], set()
    while todo:
        fn = todo.pop()
        fn = getattr(fn, "__func__", fn)
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        scope = getattr(fn, "__globals__", None)
        if scope is not None:
            own = scope.get("call")
            if getattr(own, "__func__", own) is fn:
                return scope
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:          # (an empty cell)
                pass
        if getattr(fn, "__wrapped__", None) is not None:
            todo.append(fn.__wrapped__)
    return None


def inductor_after_first_call(compiled: Any, after: Callable[[], None]) -> None:
    """Run ``after()`` once, when the first call of an Inductor result has returned; later
    calls go straight to its module (nothing is left on the call path)."""
    inner = compiled.current_callable

    def first(args: list):
        out = inner(args)
        compiled.current_callable = inner
        after()
        return out
    compiled.current_callable = first


def inductor_load_generated_module(code: dict) -> Any:
    """The Inductor-generated module stored by ``inductor_generated_code``, imported as
    Inductor imports it: that builds its kernels from their source (C++ or Triton: from the
    compilers' own disk caches when they are warm); nothing is lowered again."""
    import os

    from torch._inductor.codecache import PyCodeCache, get_path, write_atomic

    key, source = code["cache_key"], code["source_code"]
    path = get_path(key, "py")[2]
    existing = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            existing = f.read()
    if existing != source:          # absent, or not ours: the entry's code is what runs
        write_atomic(path, source, make_dirs=True)
    linemap = [tuple(x) for x in code["linemap"]] or None
    return PyCodeCache.load_by_key_path(key, path, linemap, dict(code["constants"]))


def inductor_triton_launch_facts(kernel: Any) -> dict | None:
    """What launching one of Inductor's Triton kernels (a ``CachingAutotuner`` after its first
    launch) takes without Triton or Inductor: its one chosen configuration's cubin, function
    name, shared memory, warps, argument types and lists, and grid expressions, as Inductor's
    static launcher uses them; None when the kernel is not launched statically by one
    configuration (not yet launched, several candidates left, a user-defined or non-static
    kernel) or Inductor's objects are not what this reads."""
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner, GridExpr
    except ImportError:
        return None
    if not isinstance(kernel, CachingAutotuner) or len(kernel.launchers) != 1:
        return None
    launcher = kernel.launchers[0]
    if getattr(kernel, "triton_interpret", False):
        return None
    if kernel.inductor_meta.get("coordinate_descent_tuning") and \
            not getattr(launcher.config, "found_by_coordesc", False):
        return None
    results = [r for r in kernel.compile_results if r.config is launcher.config]
    if len(results) != 1:
        return None
    result = results[0]
    found = _static_kernel(result, kernel)
    if found is None:
        return None
    static, cubin_path = found
    try:
        with open(cubin_path, "rb") as f:
            cubin = f.read()
    except OSError:
        return None
    device = result.compile_meta.get("device", 0) or 0
    device = int(getattr(device, "index", device) or 0)
    _, def_args, none_args = result._get_arg_lists(static.arg_names, static.declared_constexprs)
    call_args = [a for i, a in enumerate(static.arg_names) if i not in static.full_constexprs and a not in none_args]
    grid = GridExpr.from_meta(result.inductor_meta, result.config)
    return {"device": device, "cubin": cubin, "function": static.name, "shared": int(static.shared),
            "num_warps": int(static.num_warps), "arg_tys": static.arg_tys,
            "scratch": int(bool(static.has_global_scratch)) + int(bool(static.has_profile_scratch)),
            "def_args": list(def_args), "call_args": list(call_args),
            "grid": {"prefix": list(grid.prefix), "x": str(grid.x_grid), "y": str(grid.y_grid), "z": str(grid.z_grid)},
            "profile_name": str(kernel.inductor_meta.get("kernel_name", "triton kernel"))}


# Triton names a kernel's cache files by the kernel's name cut to this many characters
_TRITON_FILE_NAME_CHARS = 150


def _static_kernel(result: Any, autotuner: Any) -> tuple[Any, str] | None:
    """(the statically launchable kernel of a compile result, its cubin file), or None.

    Inductor builds one itself when it can. It also declines a kernel that it could launch
    statically, when it does not find the cubin: Triton stores the cubin under the kernel's
    name cut to 150 characters, and Inductor looks for the whole name, which a fused kernel of
    many operators exceeds (Qwen2's attention-mask kernel). For such a kernel this makes the
    same checks Inductor makes, with the file Triton really wrote."""
    import os

    import torch
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir
    from torch._inductor.runtime.runtime_utils import triton_hash_to_path_key
    from torch._inductor.runtime.triton_heuristics import HeuristicType, StaticTritonCompileResult

    if isinstance(result, StaticTritonCompileResult):
        static = result.kernel
        device = result.compile_meta.get("device", 0) or 0
        device = int(getattr(device, "index", device) or 0)
        path = os.path.join(triton_cache_dir(device), triton_hash_to_path_key(static.hash), f"{static.name}.cubin")
        return static, path
    compiled = getattr(result, "kernel", None)
    meta = result.compile_meta
    if compiled is None or meta.get("device_type") != "cuda" or torch.version.hip is not None:
        return None
    if autotuner.heuristic_type == HeuristicType.USER_AUTOTUNE or result.inductor_meta.get("store_cubin"):
        return None
    metadata = getattr(compiled, "metadata", None)
    if getattr(metadata, "launch_pdl", False) or getattr(metadata, "launch_cooperative_grid", False):
        return None
    try:
        name = compiled.src.fn.__name__
        folder = os.path.join(triton_cache_dir(meta.get("device", 0)), triton_hash_to_path_key(compiled.hash))
    except Exception:
        return None
    path = next((p for p in (os.path.join(folder, f"{name}.cubin"),
                             os.path.join(folder, f"{name[:_TRITON_FILE_NAME_CHARS]}.cubin")) if os.path.exists(p)), None)
    if path is None:
        return None
    from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel

    had = hasattr(compiled, "_cubin_path")
    before = getattr(compiled, "_cubin_path", None)
    compiled._cubin_path = path          # what the static kernel's constructor reads
    try:
        return StaticallyLaunchedCudaKernel(compiled), path
    except (NotImplementedError, AttributeError, KeyError, TypeError):
        return None
    finally:
        if had:
            compiled._cubin_path = before
        else:
            del compiled._cubin_path


def inductor_wake_up_workers() -> None:
    """Start Inductor's kernel-compiling worker processes now (GPU graphs compile their
    Triton kernels in them), so that they are up by the time the first graph needs them, and
    the GPU set-up that Inductor's first compile would otherwise wait for (``_prefetch``)."""
    from torch._inductor.async_compile import AsyncCompile

    AsyncCompile.wakeup()
    _start_prefetch()


_prefetch: list = []     # the thread, once started: one per process


def _start_prefetch() -> None:
    """In a background thread, what the first GPU graph's Inductor compile needs and computes
    at its start otherwise, mostly outside the GIL:

    * Triton's installation hash, which Inductor's FX graph cache keys every GPU graph on
      (reading and hashing Triton's sources and shared library: half a second or more);
    * Triton's CUDA driver utilities, a C module Triton builds with the host's compiler the
      first time it loads a kernel in a process with an empty Triton cache.

    ``join_prefetch`` waits for it: a compile that started before it ended would otherwise
    compute the same things a second time, beside it."""
    if _prefetch:
        return
    from torch._inductor import codecache

    key = getattr(codecache, "triton_key", None)
    prefetch = getattr(key, "prefetch", None)     # (torch >= 2.12: its own background thread)
    if prefetch is not None:
        prefetch()

    def compute() -> None:
        try:
            if key is not None and prefetch is None:
                key()
            from triton.runtime import driver

            driver.active.utils     # (builds or loads the driver module)
        except Exception:       # noqa: BLE001 - Inductor does it again, and reports it then
            pass

    thread = threading.Thread(target=compute, name="kiln-inductor-prefetch", daemon=True)
    _prefetch.append(thread)
    thread.start()


def join_prefetch(timeout: float = 60.0) -> None:
    """Wait for ``_start_prefetch``'s thread, if one runs (bounded: Inductor computes what
    is left itself)."""
    if _prefetch and _prefetch[0].is_alive() and _prefetch[0] is not threading.current_thread():
        _prefetch[0].join(timeout)


def inductor_boxed_bool(value: bool) -> Any:
    from torch._inductor.utils import BoxedBool

    return BoxedBool(value)


def inductor_decompositions() -> dict:
    """Inductor's decomposition table for the current Inductor config (it depends on
    ``fallback_random``). Some decompositions read ``torch._inductor.lowering`` as an
    attribute when they run (max-pool's asks which pools Inductor lowers), which only works
    once that module is imported: a process that never ran torch.compile has not."""
    import torch._inductor.lowering  # noqa: F401
    from torch._inductor.decomposition import select_decomp_table

    return dict(select_decomp_table())


def inductor_joint_graph_passes(gm: torch.fx.GraphModule, input_device=None) -> torch.fx.GraphModule:
    """Inductor's passes over a joint (or inference) ATen graph before partitioning: pattern
    rewrites (attention to SDPA, pointless views and conversions), constant folding."""
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes

    if not inductor_config().use_joint_graph_passes:
        return gm
    return joint_graph_passes(gm, input_device)


def inductor_view_to_reshape(gm: torch.fx.GraphModule) -> None:
    """Every ``aten.view`` becomes ``aten.reshape`` (Inductor's own first step: its outputs may
    have other strides than the trace said)."""
    from torch._inductor.fx_passes.post_grad import view_to_reshape

    view_to_reshape(gm)


def inductor_mode_options(mode: str | None, dynamic: bool | None = None) -> dict:
    """The Inductor config a torch.compile ``mode`` stands for."""
    if not mode or mode == "default":
        return {}
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode, dynamic))


def backward_keeps_graph() -> bool:
    """Inside a backward: whether autograd keeps the graph (``retain_graph=True``), so saved
    tensors will be read again."""
    return bool(torch._C._autograd._get_current_graph_task_keep_graph())


class DonatedSavedTensors:
    """What Inductor reads from ``TracingContext.fw_metadata`` when it compiles a backward: the
    positions of saved tensors whose memory the backward may reuse (``bw_donated_idxs``)."""

    def __init__(self, bw_donated_idxs: list[int]):
        self.bw_donated_idxs = list(bw_donated_idxs)


def load_tensors(data: bytes, map_location: Any = None) -> Any:
    """``torch.load(weights_only=True)`` of kiln's own bytes, as real tensors wherever it is
    called: torch.load makes meta storages when it finds a fake mode (an active one, or a
    TracingContext's, as around a user's backend), and a graph constant loaded so would fail
    at run time."""
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with tracing(None), unset_fake_temporarily():
        return torch.load(_io.BytesIO(data), weights_only=True, map_location=map_location)


def tracing_over(fake_mode: FakeTensorMode):
    """A TracingContext over ``fake_mode``: where torch's compilers (``detect_fake_mode``) find
    the fake mode, and its ShapeEnv, of the graph they are handed."""
    from torch._guards import TracingContext, tracing

    return tracing(TracingContext(fake_mode))


def inductor_compile_context(fake_mode: FakeTensorMode):
    """What Inductor expects around a compile: a TracingContext over the fake mode of the
    graph's example values (Inductor reads the ShapeEnv from it: guards it adds go there, and
    its FX graph cache re-checks them), ``V.fake_mode`` and the python dispatcher. Yields the
    TracingContext."""
    from torch._guards import TracingContext, tracing
    from torch._inductor.virtualized import V

    @contextlib.contextmanager
    def ctx():
        tc = TracingContext(fake_mode)
        # (the python dispatcher: decompositions keep sizes symbolic, as torch runs Inductor)
        with tracing(tc), V.set_fake_mode(fake_mode), python_dispatcher():
            yield tc
    return ctx()


# -- saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks) ---------------------------------

def top_saved_tensors_hooks() -> tuple | None:
    """The innermost active ``(pack, unpack)`` saved-tensor hooks, None when there are none
    (read even while kiln traces with the hooks paused)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(True) if top is not None else None


def applied_saved_tensors_hooks() -> tuple | None:
    """The saved-tensor hooks autograd applies now: None also while kiln pauses them."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


def saved_tensors_hooks_paused():
    """While kiln traces (fake tensors, tracing the joint graph), the user's saved-tensor hooks
    must not see kiln's tracing values: autograd then ignores the hooks stack (torch's
    'tracing' flag; the hooks stay registered and apply again on exit). Also used around the
    compiled autograd.Function when the hooks were inlined into its graphs, so they do not run
    a second time in eager."""
    return _SavedTensorsHooksPaused()


class saved_tensors_from_user_hooks:
    """Around a compiled backward whose saved tensors came back through the user's eager
    unpack hook: a hook may keep what it returns (or return a tensor it holds), so the backward
    must not reuse their memory (``active`` is read by the Inductor backward's donation)."""
    active = False

    def __enter__(self):
        self.prior = saved_tensors_from_user_hooks.active
        saved_tensors_from_user_hooks.active = True

    def __exit__(self, *exc):
        saved_tensors_from_user_hooks.active = self.prior


class _SavedTensorsHooksPaused:
    __slots__ = ("prior",)

    def __enter__(self):
        self.prior = torch._C._autograd._saved_tensors_hooks_set_tracing(True)

    def __exit__(self, *exc):
        torch._C._autograd._saved_tensors_hooks_set_tracing(self.prior)


# -- NumPy on tensors (torch._numpy) -------------------------------------------------------------
# NumPy's own defaults: what eager NumPy code computes in. torch._numpy reads its default dtypes
# lazily from a config module kiln never imports; kiln sets them on torch._numpy first, and
# does not trace NumPy code if someone else set other defaults.
def numpy_on_tensors():
    """``torch._numpy`` with NumPy's default dtypes (float64, complex128, int64), or None
    when its defaults were set to something else (then NumPy code is not traced)."""
    import torch._numpy as tnp
    from torch._numpy import _dtypes_impl

    numpy_defaults = _dtypes_impl.DefaultDTypes(float_dtype=torch.float64,
                                                complex_dtype=torch.complex128,
                                                int_dtype=torch.int64)
    if _dtypes_impl._default_dtypes is None:
        _dtypes_impl._default_dtypes = numpy_defaults
    if tuple(_dtypes_impl._default_dtypes) != tuple(numpy_defaults):
        return None
    return tnp


# -- activation checkpointing --------------------------------------------------------------------
_checkpoint_default: tuple | None = None


def checkpoint_default_mode() -> tuple[bool | None, str | None]:
    """What this torch's ``torch.utils.checkpoint.checkpoint`` does when ``use_reentrant`` is
    not given: ``(reentrant, warning)``, where ``reentrant`` is True or False, or None when
    the call raises; ``warning`` is the message it warns with (None: no warning). Learnt once
    by calling it on a tiny function: torch 2.11 to 2.13 warn and take the reentrant variant,
    and the message announces an error for later versions. The function is called without
    its ``torch._disable_dynamo`` wrapper, which would hand it to torch._dynamo."""
    global _checkpoint_default
    if _checkpoint_default is None:
        import inspect
        import warnings

        import torch.utils.checkpoint

        checkpoint = inspect.unwrap(torch.utils.checkpoint.checkpoint)

        x = torch.zeros((), requires_grad=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = checkpoint(torch.neg, x)
                reentrant = out.grad_fn is not None and "Checkpoint" in type(out.grad_fn).__name__
            except Exception:
                reentrant = None
        message = next((str(w.message) for w in caught if "use_reentrant" in str(w.message)), None)
        _checkpoint_default = (reentrant, message)
    return _checkpoint_default


def current_cuda_device() -> int | None:
    """This process's current CUDA device; None without CUDA. Before CUDA is initialized here
    that is device 0 (asking would initialize it), the one it would then be: the answer does not
    change when CUDA starts later in the process."""
    if torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0 if torch.cuda.is_available() else None


def distributed_job() -> tuple[Any, int, int] | None:
    """(the default process group's key-value store, this rank, the world size) when
    torch.distributed is initialized with more than one rank, else None. (Not imported here
    when the program never imported torch.distributed.)"""
    import sys
    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.get_world_size()
    if world < 2:
        return None
    from torch.distributed import distributed_c10d
    return distributed_c10d._get_default_store(), dist.get_rank(), world


# -- DistributedDataParallel ----------------------------------------------------------------
# kiln runs DDP's bookkeeping as torch runs it (outside any graph) and compiles the module it
# wraps; these read the DDP internals that takes. DDP's class attribute
# ``_active_ddp_module`` is the protocol DDP keeps for compilers: set while the wrapped module
# runs (``DistributedDataParallel._inside_ddp_forward``), read where a graph is finished.

@_functools.lru_cache(maxsize=None)
def ddp_class() -> type | None:
    """``DistributedDataParallel``, or None where torch.distributed is not built."""
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel


def is_ddp(obj: Any) -> bool:
    cls = ddp_class()
    return cls is not None and isinstance(obj, cls)


def active_ddp_module() -> torch.nn.Module | None:
    """The DDP module whose wrapped module is running now (on any wrapping: ``DDP(kiln.compile(m))``
    too), or None."""
    cls = ddp_class()
    return None if cls is None else getattr(cls, "_active_ddp_module", None)


def ddp_runs_plainly(ddp: torch.nn.Module) -> bool:
    """Whether ``run_ddp_forward`` can stand for ``ddp(...)``: no hooks on the DDP module itself
    (nor global ones), and the wrapped module is called (not only its ``forward``, as when every
    parameter's all-reduce is delayed)."""
    return (module_hooks_empty(ddp) and not any(global_module_hooks())
            and not getattr(ddp, "_delay_all_reduce_all_params", False)
            and all(hasattr(ddp, a) for a in ("_pre_forward", "_post_forward", "_use_python_reducer")))


def run_ddp_forward(ddp: torch.nn.Module, call_module: Callable, args: tuple, kwargs: dict) -> Any:
    """``DistributedDataParallel.forward`` with the wrapped module's call made by
    ``call_module(module, *inputs, **kwargs)``: the same steps, in the same order (its
    ``_pre_forward`` prepares the reducer and moves the inputs, ``_post_forward`` tells the
    reducer which outputs the backward starts from). Only where ``ddp_runs_plainly``."""
    cls = type(ddp)
    with torch.autograd.profiler.record_function("DistributedDataParallel.forward"):
        inputs, kwargs = ddp._pre_forward(*args, **kwargs)
        if ddp._use_python_reducer:
            output = call_module(ddp.module, *inputs, **kwargs)
        else:
            # what ``_inside_ddp_forward`` does (entered without its torch._dynamo wrapper)
            old = cls._active_ddp_module
            cls._active_ddp_module = ddp
            try:
                output = call_module(ddp.module, *inputs, **kwargs)
            finally:
                cls._active_ddp_module = old
        return ddp._post_forward(output)


def ddp_bucket_caps(ddp: torch.nn.Module) -> tuple[int, int]:
    """(first bucket's cap, other buckets' cap) in bytes, as this DDP module's reducer fills its
    buckets (parameters in reverse order; the first bucket is the 1 MiB default unless
    ``bucket_cap_mb`` was given)."""
    cap = int(ddp.bucket_bytes_cap)
    config = getattr(ddp, "_bucket_config", None)
    if config is not None:
        return int(config.first_bucket_bytes_cap), cap
    first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES if getattr(ddp, "bucket_bytes_cap_default", False) else cap
    return min(first, cap), cap


def ddp_bucketed_parameters(ddp: torch.nn.Module) -> dict[int, torch.Tensor]:
    """id -> parameter, for the parameters whose gradients this DDP module all-reduces
    (requiring grad, not in ``parameters_to_ignore``)."""
    ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
    return {id(p): p for name, p in ddp.module.named_parameters()
            if p.requires_grad and name not in ignored and not getattr(p, "_ddp_ignored", False)}


def has_static_address(t: torch.Tensor) -> bool:
    """Whether ``t`` was marked with ``torch._dynamo.mark_static_address`` (Hugging Face's static
    KV cache marks its tensors so): its address stays the same from call to call, so CUDA graphs
    read and write it in place, as a parameter. (Read from the attribute the mark sets: kiln
    never calls torch._dynamo.)"""
    return getattr(t, "_dynamo_static_input_type", None) is not None


# -- DTensor (tensor parallel) --------------------------------------------------------------
# ``parallelize_module`` turns a module's parameters into DTensors and adds hooks that
# redistribute its inputs and outputs (collectives). kiln compiles no DTensor program: such a
# module is called as it is, outside the graph, and the code around it is compiled.

def dtensor_class() -> type | None:
    """``torch.distributed.tensor.DTensor`` where it is imported, else None. Read from
    ``sys.modules``: a program that has not imported it holds no DTensor, and importing it
    (half a second) would slow every capture down."""
    module = _sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def is_dtensor(obj: Any) -> bool:
    cls = dtensor_class()
    return cls is not None and isinstance(obj, cls)


def holds_dtensors(module: torch.nn.Module) -> bool:
    """Whether ``module``'s own parameters or buffers (not its children's) include a DTensor:
    a module ``parallelize_module`` or ``distribute_module`` distributed."""
    if dtensor_class() is None:
        return False
    return any(is_dtensor(t) for t in (*module._parameters.values(), *module._buffers.values()))


def async_collective_tensor_class() -> type | None:
    """The wrapper a functional collective's result comes in (what ``RowwiseParallel``'s output
    ``to_local()`` returns), waited for at its first use; None where it is not imported (then
    there is none to see)."""
    module = _sys.modules.get("torch.distributed._functional_collectives")
    return getattr(module, "AsyncCollectiveTensor", None)


class _WaitedCollective(torch.autograd.Function):
    """An AsyncCollectiveTensor as the plain tensor it stands for, waited for now, on the same
    autograd path (the gradient goes to the wrapper's own grad_fn unchanged, as in eager where
    any op on the wrapper unwraps it)."""

    @staticmethod
    def forward(ctx, act):
        # (a fresh alias: the wrapper's inner tensor keeps its own autograd state. A view,
        # as the wrapper eager hands on is one: writing it in place is refused as in eager)
        return act.trigger_wait().view_as(act.elem)

    @staticmethod
    def backward(ctx, grad):
        return grad


def waited_collective(t: Any) -> Any:
    """``t`` as a plain tensor where it is an AsyncCollectiveTensor; otherwise ``t``."""
    cls = async_collective_tensor_class()
    if cls is None or type(t) is not cls:
        return t
    if t.requires_grad and torch.is_grad_enabled():
        return _WaitedCollective.apply(t)
    return t.trigger_wait()


def optimizer_init_group_under_dynamo(fn: Any) -> Callable | None:
    """The optimizer's own ``_init_group`` where ``fn`` is the ``torch._dynamo.disable``
    wrapper that torch.compile's first compile in a process puts on every ``torch.optim``
    class's ``_init_group`` (dynamo runs that method itself, outside its graphs). The
    marker is for dynamo, not a property of the method: eager runs it as it is, and so does
    a kiln capture, which then sees the same code with or without torch.compile in the
    process. None for any other function."""
    if not getattr(fn, "_torchdynamo_disable", False):
        return None
    original = getattr(fn, "__wrapped__", None)
    if getattr(original, "__name__", None) != "_init_group" or \
            not (getattr(original, "__module__", None) or "").startswith("torch.optim."):
        return None
    return original


def runs_outside_graphs(fn: Any) -> bool:
    """Whether torch marked ``fn`` to run outside compiled graphs: a wrapper that hands its
    work to ``torch._dynamo.disable`` when called (``torch._disable_dynamo``'s, FSDP2's hooks')
    or one ``torch._dynamo.disable`` made (told by the flag it sets). Read from the code's names,
    without importing torch._dynamo."""
    if getattr(fn, "_torchdynamo_disable", False):
        return True
    code = getattr(fn, "__code__", None)
    return code is not None and "_dynamo" in code.co_names and "disable" in code.co_names
