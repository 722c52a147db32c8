"""AOT autograd backends: ``aot_backend(fw_compiler, bw_compiler=None, partition_fn=None)``
builds a kiln backend that runs kiln's staged AOT autograd (``kiln.aot``) on each captured
graph and compiles the forward and backward graphs with the given compilers; ``"aot_eager"``
is that backend with both graphs run as FX, no decompositions and the min-cut partitioner (as
torch.compile's ``aot_eager``).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch.fx

from .. import cache
from ..aot import fallback_entries
from ..aot.compile import AOTCompiled, run_as_fx
from ..aot.dynamic import OUTSIDE_THE_TRACE, PerShapeCompiled, compile_graph, per_shape
from ..aot.export import AOTArtifact, fake_mode_of_graph
from ..config import config
from ..cudagraphs import cudagraph_compiler
from ..internal_errors import is_kiln_backend, user_callable
from .registry import register_backend


def aot_backend(fw_compiler: Callable | None = None, bw_compiler: Callable | None = None,
                partition_fn: Any = None, inference_compiler: Callable | None = None,
                decompositions: dict | None = None, cache_key: str | None = None,
                keep_input_mutations: bool = False) -> Callable:
    """A kiln backend ``(gm, example_inputs) -> callable`` running kiln's AOT autograd.

    ``fw_compiler``/``bw_compiler``/``inference_compiler`` are ``(gm, example_inputs) ->
    callable`` (torch's backend convention) and receive functional ATen graphs with fake example
    inputs; ``bw_compiler`` and ``inference_compiler`` default to ``fw_compiler``, which defaults
    to running the graph as FX. ``partition_fn``: ``"default"``, ``"min_cut"`` or a callable
    (see ``kiln.aot.partition``); None means ``kiln.config.aot_partition_fn``.

    ``keep_input_mutations``: the graphs write the inputs they mutate where autograd does not
    track the write (BatchNorm running statistics, buffers updated under no_grad): the forward
    and inference graphs then end with ``aten.copy_(placeholder, new_value)`` nodes, which your
    compilers must run, instead of returning the new values for the runtime to copy back (as
    torch's ``keep_inference_input_mutations``; ``aot_eager`` and ``inductor`` do it).

    ``cache_key``: a string that names what your compilers, partitioner and decompositions do
    (change it when their code changes). With it the AOT result (graphs and runtime wrappers) is
    stored in kiln's compile cache, and a later process runs your compilers on the loaded
    graphs instead of tracing again. Without it, a backend with your own code is not cached
    (``KILN_LOGS=cache`` says so). ``kiln.backends.register_backend(name, fn, cache_key=...)`` sets it too.

    A dynamic graph (symbolic placeholders) is traced once with its symbols; where that is not
    possible, or a call does not fit the symbolic trace, it is compiled per concrete input
    shapes (``kiln.aot.dynamic``).
    """
    # A compiler the user passes is the user's code: its exceptions propagate (not a fallback)
    def users(c):
        return c if c is None or is_kiln_backend(c) else user_callable(c)
    fw_compiler, bw_compiler, inference_compiler = users(fw_compiler), users(bw_compiler), users(inference_compiler)

    # Without a cache_key only the plain configurations are cached: user compilers and
    # decompositions are code the key cannot see.
    # (decompositions: torch's core ATen table, or none at all, as aot_eager: both nameable)
    decomposition_name = "core_aten" if decompositions is None else ("none" if not decompositions else None)
    plain = (fw_compiler is None and bw_compiler is None and inference_compiler is None
             and decomposition_name is not None and (partition_fn is None or isinstance(partition_fn, str)))

    def kiln_aot_backend(gm: torch.fx.GraphModule, example_inputs: list):
        example_inputs = list(example_inputs)
        # kiln.config.cudagraphs: each compiled graph replays as CUDA graphs. A post-compile
        # step (the graphs are wrapped, not changed): a cached entry is the same with or
        # without it, and a load applies it (load_cudagraphs).
        compilers = _with_cudagraphs(fw_compiler, bw_compiler, inference_compiler) if config.cudagraphs \
            else (fw_compiler, bw_compiler, inference_compiler)

        fw, bw, inf = compilers
        stages = dict(decompositions=decompositions, fw_compiler=fw, bw_compiler=bw, partition_fn=partition_fn,
                      inference_compiler=inf, keep_input_mutations=keep_input_mutations)

        def compile():
            started = time.perf_counter()
            compiled = _saving_shapes(compile_graph(gm, example_inputs, **stages))
            _note_stage_times(compiled, time.perf_counter() - started)
            return compiled
        user_key = getattr(kiln_aot_backend, "cache_key", None)
        partitioner = partition_fn if partition_fn is not None else config.aot_partition_fn
        if user_key is None and not plain:
            cache.bypass(gm, "aot_backend with your own compilers, partitioner or decompositions and no "
                             "cache_key (code the key cannot see): pass aot_backend(..., cache_key=...)")
            return compile()
        if user_key is None and not isinstance(partitioner, str):
            cache.bypass(gm, "kiln.config.aot_partition_fn is a callable (not keyable)")
            return compile()
        options = {"partition_fn": partitioner if isinstance(partitioner, str) else _name_of(partitioner),
                   "decompositions": decomposition_name if decomposition_name is not None
                   else sorted(str(op) for op in decompositions),
                   "input_mutations": "written by the graph" if keep_input_mutations else "copied back"}
        if user_key is not None:
            options["cache_key"] = str(user_key)
            options["compilers"] = [_name_of(c) for c in (fw_compiler, bw_compiler, inference_compiler)]

        def load(payload: bytes, g: torch.fx.GraphModule, rename: dict):
            # (the user's compilers, with kiln.config.cudagraphs wrapped as for a compile)
            started = time.perf_counter()
            compiled = _load_artifact(payload, g, compilers, rename, stages)
            _set_stage_times(compiled, {"load": time.perf_counter() - started})
            return compiled
        # (kiln's own stages name a device only in the artifact; a user's compilers may bake one in)
        return cache.cached(gm, example_inputs, backend="aot_eager" if user_key is None else "aot_backend",
                            options=options, compile=compile, load=load, dump=_dump_artifact,
                            rebind=_rebind_artifact if user_key is None else None,
                            shares_backwards=user_key is None and not config.cudagraphs)

    def load_artifact(payload: bytes, g: torch.fx.GraphModule):
        """The AOT result rebuilt from a cache payload (a package's artifact): no tracing."""
        compilers = _with_cudagraphs(fw_compiler, bw_compiler, inference_compiler) if config.cudagraphs \
            else (fw_compiler, bw_compiler, inference_compiler)
        return _load_artifact(payload, g, compilers, {}, stages_for(compilers))

    def stages_for(compilers: tuple) -> dict:
        fw, bw, inf = compilers
        return dict(decompositions=decompositions, fw_compiler=fw, bw_compiler=bw, partition_fn=partition_fn,
                    inference_compiler=inf, keep_input_mutations=keep_input_mutations)

    kiln_aot_backend.load_artifact = load_artifact
    kiln_aot_backend.__name__ = "aot_backend"
    kiln_aot_backend.cache_key = cache_key
    kiln_aot_backend.fw_compiler = getattr(fw_compiler, "__wrapped__", fw_compiler)
    kiln_aot_backend.bw_compiler = getattr(bw_compiler, "__wrapped__", bw_compiler)
    kiln_aot_backend.partition_fn = partition_fn
    kiln_aot_backend.kiln_regions = True    # (the capture hands it repeated blocks as invoke_region nodes)
    return kiln_aot_backend


def _note_stage_times(compiled, seconds: float) -> None:
    """The compile's stages (the ``perf`` log, the trace): AOT tracing and partitioning; the
    user's compilers, if any, count as part of ``aot``."""
    partition = getattr(getattr(compiled, "parts", None), "partition_seconds", 0.0)
    _set_stage_times(compiled, {"aot": seconds - partition, "partition": partition})


def _set_stage_times(compiled, seconds: dict) -> None:
    try:
        compiled.kiln_compile_seconds = seconds
    except AttributeError:      # (a result that takes no attributes: the backend's total is logged)
        pass


def _name_of(fn: Any) -> str | None:
    if fn is None:
        return None
    fn = getattr(fn, "__wrapped__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _dump_artifact(compiled) -> bytes:
    """The cache payload of an AOT result: its parts as an AOTArtifact (a dynamic one with its
    symbolic sizes, the guards its trace added and its per-call shape check)."""
    saved = fallback_entries.dump(compiled)    # (per shape, or run as captured)
    if saved is not None:
        return saved
    if not isinstance(compiled, AOTCompiled):
        raise ValueError(f"not an AOT result ({type(compiled).__name__})")
    return AOTArtifact(compiled.parts).to_bytes()


def _saving_shapes(compiled):
    """``compiled``; a per-shape result saves each shape it compiles into its cache entry."""
    if isinstance(compiled, PerShapeCompiled):
        def saver(compile_it):
            fn = compile_it()
            try:
                return fn, _dump_artifact(fn)
            except Exception as e:  # noqa: BLE001 - a shape that cannot be saved still runs
                cache.note_not_stored(e)
                return fn, None
        compiled.saver = saver
        compiled.on_new = cache.refresher(compiled)
    return compiled


def _with_cudagraphs(fw_compiler, bw_compiler, inference_compiler) -> tuple:
    """The compilers, their results run as CUDA graphs (kiln.cudagraphs)."""
    base = fw_compiler or run_as_fx
    return (cudagraph_compiler(base, "forward"), cudagraph_compiler(bw_compiler or base, "backward"),
            cudagraph_compiler(inference_compiler or base, "inference"))


def _rebind_artifact(payload: bytes, old: int, new: int) -> bytes:
    """The payload for CUDA device ``new``, from one compiled for ``old`` (``cache.cached``)."""
    if fallback_entries.is_entry(payload):
        return fallback_entries.map_shapes(payload, lambda one: _rebind_artifact(one, old, new))
    return AOTArtifact.rebind_cuda(payload, old, new)


def _load_artifact(payload: bytes, gm: torch.fx.GraphModule, compilers: tuple = (None, None, None),
                   rename: dict | None = None, stages: dict | None = None):
    """The AOT result rebuilt from its parts: no tracing, the same callable stage 2 builds
    (with ``compilers``: those of ``kiln.config.cudagraphs``, which decide from the stored
    graphs whether and how they run as CUDA graphs). A dynamic result loads into ``gm``'s
    ShapeEnv; calls outside its symbolic trace are compiled per shape with ``stages`` (the
    options ``compile_graph`` got), as after a compile."""
    if fallback_entries.is_entry(payload):
        def make_per_shape(reason: str):
            if stages is None:
                raise ValueError("a per-shape result loads with the stages' options")
            return _saving_shapes(per_shape(gm, reason, **stages))
        return fallback_entries.load(payload, gm, make_per_shape,
                                     lambda one: _load_artifact(one, gm, compilers, rename, stages))
    compiled = AOTArtifact.from_bytes(payload, rename, fake_mode=fake_mode_of_graph(gm)).load(*compilers)
    compiled.run_as_captured = gm       # as stage2_compile: eager's answer for RunAsCaptured
    if compiled.input_check is not None:
        if stages is None:
            raise ValueError("a dynamic AOT result loads with the stages' options for its per-shape fallback")
        compiled.fallback = per_shape(gm, OUTSIDE_THE_TRACE, **stages)
    return compiled


# As torch.compile's aot_eager: no decompositions (ops stay whole, as eager runs them: the core
# ATen decompositions made kiln's aot_eager slower than eager and kept more for the backward)
# and the min-cut partitioner (saves less; recomputes cheap ops in the backward).
aot_eager = register_backend("aot_eager", aot_backend(partition_fn="min_cut", decompositions={},
                                                      keep_input_mutations=True))
