"""What the inlined saved-tensor hooks did to the saved activations: ``report()``.

Stage 2 records one row per compiled graph whose hooks it inlined
(``kiln.aot.saved_hooks.rows``); ``report()`` returns them as an ``ActivationReport``
(``bytes_before``/``bytes_after`` summed over the graphs, printed as a table). The same rows show under ``KILN_LOGS=activations``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..aot.saved_hooks.rows import rows as _rows
from ..aot.graph_bytes import format_bytes


@dataclass
class ActivationReport:
    """Saved-activation bytes (saved tensors that are not graph inputs) of the graphs compiled
    with inlined hooks, before and after packing, on the compute device; ``offloaded_bytes``:
    what the hooks moved to another device (CPU). ``rows``: one per graph."""
    rows: list = field(default_factory=list)

    @property
    def bytes_before(self) -> int:
        return sum(r["bytes_before"] for r in self.rows)

    @property
    def bytes_after(self) -> int:
        return sum(r["bytes_after"] for r in self.rows)

    @property
    def offloaded_bytes(self) -> int:
        return sum(r.get("offloaded_bytes", 0) for r in self.rows)

    @property
    def saved_fraction(self) -> float:
        """1 - after/before: the share of saved bytes the hooks removed."""
        return 1.0 - self.bytes_after / self.bytes_before if self.bytes_before else 0.0

    def __str__(self) -> str:
        head = f"{'graph':>5}  {'pack hook':<36} {'packed':>6} {'kept':>5} {'before':>12} {'after':>12} {'saved':>6}"
        lines = ["saved activations (kiln inlined saved-tensor hooks)", head, "-" * len(head)]
        for i, r in enumerate(self.rows):
            frac = 1 - r["bytes_after"] / r["bytes_before"] if r["bytes_before"] else 0.0
            lines.append(f"{i:>5}  {r['pack'][:36]:<36} {r['packed']:>6} {r['kept']:>5} "
                         f"{format_bytes(r['bytes_before']):>12} {format_bytes(r['bytes_after']):>12} {frac:>6.1%}")
        lines.append("-" * len(head))
        lines.append(f"{'total':>5}  {'':<36} {sum(r['packed'] for r in self.rows):>6} "
                     f"{sum(r['kept'] for r in self.rows):>5} {format_bytes(self.bytes_before):>12} "
                     f"{format_bytes(self.bytes_after):>12} {self.saved_fraction:>6.1%}")
        return "\n".join(lines)

    __repr__ = __str__


def report(reset: bool = False) -> ActivationReport:
    """The graphs compiled with inlined saved-tensor hooks so far (``reset=True`` also forgets
    them, so that the next report covers only later compilations)."""
    r = ActivationReport([dict(x) for x in _rows])
    if reset:
        _rows.clear()
    return r


def clear() -> None:
    _rows.clear()
