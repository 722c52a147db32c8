"""Partitioners: the joint graph -> a forward graph and a backward graph.

A partitioner follows torch's convention::

    partition_fn(joint_module, joint_inputs, *, num_fwd_outputs) -> (fw_module, bw_module)

``fw_module`` takes the primals and returns the ``num_fwd_outputs`` forward outputs followed by
the values saved for the backward; ``bw_module`` takes the saved values then the tangents and
returns one gradient per primal (``None`` where there is none). What the two disagree on is
which values cross: that is the memory the backward keeps alive.

* ``default_partition``: save every forward value the backward reads (views are saved as their
  base and re-taken in the backward, which costs nothing).
* ``min_cut_rematerialization_partition``: choose the cheapest set of values to save such that
  everything else the backward needs can be recomputed from them with cheap ops (pointwise,
  views, small reductions...), by a max-flow/min-cut over the forward graph (networkx).
  Random ops and expensive ops (matmul, convolution...) are never recomputed.

Placeholders carry ``meta['kiln_tangent']`` (tangents) and ``kiln_static``/``kiln_mutated``;
nodes carry ``meta['kiln_phase']`` (``forward``/``backward``, from tracing). Primals and
forward outputs the user sees carry ``kiln_user_visible`` and ``kiln_eager_saved``: the
min-cut partitioner avoids saving one eager does not save (the user may change it in place
before backward(), which eager allows); stage 2 copies such a value if a partitioner does.

Checkpointed code (``torch.utils.checkpoint``): nodes tagged with a recompute region are never
saved, both partitioners save what the region is computed from instead and the backward
recomputes it (``recompute.py``).

Dynamic graphs: a symbolic size the backward needs (a SymInt input, ``sym_size``, arithmetic
on them) crosses as a Python int among the saved values, never as a tensor; byte counts use
the traced sizes (hints).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from .. import _torch
from ..config import config
from ..errors import Unsupported
from . import fx_graphs, graph_bytes
from . import recompute, symbolic
from .cse import eliminate_common_subexpressions, is_pure
from .dropout_recompute import REBUILT, rebuild_dropout_for_backward

aten = torch.ops.aten


@dataclass
class Partition:
    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule
    num_fw_outputs: int
    saved: list[str]
    saved_bytes: int            # bytes the saved tensors hold (one count per storage)
    saved_input_bytes: int      # of which are graph inputs (parameters, inputs)

    @property
    def saved_activation_bytes(self) -> int:
        return self.saved_bytes - self.saved_input_bytes


def _is_tangent(n: torch.fx.Node) -> bool:
    return n.op == "placeholder" and (n.meta.get("kiln_tangent") or n.name.startswith("tangents"))


class _Joint:
    """The joint graph, classified."""

    def __init__(self, gm: torch.fx.GraphModule, num_fwd_outputs: int):
        g = gm.graph
        self.graph = g
        phs = [n for n in g.nodes if n.op == "placeholder"]
        self.tangents = [p for p in phs if _is_tangent(p)]
        self.primals = [p for p in phs if not _is_tangent(p)]
        outs = fx_graphs.flat_outputs(g)
        self.fw_outs = outs[:num_fwd_outputs]
        self.grads = outs[num_fwd_outputs:]
        if len(self.grads) != len(self.primals):
            raise ValueError(f"partition: the joint graph returns {len(self.grads)} gradients for "
                             f"{len(self.primals)} primals (num_fwd_outputs={num_fwd_outputs})")
        tdep = set(self.tangents)
        for n in g.nodes:
            if n.op not in ("placeholder", "output") and any(a in tdep for a in n.all_input_nodes):
                tdep.add(n)
        fw_anc = fx_graphs.ancestors(self.fw_outs)
        if fw_anc & tdep:
            bad = sorted(x.name for x in fw_anc & tdep)[:3]
            raise Unsupported(f"partition: forward outputs depend on tangents ({', '.join(bad)})")
        self.bw = set()
        for n in g.nodes:
            if n.op in ("placeholder", "output"):
                continue
            if n in tdep or (n.meta.get("kiln_phase") == "backward" and n not in fw_anc):
                self.bw.add(n)
        self.fw = {n for n in g.nodes if n.op != "output" and n not in self.bw and not _is_tangent(n)}
        # Backward ops that read no tangent (ReLU's `x <= 0` mask, a weight's transpose): the
        # min-cut may run them at the end of the forward and save their result instead of
        # their inputs (a 1-byte mask for a 4-byte activation), as torch's "unclaimed" nodes.
        # Only pure ops qualify: a random op or a write stays where eager runs it.
        self.unclaimed = {n for n in self.bw if n not in tdep and _pure(n)}
        self.has_regions = recompute.has_regions(g)

    def required_bw(self, claimed_only: bool = False) -> set:
        """Backward nodes the gradients need; ``claimed_only``: only those that must run in the
        backward (the gradients themselves and what reads a tangent), not the unclaimed ones."""
        req: set = set()
        stack = [o for o in self.grads if isinstance(o, torch.fx.Node)]
        grads = set(stack)
        while stack:
            n = stack.pop()
            if n in req or n not in self.bw or (claimed_only and n in self.unclaimed and n not in grads):
                continue
            req.add(n)
            stack.extend(n.all_input_nodes)
        return req

    def order(self, nodes) -> list:
        s = set(nodes)
        return [n for n in self.graph.nodes if n in s]

    def build(self, gm: torch.fx.GraphModule, saved: list) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        if self.has_regions:    # checkpointed code: its insides are recomputed, not saved
            saved = recompute.saved_outside_regions(self, saved)
        saved = self.order(saved)
        fw_set = self.fw
        fw_graph = fx_graphs.extract_graph(self.graph, self.primals, list(self.fw_outs) + saved,
                                   keep=lambda n: fx_graphs.is_effect(n) and n in fw_set)
        bw_graph = _recompute_at_first_use(
            fx_graphs.extract_graph(self.graph, saved + self.tangents, list(self.grads)))
        fw = _torch.lazy_graph_module(gm, fw_graph, class_name="KilnForward")
        bw = _torch.lazy_graph_module(gm, bw_graph, class_name="KilnBackward")
        return fw, bw


def _pure(n: torch.fx.Node) -> bool:
    """A call whose only result is its value (no random draw, no write to anything)."""
    return (n.op == "call_function" and n.target is operator.getitem) or is_pure(n)


def _recompute_at_first_use(g: torch.fx.Graph) -> torch.fx.Graph:
    """Order the backward as the gradient computation needs it: a node that does not depend on a
    tangent (a recomputed forward value, a view of a saved value) runs just before its first
    user, not at the top of the backward where it would stay alive until that use."""
    phs = [n for n in g.nodes if n.op == "placeholder"]
    tangent_dep = {p for p in phs if _is_tangent(p)}
    for n in g.nodes:
        if n.op != "placeholder" and any(a in tangent_dep for a in n.all_input_nodes):
            tangent_dep.add(n)
    order: list = []
    done = set(phs)
    for n in g.nodes:
        if n.op == "output" or (n in tangent_dep and n.op != "placeholder") or fx_graphs.is_random(n):
            fx_graphs.emit_inputs_first(n, done, order)
    new = torch.fx.Graph()
    env: dict = {}
    for p in phs:
        env[p] = new.node_copy(p, lambda a: env[a])
    for n in order:
        env[n] = new.node_copy(n, lambda a: env[a])
    return new


def _only_tensor_arg(n: torch.fx.Node) -> bool:
    return len(n.all_input_nodes) == 1 and isinstance(n.args[0], torch.fx.Node)


def _save_view_bases(j: _Joint, saved: set) -> set:
    """Save a view's base instead of the view (same storage) and re-take the view in backward."""
    out = set()
    for s in saved:
        while fx_graphs.is_view(s) and _only_tensor_arg(s) and s.args[0] in j.fw:
            s = s.args[0]
        out.add(s)
    return out


