"""Bytes of a graph's values: of a tensor, of a node, of saved tensors (one count per
storage), and as text."""
from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.fx

from .fx_graphs import is_view
from .symbolic import nbytes_hint


def tensor_nbytes(t: Any) -> int:
    """Bytes of a tensor's elements; for symbolic sizes, at the traced sizes (a hint: byte
    counts only rank partitions and are reported, they never decide what a graph computes)."""
    if isinstance(t, torch.Tensor):
        return nbytes_hint(t)
    if isinstance(t, (tuple, list)):
        return sum(tensor_nbytes(x) for x in t)
    return 0


def node_nbytes(node: torch.fx.Node) -> int:
    return tensor_nbytes(node.meta.get("val"))


def storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """Follow view ops back to the node whose output owns the storage."""
    while is_view(node) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def saved_bytes(nodes: Iterable[torch.fx.Node]) -> tuple[int, int]:
    """(bytes held by the saved tensors, of which graph inputs): one count per storage."""
    roots = {}
    for n in nodes:
        r = storage_root(n)
        roots[r] = node_nbytes(r)
    total = sum(roots.values())
    inputs = sum(b for r, b in roots.items() if r.op == "placeholder")
    return total, inputs


def count_saved(backward: torch.fx.GraphModule, saved: list[str]) -> str:
    """``"3 tensors"``, or ``"3 tensors + 1 int"`` when symbolic sizes cross too."""
    names = set(saved)
    ints = sum(1 for n in backward.graph.nodes if n.op == "placeholder" and n.name in names
               and isinstance(n.meta.get("val"), (torch.SymInt, torch.SymBool, int)))
    text = f"{len(saved) - ints} tensors"
    return text + (f" + {ints} int{'s' if ints > 1 else ''}" if ints else "")


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover
