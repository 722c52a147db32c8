"""Whether a custom autograd.Function's backward is being captured now, and what of grad mode
it read: the backward is captured as it runs without ``create_graph`` (grad mode off, incoming
gradients that do not require grad), so a read of either is folded to that branch, and the
generated Function refuses ``create_graph=True`` (``captured_function.runtime_function``).

State of one capture, empty between captures (``process_state``'s list).
"""
from __future__ import annotations

import contextlib

_depth = [0]          # > 0 while a backward is being captured
_grad_mode_reads = [0]


def active() -> bool:
    return _depth[0] > 0


def note_grad_mode_read() -> None:
    """Grad mode (or an incoming gradient's ``requires_grad``) was read: counted if a backward
    is being captured."""
    if _depth[0]:
        _grad_mode_reads[0] += 1


@contextlib.contextmanager
def capturing(result: list):
    """Around the capture of one backward: ``result`` gets whether it read grad mode."""
    _depth[0] += 1
    before = _grad_mode_reads[0]
    try:
        yield
    finally:
        _depth[0] -= 1
        result.append(_grad_mode_reads[0] != before)
