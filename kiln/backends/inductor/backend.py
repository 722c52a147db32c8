"""The ``"inductor"`` backend: kiln's AOT stages, then Inductor as a kernel generator.

One captured graph goes through:

1. kiln's AOT stages (``kiln.aot``): the inference graph when nothing needs a gradient, else
   the joint forward+backward graph, traced to ATen with Inductor's decomposition table;
2. for training, Inductor's joint-graph passes (pattern rewrites such as attention to SDPA),
   then kiln's min-cut partitioner;
3. Inductor's per-graph compiler (``compile_fx_inner``, through ``kiln._torch``), once per
   graph: the inference graph, or the forward and the backward;
4. kiln's runtime wrappers (the autograd.Function, input mutations, output aliases) around the
   generated code.

Inductor runs with its CUDA graphs off and its FX graph cache on. ``mode`` and ``options``
become Inductor config (``options.py``). With ``mode="reduce-overhead"`` (or
``kiln.config.cudagraphs``) kiln records each compiled graph as CUDA graphs itself
(``kiln.cudagraphs``), with no buffer donation in the backward (the forward's saved tensors
live in the CUDA-graph pool, where the backward reads them in place). Static graphs go through
kiln's compile cache (``cache_entry.py``): a warm process loads the generated code and the
AOT wrappers, and traces and lowers nothing.

Dynamic graphs are traced and compiled once with the capture's symbols, under a
TracingContext over the capture's fake mode: the shape facts Inductor adds while compiling go
to the capture's ShapeEnv, from which kiln builds the entry's shape guards after the backend
returns (and which the AOT callable checks on every call), and a size Inductor specializes
becomes a guard on that size.

Ops Inductor has no kernel for are not failures: its generated code calls their ATen kernel. A
graph Inductor fails to compile at all runs its ATen graph as FX instead, with a RuntimeWarning
that names the graph and the error: slower, never a failed call and never silent.
"""
from __future__ import annotations

import functools
import itertools
import time
import types
import warnings
from typing import Any, Callable

import torch
import torch.fx

from ... import _torch, cache, logs
from ...aot.compile import run_as_fx
from ...aot.dynamic import PerShapeCompiled, compile_graph
from ...aot.partition import min_cut_rematerialization_partition
from ...cache import PAYLOAD_ATTR, store
from ...compile_lock import compile_scope
from ...aot import fake_propagation, fake_tensors, fx_graphs, regions
from ...aot.donation import copies_when_graph_kept, donatable_saved_tensors
from ...config import config
from ...cudagraphs import cudagraphify, graph_facts
from ...cudagraphs.partition import try_partition
from ..registry import register_backend
from . import cache_entry, device_rebinding, generated_module, vec_isa_memo
from .cache_entry import GeneratedCode, with_triton_records
from .options import inductor_config_patches
from .progress import Progress

_graph_numbers = itertools.count(1)
_partition_numbers = itertools.count(1)   # (pairs a forward with its backward: ``kiln_partition``)


