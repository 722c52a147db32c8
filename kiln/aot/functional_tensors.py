"""Functional tensors (Python functionalization: ``torch._subclasses.functional_tensor``):
into and out of them, and the dispatch key kept out of the way."""
from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.functional_tensor import FunctionalTensor

from . import symbolic


def exclude_functionalize_key():
    """Functionalization runs as a Python mode; keep the C++ Functionalize key out of the way
    above it (as every user of FunctionalTensorMode must)."""
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize))


def to_fun(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and not isinstance(t, FunctionalTensor):
        return FunctionalTensor.to_functional(t)
    return t


def from_fun(t: Any) -> Any:
    if not isinstance(t, FunctionalTensor):
        return t
    torch._sync(t)
    return torch._from_functional_tensor(t.elem)


def sync(t: Any) -> None:
    if isinstance(t, FunctionalTensor):
        torch._sync(t)


def replay_view(base: torch.Tensor, view: Any) -> torch.Tensor | None:
    """``view`` (a functional view of the functional form of ``base``) taken again from
    ``base`` by replaying its view ops, as eager took it: its sizes, strides and offset in
    ``base``'s layout. A view of a functional tensor written in place reports the layout of
    the written value (``col.mul_(2)`` on a strided column makes ``col[1:]`` contiguous),
    which is not where eager's view reads. None where torch cannot replay the view ops."""
    fz = torch._C._functionalization
    get, apply = getattr(fz, "get_view_meta_sequence", None), getattr(fz, "apply_view_meta_sequence", None)
    if get is None or apply is None or not isinstance(view, FunctionalTensor):
        return None
    try:
        sequence = get(view.elem)
        with torch.utils._python_dispatch._disable_current_modes():
            out = apply(base, sequence)
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return None
    return out if isinstance(out, torch.Tensor) and len(out.shape) == len(view.shape) else None


def keeps_layout(functional: Any, original: torch.Tensor) -> bool:
    """Whether the value a functional input holds now (after writes in place) is laid out as
    the input came in: then views of it have the input's strides and offsets."""
    sync(functional)
    value = torch._from_functional_tensor(functional.elem)
    return symbolic.known_equal((*value.stride(), value.storage_offset()),
                                (*original.stride(), original.storage_offset()))
