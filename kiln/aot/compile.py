"""Stage 2: ``stage2_compile(state, capture, fw_compiler=..., bw_compiler=None,
partition_fn=None) -> AOTCompiled``.

Partitions the joint graph (or takes the inference graph), compiles the forward and the
backward with the given compilers (``compiler(gm, example_inputs) -> callable``, torch's
backend convention; the default runs the graph as FX), wraps them in a
``torch.autograd.Function`` and applies the runtime wrappers' post-compile steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from ..errors import Unsupported
from . import _utils as U
from .runtime import apply_post_compile


def run_as_fx(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The default compiler: run the graph as it is (FX codegen'd Python).

    Returns a boxed callable (``_boxed_call = True``: it takes one list of arguments and empties
    it), so that the backward frees each saved tensor after its last use instead of holding all
    of them until it returns. Other compilers may return plain ``f(*args)`` callables."""
    from torch.fx.graph import _BoxedCodeGen

    g = torch.fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    g.set_codegen(_BoxedCodeGen())
    forward = torch.fx.GraphModule(gm, g, class_name=type(gm).__name__).forward

    def boxed(args: list):
        return forward(args)
    boxed._boxed_call = True
    boxed.graph_module = gm
    return boxed


def _caller(fn: Callable) -> Callable[[list], Any]:
    """Call a compiled graph with a list of arguments, boxed (the list is consumed) or not."""
    if getattr(fn, "_boxed_call", False):
        return fn
    return lambda args: fn(*args)


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
    symbolic: bool = False                      # traced with symbolic shapes (a dynamic graph)


def _partitioner_name(partition_fn: Any) -> str:
    from . import config

    p = config.partition_fn if partition_fn is None else partition_fn
    return p if isinstance(p, str) else getattr(p, "__name__", type(p).__name__)


def build_parts(state, capture, partition_fn: Any = None) -> CompiledParts:
    """Check the (possibly edited) capture and partition it."""
    from .partition import partition_joint

    if state.closed:
        raise RuntimeError("stage 2: the AOTState is closed; run the stages inside it")
    if capture.state is not None and capture.state is not state:
        raise ValueError("stage 2: this capture comes from another AOTState")
    gm = capture.graph_module
    gm.graph.lint()
    gm.recompile()
    outs = U.flat_outputs(gm.graph)
    expected = capture.num_fw_outputs + (capture.num_primals if capture.is_joint else 0)
    if len(outs) != expected:
        raise ValueError(f"stage 2: the graph returns {len(outs)} values, expected {expected}")
    n_in = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if n_in != len(capture.example_inputs):
        raise ValueError(f"stage 2: the graph takes {n_in} inputs, expected {len(capture.example_inputs)}")
    # Edits may have added nodes or changed ops: recompute every node's fake value.
    try:
        U.propagate_fake(gm, capture.example_inputs, state.fake_mode)
    except Exception as e:
        raise ValueError(f"stage 2: the graph does not run on its example inputs: {type(e).__name__}: {e}") from e
    common = dict(num_fw_outputs=capture.num_fw_outputs, tangent_positions=list(capture.tangent_positions),
                  fw_output_requires_grad=list(capture.fw_output_requires_grad),
                  primal_requires_grad=list(capture.primal_requires_grad),
                  grad_enabled=state.grad_enabled, wrappers=list(state.wrappers), symbolic=state.symbolic)
    if not capture.is_joint:
        fw = torch.fx.GraphModule(gm, gm.graph, class_name="KilnInference")
        return CompiledParts(kind="inference", forward=fw, backward=None, **common)
    n = capture.num_primals
    ex = capture.example_inputs
    p = partition_joint(gm, (ex[:n], ex[n:]), capture.num_fw_outputs, capture.num_tangents, partition_fn)
    return CompiledParts(kind="training", forward=p.forward, backward=p.backward, saved=p.saved,
                         saved_bytes=p.saved_bytes, saved_input_bytes=p.saved_input_bytes,
                         partitioner=_partitioner_name(partition_fn), **common)


def _example_inputs(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def _requires_grad_check(parts: CompiledParts) -> Callable[[tuple], None]:
    allowed = list(parts.primal_requires_grad) if parts.grad_enabled else [False] * len(parts.primal_requires_grad)
    why = "grad mode was off" if not parts.grad_enabled else "it did not require grad"

    def check(args):
        if torch.is_grad_enabled():
            for i, (a, ok) in enumerate(zip(args, allowed)):
                if not ok and isinstance(a, torch.Tensor) and a.requires_grad:
                    raise Unsupported(f"AOT autograd: input {i} requires grad but was compiled when {why}; "
                                      "its gradient would be missing: recompile")
    return check


def _make_training_core(fw: Callable, bw: Callable, parts: CompiledParts) -> Callable:
    fw, bw = _caller(fw), _caller(bw)
    nfw = parts.num_fw_outputs
    tangent_positions = list(parts.tangent_positions)
    nondiff = [k for k, rg in enumerate(parts.fw_output_requires_grad) if not rg]
    check = _requires_grad_check(parts)

    class KilnAOTFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *primals):
            outs = fw(list(primals))
            saved = outs[nfw:]
            tensors = [s for s in saved if isinstance(s, torch.Tensor)]
            if len(tensors) == len(saved):
                ctx.save_for_backward(*saved)
                ctx.kiln_other = None
            else:
                ctx.save_for_backward(*tensors)
                ctx.kiln_other = [(i, s) for i, s in enumerate(saved) if not isinstance(s, torch.Tensor)]
            fw_outs = tuple(outs[:nfw])
            if nondiff:
                ctx.mark_non_differentiable(*[fw_outs[k] for k in nondiff if isinstance(fw_outs[k], torch.Tensor)])
            return fw_outs

        @staticmethod
        def backward(ctx, *grad_outs):
            if torch.is_grad_enabled():   # create_graph=True: the backward graph is not differentiable
                raise Unsupported("AOT autograd: double backward (create_graph=True) through a kiln-compiled "
                                  "graph is not supported; compile with backend='eager' for it")
            args = list(ctx.saved_tensors)
            ctx.maybe_clear_saved_tensors()     # the graph frees each after its last use
            if ctx.kiln_other is not None:
                for i, s in ctx.kiln_other:
                    args.insert(i, s)
            for k in tangent_positions:
                g = grad_outs[k]
                args.append(g if g.is_contiguous() else g.contiguous())
            return tuple(bw(args))

    KilnAOTFunction.__name__ = "KilnAOTFunction"
    apply = KilnAOTFunction.apply

    def training_core(*args):
        check(args)
        return apply(*args)
    training_core.autograd_function = KilnAOTFunction
    return training_core


