"""Inductor's CPU vector-ISA probe, remembered per machine in kiln's cache directory.

Before it compiles or loads C++ kernels, Inductor decides which SIMD instruction sets
(AVX-512, AVX2...) it may use: for each one the CPU reports, it builds a probe library and
``dlopen``s it in a new Python process (``torch._inductor.cpu_vec_isa.valid_vec_isa_list``).
That costs one to several seconds in every process, most of a warm start's time on CPU.

The answer depends only on the machine: the CPU's features, the C++ compiler (its path and
version), torch (version and install), the Python that runs the probe and the environment the
probe sees. kiln stores the answer under ``<cache_dir>/vec_isa/`` named by a digest of exactly
those facts, and a later process with the same facts takes it instead of probing again; any
change (another CPU, compiler or torch) is another name, so the probe runs again. A record
that cannot be read, or names an ISA this torch does not know, is ignored. With a remote cache
(``kiln.remote_cache``) the record is written there too, by the same name, and a machine with
no record of its own takes the remote one when its facts are exactly this machine's.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import tempfile

from ... import remote_cache

FORMAT = 1


def _isa_module():
    import torch._inductor.cpu_vec_isa as isa

    return isa


def _facts() -> dict:
    return json.loads(_facts_text())


@functools.lru_cache(maxsize=1)
def _facts_text() -> str:
    """(Once per process, as torch probes once per process.)"""
    return json.dumps(_read_facts(), sort_keys=True, default=repr)


def _read_facts() -> dict:
    import torch
    from torch._inductor import config
    from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler

    isa = _isa_module()
    compiler = get_cpp_compiler()
    return {
        "format": FORMAT, "torch": torch.__version__, "torch_dir": os.path.dirname(torch.__file__),
        "python": sys.executable, "machine": platform.machine(), "platform": sys.platform,
        "cpu": isa.x86_isa_checker() if platform.machine() in ("x86_64", "AMD64")
        else sorted(k for k, v in torch.cpu.get_capabilities().items() if v is True)
        if hasattr(torch.cpu, "get_capabilities") else None,
        "compiler": [compiler, get_compiler_version_info(compiler)],
        "env": {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "CXX", "ATEN_CPU_CAPABILITY", "PATH")},
        "config": [repr(config.cpp.cxx), repr(config.cpp.vec_isa_ok), config.is_fbcode()],
    }


def _path(cache_dir: str, facts: dict) -> str:
    return os.path.join(os.path.expanduser(cache_dir), "vec_isa", _digest(facts) + ".json")


def _digest(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def _computed(fn) -> bool:
    info = getattr(fn, "cache_info", None)
    return info is not None and info().currsize > 0


# records a package carries (``offer``): tried after the cache dir's, under the same check
_offered: list = []


def offer(records: list) -> None:
    """Records saved with a package (``record()``): a load on a machine with the same facts
    takes one instead of probing, even with an empty cache dir; another machine's facts
    differ, and it probes."""
    _offered.extend(r for r in records if isinstance(r, dict) and r not in _offered)


def record() -> dict | None:
    """This process's ISA record (as ``remember`` writes it), for a package to carry; None
    when Inductor's ISA module was never used here (nothing is imported to find out)."""
    isa = sys.modules.get("torch._inductor.cpu_vec_isa")
    if isa is None:
        return None
    current = isa.valid_vec_isa_list
    if not (getattr(current, "kiln_remembered", False) or _computed(current)):
        return None
    try:
        valid = current()
        return {"facts": _facts(), "valid": [isa.supported_vec_isa_list.index(i) for i in valid],
                "names": [str(i) for i in valid]}
    except (ValueError, OSError):
        return None


def _read_record(cache_dir: str, facts: dict) -> list:
    """The stored records for these facts: the cache dir's, then those packages offered."""
    out = []
    try:
        with open(_path(cache_dir, facts), encoding="utf-8") as f:
            out.append(json.load(f))
    except FileNotFoundError:
        remote = remote_cache.get("vec_isa", _digest(facts))     # (checked against the facts by prime)
        if remote is not None:
            try:
                out.append(json.loads(remote))
            except ValueError:
                pass
    except (OSError, ValueError):
        pass
    return out + list(_offered)


def prime(cache_dir: str) -> bool:
    """Make Inductor take this machine's stored ISA list instead of probing (True when it
    does from now on, or already computed it in this process)."""
    isa = _isa_module()
    current = isa.valid_vec_isa_list
    if getattr(current, "kiln_remembered", False) or _computed(current):
        return True
    isas = None
    try:
        facts = _facts()
    except (OSError, ValueError):
        return False
    for rec in _read_record(cache_dir, facts):
        try:
            if rec.get("facts") != facts:
                continue
            supported = isa.supported_vec_isa_list
            # by position in torch's list of the ISAs it supports (two can print alike),
            # checked against the names
            found = [supported[i] for i in rec["valid"]]
            if [str(i) for i in found] == rec["names"]:
                isas = found
                break
        except (AttributeError, KeyError, TypeError, IndexError):
            continue
    if isas is None:
        return False

    @functools.cache
    def remembered_valid_vec_isa_list():
        return list(isas)
    remembered_valid_vec_isa_list.kiln_remembered = True
    remembered_valid_vec_isa_list.__wrapped__ = current
    isa.valid_vec_isa_list = remembered_valid_vec_isa_list
    return True


def remember(cache_dir: str) -> None:
    """Store the ISA list Inductor probed in this process (once computed), for the next."""
    isa = _isa_module()
    current = isa.valid_vec_isa_list
    if getattr(current, "kiln_remembered", False) or not _computed(current):
        return
    try:
        facts = _facts()
        path = _path(cache_dir, facts)
        if os.path.exists(path):
            return
        valid = current()
        text = json.dumps({"facts": facts, "valid": [isa.supported_vec_isa_list.index(i) for i in valid],
                           "names": [str(i) for i in valid]}, default=repr)
        remote_cache.put("vec_isa", _digest(facts), text.encode())
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass            # (an unwritable cache dir: the next process probes again)
