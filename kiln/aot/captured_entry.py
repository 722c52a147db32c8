"""The saved form of a graph kiln's AOT stages failed on, which runs as captured
(``dynamic.as_captured``): the reason, nothing else (the graph is the entry's own). A load
runs the graph as captured without tracing it again: the stages fail on it the same way for
this kiln and this torch, which the entry's key holds."""
from __future__ import annotations

from typing import Callable

import torch

from ..errors import Unsupported
from .dynamic import run_as_captured

_MAGIC = b"kiln.as_captured\n"   # (a backend's own payload never starts so)


def dump(compiled: Callable) -> bytes | None:
    """The entry's bytes, or None: ``compiled`` is not a graph run as captured."""
    reason = getattr(compiled, "aot_failure", None)
    return None if reason is None else _MAGIC + reason.encode()


def is_entry(payload: bytes) -> bool:
    return payload.startswith(_MAGIC)


def load(payload: bytes, gm: torch.fx.GraphModule) -> Callable:
    reason = payload[len(_MAGIC):].decode()
    if gm.meta.get("kiln_fullgraph"):
        # (fullgraph=True raises where the stages fail: compile, and raise as a compile does)
        raise Unsupported(f"AOT autograd failed on the graph: {reason}")
    return run_as_captured(gm, reason)
