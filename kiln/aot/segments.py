"""A graph in which one differentiable output feeds another: one forward graph, and one autograd
node per segment of it.

AOT autograd makes a graph one autograd node: every output's ``grad_fn`` is that node, so an
output that the graph also used to compute another output is not on that output's autograd
path. Eager's is: ``torch.autograd.grad(loss, [logits])``, ``logits.retain_grad()`` and hooks
on ``logits`` see the gradient flowing from ``loss``::

    y = torch.log_softmax(x @ w, -1)        # an output of the graph
    loss = (y * y).sum()                    # another, computed from it
    g, = torch.autograd.grad(loss, [y])     # eager: 2 * y; one node: None

A model that returns its KV cache is such a graph: every layer's keys and values feed the
next layer and the loss.

**Segments.** An output another differentiable output is computed from is a *cut output*. Each
node of the captured graph gets a level: the largest, over its inputs, of the input's level,
plus one when that input is a cut output. A segment is the nodes of one level; a differentiable
tensor that a later segment reads (a *handed value*) is handed over through a
``handoff(value, index)`` call that ``plan`` inserts into a copy of the graph, one per value
and reading level.

**One trace.** Outside a trace ``handoff`` returns its value. Stage 1 traces the joint graph
with one more primal per handoff (``handing_over``): the later segment computes from that
primal instead of the value, so the traced backward stops at it and returns its gradient. The
handed values are forward outputs (with tangents) when they are not outputs already.

**One forward.** Stage 2 replaces each handoff primal of the partitioned forward by the value
it stands for (``fuse_forward``): the forward is one graph, compiled once (Inductor fuses
across segments). **A chain of nodes.** The runtime (``function.make_training_core``) applies
one autograd.Function per segment, in level order, over the one forward call: a later node
takes the handed values, as returned by the earlier node, as inputs (the first node takes the
function's inputs). Each node saves only what its segment's backward reads. **One backward.**
Where nothing can see a cut output's gradient at its node (no hook, no ``retain_grad``, a
plain ``backward()``), the backward is one graph (``fused_backward.py``), run by the first
node; otherwise each node runs the backward graph specialized to its own tangents
(``partial.without_tangents``), which reaches only its segment (the handoff primals cut the
rest), node after node as eager's does, and ``retain_grad``, hooks and ``autograd.grad`` on a
cut output see eager's gradient.

Where this does not hold, the graph is not segmented and runs as captured (eager's autograd,
``NotSegmentable``): a handed value that a later segment writes in place (the handoff primal
would not see the write), an output that is a view regenerated at runtime and also feeds a
later segment, a non-tensor value that holds differentiable tensors and crosses a segment.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..errors import Unsupported
from . import functional_tensors, fx_graphs


class NotSegmentable(Unsupported):
    """The graph needs segments (a differentiable output feeds another) but cannot have them."""


_active = threading.local()


def handoff(value, index: int):
    """A value a later segment reads (inserted by ``plan``): the value itself, except while stage
    1 traces the segments (``handing_over``), where it is recorded and the handoff primal that
    stands for it is returned."""
    slots = getattr(_active, "slots", None)
    if slots is None:
        return value
    return slots.take(value, index)


handoff.__module__ = __name__


@dataclass
class Handoff:
    """One handoff primal: the captured node it stands for, and the level of the segment that
    reads it."""
    index: int
    source: str        # the captured graph's node name
    level: int
    example: Any       # the source's example value (its fake tensor from the capture)


class _Slots:
    def __init__(self, primals: list):
        self.primals = primals
        self.values: list = [None] * len(primals)

    def take(self, value, index: int):
        z = self.primals[index]
        if not isinstance(value, torch.Tensor) or not value.requires_grad:
            raise NotSegmentable("a handed value does not require grad in the trace")
        if tuple(value.shape) != tuple(z.shape) or value.dtype != z.dtype:
            raise NotSegmentable(f"a handed value traced as {tuple(value.shape)} {value.dtype}, captured as "
                                 f"{tuple(z.shape)} {z.dtype}")
        self.values[index] = value
        return z


def refuse_writes(primals: list) -> None:
    """NotSegmentable when the traced function wrote into a handoff primal (in place, or its
    sizes and strides): eager's write would reach the handed value and its aliases too."""
    for z in primals:
        functional_tensors.sync(z)
        elem = z.elem
        if torch._functionalize_has_data_mutation(elem) or torch._functionalize_has_metadata_mutation(elem):
            raise NotSegmentable("a later segment writes into a value an earlier one hands over")


