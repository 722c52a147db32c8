"""The structured trace: one JSON object per line, one file per process, in a directory.

``KILN_TRACE_DIR=DIR`` (or ``kiln.config.trace_dir = DIR``) turns it on; ``kiln.logs`` feeds
it from the same points that write the ``KILN_LOGS`` messages, so the trace holds what the logs
say, with the facts as fields (``kiln/trace_schema.json`` describes each record;
``docs/report.md`` explains them; ``kiln report DIR`` draws them as one HTML page).

Records are buffered and written in batches (every ``BATCH`` records, when tracing stops, and
at exit), so a compile pays one ``dict`` and one list append per event. Nothing here is on a
compiled function's call path: events come from capture, compilation and the cache.

The file is ``kiln-trace-<pid>.jsonl``; once ``torch.distributed`` is initialized it becomes
``kiln-trace-<pid>-rank<r>.jsonl`` (renamed in place) and each later record carries its rank.
This module imports nothing of kiln: it is a leaf under ``kiln.logs``.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

SCHEMA_VERSION = 1
BATCH = 256
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trace_schema.json")


def _rank() -> int | None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:   # (a half-initialized process group: no rank yet)
        return None
    return None


def _jsonable(value):
    """``json.dumps``'s fallback: anything else as its text."""
    return str(value)


class TraceWriter:
    """Appends records to ``<directory>/kiln-trace-<pid>[-rank<r>].jsonl`` in batches; the
    first is the ``process`` record, with ``header``'s fields (the versions of the writer)."""

    def __init__(self, directory: str, header: dict | None = None):
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.header = dict(header or {})
        self.pid = os.getpid()
        self.rank: int | None = None
        self.path = self._path_for(None)
        self.started = time.time()
        self._t0 = time.perf_counter()
        self._seq = 0
        self._buffer: list[dict] = []
        self._lock = threading.Lock()
        self.failed: str | None = None     # why writing stopped (the trace never fails a compile)
        self.record("process", "trace", f"pid {self.pid}: {' '.join(sys.argv)}"[:300],
                    {"argv": list(sys.argv), "python": sys.version.split()[0], "cwd": os.getcwd(),
                     "started": self.started, **self.header})

    def _path_for(self, rank: int | None) -> str:
        suffix = "" if rank is None else f"-rank{rank}"
        return os.path.join(self.directory, f"kiln-trace-{self.pid}{suffix}.jsonl")

    def record(self, kind: str, topic: str, message: str, fields: dict) -> None:
        rank = self.rank if self.rank is not None else _rank()
        rec = {"v": SCHEMA_VERSION, "seq": 0, "t": round(time.perf_counter() - self._t0, 6),
               "pid": self.pid, "rank": rank, "kind": kind, "topic": topic, "message": message}
        rec.update(fields)
        with self._lock:
            rec["seq"] = self._seq
            self._seq += 1
            self._buffer.append(rec)
            full = len(self._buffer) >= BATCH
        if full:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            batch, self._buffer = self._buffer, []
            if not batch or self.failed:
                return
            try:
                self._follow_rank()
                os.makedirs(self.directory, exist_ok=True)
                text = "".join(json.dumps(r, default=_jsonable, separators=(",", ":")) + "\n" for r in batch)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(text)
            except Exception as e:  # a full disk or a read-only directory: stop tracing, say so once
                self.failed = f"{type(e).__name__}: {e}"
                sys.stderr.write(f"[kiln:trace] cannot write {self.path}: {self.failed}; tracing stops\n")

    def _follow_rank(self) -> None:
        """Once the process has a rank, its file is named with it."""
        if self.rank is not None:
            return
        rank = _rank()
        if rank is None:
            return
        self.rank = rank
        new = self._path_for(rank)
        if os.path.exists(self.path):
            os.replace(self.path, new)
        self.path = new


writer: TraceWriter | None = None


def start(directory: str, header: dict | None = None) -> TraceWriter:
    """Trace into ``directory`` (a running trace into another directory is flushed first)."""
    global writer
    if writer is not None:
        if writer.directory == os.path.abspath(os.path.expanduser(directory)):
            return writer
        stop()
    writer = TraceWriter(directory, header)
    return writer


def stop() -> None:
    """Flush and stop tracing."""
    global writer
    w, writer = writer, None
    if w is not None:
        w.flush()


def flush() -> None:
    if writer is not None:
        writer.flush()


def _after_fork_in_child() -> None:
    """A forked child traces into a file of its own (its parent's buffer is its parent's)."""
    global writer
    if writer is not None:
        writer = TraceWriter(writer.directory, writer.header)


atexit.register(flush)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
