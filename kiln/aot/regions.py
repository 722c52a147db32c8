"""A repeated block traced, partitioned and lowered once: the ``invoke_region`` op.

The capture (``kiln/capture/regions.py``) moves each call of a repeated block (the layers of an
``nn.ModuleList``, a function under ``torch.compiler.nested_compile_region``) out of its graph
into a GraphModule, and calls it with ``invoke_region(block, *operands)``. Calls whose code and
input layouts are the same share one GraphModule: that is what makes them compile once.

Stage 1 (``compiling``) traces a block the first time a call of it is met, not at every call:

* **training**: the block's joint forward and backward, traced on its own (make_fx,
  functionalized, the graph's decompositions) and partitioned with the graph's partitioner
  into a forward (operands -> outputs and saved values) and a backward (saved values and
  tangents -> the operands' gradients). Each call then goes through an autograd.Function
  (``_RegionFunction``) that records ``invoke_region(forward, ...)`` in the joint graph and,
  when the joint's backward reaches it, ``invoke_region(backward, ...)``.
* **inference**: one functional ATen graph of the block, and one node per call.

The graphs the stages hand on hold the traced blocks as attributes (one per block, whatever
the number of calls); Inductor lowers each once (``to_inductor`` rewrites the nodes into
torch's ``invoke_subgraph`` op, which Inductor lowers to one function per subgraph).

Outside stage 1 (a metadata pass, a user's backend running the captured graph, the eager
fallback) the node runs the block's captured code where it stands: the same values as the
inlined code it replaced.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.fx
from torch._C import DispatchKey
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensorMode, maybe_get_fake_mode
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import (ProxyTorchDispatchMode, disable_proxy_modes_tracing, make_fx,
                                                track_tensor_tree)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from .. import _torch, logs
from ..errors import Unsupported
from ..lazy_imports import LazyModule
from . import functional_tensors, fx_graphs, recompute, symbolic, trace_context

_shapes = LazyModule("torch.fx.experimental.symbolic_shapes")     # (sympy: not at a warm start)

# gm.meta[STAGE]: a block as captured (torch-level code) or as traced by stage 1 (ATen)
STAGE = "kiln_region_stage"
CAPTURED = "captured"
TRACED = "traced"


class InvokeRegion(HigherOrderOperator):
    """``invoke_region(block, *operands) -> tuple of tensors``: ``block(*operands)``."""

    def __init__(self) -> None:
        super().__init__("kiln_invoke_region")

    def __call__(self, block, *operands):
        return super().__call__(block, *operands)


invoke_region = InvokeRegion()


def _run(block, operands) -> tuple:
    # (its code, not a module call: a global nn.Module hook must not see kiln's own graphs)
    return tuple((block.forward if isinstance(block, torch.nn.Module) else block)(*operands))


@invoke_region.py_impl(DispatchKey.CompositeExplicitAutograd)
def _dense(block, *operands):
    return _run(block, operands)


@invoke_region.py_impl(FakeTensorMode)
def _fake(mode, block, *operands):
    if block.meta.get(STAGE) != TRACED:
        with mode:
            return _run(block, operands)
    # A traced block is a functional ATen graph whose outputs own their memory: their layouts
    # follow from the operands' (the same block is met once per layer and per pass)
    memo = block.meta.setdefault("kiln_fake_outputs", {})
    key = (id(mode), tuple(_layout(t) for t in operands))
    layouts = memo.get(key)
    with mode:
        if layouts is None:
            outs = _run(block, operands)
            if not any(isinstance(o, torch.Tensor) and _shapes.free_unbacked_symbols(o) for o in outs):
                memo[key] = [_output_layout(o) for o in outs]
            return outs
        return tuple(_like(layout) for layout in layouts)


def _output_layout(o):
    if not isinstance(o, torch.Tensor):
        return ("value", o)
    return ("tensor", tuple(o.shape), tuple(o.stride()), o.storage_offset(), o.dtype, o.device)


def _like(layout):
    if layout[0] == "value":
        return layout[1]
    _, shape, stride, offset, dtype, device = layout
    if offset == 0:
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    return torch.empty(extent, dtype=dtype, device=device).as_strided(shape, stride, offset)


@invoke_region.py_functionalize_impl
def _functional(ctx, block, *operands):
    if block.meta.get(STAGE) != TRACED:
        raise Unsupported("kiln: a captured block reached functionalization untraced")
    unwrapped = ctx.unwrap_tensors(operands)
    with ctx.redispatch_to_next():
        out = invoke_region(block, *unwrapped)
    return ctx.wrap_tensors(out)


@invoke_region.py_impl(ProxyTorchDispatchMode)
def _proxy(mode, block, *operands):
    if block.meta.get(STAGE) != TRACED:
        raise Unsupported("kiln: a captured block reached the tracer untraced")
    with disable_proxy_modes_tracing():
        out = invoke_region(block, *operands)
    root = mode.tracer.root
    if not any(m is block for m in root.children()):
        name = f"kiln_region_{sum(1 for _ in root.children())}"
        while hasattr(root, name):
            name += "_"
        root.register_module(name, block)
    args = pytree.tree_map(mode.tracer.unwrap_proxy, (block, *operands))
    proxy = mode.tracer.create_proxy("call_function", invoke_region, args, {})
    return track_tensor_tree(out, proxy, constant=None, tracer=mode.tracer)


@invoke_region.py_impl(DispatchKey.Autograd)
def _autograd(block, *operands):
    if block.meta.get(STAGE) == TRACED:
        with torch._C._AutoDispatchBelowAutograd():
            return invoke_region(block, *operands)
    stage = _current()
    if stage is None:
        # not in a stage-1 trace: the block's code, where it stands
        return _run(block, operands)
    # a block reads dense inputs: a view with gaps (a key split from a fused projection) is
    # copied, so that Inductor, which lays the caller's buffers out densely, passes what the
    # block was traced for
    operands = tuple(t.contiguous() if isinstance(t, torch.Tensor) and not _is_dense(t)
                     else t for t in operands)
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in operands)
    traced = stage.traced(block, operands, needs_grad)
    if traced is None:          # (kiln could not trace it on its own: its code, where it stands)
        return _run(block, operands)
    if not needs_grad:
        with torch._C._AutoDispatchBelowAutograd():
            return invoke_region(traced.forward, *operands)
    return _RegionFunction.apply(traced, *operands)


# -- stage 1 ---------------------------------------------------------------------------------------

@dataclass
class TracedBlock:
    """A block as stage 1 traced it for one layout of its operands: ``forward`` (the inference
    graph, or the partitioned forward returning the outputs then the saved values) and
    ``backward`` (saved values, then the differentiable outputs' tangents -> one gradient per
    operand; None for inference)."""
    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule | None
    num_outputs: int
    differentiable: list[bool]        # per output: it has a tangent
    output_metas: list                # per output: (shape, dtype, device) of a zero tangent
    # per saved value: the operand saved as it is (None: the forward returns it)
    saved_operands: list = field(default_factory=list)


class _Stage:
    """The blocks traced during one stage-1 trace: one TracedBlock per (block, operand layout,
    grad mode, autocast state)."""

    def __init__(self, decompositions: dict, partition_fn: Callable):
        self.decompositions = decompositions
        self.partition_fn = partition_fn
        self.blocks: dict = {}

    def traced(self, block: torch.fx.GraphModule, operands: tuple, needs_grad: bool) -> TracedBlock:
        key = (id(block), needs_grad, _autocast_state(), tuple(_layout(t) for t in operands))
        found = self.blocks.get(key)
        if found is None:
            try:
                traced = self._trace(block, operands, needs_grad)
            except Exception as e:  # noqa: BLE001 - the block then runs inlined, as captured
                if logs.enabled.aot:
                    logs.log("aot", f"repeated block {block.meta.get('kiln_region_name', '')} inlined: "
                                    f"tracing it alone failed ({type(e).__name__}: {e})")
                traced = None
            found = self.blocks[key] = (block, traced)
        return found[1]

    def _trace(self, block, operands, needs_grad: bool) -> TracedBlock:
        fake_mode = next((m for m in map(maybe_get_fake_mode, operands) if m is not None), None)
        if fake_mode is None:
            raise Unsupported("kiln: a repeated block traced on tensors that are not fake")
        with _disable_current_modes(), fake_mode, fx_traceback.preserve_node_meta():
            fakes = [_fresh(t, needs_grad) for t in operands]
            if not needs_grad:
                return _trace_inference(block, fakes, self.decompositions)
            return _trace_training(block, fakes, self.decompositions, self.partition_fn)


_STAGES = threading.local()


def _current() -> _Stage | None:
    stack = getattr(_STAGES, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def compiling(decompositions: dict, partition_fn: Callable) -> Iterator[None]:
    """Within: ``invoke_region`` nodes met by the AOT stages' passes and traces run each block
    as traced once (per operand layout), with these decompositions and this partitioner."""
    stack = _STAGES.__dict__.setdefault("stack", [])
    stack.append(_Stage(decompositions, partition_fn))
    try:
        yield
    finally:
        stack.pop()


@contextlib.contextmanager
def inline() -> Iterator[None]:
    """Within: ``invoke_region`` runs the block's code (no stage-1 tracing)."""
    stack = _STAGES.__dict__.setdefault("stack", [])
    stack.append(None)
    try:
        yield
    finally:
        stack.pop()


def _layout(t) -> Any:
    if isinstance(t, torch.Tensor):
        return ("t", tuple(str(s) for s in t.shape), tuple(str(s) for s in t.stride()), str(t.dtype),
                str(t.device), bool(t.requires_grad))
    return ("v", repr(t))


def _autocast_state() -> tuple:
    return tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda"))


def _is_dense(t: torch.Tensor) -> bool:
    """Its elements fill its storage span without gaps or overlap, in some order of its dims
    (symbolic sizes: assumed so)."""
    sizes, strides = list(t.shape), list(t.stride())
    if not all(isinstance(x, int) for x in sizes + strides):
        return True
    expected = 1
    for size, stride in sorted((p for p in zip(sizes, strides) if p[0] != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _fresh(t, needs_grad: bool):
    """A leaf fake tensor of ``t``'s layout (a functional or traced wrapper left behind)."""
    if not isinstance(t, torch.Tensor):
        return t
    out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=t.device)
    if needs_grad and t.requires_grad:
        out.requires_grad_(True)
    return out


def _make_fx(fn, args, decompositions) -> torch.fx.GraphModule:
    with trace_context.preserve_rng_state(), trace_context.no_mkldnn_decompositions(), \
            FunctionalTensorMode(_allow_token_discovery=True), _torch.lazy_graph_modules():
        gm = make_fx(fn, decomposition_table=decompositions)(*args)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is invoke_region:
            raise Unsupported("kiln: a repeated block inside another")
    return gm


def _trace_inference(block, fakes: list, decompositions: dict) -> TracedBlock:
    with torch.no_grad():
        example = _run(block, fakes)

    def inference(*p):
        with functional_tensors.exclude_functionalize_key():
            fp = [functional_tensors.to_fun(x) for x in p]
            with torch.no_grad():
                outs = _with_layouts_of(_run(block, fp), example)
            return [functional_tensors.from_fun(o) for o in outs]

    gm = _make_fx(inference, fakes, decompositions)
    fx_graphs.remove_aliases(gm)
    fx_graphs.dce(gm)
    _unaliased_outputs(gm)
    gm.meta[STAGE] = TRACED
    n = len(fx_graphs.flat_outputs(gm.graph))
    return TracedBlock(gm, None, n, [False] * n, [None] * n)


def _trace_training(block, fakes: list, decompositions: dict, partition_fn: Callable) -> TracedBlock:
    block = recompute.traced_with_regions(block)    # (checkpointed code in it: tagged, recomputed)
    with torch.enable_grad():
        example = _run(block, fakes)
    differentiable = [isinstance(o, torch.Tensor) and o.requires_grad for o in example]
    metas = [(tuple(o.shape), o.dtype, o.device) if isinstance(o, torch.Tensor) else None for o in example]
    tangents = [torch.empty(tuple(o.shape), dtype=o.dtype, device=o.device)
                for o, d in zip(example, differentiable) if d]
    n, m = len(fakes), len(tangents)
    grad_primals = [i for i, p in enumerate(fakes) if isinstance(p, torch.Tensor) and p.requires_grad]

    def joint(*pt):
        p, t = pt[:n], pt[n:]
        with functional_tensors.exclude_functionalize_key():
            fp = [functional_tensors.to_fun(x) for x in p]
            ft = [functional_tensors.to_fun(x) for x in t]
            with torch.enable_grad():
                outs = _with_layouts_of(_run(block, fp), example)
            trace_context.mark_forward_nodes()
            d_outs, d_tangents = [], []
            tangent_of = iter(ft)
            for o, d in zip(outs, differentiable):
                if d:
                    g = next(tangent_of)
                    if o.grad_fn is not None:
                        d_outs.append(o)
                        d_tangents.append(g)
            gin = [fp[i] for i in grad_primals]
            grads: list = [None] * len(gin)
            if d_outs and gin:
                with torch._C._DisableAutocast():
                    grads = list(torch.autograd.grad(d_outs, gin, d_tangents, allow_unused=True))
            full: list = [None] * n
            for i, g in zip(grad_primals, grads):
                full[i] = g
            return [functional_tensors.from_fun(o) for o in outs] + \
                [functional_tensors.from_fun(g) if g is not None else None for g in full]

    gm = _make_fx(joint, fakes + tangents, decompositions)
    fx_graphs.rename_placeholders(gm, [f"primals_{i + 1}" for i in range(n)] +
                                  [f"tangents_{j + 1}" for j in range(m)])
    for i, ph in enumerate(p for p in gm.graph.nodes if p.op == "placeholder"):
        if i >= n:
            ph.meta["kiln_tangent"] = True
            ph.meta["kiln_phase"] = "backward"
        else:
            ph.meta.update(kiln_primal=True, kiln_static=False, kiln_mutated=False,
                           kiln_requires_grad=bool(isinstance(fakes[i], torch.Tensor) and fakes[i].requires_grad))
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "output"):
            node.meta.setdefault("kiln_phase", "backward")
    fx_graphs.remove_aliases(gm)
    fx_graphs.dce(gm)
    gm.recompile()
    fw, bw = partition_fn(gm, (list(fakes), list(tangents)), num_fwd_outputs=len(example))
    saved_operands = _operands_saved_as_they_are(fw, len(example))
    _unaliased_outputs(fw)
    _unaliased_outputs(bw)
    fw.meta[STAGE] = bw.meta[STAGE] = TRACED
    return TracedBlock(fw, bw, len(example), differentiable, metas, saved_operands)


def _with_layouts_of(outs, example) -> tuple:
    """The block's outputs laid out as the captured code lays them out. The decompositions can
    choose another layout (Inductor's turns ``cat`` with an empty tensor, as a KV cache's first
    update does, into a clone that keeps its input's strides), and a block's output can leave
    the graph (the KV cache), where its strides must be eager's. The copy is differentiable:
    the gradient reaches the traced output unchanged."""
    laid = []
    for o, e in zip(outs, example):
        if isinstance(o, torch.Tensor) and isinstance(e, torch.Tensor) and o.dim() == e.dim() \
                and not symbolic.known_equal(tuple(o.stride()), tuple(e.stride())):
            o = torch.empty_strided(tuple(o.shape), tuple(e.stride()), dtype=o.dtype, device=o.device).copy_(o)
        laid.append(o)
    return tuple(laid)


def _operands_saved_as_they_are(fw: torch.fx.GraphModule, num_outputs: int) -> list:
    """Saved values that are the forward's own inputs leave its outputs: the caller saves the
    operand itself. Returns, per saved value, the operand's index (None: still returned)."""
    phs = [n for n in fw.graph.nodes if n.op == "placeholder"]
    out = next(n for n in reversed(fw.graph.nodes) if n.op == "output")
    values = list(out.args[0])
    found: list = []
    kept = values[:num_outputs]
    for v in values[num_outputs:]:
        if isinstance(v, torch.fx.Node) and v.op == "placeholder":
            found.append(phs.index(v))
        else:
            found.append(None)
            kept.append(v)
    out.args = (tuple(kept),)
    return found


