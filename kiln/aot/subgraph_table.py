"""The subgraphs of a graph, numbered for saving and found again when loading.

A higher-order op's node (``torch.ops.higher_order.cond``, ``while_loop``, ``scan``...) reads
its subgraphs through ``get_attr`` nodes whose attribute is a GraphModule. A saved graph keeps
them as a table: each distinct GraphModule once, numbered by identity in the order a walk of
the graph first reaches it (so the same graph gives the same table in any process), with the
subgraphs it holds in the same table. Several ``get_attr`` nodes naming one GraphModule (a
repeated block calling one subgraph) refer to one number, and load back as one shared object.
Used by the AOT artifact (``export``), the cache key (``kiln.cache.key``) and packages
(``kiln.package.graphs``), each with its own form of a graph.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx


def attribute(gm: torch.nn.Module, target: str) -> Any:
    """What a ``get_attr`` node with ``target`` (a dotted path) reads from ``gm``."""
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def is_subgraph(obj: Any) -> bool:
    return isinstance(obj, torch.fx.GraphModule)


class SubgraphTable:
    """Numbers subgraphs by identity; ``save(gm)`` gives a subgraph's saved form (it may
    number the subgraphs that one holds: nested ones get later numbers)."""

    def __init__(self, save: Callable[[torch.fx.GraphModule], Any]):
        self.save = save
        self.entries: list = []       # saved forms, by number
        self._numbers: dict[int, int] = {}
        self._held: list = []         # (keeps each numbered object alive: ids stay unique)

    def number(self, gm: torch.fx.GraphModule) -> int:
        i = self._numbers.get(id(gm))
        if i is not None:
            if self.entries[i] is _SAVING:
                raise ValueError("a subgraph that holds itself")
            return i
        i = self._numbers[id(gm)] = len(self.entries)
        self._held.append(gm)
        self.entries.append(_SAVING)
        self.entries[i] = self.save(gm)
        return i


class SubgraphLoader:
    """The saved subgraphs, each built once (``build(number)``), on first use."""

    def __init__(self, count: int, build: Callable[[int], torch.fx.GraphModule]):
        self.count = count
        self.build = build
        self._built: dict[int, Any] = {}

    def get(self, i: int) -> torch.fx.GraphModule:
        if not isinstance(i, int) or not 0 <= i < self.count:
            raise ValueError(f"a saved graph refers to subgraph {i!r}, which it does not hold")
        found = self._built.get(i)
        if found is _SAVING:
            raise ValueError("a saved subgraph that holds itself")
        if found is None:
            self._built[i] = _SAVING
            self._built[i] = found = self.build(i)
        return found


_SAVING = object()      # (a number being saved or built: reached again, it would hold itself)
