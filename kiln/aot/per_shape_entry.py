"""The saved form of a graph compiled per shape (``dynamic.PerShapeCompiled``): why it is
compiled per shape, and the backend's payload of each shape compiled so far, keyed by the
call's ``shape_key`` as text. A load rebuilds the per-shape callable without tracing again:
each stored shape is loaded from its payload when a call first has it, and other shapes are
compiled as after a compile (and added to the entry)."""
from __future__ import annotations

import io
from typing import Callable

import torch

from .dynamic import PerShapeCompiled

FORMAT = "kiln.per_shape"
VERSION = 1
_MAGIC = b"kiln.per_shape\n"   # (a backend's own payload never starts so: dispatch without reading it)


def dump(compiled: PerShapeCompiled) -> bytes:
    """The entry's bytes: the shapes loaded or compiled in this process and those stored and
    not needed yet."""
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "version": VERSION, "reason": compiled.reason,
                "shapes": {**compiled.stored, **compiled.saved}}, buf)
    return _MAGIC + buf.getvalue()


def is_entry(payload: bytes) -> bool:
    """Whether ``payload`` is a per-shape entry (not one graph's artifact)."""
    return payload.startswith(_MAGIC)


def map_shapes(payload: bytes, fn: Callable[[bytes], bytes]) -> bytes:
    """The entry with ``fn`` applied to each shape's payload."""
    obj = _read(payload)
    obj["shapes"] = {k: fn(v) for k, v in obj["shapes"].items()}
    buf = io.BytesIO()
    torch.save(obj, buf)
    return _MAGIC + buf.getvalue()


def _read(payload: bytes) -> dict:
    if not is_entry(payload):
        raise ValueError("not a kiln per-shape entry")
    obj = torch.load(io.BytesIO(payload[len(_MAGIC):]), weights_only=True)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ValueError("not a kiln per-shape entry")
    if obj.get("version") != VERSION:
        raise ValueError(f"per-shape entry version {obj.get('version')} (this kiln reads {VERSION})")
    return obj


def load(payload: bytes, make: Callable[[str], PerShapeCompiled], load_one: Callable[[bytes], Callable]
         ) -> PerShapeCompiled:
    """The per-shape callable rebuilt: ``make(reason)`` returns a new, empty one wired to the
    backend (its ``saver`` and ``on_new``), ``load_one(payload)`` loads one shape's result."""
    obj = _read(payload)
    compiled = make(str(obj["reason"]))
    compiled.stored = dict(obj["shapes"])
    compiled.load_one = load_one
    return compiled
