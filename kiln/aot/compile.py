"""Stage 2: ``stage2_compile(state, capture, fw_compiler=..., bw_compiler=None,
partition_fn=None) -> AOTCompiled``.

Partitions the joint graph (or takes the inference graph), compiles the forward and the
backward with the given compilers (``compiler(gm, example_inputs) -> callable``, torch's
backend convention; the default runs the graph as FX), wraps them in a
``torch.autograd.Function`` and applies the runtime wrappers' post-compile steps.
"""
from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from .. import _torch, logs
from ..config import config
from ..errors import Unsupported
from .saved_hooks import rows as activation_rows
from . import fake_propagation, fake_tensors, fx_graphs, graph_bytes, graph_text
from .saved_hooks import inlining as saved_hooks
from . import symbolic as symbolic_shapes
from . import function as aot_function
from . import partial as partial_backward
from . import segments as segment_graphs
from . import versions
from .donation import donatable_saved_tensors
from .partition import partition_joint
from .runtime import RunAsCaptured, apply_post_compile
from .saved_hooks.inlining import hook_code
from .traced_layouts import give_traced_layouts


def run_as_fx(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The default compiler: run the graph as it is (FX codegen'd Python).

    Returns a boxed callable (``_boxed_call = True``: it takes one list of arguments and empties
    it), so that the backward frees each saved tensor after its last use instead of holding all
    of them until it returns. Other compilers may return plain ``f(*args)`` callables."""
    from torch.fx.graph import _BoxedCodeGen

    g = torch.fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    give_traced_layouts(g)
    g.set_codegen(_BoxedCodeGen())
    forward = torch.fx.GraphModule(gm, g, class_name=type(gm).__name__).forward

    def boxed(args: list):
        return forward(args)
    boxed._boxed_call = True
    boxed.graph_module = gm
    return boxed


run_as_fx.kiln_reads_example_inputs = False   # (assemble: a loaded graph's fakes are not made for it)


@dataclass
class CompiledParts:
    """The graphs and every piece of metadata needed to build the callable (what an exported
    artifact stores)."""
    kind: str                                   # "inference" | "training"
    forward: torch.fx.GraphModule               # inference graph, or primals -> fw outs + saved
    backward: torch.fx.GraphModule | None       # saved + tangents -> one grad per primal
    num_fw_outputs: int
    tangent_positions: list[int]
    fw_output_requires_grad: list[bool]
    primal_requires_grad: list[bool]
    grad_enabled: bool
    wrappers: list
    saved: list[str] = field(default_factory=list)
    saved_bytes: int = 0
    saved_input_bytes: int = 0
    partitioner: str = ""
    partition_seconds: float = 0.0              # the partitioner's time (a compile's stage times)
    symbolic: bool = False                      # traced with symbolic shapes (a dynamic graph)
    # per primal, the tangents (indices into tangent_positions) its gradient depends on: a
    # backward call without those (backward() on another output) leaves the gradient None,
    # as eager does; None: not computed (every gradient is returned as computed)
    grad_dependencies: list[list[int]] | None = None
    # version checks as eager's (see versions.py)
    check_inputs: list[int] = field(default_factory=list)
    check_outputs: list[int] = field(default_factory=list)
    copy_saved: list[int] = field(default_factory=list)
    eager_saves: bool = False                    # eager's graph saves tensors (versions.unpack)
    eager_saving_outputs: list = field(default_factory=list)   # per forward output (state.py)
    watch: list = field(default_factory=list)
    late_demand: list = field(default_factory=list)
    saved_demand: list = field(default_factory=list)
    # saved-tensor hooks inlined into the graphs (saved_hooks.InlinedHooks), None: not inlined
    # (the hooks active around a call, if any, then run as eager hooks)
    hooks: Any = None
    # dynamic graphs, set once the compilers ran: the traced inputs (symbolic fakes), the
    # guards tracing and the compilers added to the ShapeEnv (as recorded, and simplified),
    # and each input symbol's value range then. The callable checks every call against them
    # (``input_check``); a cache load adds ``trace_guards`` to the loading capture's ShapeEnv.
    input_fakes: list = field(default_factory=list)
    trace_guards: list = field(default_factory=list)
    input_guards: list = field(default_factory=list)
    input_ranges: dict = field(default_factory=dict)
    # a graph whose differentiable output feeds another (segments.py): the autograd nodes,
    # ``(tangents, forward outputs, inputs)`` each in the order they are applied (None: one
    # node per component, ``partial.components``); per handoff primal (the inputs after the
    # function's own), what the runtime hands its reader (``segments.Layout.feeds``); the
    # forward outputs after the function's that
    # are handed values (the callable does not return them)
    segments: list | None = None
    handoffs: list[int] = field(default_factory=list)
    num_handed_outputs: int = 0
    # (segments) per node, the backward inputs (saved values, then tangents) its own backward
    # reads (``partial.reading_only``): what the node keeps alive for its backward
    segment_reads: list | None = None
    # a custom autograd.Function's backward in the graph read grad mode (or its gradients'
    # requires_grad), held as without create_graph: a backward with create_graph=True refuses
    create_graph_refused: bool = False


def _partitioner_name(partition_fn: Any) -> str:
    p = config.aot_partition_fn if partition_fn is None else partition_fn
    return p if isinstance(p, str) else getattr(p, "__name__", type(p).__name__)


def _reads_grad_mode_in_backward(fn: Any) -> bool:
    """Whether the captured graph calls a custom autograd.Function whose captured backward read
    grad mode (the capture marks its callable so: ``kiln_captured_function``)."""
    graph = getattr(fn, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return False
    return any(n.op == "call_function" and
               (getattr(n.target, "kiln_captured_function", None) or {}).get("reads_grad_mode", False)
               for n in graph.nodes)


def build_parts(state, capture, partition_fn: Any = None) -> CompiledParts:
    """Check the (possibly edited) capture and partition it."""
    if state.closed:
        raise RuntimeError("stage 2: the AOTState is closed; run the stages before closing it")
    if capture.state is not None and capture.state is not state:
        raise ValueError("stage 2: this capture comes from another AOTState")
    gm = capture.graph_module
    gm.graph.lint()
    gm.recompile()
    outs = fx_graphs.flat_outputs(gm.graph)
    expected = capture.num_fw_outputs + (capture.num_primals if capture.is_joint else 0)
    if len(outs) != expected:
        raise ValueError(f"stage 2: the graph returns {len(outs)} values, expected {expected}")
    n_in = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if n_in != len(capture.example_inputs):
        raise ValueError(f"stage 2: the graph takes {n_in} inputs, expected {len(capture.example_inputs)}")
    # Edits may have added nodes or changed ops: recompute the fake values of what changed.
    try:
        fake_propagation.propagate_fake(gm, capture.example_inputs, state.fake_mode, keep_unchanged=True)
    except Exception as e:
        raise ValueError(f"stage 2: the graph does not run on its example inputs: {type(e).__name__}: {e}") from e
    common = dict(num_fw_outputs=capture.num_fw_outputs, tangent_positions=list(capture.tangent_positions),
                  fw_output_requires_grad=list(capture.fw_output_requires_grad),
                  primal_requires_grad=list(capture.primal_requires_grad),
                  grad_enabled=state.grad_enabled, wrappers=list(state.wrappers), symbolic=state.symbolic,
                  create_graph_refused=_reads_grad_mode_in_backward(state.fn))
    if not capture.is_joint:
        fw = _torch.lazy_graph_module(gm, gm.graph, class_name="KilnInference")
        check_input_writes(fw, state.meta.in_graph_mutated_indices)
        return CompiledParts(kind="inference", forward=fw, backward=None, **common)
    n = capture.num_primals
    ex = capture.example_inputs
    deps = partial_backward.grad_dependencies(gm, capture.num_fw_outputs)
    started = time.perf_counter()
    p = partition_joint(gm, (ex[:n], ex[n:]), capture.num_fw_outputs, capture.num_tangents, partition_fn)
    partition_seconds = time.perf_counter() - started
    layout = gm.meta.get("kiln_segments")
    segments = None
    if layout is not None:      # (segments.py: the forward as one graph, a node per segment)
        segment_graphs.fuse_forward(p.forward, layout)
        segment_graphs.contiguous_handoff_grads(p.backward, layout)
        segments = segment_graphs.nodes_of(gm, layout, capture.num_fw_outputs, capture.tangent_positions, deps)
    check_input_writes(p.forward, state.meta.in_graph_mutated_indices)
    clone_saved_before_writes(p, state.fake_mode)
    hooks = _inline_saved_hooks(state, p, capture.num_fw_outputs)
    checks = versions.version_checks(p.forward, p.backward, capture, state.meta,
                              copy_parameters=config.copy_saved_parameters)
    if logs.enabled.aot:
        _log_partition(state, p, _partitioner_name(partition_fn), partition_seconds)
    reads = None
    if segments is not None:
        n_saved = len(fx_graphs.flat_outputs(p.forward.graph)) - capture.num_fw_outputs
        reads = partial_backward.inputs_read_per_set(p.backward, capture.num_tangents,
                                                      [t for t, _, _ in segments], n_saved)
    return CompiledParts(kind="training", forward=p.forward, backward=p.backward, saved=p.saved,
                         saved_bytes=p.saved_bytes, saved_input_bytes=p.saved_input_bytes,
                         partitioner=_partitioner_name(partition_fn), grad_dependencies=deps,
                         partition_seconds=partition_seconds,
                         hooks=hooks, segments=segments, segment_reads=reads,
                         handoffs=[tuple(f) for f in layout.feeds] if layout is not None else [],
                         num_handed_outputs=layout.num_handed_outputs if layout is not None else 0,
                         **checks, **common)


def _log_partition(state, p, partitioner: str | None, seconds: float) -> None:
    """What the partition saves for the backward (the report's bytes per partition)."""
    name = type(state.fn).__name__
    name = name[5:] if name.startswith("Kiln_") else name
    size = graph_bytes.format_bytes
    activation = p.saved_bytes - p.saved_input_bytes
    logs.event("aot", "partition", f"partition of {name} ({partitioner or 'custom'} partitioner): saved for backward "
               f"{len(p.saved)} values, {size(p.saved_bytes)} ({size(activation)} activations, "
               f"{size(p.saved_input_bytes)} inputs)", function=name, partitioner=partitioner or "custom",
               saved=len(p.saved), saved_bytes=p.saved_bytes, saved_input_bytes=p.saved_input_bytes,
               activation_bytes=activation, seconds=round(seconds, 6), forward=p.forward.code,
               backward=p.backward.code)


def check_input_writes(fw: torch.fx.GraphModule, expected: list[int]) -> None:
    """The forward (or inference) graph writes exactly the inputs the metadata says it writes:
    a partitioner that drops a write, or a pass that adds one, would make the runtime skip a
    mutation or miss one."""
    phs = {p: i for i, p in enumerate(n for n in fw.graph.nodes if n.op == "placeholder")}
    got = sorted(phs[n.args[0]] for n in fw.graph.nodes if fx_graphs.is_input_write(n))
    if got != sorted(expected):
        raise Unsupported(f"AOT autograd: the forward graph writes inputs {got}, expected {sorted(expected)} "
                          "(a partitioner that drops the graph's writes into its inputs)")


def clone_saved_before_writes(p, fake_mode) -> None:
    """A saved value that is an input the forward writes (or a view of one) would reach the
    backward with the new value: the forward saves a copy taken before its first write instead
    (the runtime's copy-back used to come after the forward, ``versions.version_checks``)."""
    fw, bw = p.forward, p.backward
    writes = [n for n in fw.graph.nodes if fx_graphs.is_input_write(n)]
    if not writes:
        return
    written = {w.args[0] for w in writes}
    out = fx_graphs.output_node(fw.graph)
    outs = fx_graphs.flat_outputs(fw.graph)
    bw_phs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    changed = False
    for j in range(p.num_fw_outputs, len(outs)):
        s = outs[j]
        if not isinstance(s, torch.fx.Node):
            continue
        root = s
        while fx_graphs.is_view(root) and root.args and isinstance(root.args[0], torch.fx.Node):
            root = root.args[0]
        if root not in written:
            continue
        with fw.graph.inserting_before(writes[0]):
            c = fw.graph.call_function(torch.ops.aten.clone.default, (s,))
        val = s.meta.get("val")
        c.meta = {k: v for k, v in s.meta.items() if k != "val"}
        if isinstance(val, torch.Tensor):
            with fake_mode:
                c.meta["val"] = torch.ops.aten.clone.default(val)
            k = j - p.num_fw_outputs          # (the backward takes the saved values first)
            if k < len(bw_phs):
                bw_phs[k].meta["val"] = c.meta["val"]
        outs[j] = c
        changed = True
    if changed:
        out.args = (tuple(outs),)
        p.saved = [s.name for s in outs[p.num_fw_outputs:] if isinstance(s, torch.fx.Node)]
        fw.recompile()
        bw.recompile()


def _inline_saved_hooks(state, p, nfw: int):
    """Inline the state's inlineable saved-tensor hooks into the partition's graphs (in place;
    ``p.saved`` and the byte counts follow). None when there are none, or when they stay eager
    hooks (logged)."""
    hooks = getattr(state, "saved_hooks", None)
    if hooks is None:
        return None
    fw, bw = p.forward, p.backward
    try:
        info = saved_hooks.inline(hooks, copy_module(fw), copy_module(bw), nfw, state.decompositions, state.fake_mode)
    except saved_hooks.HookNotTraceable as e:
        saved_hooks.log_not_inlined(hooks, str(e))
        return None
    # (inline worked on copies: a hook that fails half-way leaves the partition as it was)
    p.forward, p.backward = info.graphs
    info.graphs = None
    fw_outs = fx_graphs.flat_outputs(p.forward.graph)
    saved = [s for s in fw_outs[nfw:] if isinstance(s, torch.fx.Node)]
    p.saved = [s.name for s in saved]
    p.saved_bytes, p.saved_input_bytes = graph_bytes.saved_bytes(saved)
    if "kiln_donated" in bw.meta:       # Inductor's: the saved positions changed
        p.backward.meta.update(bw.meta)
        p.backward.meta["kiln_num_saved"] = len(saved)
        p.backward.meta["kiln_donated"] = donatable_saved_tensors(p.forward, p.backward, nfw)
    p.forward.meta.update({k: v for k, v in fw.meta.items() if k not in p.forward.meta})
    if logs.enabled.activations or logs.enabled.aot:
        logs.event("activations" if logs.enabled.activations else "aot", "activations", info.describe(),
                   pack=info.pack, unpack=info.unpack, packed=len(info.packed), kept=len(info.kept),
                   bytes_before=info.bytes_before, bytes_after=info.bytes_after,
                   offloaded_bytes=info.offloaded_bytes)
    return info


def copy_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` with its own graph (node meta shared, values are fake tensors)."""
    g = torch.fx.Graph()
    out = g.graph_copy(gm.graph, {})
    g.output(out)
    new = torch.fx.GraphModule(gm, g, class_name=type(gm).__name__)
    new.meta.update(gm.meta)
    return new


def _examples_for(compiler: Callable, gm: torch.fx.GraphModule) -> list:
    """The example inputs ``compiler`` gets: none (an empty list) for one that declares it does
    not read them (``kiln_reads_example_inputs = False``: running a loaded graph then makes no
    fake tensors, see ``fake_tensors.ensure_vals``)."""
    if getattr(compiler, "kiln_reads_example_inputs", True) is False:
        return []
    return _example_inputs(gm)


def _example_inputs(gm: torch.fx.GraphModule) -> list:
    fake_tensors.ensure_vals(gm)       # (a loaded graph's are made on first need)
    return _known_example_inputs(gm)


def _known_example_inputs(gm: torch.fx.GraphModule) -> list:
    """The placeholders' values where the graph has them (None where not): a loaded graph's
    are not made here, which would import FakeTensorMode and so torch._dynamo."""
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def _grad_mode_check(parts: CompiledParts) -> Callable[[tuple, bool], None]:
    """The graphs were traced for one grad mode (the one the function was entered in) and one
    ``requires_grad`` per input. A call that differs where it matters raises RunAsCaptured:
    another grad mode when an input requires grad or the graph sets grad mode itself, or (grad
    mode on) an input whose requires_grad differs: its gradient would be missing, or outputs
    would require grad that eager's do not."""
    entry = parts.grad_enabled
    toggles = _sets_grad_mode(parts)
    traced_rg = list(parts.primal_requires_grad)[:len(parts.primal_requires_grad) - len(parts.handoffs)]
    check_rg = entry or toggles

    # the inputs that are tensors, and the requires_grad each had when traced (what the
    # per-call comparison reads: one list built at C speed, compared at once)
    values = _known_example_inputs(parts.forward)
    tensor_pos = want_rg = None            # (another layout, or values unknown: the plain loop)
    if len(values) == len(traced_rg) and all(v is not None for v in values):
        tensor_pos = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
        want_rg = [traced_rg[i] for i in tensor_pos]
    requires_grad = operator.attrgetter("requires_grad")

    def check(args, grad_enabled: bool):
        if grad_enabled is not entry:
            if toggles or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
                raise RunAsCaptured(f"AOT autograd: compiled with grad mode {'on' if entry else 'off'}, "
                                    "called with it the other way")
        elif check_rg:
            if tensor_pos is not None:
                try:
                    if list(map(requires_grad, map(args.__getitem__, tensor_pos))) == want_rg:
                        return
                except (AttributeError, IndexError):
                    pass            # (not the traced layout: the loop below says what differs)
            for i, (a, want) in enumerate(zip(args, traced_rg)):
                if isinstance(a, torch.Tensor) and a.requires_grad is not want:
                    raise RunAsCaptured(f"AOT autograd: input {i} {'requires' if a.requires_grad else 'does not require'} "
                                        "grad, unlike at compile time")
    return check


def _sets_grad_mode(parts: CompiledParts) -> bool:
    """Whether the graph leaves grad mode other than it found it (a runtime wrapper sets it after)."""
    return any(getattr(getattr(w, "meta", None), "grad_enabled_after", None) is not None for w in parts.wrappers)


def _make_inference_core(fw: Callable, parts: CompiledParts) -> Callable:
    check = _grad_mode_check(parts)
    view_outs = aot_function.view_outputs(fw, parts)
    fw = aot_function.caller(fw)

    set_grad, grad_enabled = torch._C._set_grad_enabled, torch.is_grad_enabled
    detach_views = aot_function.detach_views

    always_restore = _sets_grad_mode(parts)   # (then grad mode is restored after it in every case)

    def inference_core(*args):
        prior = grad_enabled()
        check(args, prior)
        if prior or always_restore:
            set_grad(False)      # (torch.no_grad() without its per-call objects: this runs every call)
            try:
                outs = fw(list(args))
            finally:
                set_grad(prior)
        else:
            outs = fw(list(args))
        return detach_views(outs, view_outs) if view_outs else outs
    return inference_core


class PartsView:
    """Read-only views of a stage-2 result's parts (shared by AOTCompiled and AOTArtifact)."""

    @property
    def kind(self) -> str:
        return self.parts.kind

    @property
    def forward_graph(self) -> torch.fx.GraphModule:
        return self.parts.forward

    @property
    def backward_graph(self) -> torch.fx.GraphModule | None:
        return self.parts.backward

    @property
    def saved_tensor_bytes(self) -> int:
        return self.parts.saved_bytes


class AOTCompiled(PartsView):
    """The callable stage 2 returns: call it like the original function.

    ``forward_graph``/``backward_graph`` are the compiled graphs (FX), ``saved_tensor_bytes``
    the memory the backward keeps alive per call, ``as_text()`` all of it readable.
    """

    def __init__(self, fn: Callable, parts: CompiledParts, run_as_captured: Callable | None = None):
        self._fn = fn
        self.parts = parts
        # The function as it was given (the captured graph), for calls the compiled graphs do
        # not fit (``RunAsCaptured``): it gives eager's answer. None for a loaded artifact.
        self.run_as_captured = run_as_captured
        # Dynamic graphs: ``input_check`` (symbolic.InputCheck) tells whether the arguments fit
        # the traced shapes and the guards tracing added; when they do not, ``fallback(*args)``
        # runs instead (the aot_backend compiles for those concrete shapes), or, with none,
        # kiln.Unsupported is raised: never a result computed for other shapes.
        self.input_check = None
        self.fallback: Callable | None = None
        # (training graphs) the backwards made at run time (aot/function.BackwardTable)
        self.backward_table = None

    def share_backwards(self, other) -> None:
        """Use one table of backwards made at run time with ``other``, a graph of the same
        cache entry (the same parts, compiled alike): what one compiled, the other calls."""
        mine, theirs = self.backward_table, getattr(other, "backward_table", None)
        if mine is not None and theirs is not None and mine is not theirs:
            mine.share_with(theirs)

    def __call__(self, *args):
        check = self.input_check
        if check is not None and not check.holds(args):
            if self.fallback is not None:
                return self.fallback(*args)
            raise Unsupported(f"AOT autograd (dynamic graph): {check.explain(args)}; recompile")
        try:
            return self._fn(*args)
        except RunAsCaptured as e:      # raised before anything ran
            if self.run_as_captured is None:
                raise
            if logs.enabled.aot:
                logs.log("aot", f"running the graph as captured for this call: {e}")
            run = self.run_as_captured
            # (kiln's own GraphModule: its code, not a module call a global hook would see)
            return (run.forward if isinstance(run, torch.nn.Module) else run)(*args)

    @property
    def saved_tensors(self) -> list[str]:
        return list(self.parts.saved)

    def as_text(self) -> str:
        p = self.parts
        lines = [f"# kiln AOT {p.kind} callable{' (dynamic: symbolic shapes)' if p.symbolic else ''}; runtime wrappers (pre-capture order, the first is outermost): "
                 + ", ".join(w.describe() for w in p.wrappers)]
        if p.kind == "inference":
            lines.append(graph_text.graph_text(p.forward, "inference graph"))
        else:
            lines.append(graph_text.graph_text(p.forward, f"forward graph: primals -> {p.num_fw_outputs} outputs + "
                                                 f"{len(p.saved)} saved"))
            lines.append(graph_text.graph_text(p.backward, "backward graph: saved + tangents -> gradients"))
            if p.hooks is not None:
                lines.append("# " + p.hooks.describe())
                lines += hook_code(p.forward, p.backward)
            size = graph_bytes.format_bytes
            lines.append(f"# saved for backward ({p.partitioner or 'custom'} partitioner): "
                         f"{graph_bytes.count_saved(p.backward, p.saved)}, {size(p.saved_bytes)} "
                         f"({size(p.saved_bytes - p.saved_input_bytes)} activations, "
                         f"{size(p.saved_input_bytes)} inputs): {', '.join(p.saved)}")
        if self.input_check is not None:
            lines.append("# checked on every call: " + "; ".join(self.input_check.conditions))
        return "\n".join(lines)

    def __repr__(self) -> str:
        extra = f", saved {graph_bytes.format_bytes(self.saved_tensor_bytes)}" if self.kind == "training" else ""
        return f"<kiln.aot.AOTCompiled {self.kind}{extra}>"


def assemble(parts: CompiledParts, fw_compiler: Callable | None = None, bw_compiler: Callable | None = None,
             inference_compiler: Callable | None = None, run_as_captured: Callable | None = None) -> AOTCompiled:
    """Compile the graphs of ``parts`` and build the callable (shared by stage2_compile and
    ``AOTArtifact.load``)."""
    fw_compiler = fw_compiler or run_as_fx
    if parts.kind == "inference":
        comp = inference_compiler or fw_compiler
        fw = comp(parts.forward, _examples_for(comp, parts.forward))
        core = _make_inference_core(fw, parts)
    else:
        fw = fw_compiler(parts.forward, _examples_for(fw_compiler, parts.forward))
        bw_compiler = bw_compiler or fw_compiler
        # (segments: each node compiles the backward for its own tangents instead)
        bw = None if parts.segments is not None else \
            bw_compiler(parts.backward, _examples_for(bw_compiler, parts.backward))
        # (backwards made at run time: compiled when first needed, or loaded from the entry
        # whose compiler has them stored)
        core = aot_function.make_training_core(fw, bw, parts, lambda gm: bw_compiler(gm, _example_inputs(gm)),
                                    _grad_mode_check(parts), getattr(bw_compiler, "kiln_stored_backwards", None))
        if parts.hooks is not None:     # (compiled or loaded from the cache)
            activation_rows.record(parts.hooks)
    compiled = AOTCompiled(apply_post_compile(parts.wrappers, core), parts, run_as_captured)
    compiled.backward_table = getattr(core, "backward_table", None)
    attach_input_check(compiled)
    return compiled


def attach_input_check(compiled: AOTCompiled) -> None:
    """A dynamic result's per-call check, made from its parts (after a compile or a load)."""
    p = compiled.parts
    if p.symbolic and p.input_fakes:
        compiled.input_check = symbolic_shapes.ShapeCode(p.input_fakes).input_check(p.input_guards, p.input_ranges)


def stage2_compile(state, capture, fw_compiler: Callable | None = None, bw_compiler: Callable | None = None,
                   partition_fn: Any = None, inference_compiler: Callable | None = None) -> AOTCompiled:
    """Partition, compile and wrap. ``bw_compiler`` defaults to ``fw_compiler``;
    ``partition_fn`` to ``kiln.config.aot_partition_fn``."""
    with state.tracing():
        parts = build_parts(state, capture, partition_fn)
        compiled = assemble(parts, fw_compiler, bw_compiler, inference_compiler, run_as_captured=state.fn)
    if state.symbolic:
        # after the compilers, which may also have guarded on sizes
        p = compiled.parts
        p.input_fakes = list(state.input_fakes)
        p.trace_guards = [g.expr for g in list(state.shape_env.guards)[state.guard_mark:]]
        p.input_guards = symbolic_shapes.new_guards(state.shape_env, state.guard_mark)
        p.input_ranges = symbolic_shapes.ShapeCode(p.input_fakes).ranges()
        attach_input_check(compiled)
    return compiled
