"""Recompute regions: the calls of ``torch.utils.checkpoint.checkpoint`` a capture tagged
(``kiln/capture/values/checkpoint.py``), recomputed in the backward instead of saved.

Tags (torch's names, so that Inductor's pattern rewrites carry them to their replacements)::

    node.meta["ac_graph_id"]   the region (an int)
    node.meta["recompute"]     a CheckpointPolicy: MUST_/PREFER_RECOMPUTE or MUST_/PREFER_SAVE
    node.meta["kiln_checkpoint_policy"]  on captured nodes only: a selective policy, asked per
                               ATen op while the joint graph is traced

**Tracing.** A captured graph with regions is traced through an ``fx.Interpreter``: with node
meta preserved, every ATen node made for a captured node copies its ``recompute`` and
``ac_graph_id``. A captured node with a selective policy runs under a dispatch mode that asks
the policy about each ATen op it becomes (``SelectiveCheckpointContext(is_recompute=False)``,
the op, its arguments) and tags that op's nodes with the answer (True: MUST_SAVE, False:
PREFER_RECOMPUTE), as eager's ``create_selective_checkpoint_contexts`` would decide.

**Partitioning.** A forward node is *inside* its region when it is tagged to be recomputed,
it is pure (not a random draw: the backward must see the forward's numbers, as eager's
restored RNG state gives; not a write), and nothing outside the region reads it (a region's
outputs are what the next layer saves anyway). A saved value inside a region is replaced by
what it is computed from, up to the region's inputs, its random draws and the values its
policy saves: that is what eager's checkpoint keeps (its inputs), or less. Backward ops the
partitioner moved into the forward (a ReLU's mask, "unclaimed" nodes) that read a region's
insides are replaced the same way. Saved values the backward then no longer reads are dropped.
The min-cut partitioner also never cuts through a region's insides (and never bans their
recomputation), so its cut is at the regions' borders to begin with.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from . import fx_graphs

REGION_KEY = "ac_graph_id"
POLICY_KEY = "recompute"
SELECTIVE_POLICY_KEY = "kiln_checkpoint_policy"

_RECOMPUTE = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)


def has_regions(graph: torch.fx.Graph) -> bool:
    return any(REGION_KEY in n.meta for n in graph.nodes)


def region_of(n: torch.fx.Node) -> Any:
    return n.meta.get(REGION_KEY)


# ---------------------------------------------------------------------------------------------
# Tracing: the tags onto the ATen nodes
# ---------------------------------------------------------------------------------------------

def traced_with_regions(gm: torch.fx.GraphModule) -> Callable:
    """``gm`` itself when it has no regions; else a function that runs it node by node, so
    that tracing it (with node meta preserved) tags the ATen nodes of each region."""
    if not isinstance(gm, torch.fx.GraphModule) or not has_regions(gm.graph):
        return gm

    def run_with_region_tags(*args):
        return _RegionInterpreter(gm).run(*args)

    run_with_region_tags.__wrapped__ = gm
    return run_with_region_tags


class _RegionInterpreter(torch.fx.Interpreter):
    def run_node(self, n: torch.fx.Node) -> Any:
        policy = n.meta.get(SELECTIVE_POLICY_KEY)
        if policy is None:
            return super().run_node(n)
        with _SelectivePolicyMode(policy):
            return super().run_node(n)


class _SelectivePolicyMode(TorchDispatchMode):
    """Asks the policy about each ATen op and writes its answer into the current node meta,
    which the tracer copies onto the nodes it makes for that op."""

    def __init__(self, policy) -> None:
        super().__init__()
        self.policy = policy

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not fx_traceback.has_preserved_node_meta():     # (not tracing: nothing to tag)
            return func(*args, **kwargs)
        decision = self.policy(SelectiveCheckpointContext(is_recompute=False), func, *args, **kwargs)
        if isinstance(decision, bool):
            decision = CheckpointPolicy.MUST_SAVE if decision else CheckpointPolicy.PREFER_RECOMPUTE
        if not isinstance(decision, CheckpointPolicy):
            raise TypeError(f"a selective checkpoint policy returned {decision!r} for {func} "
                            "(expected a CheckpointPolicy or a bool)")
        meta = fx_traceback.get_current_meta()
        absent = object()
        prior = meta.get(POLICY_KEY, absent)
        meta[POLICY_KEY] = decision
        try:
            return func(*args, **kwargs)
        finally:
            if prior is absent:
                meta.pop(POLICY_KEY, None)
            else:
                meta[POLICY_KEY] = prior


# ---------------------------------------------------------------------------------------------
# Partitioning: recompute the insides of the regions
# ---------------------------------------------------------------------------------------------

def _recomputable(n: torch.fx.Node) -> bool:
    """Tagged to be recomputed, and recomputing it gives the forward's value."""
    if n.op != "call_function" or region_of(n) is None or n.meta.get(POLICY_KEY) not in _RECOMPUTE:
        return False
    if n.target is operator.getitem:
        return isinstance(n.args[0], torch.fx.Node) and _recomputable(n.args[0])
    t = n.target
    if not isinstance(t, torch._ops.OpOverload):
        return False
    return not t._schema.is_mutable and not fx_graphs.is_effect(n)


def inside_region(n: torch.fx.Node, forward: set, forward_outputs: set) -> bool:
    """``n`` is recomputed in the backward, never saved: recomputable, and read only by its
    own region (and the backward)."""
    if n not in forward or n in forward_outputs or not _recomputable(n):
        return False
    r = region_of(n)
    return all(u.op != "output" and (u not in forward or region_of(u) == r) for u in n.users)


def saved_outside_regions(joint, saved: list) -> list:
    """``saved`` (a partitioner's choice over the classified joint graph ``joint``, see
    ``partition._Joint``) with each value inside a region replaced by what it is computed
    from, and without the values the backward then does not read."""
    fw, fw_outs = joint.fw, {o for o in joint.fw_outs if isinstance(o, torch.fx.Node)}
    memo: dict = {}

    def replaced(n: torch.fx.Node) -> bool:
        hit = memo.get(n)
        if hit is None:
            if n in fw:
                hit = inside_region(n, fw, fw_outs)
            else:   # a backward op moved into the forward, reading a region's insides
                hit = n in joint.unclaimed and any(replaced(a) for a in n.all_input_nodes)
            memo[n] = hit
        return hit

    kept: set = set()
    stack = list(saved)
    seen: set = set()
    while stack:
        s = stack.pop()
        if s in seen:
            continue
        seen.add(s)
        if replaced(s):
            stack.extend(s.all_input_nodes)
        elif s.op != "get_attr":          # (constants are re-read where they are used)
            kept.add(s)
    return _read_by_backward(joint, kept)


def _read_by_backward(joint, saved: set) -> list:
    """The saved values that the gradients are computed from."""
    read: set = set()
    seen: set = set()
    stack = [g for g in joint.grads if isinstance(g, torch.fx.Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in saved:
            read.add(n)
            continue
        stack.extend(n.all_input_nodes)
    return [s for s in joint.order(saved) if s in read]
