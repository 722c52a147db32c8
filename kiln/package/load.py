"""``load_package``: a compiled function whose entries come from a package file.

Calls are matched by the package's guards first, as any compiled function's entries are
(``CompiledFunction.__call__``); nothing is captured, traced or lowered for a call that
matches. A call that matches no entry compiles as usual and is logged (``on_miss="compile"``,
``KILN_LOGS=package``) or raises ``PackageMiss`` (``on_miss="error"``).
"""
from __future__ import annotations

import types

import torch

from .. import logs
from ..backends.inductor import vec_isa_memo
from ..backends.registry import lookup_backend
from ..runtime.compile_key import CompileKey
from ..runtime.function import CompiledFunction
from ..runtime.function_cache import cache_for
from ..runtime.method import CompiledMethod
from ..runtime.module import CompiledModule, module_caller
from . import fileformat, identity
from .artifacts import ARTIFACTS
from .entries import install, link_shared_groups, load_entries
from .packaged_function import PackagedFunction

_ON_MISS = ("compile", "error")


def _wrap(target, key: CompileKey, dynamic, on_miss: str, path: str, kind: str):
    """(what load_package returns, the function kiln compiles, its PackagedFunction)."""
    if kind == "module":
        if not isinstance(target, torch.nn.Module):
            raise TypeError(f"load_package: the package holds a compiled nn.Module; pass the module "
                            f"(an instance of it), not {type(target).__name__}")
        fn = module_caller(type(target))
        cf = PackagedFunction(fn, key, dynamic, ARTIFACTS, on_miss, path)
        return CompiledModule(target, cf), fn, cf
    if isinstance(target, types.MethodType) and isinstance(target.__func__, types.FunctionType):
        cf = PackagedFunction(target.__func__, key, dynamic, ARTIFACTS, on_miss, path)
        return CompiledMethod(cf, target.__self__), target.__func__, cf
    if isinstance(target, types.FunctionType):
        cf = PackagedFunction(target, key, dynamic, ARTIFACTS, on_miss, path)
        return cf, target, cf
    raise TypeError(f"load_package: pass the function, bound method or nn.Module the package was saved "
                    f"from, not {type(target).__name__}")


def load_package(path: str, model_or_fn, on_miss: str = "compile", check_source: bool = True):
    """A compiled ``model_or_fn`` whose entries come from the package at ``path`` (written by
    ``save_package`` on what ``kiln.compile`` returned), without capturing, tracing or lowering.

    ``model_or_fn``: the function, bound method or nn.Module the package was saved from (in
    this process: the guards and the generated code read its globals, closure cells,
    defaults and attributes, so a global tensor is read where it lives now). Returns what
    ``kiln.compile`` would: a ``CompiledFunction``, ``CompiledMethod`` or ``CompiledModule``,
    compiled with the package's backend and options.

    ``on_miss``: what a call that matches no saved entry does: ``"compile"`` (default)
    captures and compiles as usual and logs it (``KILN_LOGS=package``); ``"error"`` raises
    ``kiln.PackageMiss`` naming the nearest entry's failing guard (in the continuation after
    a graph break too: the call has then run up to the break).

    ``check_source``: raise ``kiln.PackageMismatch`` when the qualified name, the signature
    or the code of the function (or of a function inlined into its graphs) differs from the
    saved one; ``False`` loads anyway (the saved guards still decide which calls match).

    Raises ``kiln.PackageError`` for a file that is not an intact kiln package (checked by its
    content hash before anything in it is used) or that was saved with another kiln, torch or
    Python version or for another device kind. A package holds code: load only packages you
    trust. ``kiln.reset()`` drops the loaded entries as it drops compiled ones.
    """
    if on_miss not in _ON_MISS:
        raise ValueError(f"load_package: on_miss must be one of {_ON_MISS}, not {on_miss!r}")
    pkg = fileformat.read(str(path))
    m = pkg.manifest
    fileformat.check_environment(str(path), m["environment"])
    k = m["key"]
    backend, name = lookup_backend(k["backend"], mode=k["mode"], options=k["options"])
    key = CompileKey.get(backend, name, k["fullgraph"], k["mode"], k["options"], k["dynamic"])
    target = model_or_fn
    if isinstance(target, CompiledModule):     # (already compiled: its original gets the entries)
        target = target._orig_mod
    elif isinstance(target, (CompiledFunction, CompiledMethod)):
        target = target.original
    if m["kind"] == "method" and isinstance(target, types.MethodType):
        ident_target = target.__func__
    else:
        ident_target = target
    result, fn, cf = _wrap(target, key, k["dynamic"], on_miss, str(path), m["kind"])
    if check_source:
        identity.check(m["identity"], ident_target, fn)
    if m.get("vec_isa"):
        # a machine with the same CPU, compiler and torch skips Inductor's SIMD probe (seconds)
        vec_isa_memo.offer(m["vec_isa"])
    link_shared_groups(m["entries"])
    entries = load_entries(m["entries"], fn, cf, pkg.blob)
    install(cache_for(fn), entries)
    if logs.enabled.package:
        logs.event("package", "package", f"loaded {len(entries)} entries of {fn.__qualname__} from {path}",
                   action="loaded", path=str(path), function=fn.__qualname__, entries=len(entries))
    return result