def default_partition(joint_module: torch.fx.GraphModule, joint_inputs: Any = None, *,
                      num_fwd_outputs: int) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Save every forward value the backward reads."""
    j = _Joint(joint_module, num_fwd_outputs)
    req = j.required_bw()
    saved = set()
    for n in req:
        for a in n.all_input_nodes:
            if a in j.fw and a.op != "get_attr":
                saved.add(a)
    for gr in j.grads:  # a gradient that is a forward value
        if isinstance(gr, torch.fx.Node) and gr in j.fw and gr.op != "get_attr":
            saved.add(gr)
    return j.build(joint_module, list(_save_view_bases(j, saved)))


# ---------------------------------------------------------------------------------------------
# Min-cut rematerialization
# ---------------------------------------------------------------------------------------------

_CHEAP_OPS = {
    "clone", "_to_copy", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "empty",
    "empty_like", "empty_strided", "scalar_tensor", "arange", "expand", "_unsafe_view", "lift_fresh_copy",
    "new_zeros", "new_ones", "new_empty", "new_full", "where", "cat", "sum", "mean", "amax", "amin",
    "var", "var_mean", "index", "gather", "copy", "alias", "squeeze", "unsqueeze", "permute", "t",
    "view", "reshape", "slice", "select", "split", "split_with_sizes", "unbind", "as_strided",
    "clamp", "clamp_min", "clamp_max", "threshold_backward", "gelu", "gelu_backward", "silu", "rsub",
    "masked_fill", "fill", "argmax", "triu", "tril", "expand_copy", "permute_copy", "view_copy",
    "iota", "convert_element_type", "broadcast_in_dim", "broadcast_tensors", "var", "std", "isinf",
    "any", "maximum", "type_as", "to", "_grad_sum_to_size", "sum_to_size",
    # Inductor's max-pool decomposition: save the int8 offsets, recompute the int64 indices
    # (a ResNet's stem saves 7/8 less)
    "_low_memory_max_pool_offsets_to_indices",
}


def _recompute_allowed(n: torch.fx.Node) -> bool:
    if n.op != "call_function":
        return True
    t = n.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    if fx_graphs.is_random(n):
        return False
    if t.is_view or torch.Tag.pointwise in t.tags:
        return True
    return t._opname in _CHEAP_OPS


def _is_reduction_to_small(n: torch.fx.Node) -> bool:
    if n.op != "call_function" or fx_graphs.is_view(n) or n.target is operator.getitem:
        return False
    ins = sum(graph_bytes.node_nbytes(a) for a in n.all_input_nodes)
    return graph_bytes.node_nbytes(n) * 4 < ins


# random ops a kernel generates inside a fused kernel (never recomputed, but fusible)
_FUSIBLE_RANDOM_OPS = {"native_dropout", "rand_like", "randn_like", "bernoulli", "rand", "randn"}


def _fusible(n: torch.fx.Node) -> bool:
    """A kernel generator fuses this node into its neighbours' kernels (no buffer of its own)."""
    if n.op != "call_function":
        return False
    if _recompute_allowed(n):
        return True
    return fx_graphs.is_random(n) and n.target._opname in _FUSIBLE_RANDOM_OPS


