"""What ``kiln.compile`` returns for a callable with no Python bytecode of its own."""
from __future__ import annotations

import functools
import types
from typing import Callable

from .. import logs
from . import recording


class EagerCallable:
    """What ``kiln.compile`` returns for a callable that has no Python bytecode of its own to
    capture (``len``, ``getattr``, ``torch.add``, a class, a C method): it calls the original
    as it is. ``kiln.explain`` and ``KILN_LOGS=graph_breaks`` say why nothing is captured."""

    def __init__(self, target: Callable):
        self._target = target
        self._logged = False
        functools.update_wrapper(self, target, updated=())

    @property
    def reason(self) -> str:
        t = self._target
        if isinstance(t, type):
            what = "a class"
        elif isinstance(t, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            what = "a builtin function"
        elif isinstance(t, (types.MethodWrapperType, types.WrapperDescriptorType,
                            types.MethodDescriptorType, types.ClassMethodDescriptorType)):
            what = "a method implemented in C"
        else:
            what = f"a {type(t).__name__} object whose __call__ is not Python code"
        name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or type(t).__name__
        return f"{name} is {what}: there is no Python bytecode to capture, it runs as it is"

    @property
    def original(self) -> Callable:
        return self._target

    @property
    def entries(self) -> list:
        return []

    @property
    def recompile_reasons(self) -> list:
        return []

    def __call__(self, /, *args, **kwargs):
        if recording.recorder.stack:
            recording.record_uncompiled(self.reason)
        if not self._logged and logs.enabled.graph_breaks:
            self._logged = True
            logs.event("graph_breaks", "eager", self.reason, function=getattr(self._target, "__qualname__", None),
                       reason=self.reason, file=None, line=None)
        return self._target(*args, **kwargs)

    def __repr__(self):
        return f"<kiln.EagerCallable {self._target!r}>"
