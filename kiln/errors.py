"""User-facing exceptions."""
from __future__ import annotations


class KilnError(Exception):
    """Base class of kiln's own errors."""


class Unsupported(KilnError):
    """A construct kiln cannot capture into a graph.

    Raised to the user under ``fullgraph=True``; otherwise the frame runs eagerly and the
    reason is logged (``KILN_LOGS=graph_breaks``). ``construct`` names what was met,
    ``filename``/``lineno`` where.
    """

    def __init__(self, construct: str, filename: str | None = None, lineno: int | None = None,
                 source_line: str | None = None):
        self.construct = construct
        self.filename = filename
        self.lineno = lineno
        self.source_line = source_line
        super().__init__(self._message())

    def _message(self) -> str:
        where = f" at {self.filename}:{self.lineno}" if self.filename else ""
        line = f"\n    {self.source_line.strip()}" if self.source_line else ""
        return f"{self.construct}{where}{line}"

    def located(self, filename: str, lineno: int | None, source_line: str | None) -> "Unsupported":
        """Attach the innermost user location, once (the first one set is the most precise)."""
        if self.filename is None:
            self.filename, self.lineno, self.source_line = filename, lineno, source_line
            self.args = (self._message(),)
        return self



class FrameRunsEagerly(Unsupported):
    """(internal) A construct no graph break can isolate: the whole frame runs eagerly."""


class ConstraintViolation(KilnError):
    """A dim marked dynamic (``kiln.mark_dynamic``) that the program forces to a constant.

    The message names the dim, the value it was specialized to, and the line that did it;
    remove the mark, or make that line shape-generic."""


class CudagraphError(KilnError):
    """A graph compiled with CUDA graphs (``mode="reduce-overhead"`` or
    ``kiln.config.cudagraphs``) would run outside a CUDA graph while
    ``kiln.config.cudagraph_or_error`` (``KILN_CUDAGRAPH_OR_ERROR=1``) is set. The message
    names the reason (the op, the input) and where the compiled function was called from."""
