"""Structured logs, switched on by ``KILN_LOGS=graph,guards,recompiles,...``.

``perf``: per compiled graph, the seconds spent in capture, in the AOT stages (tracing and
partitioning) and in the backend's compiler (Inductor), see ``log_compile_times``.

Each topic is a module-level boolean so that a disabled topic costs one attribute test, and
the message (often a whole graph) is only formatted when the topic is on::

    if logs.enabled.graph:
        logs.log("graph", gm.code)

Messages go through stdlib ``logging``, one logger per topic (``kiln.graph``,
``kiln.recompiles``...), as ``TORCH_LOGS`` does for torch. ``KILN_LOGS`` / ``set_logs`` is the
switch: it sets each topic logger's level (INFO when on). ``STDERR``, a handler on the ``kiln``
logger, prints ``[kiln:topic] message`` to the ``sys.stderr`` of the moment; the ``kiln`` logger
does not propagate to the root logger, so nothing is printed twice. To route the messages
elsewhere, add your handler to ``logging.getLogger("kiln")`` (and remove ``STDERR`` if you want
them only there), or set its ``propagate`` back to True.
"""
from __future__ import annotations

import logging
import os
import sys
import types

TOPICS = ("graph", "guards", "recompiles", "graph_breaks", "aot", "cache", "cudagraphs",
          "package", "dynamic", "perf", "activations")

enabled = types.SimpleNamespace(**{t: False for t in TOPICS})


class _StderrHandler(logging.Handler):
    """``[kiln:topic] message`` on the current ``sys.stderr`` (tests and notebooks swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            topic = record.name.split(".", 2)[1] if record.name.startswith("kiln.") else record.name
            sys.stderr.write(f"[kiln:{topic}] {record.getMessage()}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a failing handler reports, never raises
            self.handleError(record)


ROOT = logging.getLogger("kiln")
STDERR = _StderrHandler()
ROOT.addHandler(STDERR)
ROOT.propagate = False
ROOT.setLevel(logging.WARNING)
_LOGGERS = {t: logging.getLogger(f"kiln.{t}") for t in TOPICS}


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
    on = {n.lstrip("+") for n in names}
    for t in TOPICS:
        setattr(enabled, t, t in on)
        _LOGGERS[t].setLevel(logging.INFO if t in on else logging.WARNING)


def log(topic: str, message: str) -> None:
    """One message under ``topic``, to the ``kiln.<topic>`` logger (callers test
    ``enabled.<topic>`` first)."""
    _LOGGERS[topic].info(message)


def log_compile_times(name: str, seconds: dict) -> None:
    """One ``perf`` line for a compiled graph: ``seconds`` maps a phase (``capture``,
    ``aot``, ``inductor``...) to its duration, in the order the phases ran."""
    parts = ", ".join(f"{phase} {secs:.3f} s" for phase, secs in seconds.items())
    log("perf", f"{name}: {parts} (total {sum(seconds.values()):.3f} s)")


set_logs(os.environ.get("KILN_LOGS", ""))
