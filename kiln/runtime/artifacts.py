"""What a compiled function asks of the artifacts layer (``kiln.package``), which sits above
the object model: whoever makes a ``CompiledFunction`` (``kiln.compile``, ``load_package``)
passes it one, and the functions a graph break hands control to get their maker's."""
from __future__ import annotations

from typing import Any, Protocol


class Artifacts(Protocol):
    def save_package(self, compiled: Any, path: str) -> Any:
        """Save every entry of ``compiled`` (a CompiledFunction, CompiledMethod or
        CompiledModule) to the file ``path``; returns a ``kiln.package.SaveReport``."""

    def lookup(self, cf: Any, args: tuple, kwargs: dict) -> Any:
        """``cf``'s first miss in this process, before capture: the call's result from an
        entry of its frame records, or MISS."""

    def record(self, cf: Any) -> None:
        """After ``cf`` (a function that keeps frame records) compiled something: rewrite this
        process's record of its frame."""
