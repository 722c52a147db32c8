"""``kiln.explain(fn)(*args, **kwargs)``: what kiln does with a call, as data and as a report.

It compiles ``fn`` with a recording backend (its own compile key, so it neither reuses nor
leaves behind the entries of other compiles), runs the call once, and reports every graph
captured on the way (continuations after graph breaks included), each break with its reason
and the user's source line, frames that run eagerly, and the guards.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from .api import compile as kiln_compile
from .capture.guards import Guard
from .runtime.recording import recorder as _recorder


@dataclasses.dataclass
class BreakReason:
    reason: str
    filename: str | None
    lineno: int | None
    source_line: str | None
    kind: str = "graph break"       # or "frame runs eagerly", "runs as it is"

    def __str__(self) -> str:
        if not self.filename:
            return f"{self.kind}: {self.reason}"
        line = f"\n        {self.source_line.strip()}" if self.source_line else ""
        return f"{self.kind}: {self.reason}\n      at {self.filename}:{self.lineno}{line}"


@dataclasses.dataclass
class ExplainOutput:
    graphs: list[torch.fx.GraphModule]
    graph_count: int
    graph_break_count: int
    break_reasons: list[BreakReason]
    guards: list[Guard]
    ops_per_graph: list[int]
    out: Any = None

    def __str__(self) -> str:
        lines = [f"Graph count: {self.graph_count}", f"Graph break count: {self.graph_break_count}",
                 f"Ops per graph: {self.ops_per_graph}"]
        if self.break_reasons:
            lines.append("Break reasons:")
            lines += [f"  {i + 1}. {b}" for i, b in enumerate(self.break_reasons)]
        for i, gm in enumerate(self.graphs):
            lines.append(f"Graph {i + 1}:")
            lines += ["    " + ln for ln in gm.code.strip().splitlines()]
        lines.append(f"Guards ({len(self.guards)}):")
        lines += [f"  {g.describe()}" for g in self.guards]
        return "\n".join(lines)

    __repr__ = __str__


def explain(fn: Callable) -> Callable[..., ExplainOutput]:
    """``kiln.explain(fn)(*args, **kwargs)`` runs the call once under kiln and returns an
    ``ExplainOutput`` (graphs, graph_count, graph_break_count, break_reasons, guards, out);
    ``print()`` it for a readable report."""
    if not callable(fn):
        raise TypeError(f"kiln.explain expects a callable, got {type(fn).__name__}")

    def run(*args, **kwargs) -> ExplainOutput:
        graphs: list[torch.fx.GraphModule] = []

        def recording_backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        compiled = kiln_compile(fn, backend=recording_backend)
        recorded: list = []
        _recorder.stack.append(recorded)
        try:
            out = compiled(*args, **kwargs)
        finally:
            _recorder.stack.remove(recorded)
        reasons, guards, seen = [], [], set()
        replaced = [entry for cache, entry in recorded if getattr(entry, "replaced_by", None) is not None]
        for cache, entry in recorded:
            if cache is None:       # a builtin, a class...: nothing to capture
                if ("runs as it is", entry) not in seen:
                    seen.add(("runs as it is", entry))
                    reasons.append(BreakReason(entry, None, None, None, "runs as it is"))
                continue
            if entry.replaced_by is not None:   # its generated code failed: the eager entry counts
                cache.replace(entry, None)
                continue
            guards += entry.guards
            exc = entry.graph_break or entry.eager_reason
            if exc is not None:
                reason = BreakReason(getattr(exc, "construct", str(exc)), exc.filename, exc.lineno,
                                     exc.source_line,
                                     "graph break" if entry.graph_break is not None else "frame runs eagerly")
                # a break deep in a call chain breaks each enclosing frame at its call: one break
                key = (reason.reason, reason.filename, reason.lineno, reason.kind)
                if key not in seen:
                    seen.add(key)
                    reasons.append(reason)
            cache.replace(entry, None)      # explain leaves no entries behind
        dropped = {id(e.graph_module) for e in replaced}
        graphs[:] = [g for g in graphs if id(g) not in dropped]
        ops = [sum(1 for n in g.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
               for g in graphs]
        return ExplainOutput(graphs, len(graphs), len(reasons), reasons, guards, ops, out)

    return run