def _fuses_into(a: torch.fx.Node, user: torch.fx.Node) -> bool:
    # (a cat writes its inputs where they go: any producer fuses into it)
    if user.op == "call_function" and isinstance(user.target, torch._ops.OpOverload) and \
            user.target._opname == "cat":
        return True
    return _fusible(a) and _fusible(user)


def _materialized_in_backward(n: torch.fx.Node, bw: set) -> bool:
    """A backward op that cannot fuse with ``n`` (a matmul's gradient, say) reads it, through
    views or not: the backward would write it out whole anyway, so recomputing it saves no
    memory the backward does not spend again and costs a kernel."""
    if fx_graphs.is_view(n):
        return False
    stack, seen = [n], {n}
    while stack:
        cur = stack.pop()
        for u in cur.users:
            if u in bw and not _fuses_into(cur, u):
                return True
            if fx_graphs.is_view(u) and u not in seen:
                seen.add(u)
                stack.append(u)
    return False


def _materialized(n: torch.fx.Node) -> bool:
    """``n`` is written to memory in the forward anyway (a user cannot fuse with it)."""
    return n.op == "placeholder" or not all(_fuses_into(n, u) for u in n.users)


def _banned(n: torch.fx.Node, bw: set) -> bool:
    """Never recompute this node in the backward."""
    if n.op != "call_function":
        return False
    if n.target is operator.getitem or fx_graphs.is_view(n):
        return False
    return not _recompute_allowed(n) or _is_reduction_to_small(n) or \
        (_materialized_in_backward(n, bw) and not _widens(n) and REBUILT not in n.meta)


