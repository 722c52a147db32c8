"""Dropout's output, rebuilt from its mask for the backward.

When random ops stay whole (Inductor's ``fallback_random``, kiln's default, so that one seed
draws eager's numbers), ``native_dropout(x, p, True)`` is one ATen kernel that returns the
dropped tensor and its mask. The partitioner may not recompute a random op, so every backward
use of the dropped tensor (the probabilities an attention's value gradient reads, a Linear's
input) made it save that tensor, although the backward keeps ``x`` or the mask anyway (the
mask for dropout's own gradient, an attention's probabilities for softmax's). Eager saves the
same extra tensor; torch.compile, which draws dropout inside its kernels, rebuilds it.

Here the backward's uses read ``x * mask * (1 / (1 - p))`` instead: the same value (where the
mask keeps an element, the kernel computes exactly that product; elsewhere both are zero),
made of pure pointwise ops the min-cut may recompute from what it saves. The forward keeps the
kernel's own output. A pure one-input op between the dropped tensor and the backward (the
autocast cast before a matmul, a view) is copied for the backward's side, so the cut can move
past it too.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

aten = torch.ops.aten

# (meta) a node made here: only the backward reads it, so saving it would cost the forward a
# kernel output it never writes otherwise (the partitioner weighs it so)
REBUILT = "kiln_rebuilt_for_backward"
_MAX_CHAIN = 4      # pure one-input ops copied between the dropped tensor and the backward


def rebuild_dropout_for_backward(graph: torch.fx.Graph, backward: set) -> bool:
    """Rewrite ``graph`` in place (``backward``: its backward nodes); True when it changed."""
    changed = False
    for nd in list(graph.nodes):
        parts = _dropout_parts(nd)
        if parts is None:
            continue
        x, out, mask, scale = parts
        if not _has_backward_use(out, backward, _MAX_CHAIN):
            continue
        with graph.inserting_before(mask.next):
            kept = graph.call_function(aten.mul.Tensor, (x, mask))
            rebuilt = graph.call_function(aten.mul.Tensor, (kept, scale))
        _set_val(kept, _val(x) * _val(mask))
        _set_val(rebuilt, _val(kept) * scale)
        kept.meta[REBUILT] = rebuilt.meta[REBUILT] = True
        _route_backward_uses(graph, out, rebuilt, backward, _MAX_CHAIN)
        changed = True
    return changed


def _dropout_parts(nd: torch.fx.Node):
    """``(x, out, mask, scale)`` of a training ``native_dropout`` whose two results are read."""
    if nd.op != "call_function" or nd.target is not aten.native_dropout.default:
        return None
    args = list(nd.args) + [nd.kwargs.get(k) for k in ("input", "p", "train")[len(nd.args):]]
    x, p, train = args[:3]
    if train is not True or not isinstance(p, (int, float)) or not 0 <= p < 1:
        return None         # (p == 1: the kernel returns zeros, the product would be nan)
    if not isinstance(x, torch.fx.Node) or not isinstance(_val(x), torch.Tensor):
        return None
    got = {u.args[1]: u for u in nd.users if u.op == "call_function" and u.target is operator.getitem}
    if got.get(0) is None or got.get(1) is None:
        return None
    return x, got[0], got[1], 1.0 / (1.0 - p)


def _has_backward_use(node: torch.fx.Node, backward: set, depth: int) -> bool:
    for u in node.users:
        if u in backward or (depth > 0 and _copyable(u, node) and _has_backward_use(u, backward, depth - 1)):
            return True
    return False


def _route_backward_uses(graph, node: torch.fx.Node, replacement: torch.fx.Node, backward: set,
                         depth: int) -> None:
    """Make ``node``'s backward users read ``replacement``; a forward user that is a pure
    one-input op with backward users of its own gets a copy over ``replacement`` for them."""
    for u in list(node.users):
        if u in backward:
            u.replace_input_with(node, replacement)
        elif depth > 0 and _copyable(u, node) and _has_backward_use(u, backward, depth - 1):
            with graph.inserting_before(_later(u, replacement).next):
                twin = graph.node_copy(u, lambda a: replacement if a is node else a)
            twin.meta = {k: v for k, v in u.meta.items() if k in ("val", "tensor_meta", "stack_trace")}
            twin.meta[REBUILT] = True
            _route_backward_uses(graph, u, twin, backward, depth - 1)


def _copyable(u: torch.fx.Node, src: torch.fx.Node) -> bool:
    """A pure op whose only tensor input is ``src`` (a cast, a view, a scale)."""
    t = u.target
    if u.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in t.tags or t._schema.is_mutable:
        return False
    if not (t.is_view or torch.Tag.pointwise in t.tags or t is torch.ops.prims.convert_element_type.default):
        return False
    return all(a is src for a in u.all_input_nodes)


def _later(a: torch.fx.Node, b: torch.fx.Node) -> torch.fx.Node:
    """The one of ``a`` and ``b`` that comes later in their graph."""
    n = a.next
    while n.op != "root":
        if n is b:
            return b
        n = n.next
    return a


def _val(n: torch.fx.Node):
    return n.meta.get("val")


def _set_val(n: torch.fx.Node, v) -> None:
    n.meta["val"] = v
