"""What ``kiln.explain`` collects while its call runs: each new entry, and each callable run as
it is. The call path reports here; ``kiln.explain`` reads it."""
from __future__ import annotations

import threading


class _Recorder(threading.local):
    def __init__(self) -> None:
        self.stack: list[list] = []


recorder = _Recorder()


def record_entry(cache, entry) -> None:
    """Called by the call path for each new entry while an explain is running."""
    for rec in recorder.stack:
        rec.append((cache, entry))


def record_uncompiled(reason: str) -> None:
    """Called by ``kiln.compile`` of a callable without bytecode (``len``) when it runs."""
    for rec in recorder.stack:
        rec.append((None, reason))
