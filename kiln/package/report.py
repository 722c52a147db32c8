"""What ``save_package`` saved and what it left out, and why."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class LeftOut:
    function: str        # the function (or continuation) whose entry was left out
    guards: str          # the entry's guards, as text
    reason: str


@dataclasses.dataclass
class SaveReport:
    """Returned by ``save_package``. ``saved``: entries written per function (continuations
    after graph breaks included); ``left_out``: entries not written, each with its reason
    (a call they would match compiles as usual after loading)."""
    path: str
    size: int
    saved: dict[str, int]
    left_out: list[LeftOut]

    @property
    def entries(self) -> int:
        return sum(self.saved.values())

    def __str__(self) -> str:
        lines = [f"kiln package {self.path}: {self.entries} entries, {self.size} bytes"]
        lines += [f"  {name}: {n} entries" for name, n in self.saved.items()]
        for lo in self.left_out:
            lines.append(f"  left out: an entry of {lo.function}: {lo.reason}")
        return "\n".join(lines)
