"""``id()`` during capture.

An object read through a global or closure source keeps its identity from call to call only
while a guard says so: its ``id`` is a constant behind an identity guard. An object of the call's
arguments (a model's config) is not pinned that way: an identity guard on it would fail for
another instance of the same model, and no other process could ever satisfy it (a package, a
frame record). Its ``id``, and that of any other value (an object the frame created, a
constant), is a capture-time token: equal for the same object, usable as a dict key (``copy.deepcopy``'s memo,
a ``seen`` set), and refused anywhere its number would matter (arithmetic, printing, a return).
"""

from __future__ import annotations

from ...errors import Unsupported
from ..guards import GuardKind
from ..sources import is_argument_rooted
from .base import ConstantValue, Value
from .builtins import handles


class CaptureIdValue(Value):
    """The ``id()`` of a value whose identity exists only in this capture. One token per
    object (interned per capture), so Python's identity hashing and ``==`` are right."""

    def __init__(self, target: object):
        self.target = target   # kept alive: its id must not be reused during the capture

    def python_type(self):
        return int

    def describe(self):
        return "id() of a value created during the capture"

    def call_method(self, tx, name, args, kwargs):
        if name in ("__eq__", "__ne__") and len(args) == 1 and isinstance(args[0], CaptureIdValue):
            same = args[0] is self      # (against a plain int its answer is not known)
            return ConstantValue(same if name == "__eq__" else not same)
        if name == "__hash__":
            raise Unsupported("hash() of an id() taken during the capture (its number is not known)")
        raise Unsupported(f"{name} on an id() taken during the capture (its number is not known)")

    def reconstruct(self, cg):
        raise Unsupported("an id() taken during the capture leaves the compiled code")


def _identity_target(v: Value):
    """What the object's identity is, during this capture: the real object (a constant, an
    existing object), else the value itself (a list, dict or object the frame made: one value
    per object, whatever constants it holds)."""
    if isinstance(v, ConstantValue):
        return v.value
    real = v.real_object()
    return real if real is not None else v


@handles(id)
def _id(tx, fn, args, kwargs):
    if len(args) != 1 or kwargs:
        raise tx.user_exception(TypeError(f"id() takes exactly one argument ({len(args)} given)"))
    v = args[0]
    real = None if isinstance(v, ConstantValue) else v.real_object()
    source = getattr(v, "source", None)
    if real is not None and source is not None and not is_argument_rooted(source):
        tx.output.builder.guard(GuardKind.ID_MATCH, source, real)
        if tx.output.guards_enabled_for(source):
            return ConstantValue(id(real))
    target = _identity_target(v)
    tokens = tx.output.capture_ids
    hit = tokens.get(id(target))
    if hit is None or hit.target is not target:
        hit = tokens[id(target)] = CaptureIdValue(target)
    return hit
