"""Eager's memory-overlap checks for in-place writes, which functionalization drops.

Eager refuses an in-place write whose written-to tensor has more than one element at one
address (an ``expand``ed tensor), or whose input partially overlaps the written-to tensor
(``x.t().add_(x)``, ``x[1:].copy_(x[:-1])``): "unsupported operation: ... refer to a single
memory location". A functionalized graph computes such a write out of place and raises
nothing. ``overlapping_write(gm)`` finds those writes in a captured (torch-level) graph from
its example values; the AOT stages then refuse the graph, and it runs as captured, raising as
eager does.
"""
from __future__ import annotations

import operator

import torch
import torch.fx
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
from torch.multiprocessing.reductions import StorageWeakRef

from ..inplace_ops import inplace_name

# in-place ops that change metadata only, or write without eager's overlap checks
_EXEMPT = {"fill_", "zero_", "t_", "transpose_", "unsqueeze_", "squeeze_", "as_strided_", "resize_",
           "resize_as_", "set_", "requires_grad_", "retain_grad_", "share_memory_", "detach_",
           "swapdims_", "swapaxes_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_",
           "geometric_", "cauchy_", "log_normal_"}


def _inplace_name(node: torch.fx.Node) -> str | None:
    if node.op not in ("call_method", "call_function") or node.target is operator.setitem:
        return None
    name = inplace_name(node.op, node.target)
    return name if name is not None and name not in _EXEMPT else None


def _fake(a):
    if isinstance(a, torch.fx.Node):
        v = a.meta.get("example_value")
        if isinstance(v, torch.Tensor):
            return v
    return None


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    """[first byte, last byte] of ``t`` in its storage; None when empty or symbolic."""
    try:
        sizes = [int(s) for s in t.shape]
        strides = [int(s) for s in t.stride()]
        start = int(t.storage_offset())
    except Exception:      # symbolic: unknown, treated as overlapping
        return (0, -1)
    if 0 in sizes:
        return None
    last = start + sum((s - 1) * st for s, st in zip(sizes, strides))
    es = t.element_size()
    return start * es, last * es + es - 1


def _partial_overlap(out: torch.Tensor, inp: torch.Tensor) -> bool:
    """torch's ``get_overlap_status(out, inp) == PARTIAL`` (TOO_HARD counts as none, as in
    eager)."""
    if out is inp:
        return False
    if StorageWeakRef(out.untyped_storage()) != StorageWeakRef(inp.untyped_storage()):
        return False
    a, b = _span(out), _span(inp)
    if a is None or b is None:
        return False
    if a == (0, -1) or b == (0, -1):
        return True
    try:
        if not (is_non_overlapping_and_dense(out) and is_non_overlapping_and_dense(inp)):
            return False
        if a == b:
            return tuple(out.stride()) != tuple(inp.stride())
    except Exception:
        return True
    return a[0] <= b[1] and b[0] <= a[1]


def _internal_overlap(t: torch.Tensor) -> bool:
    try:
        return torch._debug_has_internal_overlap(t) == 1
    except Exception:
        return False


def _setitem_target(node: torch.fx.Node) -> torch.Tensor | None:
    """The view ``x[index]`` that ``x[index] = value`` writes to (basic indexing with constant
    indices only: advanced indexing writes through index_put_, which copies)."""
    base = _fake(node.args[0])
    index = node.args[1]
    parts = index if isinstance(index, tuple) else (index,)
    if base is None or not all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts):
        return None
    if any(isinstance(p, slice) and any(isinstance(x, torch.fx.Node) for x in (p.start, p.stop, p.step))
           for p in parts):
        return None
    try:
        with base.fake_mode:
            return base[index]
    except Exception:
        return None


def overlapping_write(gm: torch.fx.GraphModule) -> str | None:
    """A description of the first in-place write of ``gm`` that eager refuses for overlapping
    memory, or None."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is operator.setitem and len(node.args) == 3:
            name, out = "x[...] = value", _setitem_target(node)
            if out is None:
                continue
            node_args = [node.args[2]]
        else:
            name = _inplace_name(node)
            if name is None or not node.args:
                continue
            out = _fake(node.args[0])
            if out is None:
                continue
            node_args = list(node.args[1:]) + list(node.kwargs.values())
        if _internal_overlap(out):
            return f"{name} writes to a tensor whose elements share memory (an expanded tensor)"
        others = [_fake(a) for a in node_args]
        for inp in others:
            if inp is not None and _partial_overlap(out, inp):
                return f"{name} reads memory it partially overwrites"
    return None
