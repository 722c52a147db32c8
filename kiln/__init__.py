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
from . import aot, backends, cache, testing
from .api import compile, reset
from .runtime import CompiledFunction, CompiledMethod, CompiledModule
from .capture.comptime import comptime
from .config import config
from .errors import ConstraintViolation, CudagraphError, Unsupported
from .explain import explain
from .logs import set_logs
from .package import PackageError, PackageMismatch, PackageMiss, load_package
from .shapes import mark_dynamic, mark_static
from .version import __version__
from . import activations
from .activations.hooks import inline_saved_tensors_hooks, saved_tensors_hooks

__all__ = ["compile", "reset", "explain", "comptime", "config", "Unsupported", "aot", "backends",
           "testing", "set_logs", "CompiledFunction", "CompiledMethod", "CompiledModule",
           "mark_dynamic", "mark_static", "ConstraintViolation", "activations",
           "saved_tensors_hooks", "inline_saved_tensors_hooks", "CudagraphError",
           "load_package", "PackageError", "PackageMismatch", "PackageMiss"]
