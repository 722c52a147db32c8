"""Inductor's generated module, loaded by kiln without importing Inductor.

A module Inductor generates for one graph starts with imports from ``torch._inductor``
(``AsyncCompile``, ``extern_kernels``, a few helpers) and builds its kernels when it is
imported. Importing ``torch._inductor`` imports ``torch._dynamo`` and takes a second or more,
and building the C++ kernels probes the CPU's vector ISA: most of a warm start or a package
load. The kernels themselves are finished shared libraries in Inductor's cache.

So a cache entry or package keeps, next to the module's source (``describe`` at save time):

* the module's source with each top-level ``from torch._inductor... import NAME`` replaced by
  a name from ``kiln_generated_runtime`` (``__kiln_rt__``): ``AsyncCompile`` and
  ``extern_kernels`` are kiln's, anything else is a proxy that imports the real object the
  first time it is used (a helper the code only calls under a debug setting);
* each C++ kernel's compiled library (``cpp_pybinding`` kernels), keyed by a digest of its
  source, with the facts of the machine that built it (CPU flags, architecture, Python,
  torch): a load elsewhere builds the kernels from source as before;
* where each ``extern_kernels.NAME`` the code calls lives (``torch.addmm``...), so that the
  namespace is filled without ``torch._inductor.select_algorithm``.

* for Triton kernels, the digest of each kernel's source: their cubins and launchers are
  recorded after the module's first call (``triton_kernels``), not at compile time, because
  Inductor picks each kernel's launch configuration on its first launch.

``load`` returns the module's ``call`` from that, or None (the caller then imports the module
as Inductor does): another machine, a kernel kind kiln does not load itself, Triton kernels not
recorded yet (``triton_recorder`` records them after the first call), a library that fails to load. A
kernel file is named by the digest of its bytes and checked before it is loaded. Nothing about
what runs changes: the same source, the same kernels, the same extern functions.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import os
import platform
import re
import sys
import tempfile
import types
from typing import Any, Callable

from ... import logs
from . import triton_kernels

FORMAT = 1
_IGNORED_FUNCTIONS = ("get_args", "benchmark_compiled_module")
_KERNEL_KINDS = ("cpp_pybinding", "triton")


# ------------------------------------------------------------------------------------------------
# Save time
# ------------------------------------------------------------------------------------------------

def describe(source: str, module_globals: dict | None) -> dict | None:
    """What a load needs to skip Inductor for this module, or None when it cannot (a kernel
    kind kiln does not load itself, a kernel whose library is not found). (Runs after every
    compile: the source is parsed once and rewritten line by line, never unparsed.)"""
    if module_globals is None:
        return None
    if any(kind not in _KERNEL_KINDS for kind in set(_KIND_CALL.findall(source))):
        return None                 # (Triton kernels...: before parsing a large module)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    kernels: dict[str, bytes] = {}
    triton: dict[str, str] = {}
    lines = source.splitlines(keepends=True)
    for stmt in tree.body:
        kind = _kernel_kind(stmt)
        if kind == "triton":
            src = _kernel_source(stmt)
            if src is None or _kernel_name(stmt) != stmt.targets[0].id:
                return None
            triton[stmt.targets[0].id] = _digest(src.encode())
        elif kind is not None:
            if kind not in _KERNEL_KINDS:
                return None
            src = _kernel_source(stmt)
            fn = module_globals.get(stmt.targets[0].id)
            path = getattr(getattr(fn, "__self__", None), "__file__", None)
            if src is None or not path:
                return None
            try:
                with open(path, "rb") as f:
                    kernels[_digest(src.encode())] = f.read()
            except OSError:
                return None
        replacement = _rewrite_import(stmt)
        if replacement is not None:
            lines[stmt.lineno - 1] = replacement
            for k in range(stmt.lineno, stmt.end_lineno):
                lines[k] = "\n"
    extern = {}
    kernel_names = module_globals.get("extern_kernels")
    for name in sorted(set(_EXTERN_USE.findall(source))):
        extern[name] = _where(getattr(kernel_names, name, None))
    return {"format": FORMAT, "source": "".join(lines), "kernels": kernels, "triton": triton,
            "extern": extern, "machine": machine_facts()}


_KIND_CALL = re.compile(r"^\w+ = async_compile\.(\w+)\(", re.MULTILINE)
_EXTERN_USE = re.compile(r"\bextern_kernels\.(\w+)")


def _kernel_kind(stmt) -> str | None:
    """``NAME = async_compile.KIND(...)`` -> KIND."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
            and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute) \
            and isinstance(stmt.value.func.value, ast.Name) and stmt.value.func.value.id == "async_compile":
        return stmt.value.func.attr
    return None


def _kernel_name(stmt) -> str | None:
    args = stmt.value.args
    if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        return args[0].value
    return None


