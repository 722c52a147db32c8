"""Structured logs, switched on by ``KILN_LOGS=graph,guards,recompiles,...``.

``perf``: per compiled graph, the seconds spent in capture, in the AOT stages (tracing and
partitioning) and in the backend's compiler (Inductor), see ``log_compile_times``.

Each topic is a module-level boolean so that a disabled topic costs one attribute test, and
the message (often a whole graph) is only formatted when the topic is on::

    if logs.enabled.graph:
        logs.log("graph", gm.code)
"""
from __future__ import annotations

import os
import sys
import types

TOPICS = ("graph", "guards", "recompiles", "graph_breaks", "aot", "cache", "cudagraphs",
          "package", "dynamic", "perf", "activations")

enabled = types.SimpleNamespace(**{t: False for t in TOPICS})


def set_logs(spec: str | list[str] | None) -> None:
    """Enable topics by name: ``set_logs("graph,guards")``; ``"all"`` enables every topic;
    ``None`` or ``""`` disables all."""
    if spec is None:
        names: list[str] = []
    elif isinstance(spec, str):
        names = [s.strip() for s in spec.split(",") if s.strip()]
    else:
        names = list(spec)
    if "all" in names:
        names = list(TOPICS)
    unknown = [n for n in names if n.lstrip("+") not in TOPICS]
    if unknown:
        raise ValueError(f"unknown log topic(s) {unknown}; known topics: {', '.join(TOPICS)}")
    for t in TOPICS:
        setattr(enabled, t, False)
    for n in names:
        setattr(enabled, n.lstrip("+"), True)


def log(topic: str, message: str) -> None:
    """Print one message under ``topic`` (callers test ``enabled.<topic>`` first)."""
    print(f"[kiln:{topic}] {message}", file=sys.stderr, flush=True)


def log_compile_times(name: str, seconds: dict) -> None:
    """One ``perf`` line for a compiled graph: ``seconds`` maps a phase (``capture``,
    ``aot``, ``inductor``...) to its duration, in the order the phases ran."""
    parts = ", ".join(f"{phase} {secs:.3f} s" for phase, secs in seconds.items())
    log("perf", f"{name}: {parts} (total {sum(seconds.values()):.3f} s)")


set_logs(os.environ.get("KILN_LOGS", ""))
