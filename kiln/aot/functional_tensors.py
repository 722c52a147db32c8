"""Functional tensors (Python functionalization: ``torch._subclasses.functional_tensor``):
into and out of them, and the dispatch key kept out of the way."""
from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.functional_tensor import FunctionalTensor


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