def _make_inference_core(fw: Callable, parts: CompiledParts) -> Callable:
    check = _requires_grad_check(parts)
    fw = _caller(fw)

    def inference_core(*args):
        check(args)
        with torch.no_grad():
            return fw(list(args))
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

    def __init__(self, fn: Callable, parts: CompiledParts, open_flag: list | None = None):
        self._fn = fn
        self.parts = parts
        self._open = open_flag
        # Dynamic graphs: ``input_check`` (symbolic.InputCheck) tells whether the arguments fit
        # the traced shapes and the guards tracing added; when they do not, ``fallback(*args)``
        # runs instead (the aot_backend compiles for those concrete shapes), or, with none,
        # kiln.Unsupported is raised: never a result computed for other shapes.
        self.input_check = None
        self.fallback: Callable | None = None

    def __call__(self, *args):
        check = self.input_check
        if check is not None and not check.holds(args):
            if self.fallback is not None:
                return self.fallback(*args)
            raise Unsupported(f"AOT autograd (dynamic graph): {check.explain(args)}; recompile")
        if self._open is not None and self._open[0]:
            # still inside the AOTState (its fake mode is entered): run on real tensors anyway
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():
                return self._fn(*args)
        return self._fn(*args)


    @property
    def saved_tensors(self) -> list[str]:
        return list(self.parts.saved)

    def as_text(self) -> str:
        p = self.parts
        lines = [f"# kiln AOT {p.kind} callable{' (dynamic: symbolic shapes)' if p.symbolic else ''}; runtime wrappers (pre-capture order, the first is outermost): "
                 + ", ".join(w.describe() for w in p.wrappers)]
        if p.kind == "inference":
            lines.append(U.graph_text(p.forward, "inference graph"))
        else:
            lines.append(U.graph_text(p.forward, f"forward graph: primals -> {p.num_fw_outputs} outputs + "
                                                 f"{len(p.saved)} saved"))
            lines.append(U.graph_text(p.backward, "backward graph: saved + tangents -> gradients"))
            lines.append(f"# saved for backward ({p.partitioner or 'custom'} partitioner): {U.count_saved(p.backward, p.saved)}, "
                         f"{U.format_bytes(p.saved_bytes)} ({U.format_bytes(p.saved_bytes - p.saved_input_bytes)} "
                         f"activations, {U.format_bytes(p.saved_input_bytes)} inputs): {', '.join(p.saved)}")
        if self.input_check is not None:
            lines.append("# checked on every call: " + "; ".join(self.input_check.conditions))
        return "\n".join(lines)

    def __repr__(self) -> str:
        extra = f", saved {U.format_bytes(self.saved_tensor_bytes)}" if self.kind == "training" else ""
        return f"<kiln.aot.AOTCompiled {self.kind}{extra}>"


def assemble(parts: CompiledParts, fw_compiler: Callable | None = None, bw_compiler: Callable | None = None,
             inference_compiler: Callable | None = None, open_flag: list | None = None) -> AOTCompiled:
    """Compile the graphs of ``parts`` and build the callable (shared by stage2_compile and
    ``AOTArtifact.load``)."""
    fw_compiler = fw_compiler or run_as_fx
    if parts.kind == "inference":
        comp = inference_compiler or fw_compiler
        fw = comp(parts.forward, _example_inputs(parts.forward))
        core = _make_inference_core(fw, parts)
    else:
        fw = fw_compiler(parts.forward, _example_inputs(parts.forward))
        bw = (bw_compiler or fw_compiler)(parts.backward, _example_inputs(parts.backward))
        core = _make_training_core(fw, bw, parts)
    return AOTCompiled(apply_post_compile(parts.wrappers, core), parts, open_flag)


def stage2_compile(state, capture, fw_compiler: Callable | None = None, bw_compiler: Callable | None = None,
                   partition_fn: Any = None, inference_compiler: Callable | None = None) -> AOTCompiled:
    """Partition, compile and wrap. ``bw_compiler`` defaults to ``fw_compiler``;
    ``partition_fn`` to ``kiln.aot.config.partition_fn``."""
    parts = build_parts(state, capture, partition_fn)
    compiled = assemble(parts, fw_compiler, bw_compiler, inference_compiler, open_flag=state._open)
    if state.symbolic:
        # after the compilers, which may also have guarded on sizes
        from . import symbolic as S

        guards = S.new_guards(state.shape_env, state.guard_mark)
        compiled.input_check = S.ShapeCode(state.input_fakes).input_check(guards)
    return compiled
