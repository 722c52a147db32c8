"""Reading trace files: every ``*.jsonl`` of a directory (or one file), one record per line.

Only the format is known here (``kiln/trace_schema.json``): the records may come from any
process and any kiln version that writes schema version 1. A line that is not a JSON object
(a process killed mid-write) is counted and skipped, never fatal.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os


@dataclasses.dataclass
class Trace:
    files: list[str]
    records: list[dict]
    bad_lines: int = 0


def trace_files(path: str) -> list[str]:
    if os.path.isdir(path):
        return sorted(glob.glob(os.path.join(path, "*.jsonl")))
    return [path] if os.path.exists(path) else []


def read_trace(path: str) -> Trace:
    """The records of ``path`` (a directory of trace files, or one file), each file's in order,
    each tagged with ``_file`` (the index of its file in ``files``)."""
    files = trace_files(path)
    records: list[dict] = []
    bad = 0
    for i, name in enumerate(files):
        with open(name, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if not isinstance(rec, dict) or "kind" not in rec:
                    bad += 1
                    continue
                rec["_file"] = i
                records.append(rec)
    return Trace(files, records, bad)
