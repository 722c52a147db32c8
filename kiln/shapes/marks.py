"""``kiln.mark_dynamic`` / ``kiln.mark_static``: per-tensor, per-dim overrides of the policy.

The marks live on the tensor object (as torch.compile's do), so they travel with it to every
compiled function it is passed to, and are read when a capture wraps the tensor.
"""
from __future__ import annotations

from typing import Iterable

import torch

_DYNAMIC = "_kiln_dynamic_dims"
_STATIC = "_kiln_static_dims"


def _dims(t: torch.Tensor, dim, what: str) -> set[int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"kiln.{what} expects a tensor, got {type(t).__name__}")
    if dim is None:
        return set(range(t.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    out = set()
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool):
            raise TypeError(f"kiln.{what}: dim must be an int or a list of ints, got {d!r}")
        if not -t.dim() <= d < t.dim():
            raise IndexError(f"kiln.{what}: dim {d} is out of range for a tensor of rank {t.dim()}")
        out.add(d % t.dim())
    return out


def mark_dynamic(t: torch.Tensor, dim: int | Iterable[int]) -> None:
    """Make ``t``'s size in ``dim`` (an int or several) symbolic in every capture it is passed
    to, whatever the ``dynamic=`` policy: one graph serves all its sizes. If the program forces
    the dim to a constant (``if x.size(0) == 8``, a view with a fixed size), compiling raises
    ``kiln.ConstraintViolation`` naming the line that specialized it. Sizes 0 and 1 stay static."""
    dims = _dims(t, dim, "mark_dynamic")
    setattr(t, _DYNAMIC, getattr(t, _DYNAMIC, frozenset()) | dims)
    if hasattr(t, _STATIC):
        setattr(t, _STATIC, getattr(t, _STATIC) - dims)


def mark_static(t: torch.Tensor, dim: int | Iterable[int] | None = None) -> None:
    """Keep ``t``'s size in ``dim`` (default: every dim) static, even where automatic dynamic
    shapes or ``dynamic=True`` would make it symbolic."""
    dims = _dims(t, dim, "mark_static")
    setattr(t, _STATIC, getattr(t, _STATIC, frozenset()) | dims)
    if hasattr(t, _DYNAMIC):
        setattr(t, _DYNAMIC, getattr(t, _DYNAMIC) - dims)


def marked_dynamic(t: torch.Tensor) -> frozenset:
    return getattr(t, _DYNAMIC, frozenset())


def marked_static(t: torch.Tensor) -> frozenset:
    return getattr(t, _STATIC, frozenset())