class InductorBackend:
    """``backend="inductor"``. ``configure(mode, options)`` returns the backend for a mode and
    Inductor options (one object per distinct pair, so that compile keys stay interned)."""

    __name__ = "inductor"

    def __init__(self, mode: str | None = None, options: dict | None = None):
        self.mode = mode
        self.options = dict(options or {})
        self._patches: dict | None = None
        self._configured: dict = {}

    @property
    def cudagraphs(self) -> bool:
        """Whether compiled graphs are recorded as CUDA graphs (kiln.cudagraphs)."""
        return self.mode == "reduce-overhead" or config.cudagraphs

    # the capture hands this backend repeated blocks as ``invoke_region`` nodes (CUDA graphs
    # included: a replay runs each block's kernels as recorded, and the compile-time check
    # looks inside every block)
    kiln_regions = True

    def before_capture(self) -> None:
        """Called before kiln captures a frame for this backend (a miss, not a warm start's
        load). A process that uses CUDA starts Inductor's kernel-compiling workers and the hash
        of Triton's installation now: both take seconds, and begun here they are ready by the
        time the first graph's kernels compile, instead of the compile waiting for them."""
        if torch.cuda.is_initialized():
            try:
                _torch.inductor_wake_up_workers()
            except Exception as e:      # noqa: BLE001 - only earlier than the compile would start them
                if logs.enabled.perf:
                    logs.log("perf", f"starting Inductor's compile workers early failed: {e!r}")

    @property
    def config_patches(self) -> dict:
        """The Inductor config every compile of this backend runs under."""
        if self._patches is None:
            self._patches = inductor_config_patches(self.mode, self.options)
        return self._patches

    def configure(self, mode: str | None = None, options: dict | None = None) -> "InductorBackend":
        if mode in (None, "default") and not options:
            return self
        try:
            key: Any = (mode, tuple(sorted((options or {}).items())))
            hash(key)
        except TypeError:           # an unhashable option value: a backend of its own
            key = None
        backend = self._configured.get(key) if key is not None else None
        if backend is None:
            backend = InductorBackend(mode, options)
            backend.config_patches   # validate now: a bad option fails at kiln.compile
            if key is not None:
                self._configured[key] = backend
        return backend

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        example_inputs = list(example_inputs)
        graph = GraphCompile(self.config_patches, gm, cudagraphs=self.cudagraphs)
        try:
            options = self.cache_options()
        except Exception as e:       # an Inductor config kiln cannot key: compile, uncached
            cache.bypass(gm, f"the Inductor config cannot be keyed ({type(e).__name__}: {e})")
            return graph.run(example_inputs)
        records = graph.records     # (kept by the dump a package may ask for after a cache bypass)
        late = graph.late
        try:
            compiled = with_triton_records_for_packages(cache.cached(
                gm, example_inputs, backend="inductor", options=options,
                compile=lambda: graph.run(example_inputs),
                load=lambda payload, g, rename: cache_entry.load(payload, g, self._graph_compile,
                                                                    self.cudagraphs, rename),
                dump=lambda compiled: cache_entry.dump(compiled, records, graph._fw_output_strides,
                                                           late),
                rebind=device_rebinding.rebind, shares_backwards=not self.cudagraphs))
        finally:
            graph.records = {}      # (the generated code is on disk now; the callable keeps its module)
        graph.stored_again = cache.refresher(compiled)
        return compiled

    def load_artifact(self, payload: bytes, gm: torch.fx.GraphModule) -> Callable:
        """The compiled graph rebuilt from a cache payload (a package's artifact): no AOT
        tracing, no Inductor lowering."""
        return cache_entry.load(payload, gm, self._graph_compile, self.cudagraphs, {})

    def _graph_compile(self, gm: torch.fx.GraphModule) -> "GraphCompile":
        return GraphCompile(self.config_patches, gm, cudagraphs=self.cudagraphs)

    def cache_options(self) -> dict:
        """What the cache key holds of this backend: the mode, the options, and every Inductor
        config value the compile runs under (a user's ``torch._inductor.config`` change too)."""
        import hashlib
        import json

        cfg = _torch.inductor_config()
        with cfg.patch(self.config_patches):
            portable = cfg.save_config_portable()
        text = json.dumps(portable, sort_keys=True, default=repr)
        return {"mode": self.mode, "options": json.dumps(self.options, sort_keys=True, default=repr),
                "cudagraphs": self.cudagraphs, "input_mutations": "written by the graph",
                "inductor_config": hashlib.sha256(text.encode()).hexdigest()}

    def __repr__(self) -> str:
        extra = "".join([f", mode={self.mode!r}" if self.mode else "",
                         f", options={self.options!r}" if self.options else ""])
        return f"<kiln inductor backend{extra}>"


# ------------------------------------------------------------------------------------------------
# One captured graph
# ------------------------------------------------------------------------------------------------

