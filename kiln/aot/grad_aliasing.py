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

import torch


def _extent(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage address, first byte, end byte) of the memory ``t`` covers; None when empty."""
    if t.numel() == 0 or t.is_sparse or t.layout != torch.strided:
        return None
    try:
        base = t.untyped_storage().data_ptr()
    except Exception:   # (a tensor without storage: a subclass, a functional wrapper)
        return None
    size = t.element_size()
    start = t.storage_offset() * size
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return base, start, start + span * size


def distinct(grads) -> tuple:
    """``grads`` with each tensor that overlaps an earlier one's memory (or is the same
    tensor) replaced by a copy."""
    seen: list[tuple[int, int, int]] = []
    ids: set[int] = set()
    out = list(grads)
    for i, g in enumerate(out):
        if not isinstance(g, torch.Tensor):
            continue
        ext = _extent(g)
        if id(g) in ids or (ext is not None and any(b == ext[0] and s < ext[2] and ext[1] < e for b, s, e in seen)):
            out[i] = g.clone()
            continue
        ids.add(id(g))
        if ext is not None:
            seen.append(ext)
    return tuple(out)
