"""Inductor's Triton kernels, launched by kiln without importing Triton or Inductor.

A generated module for a CUDA graph builds each kernel with ``async_compile.triton(name,
source)``: Inductor imports Triton, compiles (or finds in Triton's cache) one binary per
candidate launch configuration, and on the kernel's first launch benchmarks the candidates and
keeps one. In a warm process that costs the import of ``torch._inductor`` (which imports
``torch._dynamo``), of Triton, and a cache lookup per kernel: most of a warm start on a GPU.

What a kernel finally is after its first launch is small: a cubin, the function's name, its
shared memory and warp count, the types of the arguments it takes, and how the launch grid is
computed from the sizes. That is what Inductor's own static launcher
(``torch._C._StaticCudaLauncher``, torch's building block, no Triton at run time) launches.

So after a module's first call, in the process that ran it through Inductor (the compiling one,
or one that loaded it the slow way), ``record`` writes one file per module, named by the digest
of the module's source, into kiln's kernel directory:

* per kernel: the digest of its Triton source, the chosen configuration's launch facts and
  launcher (the grid expressions Inductor generated for that configuration), and its cubin;
* the facts a cubin and its launcher depend on: the GPU's name and compute capability and the
  torch version (the launcher's calling convention).

``load`` turns that file back into kernels whose ``run(*args, stream=...)`` is the call the
generated module makes. Anything it cannot vouch for (no file, another GPU or torch, a kernel
source that differs, a corrupt file) makes it return None, and the module is loaded through
Inductor as before (which then records it). A kernel Inductor could not launch statically (a
user-defined Triton kernel, a launch needing scratch memory or a cooperative grid) makes the
whole module take Inductor's path: nothing is half-recorded.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

from ... import _torch
from ...cache import compile_once, store
from ...process_state import triton_records as _made

FORMAT = 1
SUFFIX = ".kt"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_path(kernel_dir: str, module_digest: str) -> str:
    return os.path.join(kernel_dir, f"triton-{module_digest[:32]}{SUFFIX}")


def device_facts(device: int) -> dict:
    """What a recorded cubin and its launcher depend on."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return {"gpu": torch.cuda.get_device_name(device), "capability": f"{major}.{minor}",
            "torch": torch.__version__}


# ------------------------------------------------------------------------------------------------
# Recording (Inductor is imported: the module ran through it)
# ------------------------------------------------------------------------------------------------

def record(module_globals: dict, kernel_sources: dict[str, str]) -> tuple[dict, bytes] | None:
    """(header, payload) of a module's kernels after their first launch, or None when one of
    them is not launched statically by one chosen configuration. ``kernel_sources``: the
    digest of each kernel's Triton source by its global name (from ``describe``)."""
    header: dict = {"format": FORMAT, "kernels": {}}
    blobs: list[bytes] = []
    offset = 0
    device = None
    for name, src_digest in kernel_sources.items():
        facts = _torch.inductor_triton_launch_facts(module_globals.get(name))
        if facts is None:
            return None
        cubin = facts.pop("cubin")
        if device is None:
            device = facts["device"]
        elif facts["device"] != device:
            return None
        header["kernels"][name] = {**facts, "source": src_digest, "cubin": [offset, len(cubin),
                                                                            _digest(cubin)]}
        blobs.append(cubin)
        offset += len(cubin)
    if device is None:
        return None
    header["device"] = device
    header["facts"] = device_facts(device)
    return header, b"".join(blobs)


# (_made) The records made in this process, by module digest: a package saved here carries
# them even with the cache off (then nothing is written to disk). The newest _MAX_MADE are
# kept (a record is a few cubins: tens of KB to a few MB); an older one is read back from the
# cache.
_MAX_MADE = 256


def save(kernel_dir: str | None, module_digest: str, recorded: tuple[dict, bytes]) -> None:
    """Keep the record for packages saved by this process; write it to ``kernel_dir`` (the
    cache's) unless that is None; publish it to the ranks of a job that received the module
    from this one and wait for it (``compile_once``)."""
    header, payload = recorded
    blob = store.encode(header, payload, store.KERNELS)
    _made[module_digest] = blob
    while len(_made) > _MAX_MADE:
        del _made[next(iter(_made))]
    if kernel_dir is not None:
        store.write_kernel_record(record_path(kernel_dir, module_digest), blob)
    compile_once.publish_kernels(module_digest, blob)


def is_recorded(kernel_dir: str | None, module_digest: str) -> bool:
    return module_digest in _made or (kernel_dir is not None and os.path.exists(record_path(kernel_dir, module_digest)))