class GraphCompile:
    """Compiling one captured graph: the compilers and the partitioner kiln's AOT stages call,
    and what they share (the graph's number, the forward's output strides for the backward,
    the time spent in Inductor, progress on stderr)."""

    def __init__(self, patches: dict, gm: torch.fx.GraphModule, cudagraphs: bool = False):
        self.patches = patches
        self.cudagraphs = cudagraphs
        self.gm = gm
        self.number = next(_graph_numbers)
        name = type(gm).__name__
        self.function = name[5:] if name.startswith("Kiln_") else name
        self.name = f"graph #{self.number} ({self.function})"
        self.inductor_seconds = 0.0
        self.fallbacks: list[tuple[str, BaseException]] = []
        self.progress = Progress(self.name)
        self._in_run = False
        # set by the forward compile, read by the backward compile that follows it
        self._fw_output_strides: list | None = None
        self._fw_num_outputs = 0
        # the same per partition (``kiln_partition`` in both graphs' meta): one captured graph
        # may be several forward and backward pairs (a chain of parts, a compile per shape),
        # and a backward made at run time is compiled after later forwards
        self._fw_layouts: dict = {}
        # per graph kind, what the cache entry needs of Inductor's result (cache_entry)
        self.records: dict = {}
        # the same for backwards made at run time (``function.backward_key`` -> GeneratedCode),
        # compiled after the entry was written; ``stored_again()`` then writes it again
        self.late: dict = {}
        self.stored_again: Callable[[], None] | None = None

    def run(self, example_inputs: list) -> Callable:
        start = time.perf_counter()
        if any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs):
            _torch.inductor_wake_up_workers()    # (while kiln traces, as torch.compile does)
        self._in_run = True
        try:
            with self.progress, self.progress.phase("tracing (AOT)"):
                compiled = compile_graph(self.gm, example_inputs, **self.stage_options())
        finally:
            self._in_run = False
        total = time.perf_counter() - start
        partition = getattr(getattr(compiled, "parts", None), "partition_seconds", 0.0)
        compiled.kiln_compile_seconds = {"aot": total - self.inductor_seconds - partition, "partition": partition,
                                         "inductor": self.inductor_seconds}
        compiled.kiln_inductor_fallbacks = self.fallbacks
        return self.saving_shapes(compiled)

    def saving_shapes(self, compiled):
        """``compiled``; a per-shape result keeps each shape's entry (``cache_entry``) as
        it compiles it, and has the cache entry written again."""
        if isinstance(compiled, PerShapeCompiled):
            compiled.saver = self._compile_and_dump
            compiled.on_new = lambda: self.stored_again() if self.stored_again is not None else None
        return compiled

    def _compile_and_dump(self, compile_it: Callable[[], Callable]) -> tuple[Callable, bytes | None]:
        """One shape of a per-shape result compiled, with its entry's bytes (None: it has none)."""
        records, in_run, fallbacks = self.records, self._in_run, len(self.fallbacks)
        self.records, self._in_run = {}, True
        try:
            fn = compile_it()
            payload = None
            if len(self.fallbacks) == fallbacks:     # (a graph Inductor failed on: not stored)
                try:
                    payload = cache_entry.dump(fn, self.records, self._fw_output_strides, {})
                except Exception as e:  # noqa: BLE001 - a shape that cannot be saved still runs
                    cache.note_not_stored(e)
            return fn, payload
        finally:
            self.records, self._in_run = records, in_run

    def stage_options(self) -> dict:
        """The options of kiln's AOT stages for this graph (``compile_graph``'s)."""
        with _torch.inductor_config().patch(self.patches):
            decompositions = decomposition_table()
        # (the graphs write the inputs they mutate: Inductor fuses the write into the kernel
        # that computes the value, as torch.compile's graphs do)
        return dict(decompositions=decompositions, fw_compiler=self.forward, bw_compiler=self.backward,
                    inference_compiler=self.inference, partition_fn=self._partitioner(),
                    keep_input_mutations=True)

    # -- the AOT stages' hooks -------------------------------------------------------------------
    def _partitioner(self) -> Callable:
        def partition(joint, joint_inputs, *, num_fwd_outputs):
            return self.partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)
        partition.__name__ = "min_cut (after Inductor's joint-graph passes)"   # (AOT's as_text)
        return partition

    def partition(self, joint: torch.fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int):
        """Inductor's joint-graph passes, then kiln's min-cut partitioner."""
        flat = [*joint_inputs[0], *joint_inputs[1]]
        with self.progress.phase("joint-graph passes (Inductor)"):
            joint = self._joint_passes(joint, flat)
        with self.progress.phase("partitioning"):
            fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)
        fw.meta["kiln_num_fw_outputs"] = num_fwd_outputs
        fw.meta["kiln_partition"] = bw.meta["kiln_partition"] = next(_partition_numbers)
        bw.meta["kiln_num_saved"] = len(_outputs(fw)) - num_fwd_outputs
        # (CUDA graphs: the saved tensors are pool memory the backward reads in place)
        bw.meta["kiln_donated"] = [] if self.cudagraphs else donatable_saved_tensors(fw, bw, num_fwd_outputs)
        return fw, bw

    def inference(self, gm: torch.fx.GraphModule, example_inputs: list):
        return self._compile(gm, example_inputs, "inference")

    def forward(self, gm: torch.fx.GraphModule, example_inputs: list):
        return self._compile(gm, example_inputs, "forward")

    def backward(self, gm: torch.fx.GraphModule, example_inputs: list):
        return self._compile(gm, example_inputs, "backward")

    # -- internals -------------------------------------------------------------------------------
    def _joint_passes(self, joint: torch.fx.GraphModule, flat_inputs: list) -> torch.fx.GraphModule:
        mode = fake_mode_of(flat_inputs, joint)
        candidate = fx_graphs.copy_graph_module(joint)
        try:
            fake_propagation.record_val_calls(candidate.graph)
            aliasing = _outputs_aliasing_inputs(joint)
            # (autocast off, as for the compile: the passes trace their replacements, and the
            # graph's ATen ops already hold the casts)
            with _torch.inductor_config().patch(self.patches), _torch.inductor_compile_context(mode), \
                    torch._C._DisableAutocast():
                candidate = _torch.inductor_joint_graph_passes(candidate, device_of(flat_inputs))
                # (new nodes need their values; the rest keep theirs)
                fake_propagation.propagate_fake(candidate, flat_inputs, mode, keep_unchanged=True)
                _keep_outputs_fresh(candidate, aliasing, mode)
            changed = _changed_outputs(joint, candidate)
            if changed:
                raise RuntimeError(f"the passes changed the graph's outputs ({changed})")
        except Exception as e:      # the passes only optimize: partition the graph as traced
            self._note_failure("joint-graph passes", e)
            return joint
        mark_phases_of_new_nodes(candidate)
        return candidate

    def _compile(self, gm: torch.fx.GraphModule, example_inputs: list, kind: str):
        start = time.perf_counter()
        which = {"inference": "1/1 (inference)", "forward": "1/2 (forward)", "backward": "2/2 (backward)"}[kind]
        try:
            facts = None
            if self.cudagraphs:
                facts = graph_facts(gm, kind)
                pieces: list = []
                split = try_partition(gm, lambda piece, ex: self._compile_piece(piece, ex, pieces), facts)
                if split is not None:
                    if self._in_run:     # (the entry keeps each piece's module, in order)
                        self.records[kind] = pieces
                    return split
            try:
                untrusted = untrusted_lowering(gm, kind)
                if untrusted is not None:
                    raise RuntimeError(untrusted)
                with self.progress, self.progress.phase(f"Inductor, graph {which}"):
                    compiled = self._inductor(gm, list(example_inputs), kind)
                if logs.enabled.graph:
                    self._log_output_code(compiled, kind)
            except Exception as e:
                compiled = self._fallback(gm, list(example_inputs), kind, e)
            if facts is not None:
                compiled = cudagraphify(compiled, gm, kind, facts=facts)
            return compiled
        finally:
            secs = time.perf_counter() - start
            self.inductor_seconds += secs
            if not self._in_run and logs.enabled.perf:   # a per-shape compile, on a later call
                logs.log_compile_times(f"{self.name} {kind} graph, compiled at a later call (its first, or new input shapes)",
                                       {"inductor": secs}, function=self.name)

    def _log_output_code(self, compiled, kind: str) -> None:
        """Where Inductor wrote the generated module (a report links to it)."""
        path = (_torch.inductor_module_globals(compiled) or {}).get("__file__")
        if path:
            logs.event("graph", "inductor_code", f"Inductor's code for the {kind} graph of {self.name}: {path}",
                       function=self.function, graph=self.name, graph_kind=kind, path=path)

    def _compile_piece(self, piece: torch.fx.GraphModule, example_inputs: list, pieces: list):
        """One piece of CUDA ops of a split inference graph (kiln.cudagraphs.partition); what
        the cache entry keeps of it is appended to ``pieces`` (None: a piece Inductor failed on)."""
        with self.progress, self.progress.phase("Inductor, a CUDA-graph part of graph 1/1 (inference)"):
            self.records.pop("inference", None)
            try:
                compiled = self._inductor(piece, list(example_inputs), "inference")
            except Exception as e:
                compiled = self._fallback(piece, list(example_inputs), "inference", e)
            pieces.append(self.records.pop("inference", None))
            return compiled

    def _inductor(self, gm: torch.fx.GraphModule, example_inputs: list, kind: str):
        device = device_of(example_inputs)
        cpu = device is None or device.type == "cpu"
        with compile_scope(config.pause_gc_while_compiling):      # (also a compile at run time: a late backward, new shapes)
            if cpu:     # (this machine's vector ISAs, when an earlier process probed them)
                vec_isa_memo.prime(config.cache_dir)
            try:
                return self._inductor_compile(gm, example_inputs, kind)
            finally:
                if cpu:
                    vec_isa_memo.remember(config.cache_dir)

    def _inductor_compile(self, gm: torch.fx.GraphModule, example_inputs: list, kind: str):
        cfg = _torch.inductor_config()
        mode = fake_mode_of(example_inputs, gm)
        graph = fx_graphs.copy_graph_module(gm)      # Inductor rewrites the graph it compiles
        if regions.has_regions(graph):
            regions.to_inductor(graph)
            _torch.inductor_skip_input_asserts_of_subgraphs(regions.UNCHECKED_INPUTS_PREFIX)
        fx_graphs.without_kiln_meta(graph)
        if kind == "forward":
            self._fw_output_strides = None
            self._fw_num_outputs = gm.meta.get("kiln_num_fw_outputs", len(_outputs(gm)))
        with cfg.patch(self.patches), torch.no_grad(), torch._C._DisableAutocast():
            if kind == "inference":      # (training graphs had them before partitioning)
                aliasing = _outputs_aliasing_inputs(graph)
                with _torch.inductor_compile_context(mode):
                    graph = _torch.inductor_joint_graph_passes(graph, device_of(example_inputs))
                    _keep_outputs_fresh(graph, aliasing, mode)
            donated = gm.meta.get("kiln_donated", []) if kind == "backward" else []
            if donated and _has_subgraphs(gm):
                # (Inductor lowers a subgraph, a repeated block or a branch or body of cond,
                # while_loop, scan..., with its parent's donated input positions: it would
                # write into the subgraph's own inputs at those positions, a parameter among them)
                donated = []
            if kind == "backward":
                example_inputs = self._restride_saved(gm, example_inputs, mode)
                # (the names say which inputs are donated: Inductor's FX graph cache keys on
                # the graph's code, not on the donation)
                mark_donated_placeholders(graph, donated)
            if mode.shape_env is None:
                # a static graph: compiled under a mode with a ShapeEnv, which Inductor's FX
                # graph cache needs (Inductor recomputes the graph's fake values from these)
                mode = _torch.static_fake_mode()
                example_inputs = [_torch.static_fake(mode, t) if isinstance(t, torch.Tensor) else t
                                  for t in example_inputs]
            mark_user_visible_outputs(graph, kind, cfg, num_fw_outputs=gm.meta.get("kiln_num_fw_outputs"))
            # Inductor's FX graph cache re-checks, on a hit, only the guards on the graph's SymInt
            # inputs (dynamo lifts every size symbol to one); kiln's graphs read most sizes from
            # tensors, so a hit would drop the shape facts of the first compile: not for them.
            graph_patches = {"fx_graph_cache": False} if _has_symbols(example_inputs) else {}
            from ...activations import stream_ops  # waits: its custom ops; a package load needs none

            if stream_ops.in_graph(graph.graph):
                # Inductor's peak-memory reordering sees no memory in a copy that is in
                # flight (the device buffer of kiln::prefetch is allocated inside the opaque
                # op): it would start every copy back at the top of the backward. kiln's
                # schedule (aot/saved_hooks_schedule.py) is this graph's memory plan.
                graph_patches["reorder_for_peak_memory"] = False
            fake_propagation.complete_subgraph_vals(graph)     # (a loaded graph's branches)
            static = [] if kind == "backward" else [
                i for i, p in enumerate(_placeholders(gm)) if p.meta.get("kiln_static")]
            with _torch.inductor_compile_context(mode) as tracing, cfg.patch(graph_patches):
                if kind == "forward":
                    tracing.output_strides = []
                if donated:
                    tracing.fw_metadata = _torch.DonatedSavedTensors(donated)
                compiled = _torch.inductor_compile_graph(
                    graph, example_inputs, static_input_idxs=static, is_inference=kind == "inference",
                    is_backward=kind == "backward", graph_id=self.number,
                    cudagraphs=_torch.inductor_boxed_bool(False), cpp_wrapper=bool(cfg.cpp_wrapper))
                if kind == "forward":
                    self._fw_output_strides = list(tracing.output_strides or [])
                    if "kiln_partition" in gm.meta:
                        self._fw_layouts[gm.meta["kiln_partition"]] = (self._fw_output_strides,
                                                                        self._fw_num_outputs)
        late_key = gm.meta.get("kiln_backward_key") if kind == "backward" and not self.cudagraphs else None
        if self._in_run:
            self.records[kind] = self._generated_code(compiled, kind, donated)
        elif late_key is not None:  # (a backward made at run time: the entry takes it too)
            self.late[late_key] = self._generated_code(compiled, kind, donated, gm.meta.get("kiln_kept_inputs"))
            if self.stored_again is not None:
                self.stored_again()
        return copies_when_graph_kept(compiled, donated) if donated else compiled

    @staticmethod
    def _generated_code(compiled: Callable, kind: str, donated: list, kept: list | None = None):
        """What the cache entry keeps of Inductor's result (``cache_entry.GeneratedCode``)."""
        code = _torch.inductor_generated_code(compiled)
        if code is not None:
            # (how a later process loads the module and its kernels without Inductor)
            module_globals = _torch.inductor_module_globals(compiled)
            code["fast"] = generated_module.describe(code["source_code"], module_globals)
            record = generated_module.triton_recorder(code["fast"], module_globals,
                                                      store.kernels_dir() if config.cache else None)
            if record is not None:
                _torch.inductor_after_first_call(compiled, record)
        return GeneratedCode(kind, code, donated, kept)

    def _restride_saved(self, bw: torch.fx.GraphModule, example_inputs: list, mode) -> list:
        """The backward's saved inputs with the strides the compiled forward really returns them
        with (Inductor may choose other layouts for values only the backward reads)."""
        strides, num_outputs = self._fw_layouts.get(bw.meta.get("kiln_partition"),
                                                    (self._fw_output_strides, self._fw_num_outputs))
        if not strides:
            return example_inputs
        n_saved = bw.meta.get("kiln_num_saved", 0)
        # (a backward that reads some saved values only: which forward outputs they are)
        positions = bw.meta.get("kiln_saved_positions") or range(n_saved)
        out = list(example_inputs)
        for j in range(min(n_saved, len(out))):
            k = num_outputs + positions[j]
            t = out[j]
            if k >= len(strides) or strides[k] is None or not isinstance(t, torch.Tensor):
                continue
            if any(_torch.is_symbolic(v) for v in (*t.shape, *t.stride(), t.storage_offset())):
                continue        # dynamic graphs: Inductor keeps the traced layouts
            real = tuple(int(s) for s in strides[k])
            if real != tuple(t.stride()):
                with mode:
                    out[j] = t.as_strided(t.shape, real, t.storage_offset())
        return out

    def _fallback(self, gm: torch.fx.GraphModule, example_inputs: list, kind: str, error: BaseException):
        self._note_failure(f"the {kind} graph", error)
        graph = fx_graphs.copy_graph_module(gm)
        if kind == "backward":
            # saved values may come from an Inductor forward with other strides than traced
            _torch.inductor_view_to_reshape(graph)
        return run_as_fx(graph, example_inputs)

    def _note_failure(self, what: str, error: BaseException) -> None:
        self.fallbacks.append((what, _without_tracebacks(error)))
        first = (str(error).strip().splitlines() or [""])[0][:300]
        action = ("it runs as ATen ops (FX) instead" if what.startswith("the ")
                  else "the graph is partitioned without them")
        warnings.warn(f"kiln: Inductor failed on {what} of {self.name}: {type(error).__name__}: {first}; "
                      f"{action}.{cpp_compiler_hint(error)}", RuntimeWarning, stacklevel=2)


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------

