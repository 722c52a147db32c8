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

The same calls feed the structured trace (``kiln/trace.py``) when ``kiln.config.trace_dir``
is set: tracing turns every topic's ``enabled`` flag on (the loggers keep their levels, so
stderr shows only the ``KILN_LOGS`` topics), and ``event(topic, kind, message, **fields)``
writes the message to the topic's logger and one trace record of ``kind`` with ``fields``
(``kiln/trace_schema.json``). A plain ``log`` is a record of kind ``message``.
"""
from __future__ import annotations

import inspect
import logging
import os
import sys
import types

from . import trace
from .config import config, observe
from .version import __version__

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
    _on.clear()
    _on.update(n.lstrip("+") for n in names)
    for t in TOPICS:
        _LOGGERS[t].setLevel(logging.INFO if t in _on else logging.WARNING)
    _set_enabled()


_on: set[str] = set()


def _set_enabled() -> None:
    tracing = trace.writer is not None
    for t in TOPICS:
        setattr(enabled, t, tracing or t in _on)


def set_trace_dir(directory: str | None) -> None:
    """Start the structured trace into ``directory`` (``None`` or ``""``: stop it); what
    setting ``kiln.config.trace_dir`` does."""
    if directory:
        before = trace.writer
        torch = sys.modules.get("torch")
        if trace.start(str(directory), {"kiln": __version__, "torch": getattr(torch, "__version__", None)}) \
                is not before:
            _sources.clear()        # (a new file records each frame's source again)
    else:
        trace.stop()
    _set_enabled()


def log(topic: str, message: str) -> None:
    """One message under ``topic``, to the ``kiln.<topic>`` logger (callers test
    ``enabled.<topic>`` first)."""
    event(topic, "message", message)


def event(topic: str, kind: str, message: str, **fields) -> None:
    """One event: ``message`` to the ``kiln.<topic>`` logger and, while tracing, a record of
    ``kind`` with ``fields`` (callers test ``enabled.<topic>`` first)."""
    logger = _LOGGERS.get(topic)
    if logger is not None:
        logger.info(message)
    w = trace.writer
    if w is not None:
        w.record(kind, topic, message, fields)


_sources: set = set()


def where(fn) -> dict:
    """``function``, ``frame``, ``file`` and ``line`` fields for an event about ``fn`` (a
    function or a code object). ``frame`` is the function a continuation after a graph break
    continues (``fn``'s own name otherwise). While tracing, the first event about a frame also
    records its source (kind ``source``; a module's forward for a compiled module), so that a
    report shows the user's code without reading their files."""
    code = getattr(fn, "__code__", fn)
    name = getattr(fn, "__qualname__", None) or getattr(code, "co_qualname", None) or getattr(code, "co_name", "?")
    frame = getattr(fn, "__kiln_frame__", None) or name
    filename = getattr(code, "co_filename", None)
    line = getattr(code, "co_firstlineno", None)
    if trace.writer is not None and filename and (frame, filename) not in _sources:
        _sources.add((frame, filename))
        shown = getattr(fn, "__kiln_source__", None) or code
        try:
            if callable(shown):     # (a decorated forward: the source and file of the function itself)
                shown = inspect.unwrap(shown)
            lines, first = inspect.getsourcelines(shown)
            shown_file = inspect.getsourcefile(shown) or filename
        except Exception:   # (no source: generated code, a REPL; the trace goes on without it)
            lines, first, shown_file = [], line, filename
        if lines:
            event("trace", "source", f"source of {frame}", function=name, frame=frame, frame_file=filename,
                  file=shown_file, line=first, lines=[ln.rstrip("\n") for ln in lines])
    return {"function": name, "frame": frame, "file": filename, "line": line}


def log_compile_times(name: str, seconds: dict, **fields) -> None:
    """One ``perf`` line for a compiled graph: ``seconds`` maps a phase (``capture``,
    ``aot``, ``inductor``...) to its duration, in the order the phases ran."""
    parts = ", ".join(f"{phase} {secs:.3f} s" for phase, secs in seconds.items())
    event("perf", "stage_times", f"{name}: {parts} (total {sum(seconds.values()):.3f} s)",
          graph=name, stages={k: round(float(v), 6) for k, v in seconds.items()}, **fields)


set_logs(os.environ.get("KILN_LOGS", ""))
observe("trace_dir", set_trace_dir)
set_trace_dir(config.trace_dir)
