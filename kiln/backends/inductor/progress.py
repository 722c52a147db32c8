"""Progress of a long compile on stderr: ``[kiln] compiling graph #3 (f): Inductor, graph 2/2
(backward)…``, after the first two seconds only, and never with ``kiln.config.progress = False``."""
from __future__ import annotations

import sys
import threading
import time

from ...config import config as kiln_config


class Progress:
    """Says on stderr what a long compile is doing: nothing for its first ``DELAY`` seconds,
    then the current phase and every later one, then the total time. Off with
    ``kiln.config.progress = False``. Re-entrant: nested uses share one clock."""

    DELAY = 2.0

    def __init__(self, name: str):
        self.name = name
        self._depth = 0
        self._phase = ""
        self._shown = False
        self._start = 0.0
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def __enter__(self):
        self._depth += 1
        if self._depth == 1:
            self._start = time.perf_counter()
            self._shown = False
            if kiln_config.progress:
                self._timer = threading.Timer(self.DELAY, self._show)
                self._timer.daemon = True
                self._timer.start()
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            with self._lock:
                if self._shown:
                    self._print(f"compiled {self.name} in {time.perf_counter() - self._start:.1f} s")
                self._shown = False
        return False

    def phase(self, text: str):
        return _Phase(self, text)

    def _set(self, text: str) -> str:
        prior, self._phase = self._phase, text
        with self._lock:
            if self._shown and text:
                self._print(f"compiling {self.name}: {text}…")
        return prior

    def _show(self) -> None:
        with self._lock:
            if self._depth and not self._shown:
                self._shown = True
                self._print(f"compiling {self.name}: {self._phase}…")

    @staticmethod
    def _print(message: str) -> None:
        print(f"[kiln] {message}", file=sys.stderr, flush=True)


class _Phase:
    def __init__(self, progress: Progress, text: str):
        self.progress = progress
        self.text = text
        self.prior = ""

    def __enter__(self):
        self.prior = self.progress._set(self.text)
        return self

    def __exit__(self, *exc):
        self.progress._phase = self.prior   # the enclosing phase, without saying it again
        return False
