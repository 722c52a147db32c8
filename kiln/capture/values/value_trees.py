"""Tensors nested in tuples and lists, as torch's pytrees see them: flattened into a list of
tensor values and a structure that rebuilds the same nesting around other values.

A structure is ``None`` for a single tensor, or ``(tuple, [children])`` / ``(list,
[children])``: tuples and lists are different structures, as they are to torch's pytree.
"""
from __future__ import annotations

from ...errors import Unsupported
from .base import Value
from .containers import ListValue, TupleValue
from .tensor import TensorValue


def flatten_tensors(v: Value, what: str) -> tuple[list[TensorValue], object]:
    """The tensors of ``v`` in pytree order and its structure; ``what`` names ``v`` in the
    reason when a leaf is not a tensor with a graph value ("a scan init")."""
    if isinstance(v, TensorValue):
        if v.node is None:
            raise Unsupported(f"{what} holding a tensor with no graph value")
        return [v], None
    if isinstance(v, (TupleValue, ListValue)) and v.python_type() in (tuple, list):
        leaves: list[TensorValue] = []
        children = []
        for item in v.items:
            sub, spec = flatten_tensors(item, what)
            leaves += sub
            children.append(spec)
        return leaves, (v.python_type(), children)
    raise Unsupported(f"{what} holding {v.describe()} (kiln captures tensors, in tuples or lists)")


def unflatten(structure, leaves: list[Value]) -> Value:
    """``leaves`` nested as ``structure`` (the inverse of ``flatten_tensors``)."""
    it = iter(leaves)
    out = _build(structure, it)
    if next(it, None) is not None:
        raise ValueError("more leaves than the structure holds")
    return out


def _build(structure, it) -> Value:
    if structure is None:
        return next(it)
    kind, children = structure
    items = [_build(c, it) for c in children]
    return TupleValue(items) if kind is tuple else ListValue(items)


def leaf_count(structure) -> int:
    if structure is None:
        return 1
    return sum(leaf_count(c) for c in structure[1])


def describe_structure(structure) -> str:
    """``(tensor, [tensor, tensor])``: for reasons."""
    if structure is None:
        return "tensor"
    kind, children = structure
    inner = ", ".join(describe_structure(c) for c in children)
    return f"({inner}{',' if len(children) == 1 else ''})" if kind is tuple else f"[{inner}]"
