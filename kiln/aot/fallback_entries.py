"""The saved forms of what ``compile_graph`` returns besides one AOT result, for the compile
cache and packages:

* a graph compiled per shape (``dynamic.PerShapeCompiled``): why, and the backend's payload of
  each shape compiled so far, keyed by the call's ``shape_key`` as text. A load answers those
  shapes from their payloads (loaded when a call first has that shape) and compiles others as
  after a compile, adding them to the entry; it never retries the symbolic trace;
* a graph kiln's AOT stages failed on (``dynamic.as_captured``): the reason only (the graph is
  the entry's own). A load runs it as captured without tracing it again: the stages fail on it
  the same way for this kiln and this torch, which the entry's key holds.

Each starts with its own magic line, which no backend's payload starts with: a load tells them
apart without reading them."""
from __future__ import annotations

import io
from typing import Callable

import torch

from .. import _torch
from ..errors import Unsupported
from .dynamic import PerShapeCompiled, run_as_captured

VERSION = 1
_PER_SHAPE = b"kiln.per_shape\n"
_AS_CAPTURED = b"kiln.as_captured\n"


def dump(compiled: Callable) -> bytes | None:
    """The entry's bytes, or None: ``compiled`` is one AOT result (the backend's own form)."""
    if isinstance(compiled, PerShapeCompiled):
        return _with_shapes(compiled.reason, {**compiled.stored, **compiled.saved})
    reason = getattr(compiled, "aot_failure", None)
    return None if reason is None else _AS_CAPTURED + reason.encode()


def is_entry(payload: bytes) -> bool:
    return payload.startswith((_PER_SHAPE, _AS_CAPTURED))


def load(payload: bytes, gm: torch.fx.GraphModule, make_per_shape: Callable[[str], PerShapeCompiled],
         load_one: Callable[[bytes], Callable]) -> Callable:
    """The compiled graph rebuilt. A per-shape entry: ``make_per_shape(reason)`` returns a new,
    empty ``PerShapeCompiled`` wired to the backend (its ``saver`` and ``on_new``), and
    ``load_one(payload)`` loads one shape's result."""
    if payload.startswith(_AS_CAPTURED):
        reason = payload[len(_AS_CAPTURED):].decode()
        if gm.meta.get("kiln_fullgraph"):
            # (fullgraph=True raises where the stages fail: compile, and raise as a compile does)
            raise Unsupported(f"AOT autograd failed on the graph: {reason}")
        return run_as_captured(gm, reason)
    obj = _read_shapes(payload)
    compiled = make_per_shape(str(obj["reason"]))
    compiled.stored = dict(obj["shapes"])
    compiled.load_one = load_one
    return compiled


def map_shapes(payload: bytes, fn: Callable[[bytes], bytes]) -> bytes:
    """The entry with ``fn`` applied to each shape's payload (an as-captured entry has none)."""
    if payload.startswith(_AS_CAPTURED):
        return payload
    obj = _read_shapes(payload)
    return _with_shapes(obj["reason"], {k: fn(v) for k, v in obj["shapes"].items()})


def _with_shapes(reason: str, shapes: dict) -> bytes:
    buf = io.BytesIO()
    torch.save({"version": VERSION, "reason": reason, "shapes": shapes}, buf)
    return _PER_SHAPE + buf.getvalue()


def _read_shapes(payload: bytes) -> dict:
    if not payload.startswith(_PER_SHAPE):
        raise ValueError("not a kiln per-shape entry")
    obj = _torch.load_tensors(payload[len(_PER_SHAPE):])
    if not isinstance(obj, dict) or obj.get("version") != VERSION:
        raise ValueError(f"per-shape entry version {obj.get('version') if isinstance(obj, dict) else '?'} "
                         f"(this kiln reads {VERSION})")
    return obj
