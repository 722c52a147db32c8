"""Whether an in-place write may hit eager's partial-overlap error.

Eager refuses an in-place (TensorIterator) op whose output and one of its inputs are
different views of the same memory that partly overlap ("unsupported operation: some
elements of the input tensor and the written-to tensor refer to a single memory location").
Fake tensors do not run that check, so a graph would raise it later, from the graph, with a
traceback that does not point at the user's line (or, functionalized, not raise at all). Such
a write is left to eager: a graph break, so eager either runs it or raises its own error.
The check mirrors ATen's ``get_overlap_status``; where a size is symbolic it answers "may"."""
from __future__ import annotations

import torch


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two different tensors over one storage."""
    try:
        return a is not b and a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except Exception:   # noqa: BLE001 - no storage to compare (sparse, nested): not ours to refuse
        return False


def _dense(sizes, strides) -> bool:
    """Non-overlapping and dense (some permutation of the dims is contiguous), as ATen's
    ``is_non_overlapping_and_dense`` (concrete sizes)."""
    expected = 1
    for size, stride in sorted(zip(sizes, strides), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _layout(t: torch.Tensor) -> tuple:
    """Sizes, strides and offset, symbolic ones as their expressions (compared as written)."""
    return tuple(v.node.expr if isinstance(v, torch.SymInt) else v
                 for v in (*t.shape, *t.stride(), t.storage_offset()))


def _ints(*values) -> bool:
    return all(type(v) is int for v in values)


def may_partially_overlap(out: torch.Tensor, inp: torch.Tensor) -> bool:
    """Whether writing ``out`` while reading ``inp`` may be refused by eager as a partial
    overlap (both fake tensors of this capture)."""
    if not same_storage(out, inp):
        return False
    if _layout(out) == _layout(inp):
        return False   # the same view (``t[i] += 1`` writes back what it read): allowed
    shapes = (*out.shape, *out.stride(), out.storage_offset(), *inp.shape, *inp.stride(), inp.storage_offset())
    if not _ints(*shapes):
        return True
    if out.numel() == 0 or inp.numel() == 0:
        return False
    if not (_dense(out.shape, out.stride()) and _dense(inp.shape, inp.stride())):
        return False   # ATen: "too hard", not checked
    a0, b0 = out.storage_offset() * out.element_size(), inp.storage_offset() * inp.element_size()
    a1, b1 = a0 + out.numel() * out.element_size(), b0 + inp.numel() * inp.element_size()
    if (a0, a1) == (b0, b1):
        return tuple(out.stride()) != tuple(inp.stride())
    return a0 < b1 and b0 < a1


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether some elements of ``t`` share memory (an expanded tensor): eager refuses to
    write into it. ATen's own test, which the fake tensor's strides answer ("too hard" and
    symbolic strides count as no, as eager's check does: it raises only on a sure yes)."""
    try:
        return torch._debug_has_internal_overlap(t) == 1
    except Exception:   # noqa: BLE001 - symbolic strides it cannot decide, no storage
        return False
