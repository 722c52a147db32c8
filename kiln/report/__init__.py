"""``kiln report DIR [-o report.html]``: one self-contained HTML page from a structured trace.

The trace (``KILN_TRACE_DIR``, ``kiln/trace.py``) is read as files, in the format of
``kiln/trace_schema.json``: this package imports nothing of the compiler, so a report can be
built anywhere the trace files are (``docs/report.md``).

    kiln.report.build_report("traces/", "report.html")
"""
from __future__ import annotations

import os

from .model import build_model
from .page import render
from .traces import read_trace, trace_files

__all__ = ["build_report", "render_report"]


def render_report(path: str, title: str | None = None) -> str:
    """The page for the trace files at ``path`` (a directory or one file), as text."""
    return render(build_model(read_trace(path)), title or os.path.abspath(path))


def build_report(path: str, output: str | None = None, title: str | None = None) -> str:
    """Write the page for the trace at ``path`` to ``output`` (default: ``report.html`` in the
    trace directory, or beside the file); returns the page's path."""
    if not trace_files(path):
        raise FileNotFoundError(f"no trace files (*.jsonl) at {path}")
    if output is None:
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        output = os.path.join(folder, "report.html")
    text = render_report(path, title)
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)
    return output
