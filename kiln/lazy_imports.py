"""Modules imported at their first use, for the modules of kiln that a warm start loads.

A warm start (a frame record's entries loaded, nothing traced) imports the AOT runtime and the
guards, whose modules also serve tracing. What only tracing needs of torch's symbolic shapes
(``torch.fx.experimental.symbolic_shapes``, ``proxy_tensor``) and sympy costs a third of a
second to import, so those modules name it through a ``LazyModule``: the import happens at the
first attribute read, which a warm start of static graphs never makes.
"""
from __future__ import annotations

import importlib
from typing import Any


def submodule(package: str, name: str):
    """The submodule ``package.name``, imported: what a lazy package's ``__getattr__`` returns
    for a name it does not bind itself (AttributeError when there is no such module)."""
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{package}.{name}":
            raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None


class LazyModule:
    """Stands for the module ``name``, imported at the first attribute read."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = importlib.import_module(self._name)
            object.__setattr__(self, "_module", module)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}{'' if self._module is None else ' (imported)'}>"
