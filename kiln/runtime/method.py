"""A CompiledFunction bound to an object."""
from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .function import CompiledFunction


class CompiledMethod:
    """A CompiledFunction bound to ``self`` (``kiln.compile(obj.method)``)."""

    __slots__ = ("_compiled", "_self", "_wrapped")

    def __init__(self, compiled: CompiledFunction, obj: Any, wrapped: Any = None):
        self._compiled = compiled
        self._self = obj
        self._wrapped = wrapped

    @property
    def __wrapped__(self):
        """The method it compiles: ``inspect.signature`` reads its parameters through this,
        as through ``functools.wraps`` (Hugging Face's ``generate`` checks its keyword
        arguments against ``inspect.signature(model.forward)``)."""
        return self._wrapped if self._wrapped is not None else self.original

    @property
    def __name__(self):
        return self.__wrapped__.__name__

    def __call__(self, /, *args, **kwargs):
        return self._compiled(self._self, *args, **kwargs)

    @property
    def compiled_function(self) -> CompiledFunction:
        return self._compiled

    @property
    def entries(self):
        return self._compiled.entries

    @property
    def recompile_reasons(self):
        return self._compiled.recompile_reasons

    @property
    def original(self):
        return types.MethodType(self._compiled.original, self._self)

    def save_package(self, path: str):
        """Save every entry compiled so far (and those of the continuations after graph
        breaks) to the file ``path``, for ``kiln.load_package``. Returns a
        ``kiln.package.SaveReport``: entries saved, and entries left out with the reason."""
        return self._compiled.artifacts.save_package(self, path)

    def __repr__(self):
        return f"<kiln.CompiledMethod {self._compiled._fn.__qualname__} of {type(self._self).__name__}>"
