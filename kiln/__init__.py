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
from .version import __version__

# ``import kiln`` imports no torch: the names below are imported with their modules at the first
# use of any of them, so that the ``kiln`` command's subcommands that need no compiler (``kiln
# report``) start at once. After that first use the package holds exactly what an eager import
# would have bound.
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
_MISSING = object()


def _importing_kiln() -> bool:
    """Whether one of kiln's modules is being imported now."""
    for name, m in list(_sys.modules.items()):
        if name.startswith("kiln.") and getattr(getattr(m, "__spec__", None), "_initializing", False):
            return True
    return False


class _Kiln(_types.ModuleType):
    def __getattr__(self, name: str):
        d = self.__dict__
        if name.startswith("__"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        if _importing_kiln():
            # kiln's own ``from .. import cache`` while its modules import: that module only
            # (loading every name now would import a module that is halfway through its import)
            if name in _SHADOWED or name not in _MODULES and name in _LAZY:
                raise AttributeError(f"module {__name__!r} has no attribute {name!r} yet (kiln is importing)")
            return self._submodule(name)
        if name in _LAZY and not d.get("_loaded"):
            self._load()
        if name in d:
            return d[name]
        return self._submodule(name)

    def _submodule(self, name: str):
        try:
            return _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None

    def _load(self) -> None:
        """Import and bind every lazy name. Reached again while a module it imports is still
        being imported (which may ask the package for a name): what that module does not hold
        yet stays unbound, and a later use loads again."""
        d = self.__dict__
        if d.get("_loading"):
            return
        bind = _types.ModuleType.__setattr__
        bind(self, "_loading", True)
        try:
            complete = True
            for m in _MODULES:
                bind(self, m, _importlib.import_module(f"{__name__}.{m}"))
            for module, names in _NAMES.items():
                mod = _importlib.import_module(module, __name__)
                for n in names:
                    value = getattr(mod, n, _MISSING)
                    if value is _MISSING:
                        complete = False
                    else:
                        bind(self, n, value)
            bind(self, "_loaded", complete)
        finally:
            bind(self, "_loading", False)

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