def _unaliased_outputs(gm: torch.fx.GraphModule) -> None:
    """A block's outputs own their memory: an output that is an input, a view of one or of
    another output is cloned. (Inductor plans the caller's memory as if each output of a
    subgraph were a buffer of its own: it would reuse an input's memory once the caller no
    longer reads it, while the output still aliases it.)"""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    storages = {_storage(p) for p in phs} - {None}
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = list(out.args[0])
    changed = False
    for i, v in enumerate(values):
        if not isinstance(v, torch.fx.Node):
            continue
        s = _storage(v)
        if s is None:
            continue
        if s in storages:
            with gm.graph.inserting_before(out):
                c = gm.graph.call_function(torch.ops.aten.clone.default, (v,))
            c.meta["val"] = v.meta["val"].clone()
            values[i] = c
            changed = True
        else:
            storages.add(s)
    if changed:
        out.args = (tuple(values),)
    gm.recompile()


def _storage(n: torch.fx.Node):
    v = n.meta.get("val")
    if isinstance(v, torch.Tensor):
        return StorageWeakRef(v.untyped_storage())
    return None


class _RegionFunction(torch.autograd.Function):
    """One call of a traced block in a joint trace: its forward node now, its backward node
    when the joint's backward reaches it."""

    @staticmethod
    def forward(ctx, traced: TracedBlock, *operands):
        with torch._C._AutoDispatchBelowAutograd():
            res = invoke_region(traced.forward, *operands)
        outs, returned = res[:traced.num_outputs], iter(res[traced.num_outputs:])
        saved = [next(returned) if i is None else operands[i] for i in traced.saved_operands]
        tensors = [s for s in saved if isinstance(s, torch.Tensor)]
        ctx.save_for_backward(*tensors)
        ctx.others = [None if isinstance(s, torch.Tensor) else s for s in saved]
        ctx.traced = traced
        ctx.num_operands = len(operands)
        ctx.mark_non_differentiable(*[o for o, d in zip(outs, traced.differentiable)
                                      if not d and isinstance(o, torch.Tensor)])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        traced = ctx.traced
        tensors = iter(ctx.saved_tensors)
        saved = [next(tensors) if s is None else s for s in ctx.others]
        tangents = []
        for g, d, meta in zip(grads, traced.differentiable, traced.output_metas):
            if not d:
                continue
            if g is None:
                shape, dtype, device = meta
                g = torch.zeros(shape, dtype=dtype, device=device)
            tangents.append(g.contiguous())
        res = invoke_region(traced.backward, *saved, *tangents)
        return (None, *res[:ctx.num_operands])


