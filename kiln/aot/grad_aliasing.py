"""Gradients a compiled backward returns must not share memory with each other.

Autograd stores a leaf's gradient without copying it when nothing else holds the tensor
(``AccumulateGrad`` "steals" it), and the next backward then adds into that ``.grad`` in place.
Eager's backward makes one tensor per gradient. A compiled backward may not: the graph computes
equal gradients once (two biases added to one output both get ``tangent.sum(0)``), or returns
several views of one buffer. Two leaves would then hold one ``.grad``, and every later
accumulation into one would be added to the other too (their gradients doubled from the second
step of a training loop on). So a gradient whose memory overlaps an earlier one's is copied.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from . import fx_graphs


def _extent(t: torch.Tensor) -> tuple[int, int] | None:
    """(first byte, end byte) of the memory ``t`` covers in its storage; None when empty."""
    if t.numel() == 0:
        return None
    size = t.element_size()
    start = t.storage_offset() * size
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return start, start + span * size


def _storage(t: torch.Tensor) -> int | None:
    if t.is_sparse or t.layout != torch.strided:
        return None
    try:
        return t.untyped_storage().data_ptr() or None
    except Exception:   # (a tensor without storage: a subclass, a functional wrapper)
        return None


def distinct(grads) -> tuple:
    """``grads`` with each tensor that overlaps an earlier one's memory (or is the same
    tensor) replaced by a copy. One storage lookup per gradient; extents are compared only
    between gradients of one storage."""
    out = list(grads)
    if len(out) < 2:
        return tuple(out)
    by_storage: dict = {}
    for i, g in enumerate(out):
        if not isinstance(g, torch.Tensor):
            continue
        key = _storage(g)
        if key is None:
            continue
        earlier = by_storage.get(key)
        if earlier is None:
            by_storage[key] = [g]
            continue
        ext = _extent(g)
        if ext is None:
            continue
        if any(h is g or (e := _extent(h)) is not None and e[0] < ext[1] and ext[0] < e[1] for h in earlier):
            out[i] = g.clone()
        else:
            earlier.append(g)
    return tuple(out)


def outputs_may_share_memory(graph: torch.fx.Graph, outputs: list | None = None) -> bool:
    """Whether two of ``graph``'s outputs may be one tensor or views of one: the same node
    twice, or two nodes that alias one root (a view, an op whose schema returns an alias, the
    item of such an op's list). False lets a backward skip ``distinct`` on every call:
    duplicate computations were merged into one node before, so aliasing shows here."""
    roots = set()
    for out in (fx_graphs.flat_outputs(graph) if outputs is None else outputs):
        if not isinstance(out, torch.fx.Node):
            continue
        root = _alias_root(out)
        if root in roots:
            return True
        roots.add(root)
    return False


def _returns_alias(node: torch.fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    return any(r.alias_info is not None for r in target._schema.returns)


def _alias_root(node: torch.fx.Node) -> torch.fx.Node:
    while True:
        if node.op == "call_function" and node.target is operator.getitem \
                and isinstance(node.args[0], torch.fx.Node):
            source = node.args[0]
            if not _returns_alias(source):
                return node          # (an item of a list of new tensors is its own)
            node = source
        if _returns_alias(node) and node.args and isinstance(node.args[0], torch.fx.Node):
            node = node.args[0]
            continue
        return node