def _changed_outputs(before: torch.fx.GraphModule, after: torch.fx.GraphModule) -> str:
    """Where the outputs of ``after`` differ from ``before``'s in number, shape or dtype ('' where
    they do not): a graph pass that only optimizes never changes them (on torch 2.11 with CUDA
    one turned float32 outputs of a training graph under autocast into bfloat16 ones, which the
    tangents traced for them then did not match)."""
    a, b = _outputs(before), _outputs(after)
    if len(a) != len(b):
        return f"{len(a)} outputs, then {len(b)}"
    for k, (x, y) in enumerate(zip(a, b)):
        vx = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        vy = y.meta.get("val") if isinstance(y, torch.fx.Node) else None
        if isinstance(vx, torch.Tensor) and isinstance(vy, torch.Tensor) and \
                (vx.dtype != vy.dtype or tuple(vx.shape) != tuple(vy.shape)):
            return f"output {k}: {vx.dtype} {tuple(vx.shape)}, then {vy.dtype} {tuple(vy.shape)}"
    return ""


def _outputs_aliasing_inputs(gm: torch.fx.GraphModule) -> list[bool]:
    """Per output of ``gm``, whether its value shares memory with an input's."""
    inputs = {fake_tensors.fake_storage(p.meta.get("val")) for p in _placeholders(gm)} - {None}
    return [isinstance(o, torch.fx.Node) and fake_tensors.fake_storage(o.meta.get("val")) in inputs
            for o in _outputs(gm)]