def _widens(n: torch.fx.Node) -> bool:
    """``n`` is at least twice the bytes of the activations it is made from (max-pool's int64
    indices from int8 offsets, an upcast): recomputing it in the backward does save memory."""
    ins = sum(graph_bytes.node_nbytes(a) for a in n.all_input_nodes
              if not (a.op == "placeholder" and a.meta.get("kiln_static")))
    return 2 * ins <= graph_bytes.node_nbytes(n)


def _banned_by_fusion_structure(j: _Joint) -> set:
    """Forward nodes not to recompute because of where they sit, as torch's partitioner
    decides (its ``ban_if_used_far_apart`` and ``ban_if_long_fusible_chains``):

    * a value used on both sides of an op that cannot fuse (a residual stream read by a
      LayerNorm before a matmul and by the residual add after it): its later fusible users
      are not recomputed, or the backward would rebuild the whole stream from far back;
    * a chain of fusible ops longer than 100 nodes is cut at its end, so that the backward
      never recomputes a pointwise path from the start of the model to its end."""
    import heapq

    order = {n: i for i, n in enumerate(j.graph.nodes)}
    fw = j.fw
    banned: set = set()

    def first_unfusible(starts: list, max_range: int) -> int:
        heap = [(order[n], True) for n in starts]
        by_order = {order[n]: n for n in starts}
        heapq.heapify(heap)
        seen = set(heap)
        while heap:
            pos, fusible = heapq.heappop(heap)
            if not fusible:
                return pos
            node = by_order[pos]
            for u in node.users:
                if u in fw and order[u] <= max_range:
                    item = (order[u], _fuses_into(node, u))
                    if item not in seen:
                        seen.add(item)
                        by_order[order[u]] = u
                        heapq.heappush(heap, item)
        return max_range

    for used in fw:
        users = [u for u in used.users if u in fw]
        if not users:
            continue
        first = first_unfusible(users, max(order[u] for u in users))
        for u in users:
            if order[u] > first and _fuses_into(used, u) and not fx_graphs.is_view(u):
                banned.add(u)

    visited: set = set()
    for start in j.graph.nodes:
        if start not in fw:
            continue
        heap = [(order[start], start.name)]
        nodes = {start.name: start}
        while heap:
            pos, name = heapq.heappop(heap)
            cur = nodes[name]
            if cur in visited:
                continue
            visited.add(cur)
            if pos > order[start] + 100 and not heap:
                if not fx_graphs.is_view(cur):
                    banned.add(cur)
                break
            for u in cur.users:
                if u in fw and _fuses_into(cur, u) and u not in banned:
                    nodes[u.name] = u
                    heapq.heappush(heap, (order[u], u.name))
    return banned


_REDUCTIONS = {"sum", "mean", "var", "var_mean", "std", "std_mean", "amax", "amin", "argmax", "argmin", "prod",
               "logsumexp", "linalg_vector_norm", "norm", "_softmax", "_log_softmax", "native_layer_norm",
               "native_group_norm", "native_batch_norm", "_native_batch_norm_legit_functional"}


def _is_reduction(n: torch.fx.Node) -> bool:
    t = n.target
    if not isinstance(t, torch._ops.OpOverload):
        return False
    name = t._opname
    return name in _REDUCTIONS or (name in ("max", "min") and t._overloadname in ("dim", "default"))


def _cats_read_by_reductions(j: _Joint) -> set:
    """Forward ``cat`` nodes that a forward reduction reads (through fusible ops): a
    normalization of a class token joined to patch embeddings, say. Recomputed in the backward,
    such a cat is left unwritten in the forward too, and the kernel generator computes it inside
    every reduction that reads it, each a looped reduction over its inputs' own strides: slower
    to compile (seconds per kernel) and to run. It is not recomputed, and it weighs as a value
    the forward writes anyway: saved, it is written once, as torch's partitioner, which never
    recomputes a cat, does for every cat."""
    found: set = set()
    for n in j.fw:
        if not (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                and n.target._opname == "cat"):
            continue
        stack, seen = [n], {n}
        while stack:
            cur = stack.pop()
            for u in cur.users:
                if u not in j.fw or u in seen:
                    continue
                if _is_reduction(u):
                    found.add(n)
                    stack = []
                    break
                if _fusible(u):
                    seen.add(u)
                    stack.append(u)
    return found