def _kernel_source(stmt) -> str | None:
    args = stmt.value.args
    if len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
        return args[1].value
    return None


def _rewrite_import(stmt) -> str | None:
    """``from torch._inductor.X import A as B`` -> ``B = __kiln_rt__.get('torch._inductor.X', 'A')``
    and ``import triton.language as tl`` -> ``tl = __kiln_rt__.module('triton.language')`` (one
    line: the kernels are loaded, Triton is imported only if the code really uses it), None
    for other statements."""
    if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0 \
            and (stmt.module == "torch._inductor" or stmt.module.startswith("torch._inductor.")):
        return "; ".join(f"{alias.asname or alias.name} = __kiln_rt__.get({stmt.module!r}, {alias.name!r})"
                         for alias in stmt.names) + "\n"
    if isinstance(stmt, ast.Import) and all(a.name == "triton" or a.name.startswith("triton.") for a in stmt.names):
        return "; ".join(f"{a.asname or a.name.split('.')[0]} = __kiln_rt__.module({(a.name if a.asname else a.name.split('.')[0])!r})"
                         for a in stmt.names) + "\n"
    return None


def _where(fn) -> list | None:
    """[module, attribute] where ``fn`` is found without Inductor, or None (then the real
    namespace is imported when the name is first used)."""
    if fn is None:
        return None
    mod, name = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
    if not mod or not name or mod == "torch._inductor" or mod.startswith("torch._inductor."):
        return None
    try:
        if getattr(importlib.import_module(mod), name) is fn:
            return [mod, name]
    except Exception:
        pass
    return None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=1)
def machine_facts() -> str:
    """What a C++ kernel library depends on: the architecture, the CPU's instruction sets,
    the Python ABI its bindings use and the torch whose headers it was built with."""
    import torch

    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
                    break
    except OSError:
        pass
    return _digest("\n".join([platform.machine(), sys.platform, sys.implementation.cache_tag or "",
                              torch.__version__, flags]).encode())[:32]


# ------------------------------------------------------------------------------------------------
# Load time
# ------------------------------------------------------------------------------------------------

def load(fast: dict | None, constants: dict, kernel_dir: str, triton_record: bytes | None = None) -> Any | None:
    """The generated module loaded from ``describe``'s record (``None``: load it as Inductor
    does). ``kernel_dir``: where kernel libraries are written (kiln's cache directory);
    ``triton_record``: the recorded Triton kernels a package carries (else looked up there)."""
    if not fast or fast.get("format") != FORMAT:
        return None
    if fast["kernels"] and fast.get("machine") != machine_facts():
        return None         # (C++ libraries: built for this machine's CPU, Python and torch)
    try:
        kernels = {key: _load_library(data, kernel_dir) for key, data in fast["kernels"].items()}
    except Exception:       # (an unwritable directory, a library that does not load here)
        return None
    triton = {}
    if fast.get("triton"):
        triton = triton_kernels.load(kernel_dir, module_digest(fast), fast["triton"], triton_record,
                                     cuda_device(fast["source"]))
        if triton is None:          # (not recorded yet, or not for this GPU)
            return None
    rt = Runtime(kernels, fast["extern"], triton)
    module = types.ModuleType("kiln_generated_" + _digest(fast["source"].encode())[:16])
    module.__dict__["__kiln_rt__"] = rt
    code = compile(fast["source"], f"<kiln: Inductor's generated module {module.__name__}>", "exec",
                   dont_inherit=True)
    exec(code, module.__dict__)
    for name, value in constants.items():
        setattr(module, name, value)
    return module


def module_digest(fast: dict) -> str:
    """Names the module's recorded Triton kernels (``triton_kernels``): the module as compiled
    (a module rebound to another GPU, ``device_rebinding``, keeps that name)."""
    return fast.get("record_digest") or _digest(fast["source"].encode())


_DEVICE_GUARD = re.compile(r"_DeviceGuard\((\d+)\)")


def cuda_device(source: str) -> int | None:
    """The CUDA device a generated module runs its kernels on (its device guard), when it names
    one: where its recorded Triton kernels are loaded."""
    found = {int(i) for i in _DEVICE_GUARD.findall(source)}
    return found.pop() if len(found) == 1 else None


def triton_recorder(fast: dict | None, module_globals: dict | None, kernel_dir: str | None
                    ) -> Callable[[], None] | None:
    """What records the module's Triton kernels (``triton_kernels``), to run once after its
    first call returns: written to ``kernel_dir`` (the cache's) unless None, and kept for
    packages saved by this process. None when there is nothing to record or it is recorded."""
    if not fast or not fast.get("triton") or module_globals is None:
        return None
    digest = module_digest(fast)
    if triton_kernels.is_recorded(kernel_dir, digest):
        return None

    def record() -> None:
        try:
            recorded = triton_kernels.record(module_globals, fast["triton"])
            if recorded is not None:
                triton_kernels.save(kernel_dir, digest, recorded)
        except Exception as e:         # (never the user's call: the next load is slower)
            if logs.enabled.cache:
                logs.log("cache", f"Triton kernels of module {digest[:12]} not recorded: {type(e).__name__}: {e}")
    return record