# -- Inductor ------------------------------------------------------------------------------------

def has_regions(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and n.target is invoke_region for n in gm.graph.nodes)


# A block whose every call passes operands of one static layout is lowered under this prefix:
# Inductor's code then calls it without re-checking its inputs' sizes and strides (see
# ``to_inductor``; kiln._torch.inductor_skip_input_asserts_of_subgraphs). The name is part of
# the graph's code, so Inductor's FX graph cache keys on it.
UNCHECKED_INPUTS_PREFIX = "kiln_unchecked_"


def to_inductor(gm: torch.fx.GraphModule) -> None:
    """Rewrite ``invoke_region(block, *operands)`` into torch's ``invoke_subgraph(block, name,
    *operands)``, which Inductor lowers once per subgraph attribute and calls per node. Each
    block is copied first: Inductor rewrites the graphs it compiles.

    Inductor lowers a subgraph for its first call's operands and gives every other call's
    operands those strides (copying where they differ). Where every call already passes one
    static layout (the same sizes, strides, dtypes and devices), the input asserts inside the
    subgraph re-check at every call what the caller's code made true, a microsecond each on a
    step bound by the host: such a block is renamed under ``UNCHECKED_INPUTS_PREFIX``. A
    symbolic size, or calls that differ, keep the asserts."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is invoke_region]
    uniform = _uniform_call_layouts(calls)
    renamed: dict[str, str] = {}
    for target in dict.fromkeys(call.args[0].target for call in calls):
        copy = fx_graphs.copy_graph_module(getattr(gm, target))
        _tuple_output(copy)
        name = target
        if target in uniform:
            delattr(gm, target)
            name = UNCHECKED_INPUTS_PREFIX + target.removeprefix("kiln_")
        setattr(gm, name, copy)
        renamed[target] = name
    for block in {call.args[0] for call in calls}:
        block.target = renamed[block.target]
    for call in calls:
        block = call.args[0]
        call.target = torch.ops.higher_order.invoke_subgraph
        call.args = (block, f"kiln_{block.target}", *call.args[1:])
    gm.recompile()


def _uniform_call_layouts(calls: list) -> set[str]:
    """The blocks (their attribute names) whose every ``invoke_region`` call passes operands
    of one static layout."""
    layouts: dict[str, tuple | None] = {}
    for call in calls:
        name, layout = call.args[0].target, _static_layout(call.args[1:])
        if name not in layouts:
            layouts[name] = layout
        elif layouts[name] != layout:
            layouts[name] = None
    return {name for name, layout in layouts.items() if layout is not None}


def _static_layout(operands) -> tuple | None:
    """(size, stride, dtype, device) of each tensor operand, other operands as they are; None
    where one is symbolic or has no example value."""
    out = []
    for a in operands:
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        if isinstance(val, torch.Tensor):
            if any(isinstance(d, torch.SymInt) for d in (*val.shape, *val.stride())):
                return None
            out.append((tuple(val.shape), tuple(val.stride()), val.dtype, val.device))
        elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) or (
                val is None and isinstance(a, torch.fx.Node)):
            return None
        else:
            out.append(val)
    return tuple(out)


def _tuple_output(gm: torch.fx.GraphModule) -> None:
    """A block returning a list returns a tuple: torch's fake-tensor cache takes a
    higher-order op's outputs as a tuple only (torch 2.11 asserts it)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    if isinstance(out.args[0], list):
        out.args = (tuple(out.args[0]),)
        gm.recompile()


__all__ = ["invoke_region", "compiling", "inline", "has_regions", "to_inductor", "UNCHECKED_INPUTS_PREFIX", "STAGE", "CAPTURED",
           "TRACED", "TracedBlock"]