class handing_over:
    """``with handing_over(primals) as slots:`` the handoffs in the traced function return these
    primals; ``slots.values[i]`` is then the value handoff ``i`` stood for."""

    def __init__(self, primals: list):
        self.slots = _Slots(primals)

    def __enter__(self) -> _Slots:
        if getattr(_active, "slots", None) is not None:
            raise NotSegmentable("segments traced inside segments")
        _active.slots = self.slots
        return self.slots

    def __exit__(self, *exc) -> None:
        _active.slots = None


# ------------------------------------------------------------------------------------------------
# Planning, on the captured (torch-level) graph
# ------------------------------------------------------------------------------------------------

def _requires_grad(node: torch.fx.Node) -> bool:
    v = node.meta.get("example_value")
    return isinstance(v, torch.Tensor) and v.requires_grad


def output_nodes(gm: torch.fx.GraphModule) -> list:
    """The graph's outputs in the order the function returns them, flattened."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    leaves, _ = pytree.tree_flatten(out.args[0])
    return leaves


def cut_outputs(gm: torch.fx.GraphModule) -> set:
    """Differentiable outputs that another differentiable output is computed from."""
    outs = []
    for o in output_nodes(gm):
        if isinstance(o, torch.fx.Node) and o.op not in ("placeholder", "get_attr") and _requires_grad(o) \
                and o not in outs:
            outs.append(o)
    if len(outs) < 2:
        return set()
    cut = set()
    for later in outs:
        seen = fx_graphs.ancestors(later.all_input_nodes)
        cut.update(o for o in outs if o is not later and o in seen)
    return cut


def plan(gm: torch.fx.GraphModule) -> torch.fx.GraphModule | None:
    """A copy of ``gm`` with the handoffs its segments need (``meta["kiln_handoffs"]``: the
    ``Handoff`` list), or None when it needs none: grad mode off, or no output feeds another.
    Raises NotSegmentable where it needs segments it cannot have."""
    if not torch.is_grad_enabled():
        return None
    cut = cut_outputs(gm)
    if not cut:
        return None
    nodes = list(gm.graph.nodes)
    level: dict = {}
    for n in nodes:
        if n.op in ("placeholder", "get_attr", "output"):
            level[n] = 0
            continue
        level[n] = max((level[a] + (a in cut) for a in n.all_input_nodes), default=0)
    new = fx_graphs.copy_graph_module(gm)
    by_name = {n.name: n for n in new.graph.nodes}
    handoffs: list[Handoff] = []
    for a in nodes:
        if a.op in ("placeholder", "get_attr", "output"):
            continue
        later = sorted({level[u] for u in a.users if u.op != "output" and level[u] > level[a]})
        if not later:
            continue
        v = a.meta.get("example_value")
        if not isinstance(v, torch.Tensor):
            if any(isinstance(x, torch.Tensor) and x.requires_grad for x in pytree.tree_leaves(v)):
                raise NotSegmentable(f"{a.name} ({type(v).__name__}) holds differentiable tensors and a later "
                                     "segment reads it")
            continue
        if not v.requires_grad:
            continue        # no gradient crosses: the later segment reads it as it is
        na = by_name[a.name]
        for lv in later:
            users = [by_name[u.name] for u in a.users if u.op != "output" and level[u] == lv]
            with new.graph.inserting_after(na):
                h = new.graph.call_function(handoff, (na, len(handoffs)))
            h.meta = dict(na.meta)
            for u in users:
                u.replace_input_with(na, h)
            handoffs.append(Handoff(len(handoffs), a.name, lv, v))
    if not handoffs:
        return None
    new.graph.lint()
    new.recompile()
    new.meta["kiln_handoffs"] = handoffs
    new.meta["kiln_levels"] = {n.name: level[n] for n in nodes}
    return new


# ------------------------------------------------------------------------------------------------
# After the trace: the forward as one graph, the nodes of the runtime
# ------------------------------------------------------------------------------------------------

@dataclass
class Layout:
    """How a segmented joint graph reads (set by stage 1, used by stage 2).

    The joint's primals are the function's ``num_args`` inputs, then one handoff primal per
    handoff; its forward outputs are the function's, then the handed values that are not
    outputs already (``num_handed_outputs``). ``sources[j]``: the forward output handoff ``j``
    stands for; ``levels[j]``: the level of the segment that reads it; ``feeds[j]``: what the
    runtime hands the reader, ``("out", p)``, forward output ``p`` as its node returned it, or
    ``("view", p, k)``, the function's output ``k`` (a view of an intermediate: forward output
    ``p``) as the runtime rebuilds it for the caller: the very tensor the caller gets."""
    num_args: int
    num_handed_outputs: int
    sources: list
    levels: list
    feeds: list


def fuse_forward(fw: torch.fx.GraphModule, layout: Layout) -> None:
    """Replace the partitioned forward's handoff primals by the values they stand for (in
    place): the forward takes the function's inputs only. A value traced with other strides
    than its handoff primal is copied to those strides (the later segment was traced for them)."""
    g = fw.graph
    phs = [n for n in g.nodes if n.op == "placeholder"]
    zs = phs[layout.num_args:]
    for j, z in enumerate(zs):
        src = _flat_outputs(g)[layout.sources[j]]
        if src is z:
            raise NotSegmentable("a handed value stands for itself")
        if not isinstance(src, torch.fx.Node):
            raise NotSegmentable("a handed value is not a value of the forward graph")
        val, want = src.meta.get("val"), z.meta.get("val")
        repl = src
        if isinstance(val, torch.Tensor) and isinstance(want, torch.Tensor) and _static(want) and _static(val) \
                and tuple(val.stride()) != tuple(want.stride()):
            with g.inserting_after(src):
                repl = g.call_function(torch.ops.prims.copy_strided.default, (src, list(want.stride())))
            repl.meta = {k: v for k, v in src.meta.items() if k != "val"}
            repl.meta["val"] = want
        z.replace_all_uses_with(repl)
        g.erase_node(z)
    try:
        g.lint()        # (each handed value is traced before the later segment reads it)
    except RuntimeError as e:
        raise NotSegmentable(f"the fused forward reads a handed value before computing it ({e})") from e
    fw.recompile()


def contiguous_handoff_grads(bw: torch.fx.GraphModule, layout: Layout) -> None:
    """The backward returns each handoff primal's gradient contiguous (in place): it is the
    tangent of the node that handed the value over, which was traced contiguous (the runtime
    would otherwise copy it there, a kernel of its own; here the compiler writes it so)."""
    g = bw.graph
    out = next(n for n in reversed(g.nodes) if n.op == "output")
    flat = list(out.args[0])
    changed = False
    for i in range(layout.num_args, len(flat)):
        node = flat[i]
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or not _static(val) or val.is_contiguous():
            continue
        stride = list(torch.empty(tuple(val.shape), device="meta").stride())
        with g.inserting_before(out):
            c = g.call_function(torch.ops.prims.copy_strided.default, (node, stride))
        c.meta = {k: v for k, v in node.meta.items() if k != "val"}
        c.meta["val"] = val.contiguous()
        flat[i] = c
        changed = True
    if changed:
        out.args = (tuple(flat),)
        g.lint()
        bw.recompile()


def _static(t: torch.Tensor) -> bool:
    return not any(isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride()))


def _flat_outputs(g: torch.fx.Graph) -> list:
    out = next(n for n in reversed(g.nodes) if n.op == "output")
    return list(out.args[0])


def forward_levels(joint: torch.fx.GraphModule, layout: Layout) -> dict:
    """The segment of each node of the joint's forward: a handoff primal's is its reading level,
    any other node's the largest of its inputs' (the function's inputs: 0)."""
    phs = [n for n in joint.graph.nodes if n.op == "placeholder"]
    seg: dict = {}
    for i, p in enumerate(phs):
        j = i - layout.num_args
        seg[p] = layout.levels[j] if 0 <= j < len(layout.levels) else 0
    for n in joint.graph.nodes:
        if n not in seg:
            seg[n] = max((seg[a] for a in n.all_input_nodes), default=0)
    return seg


def nodes_of(joint: torch.fx.GraphModule, layout: Layout, num_fw_outputs: int, tangent_positions: list,
             grad_dependencies: list) -> list:
    """The runtime's autograd nodes, in the order they are applied: ``(tangents, forward
    outputs, inputs)`` each, inputs indexing the joint's primals (handoff primals included).

    A node per segment that has tangents: the tangents of the outputs computed in it, and the
    inputs whose gradient those reach. Outputs without a tangent go to the first node. Raises
    NotSegmentable when a handoff primal's gradient comes from another segment than the one
    that reads it, or the node a handed value comes from is not applied before its reader."""
    seg = forward_levels(joint, layout)
    outs = _flat_outputs(joint.graph)[:num_fw_outputs]
    level_of_out = [seg.get(o, 0) if isinstance(o, torch.fx.Node) else 0 for o in outs]
    n_user = num_fw_outputs - layout.num_handed_outputs
    levels = sorted({level_of_out[k] for k in tangent_positions})
    index = {lv: c for c, lv in enumerate(levels)}
    groups: list = [([], [], []) for _ in levels]
    node_of_tangent = {}
    for j, k in enumerate(tangent_positions):
        c = index[level_of_out[k]]
        groups[c][0].append(j)
        node_of_tangent[j] = c
    tangent_of = {k: j for j, k in enumerate(tangent_positions)}
    for k in range(num_fw_outputs):
        if k in tangent_of:
            groups[node_of_tangent[tangent_of[k]]][1].append(k)
        elif k < n_user:
            groups[0][1].append(k)
        # (a handed value that stands for a rebuilt view is only the forward's: no node returns it)
    for i, deps in enumerate(grad_dependencies):
        nodes = sorted({node_of_tangent[j] for j in deps})
        j = i - layout.num_args
        if j >= 0 and nodes:
            reader = index.get(layout.levels[j])
            if any(c != reader for c in nodes):
                raise NotSegmentable("a handed value's gradient comes from another segment than its reader's")
            src = layout.feeds[j][1]
            if src not in tangent_of or node_of_tangent[tangent_of[src]] >= reader:
                raise NotSegmentable("a handed value comes from a node not applied before its reader")
        for c in nodes:
            groups[c][2].append(i)
    # A later node takes every handed value its segment reads, whether or not its tangents'
    # gradient reaches it: its outputs then hang on the earlier node, as eager's do. Otherwise
    # an output computed from a handed value's size or detached value (``zeros_like(t) * w``)
    # and from an input would come from a node with no differentiable input: no grad_fn, and
    # the input's gradient never delivered (the first node delivers the later nodes' gradients
    # for the function's inputs, after they ran).
    for j, lv in enumerate(layout.levels):
        c = index.get(lv)
        i = layout.num_args + j
        if c is not None and c > 0 and i not in groups[c][2]:
            groups[c][2].append(i)
    return [(t, o, sorted(ins)) for t, o, ins in groups]


# ------------------------------------------------------------------------------------------------
# Before the trace: what stage 1 adds to the joint
# ------------------------------------------------------------------------------------------------

@dataclass
class TracePlan:
    """What stage 1 adds to a segmented joint: one primal per handoff (``primals``), and, per
    handed value that is not an output already, a forward output (``extra``: the handoff index
    whose value it is), with a tangent (``tangents``, one per ``with_tangent`` position) unless
    the runtime hands the reader a rebuilt view instead."""
    layout: Layout
    primals: list
    extra: list
    tangents: list
    with_tangent: list


def trace_plan(state, num_fw_outputs: int) -> TracePlan | None:
    """The additions for ``state`` (None when its function has no handoffs). A handed value
    that is an output the runtime rebuilds (a view, an input, a repeat) cannot be one node's
    output and another's input: NotSegmentable."""
    fn = state.fn
    handoffs = fn.meta.get("kiln_handoffs") if isinstance(fn, torch.fx.GraphModule) else None
    if not handoffs:
        return None
    if any(type(w).__name__ == "SyntheticBases" for w in state.wrappers):
        raise NotSegmentable("inputs that share memory, one of them mutated")
    meta = state.meta
    n_mut = len(meta.mutated_data_indices)
    graph_outs = list(meta.graph_output_indices)
    names = [o.name if isinstance(o, torch.fx.Node) else None for o in output_nodes(fn)]
    if len(names) != len(meta.outputs):
        raise NotSegmentable("the graph's outputs are not the function's flat outputs")
    fm = state.fake_mode
    primals, extra, tangents, with_tangent, sources, feeds = [], [], [], [], [], []
    extra_of: dict = {}
    n_bases_at = n_mut + len(graph_outs)
    for h in handoffs:
        ex = h.example
        with fm:
            z = torch.empty_strided(tuple(ex.shape), tuple(ex.stride()), dtype=ex.dtype, device=ex.device)
        primals.append(z.requires_grad_(True))
        k = names.index(h.source) if h.source in names else None
        feed = None
        if k is not None:
            info = meta.outputs[k]
            if not info.requires_grad or info.kind not in ("graph", "alias_of_intermediate"):
                raise NotSegmentable(f"output {k} ({info.kind}) is rebuilt at runtime and feeds a later segment")
            if info.kind == "graph":
                sources.append(n_mut + graph_outs.index(k))
                feeds.append(("out", sources[-1]))
                continue
            feed = ("view", n_bases_at + info.base, k)
        if h.source not in extra_of:
            extra_of[h.source] = len(extra)
            extra.append(h.index)
            if feed is None:
                with_tangent.append(num_fw_outputs + len(extra) - 1)
                with fm:
                    tangents.append(torch.empty(tuple(ex.shape), dtype=ex.dtype, device=ex.device))
        sources.append(num_fw_outputs + extra_of[h.source])
        feeds.append(feed or ("out", sources[-1]))
    layout = Layout(num_args=len(state.flat_args), num_handed_outputs=len(extra), sources=sources,
                    levels=[h.level for h in handoffs], feeds=feeds)
    return TracePlan(layout, primals, extra, tangents, with_tangent)
