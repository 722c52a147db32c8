"""kiln: a compiler for PyTorch programs written in Python.

``kiln.compile(fn)`` captures the bytecode of ``fn`` into FX graphs guarded by checks on its
inputs, compiles them with a backend, and reuses them while the guards hold::

    import kiln, torch

    @kiln.compile
    def f(x, y):
        return torch.relu(x) @ y

Public API: ``compile``, ``reset``, ``explain``, ``comptime``, ``config``, ``Unsupported``,
``aot`` (staged AOT autograd), ``backends``, ``testing``, ``set_logs``, and for dynamic shapes
``mark_dynamic``, ``mark_static``, ``ConstraintViolation``; for activation memory
``saved_tensors_hooks`` / ``inline_saved_tensors_hooks`` (saved-tensor hooks inlined into the
compiled graphs) and ``activations`` (the cast, fp8 and offload policies and their report);
``load_package`` (with ``save_package`` on what ``compile`` returns), ``PackageError``,
``PackageMismatch``, ``PackageMiss`` for packages (``kiln.package``); ``CudagraphError`` for CUDA graphs (``mode="reduce-overhead"``, ``kiln.config.cudagraphs``; see
``kiln.cudagraphs``).
"""
import importlib as _importlib
import sys as _sys
import types as _types

from .config import config
from .lazy_imports import submodule as _import_submodule
from .version import __version__

# ``import kiln`` imports no torch: each name below is imported with its own module at its first
# use, so that the ``kiln`` command's subcommands that need no compiler (``kiln report``) start
# at once, and a warm start (``kiln.compile`` served by the cache) imports no tracer.
_MODULES = ("aot", "backends", "cache", "testing", "activations")
_NAMES = {
    ".api": ("compile", "reset"),
    ".runtime": ("CompiledFunction", "CompiledMethod", "CompiledModule"),
    ".capture.comptime": ("comptime",),
    ".errors": ("ConstraintViolation", "CudagraphError", "Unsupported"),
    ".explain": ("explain",),
    ".logs": ("set_logs",),
    ".package": ("PackageError", "PackageMismatch", "PackageMiss", "load_package"),
    ".shapes": ("mark_dynamic", "mark_static"),
    ".activations.hooks": ("inline_saved_tensors_hooks", "saved_tensors_hooks"),
}
# names that are also submodules: importing the submodule binds it on the package, where the
# function or object of that name belongs
_SHADOWED = frozenset({"config", "explain"})


_LAZY = frozenset(_MODULES).union(*_NAMES.values())
_HOME = {name: module for module, names in _NAMES.items() for name in names}


def _importing_kiln() -> bool:
    """Whether one of kiln's modules is being imported now."""
    for name, m in list(_sys.modules.items()):
        if name.startswith("kiln.") and getattr(getattr(m, "__spec__", None), "_initializing", False):
            return True
    return False


class _Kiln(_types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        if _importing_kiln():
            # kiln's own ``from .. import cache`` while its modules import: that module only
            # (a name's module may be halfway through its import)
            if name in _SHADOWED or name not in _MODULES and name in _LAZY:
                raise AttributeError(f"module {__name__!r} has no attribute {name!r} yet (kiln is importing)")
            return self._submodule(name)
        home = _HOME.get(name)
        if home is None:
            return self._submodule(name)
        value = getattr(_importlib.import_module(home, __name__), name)
        _types.ModuleType.__setattr__(self, name, value)
        return value

    def _submodule(self, name: str):
        return _import_submodule(__name__, name)

    def __setattr__(self, name: str, value) -> None:
        if name in _SHADOWED and isinstance(value, _types.ModuleType):
            return
        _types.ModuleType.__setattr__(self, name, value)

    def __dir__(self):
        return sorted(set(self.__dict__) | set(__all__))


_sys.modules[__name__].__class__ = _Kiln

__all__ = ["compile", "reset", "explain", "comptime", "config", "Unsupported", "aot", "backends",
           "testing", "set_logs", "CompiledFunction", "CompiledMethod", "CompiledModule",
           "mark_dynamic", "mark_static", "ConstraintViolation", "activations",
           "saved_tensors_hooks", "inline_saved_tensors_hooks", "CudagraphError",
           "load_package", "PackageError", "PackageMismatch", "PackageMiss"]