def _without_common_subexpressions(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    new = fx_graphs.copy_graph_module(gm)
    if not eliminate_common_subexpressions(new.graph):
        return gm
    new.recompile()         # (lazy: marks the code stale)
    return new


def _with_dropout_rebuilt(joint_module: torch.fx.GraphModule, j: "_Joint", num_fwd_outputs: int) -> "_Joint":
    """The joint graph whose backward reads dropout's output rebuilt from its mask
    (``dropout_recompute.py``), on a copy; ``j`` itself where there is nothing to rebuild."""
    if not any(n.target is aten.native_dropout.default for n in j.fw):
        return j
    copy = fx_graphs.copy_graph_module(joint_module)
    names = {n.name for n in j.bw}
    if not rebuild_dropout_for_backward(copy.graph, {n for n in copy.graph.nodes if n.name in names}):
        return j
    copy.graph.lint()
    copy.recompile()
    return _Joint(copy, num_fwd_outputs)


def min_cut_rematerialization_partition(joint_module: torch.fx.GraphModule, joint_inputs: Any = None, *,
                                        num_fwd_outputs: int) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Save the cheapest cut between the primals and the backward; recompute the rest."""
    try:
        import networkx as nx
    except ImportError as e:  # pragma: no cover
        raise RuntimeError("the min-cut partitioner needs networkx (pip install networkx)") from e

    # (a copy: the caller's joint graph stays as traced)
    joint_module = _without_common_subexpressions(joint_module)
    j = _Joint(joint_module, num_fwd_outputs)
    j = _with_dropout_rebuilt(joint_module, j, num_fwd_outputs)
    req = j.required_bw(claimed_only=True)
    # distance (in nodes) from each forward node to the backward (weights the cut)
    dist: dict = {n: 0 for n in req | j.unclaimed}
    for n in reversed(list(j.graph.nodes)):
        if n in j.fw:
            ds = [dist[u] + 1 for u in n.users if u in dist]
            if ds:
                dist[n] = min(ds)

    written_cats = _cats_read_by_reductions(j)
    also_banned = _banned_by_fusion_structure(j) | written_cats
    # a gradient that is a forward value (an autograd.Function's backward returning what its
    # forward saved): the backward needs it as it is, saved or recomputed like any value it
    # reads (a random draw, banned from recomputation, is then saved)
    grads_in_fw = {g for g in j.grads if isinstance(g, torch.fx.Node) and g in j.fw}
    fw_outs = {o for o in j.fw_outs if isinstance(o, torch.fx.Node)}
    inside = {n for n in j.fw if recompute.inside_region(n, j.fw, fw_outs)} if j.has_regions else set()
    G = nx.DiGraph()
    G.add_node("source")
    G.add_node("sink")
    for n in j.graph.nodes:
        if n.op == "output":
            continue
        if n in req or _is_tangent(n):
            G.add_edge(n.name + "_in", "sink")            # infinite
            continue
        if n not in j.fw and n not in j.unclaimed:
            continue
        # (an unclaimed op is a backward op: running it there is never a recomputation)
        if n in j.fw and n not in inside and (n.op == "placeholder" or n in also_banned or _banned(n, j.bw)):
            G.add_edge("source", n.name + "_in")
        val = n.meta.get("val")
        if n in inside:
            w = math.inf                                    # recomputed: a checkpointed region's insides
        elif n.op == "get_attr":
            w = math.inf                                    # constants are re-read, never saved
        elif symbolic.is_sym(val):
            w = 8.0                                         # a symbolic size: saved as an int
        elif isinstance(val, (tuple, list)) or not isinstance(val, torch.Tensor):
            w = math.inf                                    # save its getitems instead
        elif fx_graphs.is_view(n) and _only_tensor_arg(n):
            w = math.inf                                    # save the base: same storage
        elif n.meta.get("kiln_user_visible") and not n.meta.get("kiln_eager_saved"):
            # the user may change it before backward(): stage 2 copies it if it is cut (one
            # multi-tensor copy per call). For a parameter (a BatchNorm's bias, which the
            # normalized activations after it are recomputed from) that copy is worth its
            # bytes; for anything else (an input batch, an output), never.
            w = float(graph_bytes.node_nbytes(n)) if n.op == "placeholder" and n.meta.get("kiln_static") else 1e15
        elif n.op == "placeholder" and n.meta.get("kiln_mutated"):
            w = 1e15                                        # copied into after the forward
        elif n.op == "placeholder" and n.meta.get("kiln_static"):
            w = 0.0                                         # parameters are alive anyway
        else:
            # Saving a value the forward would only have kept in registers (all its users fuse
            # with it) costs a write it would not have made: twice the bytes. And the farther
            # from the backward, the longer a saved value stays alive: 10% more per node.
            written = n in written_cats or _materialized(n)
            w = float(graph_bytes.node_nbytes(n)) * (1.0 if written and REBUILT not in n.meta else 2.0)
            w *= 1.1 ** max(min(dist.get(n, 100), 100), 1)
        if not math.isinf(w):
            w += 1e-6
            G.add_edge(n.name + "_in", n.name + "_out", capacity=w)
        else:
            G.add_edge(n.name + "_in", n.name + "_out")
        for u in n.users:
            if u.op != "output":
                G.add_edge(n.name + "_out", u.name + "_in")
        if n in grads_in_fw:
            G.add_edge(n.name + "_out", "sink")
    try:
        _, (reach, _non) = nx.minimum_cut(G, "source", "sink")
    except nx.NetworkXUnbounded as e:  # pragma: no cover (every path has a finite edge)
        raise Unsupported(f"min-cut partitioner: no finite cut ({e}); use partition_fn='default'") from e
    saved = set()
    for n in j.fw | j.unclaimed:
        if n.name + "_in" in reach and n.name + "_out" not in reach and G.has_node(n.name + "_out"):
            saved.add(n)
    return j.build(joint_module, list(saved))


# ---------------------------------------------------------------------------------------------

PARTITIONERS: dict[str, Callable] = {
    "default": default_partition,
    "min_cut": min_cut_rematerialization_partition,
}


def resolve_partition_fn(partition_fn: Any) -> Callable:
    if partition_fn is None:
        partition_fn = config.aot_partition_fn
    if isinstance(partition_fn, str):
        try:
            return PARTITIONERS[partition_fn]
        except KeyError:
            raise ValueError(f"unknown partition_fn {partition_fn!r}; use one of {sorted(PARTITIONERS)} "
                             "or a callable (joint_module, joint_inputs, *, num_fwd_outputs) -> (fw, bw)") from None
    if callable(partition_fn):
        return partition_fn
    raise TypeError(f"partition_fn must be a name or a callable, not {type(partition_fn).__name__}")


def partition_joint(gm: torch.fx.GraphModule, joint_inputs: Any, num_fw_outputs: int, num_tangents: int,
                    partition_fn: Any = None) -> Partition:
    fn = resolve_partition_fn(partition_fn)
    fw, bw = fn(gm, joint_inputs, num_fwd_outputs=num_fw_outputs)
    fw.meta.setdefault("kiln_num_fw_outputs", num_fw_outputs)   # (the rest are saved tensors)
    fw_outs = fx_graphs.flat_outputs(fw.graph)
    saved = fw_outs[num_fw_outputs:]
    n_bw_in = sum(1 for n in bw.graph.nodes if n.op == "placeholder")
    if n_bw_in != len(saved) + num_tangents:
        raise ValueError(f"partition: the backward takes {n_bw_in} inputs, expected {len(saved)} saved "
                         f"values + {num_tangents} tangents")
    saved_nodes = [s for s in saved if isinstance(s, torch.fx.Node)]
    total, inputs = graph_bytes.saved_bytes(saved_nodes)
    return Partition(fw, bw, num_fw_outputs, [s.name for s in saved_nodes], total, inputs)


def partition_capture(capture, partition_fn: Any = None) -> Partition:
    gm = capture.graph_module
    n = capture.num_primals
    ex = capture.example_inputs
    return partition_joint(gm, (ex[:n], ex[n:]), capture.num_fw_outputs, capture.num_tangents, partition_fn)