def _keep_outputs_fresh(gm: torch.fx.GraphModule, aliasing: list[bool], mode) -> None:
    """An output that shares no memory with an input before Inductor's graph passes, and an
    input itself (or a view of one) after them, is copied. A pass that removes a no-op
    (``x * 1``, a multiply by a one-element tensor of ones) hands the input back, where
    eager's output is new memory: a write to it would write the input."""
    after = _outputs_aliasing_inputs(gm)
    if len(after) != len(aliasing) or not any(a and not b for a, b in zip(after, aliasing)):
        return
    out = _output_node(gm)
    vals = _outputs(gm)
    for k, node in enumerate(vals):
        if after[k] and not aliasing[k]:
            with gm.graph.inserting_before(out):
                copy = gm.graph.call_function(torch.ops.aten.clone.default, (node,))
            with mode:
                copy.meta["val"] = torch.ops.aten.clone.default(node.meta["val"])
            vals[k] = copy
    single = not isinstance(out.args[0], (tuple, list))
    out.args = (vals[0] if single else type(out.args[0])(vals),)
    gm.recompile()


def with_triton_records_for_packages(compiled: Callable) -> Callable:
    """``compiled`` whose package payload carries its graphs' recorded Triton kernels (the
    cache's entry, written before the first call, does not)."""
    payload = getattr(compiled, PAYLOAD_ATTR, None)
    if payload is not None:
        try:
            setattr(compiled, PAYLOAD_ATTR, lambda c: with_triton_records(payload(c)))
        except (AttributeError, TypeError):
            pass
    return compiled