def saved_blob(kernel_dir: str, module_digest: str) -> bytes | None:
    """The record's bytes, for a package: made here, or found in ``kernel_dir``."""
    blob = _made.get(module_digest)
    if blob is not None:
        return blob
    try:
        with open(record_path(kernel_dir, module_digest), "rb") as f:
            return f.read()
    except OSError:
        return None


# ------------------------------------------------------------------------------------------------
# Loading (no Triton, no Inductor)
# ------------------------------------------------------------------------------------------------

def load(kernel_dir: str, module_digest: str, kernel_sources: dict[str, str], blob: bytes | None = None,
         device: int | None = None) -> dict | None:
    """The module's kernels by global name, launchable, or None (the module then loads through
    Inductor). ``blob``: the record a package carries (else it is read from ``kernel_dir``).
    ``device``: the CUDA device the module runs them on (else the one they were recorded on):
    a cubin does not name its device, and the record's facts must hold for the device it
    loads on."""
    path = record_path(kernel_dir, module_digest)
    from_file = blob is None
    if from_file:
        blob = store.read_kernel_record(path)      # (or the remote cache's)
        if blob is None:
            return None
    try:
        header, payload = store.decode(blob, store.KERNELS)
    except store.CorruptEntry:
        if from_file:
            _discard(path)      # (rewritten after the next slow load)
        return None
    try:
        on = header["device"] if device is None else device
        if header.get("format") != FORMAT or header.get("facts") != device_facts(on):
            return None
        recorded = header["kernels"]
        if {n: k["source"] for n, k in recorded.items()} != kernel_sources:
            return None
        return {name: TritonKernel.from_record(name, k, payload, kernel_dir, on)
                for name, k in recorded.items()}
    except Exception:           # (a cubin the driver refuses, a record from another kiln)
        return None


def _discard(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _cubin_file(kernel_dir: str, data: bytes, digest: str) -> str:
    """The path of a file holding exactly ``data`` (the driver loads cubins from files)."""
    path = os.path.join(kernel_dir, f"{digest[:32]}.cubin")
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return path
    except OSError:
        pass
    import tempfile

    os.makedirs(kernel_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=kernel_dir, prefix=".tmp-", suffix=".cubin")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


class TritonKernel:
    """One recorded kernel: ``run`` is its launcher, generated from the recorded argument lists
    and grid expressions (the code Inductor's static launcher generates for the configuration
    it chose), calling ``torch._C._StaticCudaLauncher``."""

    def __init__(self, name: str, run: Any):
        self.name = name
        self.run = run

    def __repr__(self) -> str:
        return f"<kiln Triton kernel {self.name}>"

    @classmethod
    def from_record(cls, name: str, k: dict, payload: bytes, kernel_dir: str, device: int) -> "TritonKernel":
        import torch
        from torch._C import _StaticCudaLauncher

        start, size, digest = k["cubin"]
        data = payload[start:start + size]
        if _digest(data) != digest:
            raise ValueError(f"kernel {name}: cubin digest mismatch")
        path = _cubin_file(kernel_dir, data, digest)
        function, _, _ = _StaticCudaLauncher._load_kernel(path, k["function"], k["shared"], device)
        scope = {"_kiln_launch": _StaticCudaLauncher._launch_kernel, "_kiln_function": function,
                 "_kiln_profiler": torch.autograd.profiler,
                 "_kiln_record": torch._C._profiler._RecordFunctionFast}
        exec(compile(launcher_source(k), f"<kiln: Triton launcher {name}>", "exec"), scope)
        return cls(name, scope["launcher"])


def launcher_source(k: dict) -> str:
    """``def launcher(<args>, stream)``: the grid from the sizes, then one launch (named in the
    profiler's trace when it records, as Inductor's launch is)."""
    def_args = ", ".join([*k["def_args"], "stream"])
    call = list(k["call_args"]) + ["None"] * int(k["scratch"])
    launch = (f"_kiln_launch(_kiln_function, grid_0, grid_1, grid_2, {int(k['num_warps'])}, "
              f"{int(k['shared'])}, {k['arg_tys'] + 'O' * int(k['scratch'])!r}, "
              f"({', '.join(call)}{',' if len(call) == 1 else ''}), stream)")
    lines = [f"def launcher({def_args}):",
             *[f"    {line}" for line in k["grid"]["prefix"]],
             f"    grid_0 = {k['grid']['x']}",
             f"    grid_1 = {k['grid']['y']}",
             f"    grid_2 = {k['grid']['z']}",
             "    if _kiln_profiler._is_profiler_enabled:",
             f"        with _kiln_record({k['profile_name']!r}, ({', '.join(k['call_args'])}{',' if len(k['call_args']) == 1 else ''})):",
             f"            {launch}",
             "    else:",
             f"        {launch}"]
    return "\n".join(lines) + "\n"