def _load_library(data: bytes, kernel_dir: str):
    """The ``kernel`` function of a C++ kernel library (named by the digest of its bytes,
    written once, checked before it is loaded)."""
    import importlib.util

    import torch

    key = _digest(data)
    name = f"kiln_kernels_{key[:32]}.kernel"       # (the module's init function is PyInit_kernel)
    if name in sys.modules:
        return sys.modules[name].kernel
    path = os.path.join(kernel_dir, key[:32] + ".so")
    try:
        with open(path, "rb") as f:
            intact = _digest(f.read()) == key
    except OSError:
        intact = False
    if not intact:
        os.makedirs(kernel_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=kernel_dir, prefix=".tmp-", suffix=".so")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    # the library finds the tensor data-pointer function through this variable (as Inductor's
    # own loader sets it)
    os.environ["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] = str(
        torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module.kernel


class _Lazy:
    """An object of ``torch._inductor`` imported the first time it is called or read."""

    def __init__(self, module: str, name: str):
        self._where = (module, name)
        self._target = None

    def _resolve(self):
        if self._target is None:
            module, name = self._where
            self._target = getattr(importlib.import_module(module), name)
        return self._target

    def __call__(self, /, *args, **kwargs):
        return self._resolve()(*args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._resolve(), name)


class _LazyModule:
    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


class _ExternKernels:
    """``extern_kernels``: each name from where ``describe`` found it; others from Inductor's
    own namespace, imported then."""

    def __init__(self, where: dict):
        self._where_ = where

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        loc = self._where_.get(name)
        if loc is not None:
            fn = getattr(importlib.import_module(loc[0]), loc[1])
        else:
            from torch._inductor.select_algorithm import extern_kernels

            fn = getattr(extern_kernels, name)
        setattr(self, name, fn)             # (looked up once)
        return fn


class _AsyncCompile:
    """Returns the loaded kernels; a kernel it does not have is built by Inductor's own
    ``AsyncCompile`` (imported then)."""

    def __init__(self, kernels: dict, triton: dict):
        self._kernels = kernels
        self._triton = triton
        self._real = None

    def _inductor(self):
        if self._real is None:
            from torch._inductor.async_compile import AsyncCompile

            self._real = AsyncCompile()
        return self._real

    def cpp_pybinding(self, argtypes, source_code, *args, **kwargs):
        fn = self._kernels.get(_digest(source_code.encode()))
        if fn is not None:
            return fn
        return self._inductor().cpp_pybinding(argtypes, source_code, *args, **kwargs)

    def triton(self, kernel_name, source_code, *args, **kwargs):
        # (``load`` checked each recorded kernel's source digest against ``describe``'s)
        kernel = self._triton.get(kernel_name)
        if kernel is not None:
            return kernel
        return self._inductor().triton(kernel_name, source_code, *args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inductor(), name)

    def wait(self, scope: dict) -> None:
        if self._real is not None:
            self._real.wait(scope)


class Runtime:
    """``__kiln_rt__`` in a generated module loaded by kiln."""

    def __init__(self, kernels: dict, extern: dict, triton: dict | None = None):
        self._async = _AsyncCompile(kernels, triton or {})
        self._extern = _ExternKernels(extern)

    def get(self, module: str, name: str):
        if name == "AsyncCompile":
            return lambda: self._async
        if name == "extern_kernels":
            return self._extern
        return _Lazy(module, name)

    def module(self, name: str):
        """A module (Triton) imported the first time the code reads one of its names."""
        return _LazyModule(name)


# ------------------------------------------------------------------------------------------------

ALIGNMENT = 16      # (Inductor's: the alignment its kernels assume of the inputs it checks)


def realign_inputs(call: Callable, check: list[int], mutated: set) -> Callable:
    """Inductor's call wrapper for inputs it assumed aligned: a misaligned one is copied to
    aligned memory first, and a mutated one is copied back after."""
    def run(args: list):
        old, new = [], []
        for i in check:
            a = args[i]
            if a.data_ptr() % ALIGNMENT:
                args[i] = _clone_preserve_strides(a)
                if i in mutated:
                    old.append(a)
                    new.append(args[i])
        out = call(args)
        if old:
            import torch

            torch._foreach_copy_(old, new)
        return out
    return run


def _clone_preserve_strides(x):
    import torch

    needed = 0 if 0 in x.size() else sum((s - 1) * st for s, st in zip(x.size(), x.stride())) + 1
    buf = torch.as_strided(x, (needed,), (1,)).clone()
    return torch.as_strided(buf, x.size(), x.stride())