def _without_tracebacks(error: BaseException) -> BaseException:
    """``error`` (and the exceptions it chains or wraps) with no traceback and no frame: a kept
    traceback or frame keeps its locals, and those are the compile's tensors (the caller's first
    inputs among them). Inductor's errors wrap the inner exception and keep a frame of their own
    (``InductorError.first_useful_frame``)."""
    seen = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        for name, value in list(getattr(e, "__dict__", {}).items()):
            if isinstance(value, (types.FrameType, types.TracebackType)):
                setattr(e, name, None)
            elif isinstance(value, BaseException):
                todo.append(value)
    return error


def decomposition_table() -> dict:
    """Inductor's decompositions for the current Inductor config, as kiln's AOT traces with
    them: CompositeImplicitAutograd entries dropped (they never reach a post-autograd trace),
    and with ``fallback_random`` random ops kept whole, so they draw eager's numbers."""
    keep_random = _torch.inductor_config().fallback_random
    table = {}
    for op, fn in _torch.inductor_decompositions().items():
        if isinstance(fn, functools.partial) and getattr(fn.func, "__name__", "") == "_special_op_to_decompose_cia":
            continue
        if keep_random and isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags:
            continue
        table[op] = fn
    return table


def untrusted_lowering(gm: torch.fx.GraphModule, kind: str) -> str | None:
    """Why Inductor must not compile ``gm``, where its lowering of an op in it is known to
    give wrong values (None: none known); torch.compile's own Inductor gives the same wrong
    values:

    - a backward graph calling ``scan`` (the scan of the gradients): Inductor's scan lowering
      drops the gradient that flows in through the final carry;
    - average pooling's backward with ``ceil_mode=True`` and ``count_include_pad=True``: a
      last window that overhangs the padded input gets another divisor than eager's
      (``F.avg_pool2d(x, 2, 2, ceil_mode=True)`` on an odd size)."""
    if kind == "backward" and any(n.op == "call_function" and n.target is torch.ops.higher_order.scan
                                  for n in gm.graph.nodes):
        return "Inductor's scan lowering gives wrong gradients through a scan's final carry"
    if any(_pads_overhanging_windows(n) for n in gm.graph.nodes):
        return ("Inductor's average-pooling backward with ceil_mode=True and count_include_pad=True "
                "gives wrong gradients for a window that overhangs the input")
    return None


def _pads_overhanging_windows(n: torch.fx.Node) -> bool:
    """``avg_pool{2,3}d_backward(grad, x, kernel, stride, padding, ceil_mode, count_include_pad, ...)``
    with both ``ceil_mode`` and ``count_include_pad`` (the backward op names each)."""
    if n.op != "call_function" or n.target not in (torch.ops.aten.avg_pool2d_backward.default,
                                                   torch.ops.aten.avg_pool3d_backward.default):
        return False
    args = dict(zip(("grad_output", "self", "kernel_size", "stride", "padding", "ceil_mode",
                     "count_include_pad"), n.args)) | n.kwargs
    return bool(args.get("ceil_mode")) and bool(args.get("count_include_pad"))


def mark_donated_placeholders(gm: torch.fx.GraphModule, donated: list[int]) -> None:
    phs = _placeholders(gm)
    taken = {n.name for n in gm.graph.nodes}
    for j in donated:
        name = f"{phs[j].name}_donated"
        while name in taken:
            name += "_"
        taken.add(name)
        phs[j].name = phs[j].target = name
    gm.recompile()


def mark_phases_of_new_nodes(joint: torch.fx.GraphModule) -> None:
    """Nodes the joint-graph passes created have no ``kiln_phase``: one that reads a backward
    value (or a tangent) is backward too, any other is forward. Without this, a rewritten
    backward pattern (nll_loss's gradient becomes ``where(iota == target, ...)``) would look
    like forward work to the partitioner, which would then save its large results."""
    for n in joint.graph.nodes:
        if n.op in ("placeholder", "output") or "kiln_phase" in n.meta:
            continue
        backward = any(a.meta.get("kiln_phase") == "backward" or a.meta.get("kiln_tangent")
                       for a in n.all_input_nodes)
        n.meta["kiln_phase"] = "backward" if backward else "forward"


def mark_user_visible_outputs(gm: torch.fx.GraphModule, kind: str, cfg: Any, *,
                              num_fw_outputs: int | None = None) -> None:
    """Tell Inductor which outputs the user sees: it keeps their traced strides (kiln's runtime
    rebuilds output views from them); values saved for the backward may get any layout (a
    convolution's output stays channels-last). A forward's first ``num_fw_outputs`` outputs
    are the user's, the rest saved tensors (given by the caller: the graph Inductor gets has
    no kiln meta left to say so)."""
    out = _output_node(gm)
    vals = out.args[0]
    if kind == "backward":
        n = len(vals) if cfg.bw_outputs_user_visible else 0
    elif not cfg.keep_output_stride:
        n = 0
    elif kind == "forward":
        n = len(vals) if num_fw_outputs is None else num_fw_outputs
    else:
        n = len(vals)
    out.meta["user_visible_output_idxs"] = [i for i in range(n) if isinstance(vals[i], torch.fx.Node)]


def fake_mode_of(values: list, gm: torch.fx.GraphModule):
    """The FakeTensorMode of a graph's example values (inputs first, then node values)."""
    for v in values:
        if _torch.is_fake(v):
            return v.fake_mode
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if _torch.is_fake(v):
            return v.fake_mode
    for v in values:
        if _torch.is_symbolic(v):
            return _torch.FakeTensorMode(allow_non_fake_inputs=True, shape_env=v.node.shape_env)
    return _torch.FakeTensorMode(allow_non_fake_inputs=True)


def _has_subgraphs(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` reads a graph of its own (a higher-order op's branch, body or block)."""
    return any(n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.fx.GraphModule)
               for n in gm.graph.nodes)


def _has_symbols(values: list) -> bool:
    for v in values:
        if _torch.is_symbolic(v):
            return True
        if isinstance(v, torch.Tensor) and any(
                _torch.is_symbolic(x) for x in (*v.shape, *v.stride(), v.storage_offset())):
            return True
    return False


def device_of(values: list):
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    return None


def cpp_compiler_hint(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".lower()
    if any(w in text for w in ("cppcompileerror", "c++ compiler", "no such file or directory: 'g++'",
                               "invalidcxxcompiler", "gcc", "clang")):
        return (" Inductor needs a C++ compiler for CPU graphs: install one (Debian/Ubuntu: "
                "`apt-get install g++`; macOS: `xcode-select --install`) or set CXX.")
    return ""


def _placeholders(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _output_node(gm: torch.fx.GraphModule) -> torch.fx.Node:
    return next(n for n in reversed(gm.graph.nodes) if n.op == "output")


def _outputs(gm: torch.fx.GraphModule) -> list:
    vals = _output_node(gm).args[0]
    return list(vals) if isinstance(vals, (tuple, list)) else [vals]


inductor = register_backend("inductor", InductorBackend())
