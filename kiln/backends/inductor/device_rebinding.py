"""An Inductor entry compiled for one CUDA device, made to run on another.

The ranks of one machine run the same program, each on its own GPU. Inductor's code for a
graph on cuda:0 and for the same graph on cuda:1 differ only in the index they name, so the
cache keys such a graph without it (``kiln.cache.cached``'s ``rebind``) and a rank loading
another's entry rebinds it here: one compile serves every GPU of the machine.

What names the device in an entry, and what ``rebind`` does to it:

* each generated module's source (the Python wrapper and the Triton sources it holds): device
  guards, ``set_device``, streams, device arguments, the device properties of each Triton
  kernel, the CUDA generator it reads: rewritten. A module that names a CUDA device in a form
  not listed in ``_FORMS`` is not rebound: ``rebind`` raises, the load is a miss and the graph
  compiles (never run on a device it was not made for);
* the AOT artifact's graphs (device arguments, each value's device) and every tensor the entry
  holds (Inductor's constants): ``AOTArtifact.rebind_cuda`` and ``torch.load``'s
  ``map_location``;
* the recorded Triton kernels (cubins and launchers, ``triton_kernels``): device-free; they stay
  named by the digest of the module as compiled (``record_digest``) and load onto the device the
  rebound module names.

Nothing else depends on the index: the key holds the GPU's name and compute capability, so the
cubins, launch configurations and the choices of Inductor's autotuning are the other GPU's too.
"""
from __future__ import annotations

import io
import re

import torch

from ... import _torch
from ...aot import fallback_entries
from ...aot.export import AOTArtifact
from . import generated_module

# Every form in which Inductor's generated code names a CUDA device (group 1: the index).
_FORMS = (
    r"(?<=_DeviceGuard\()(\d+)(?=\))",
    r"(?<=\.set_device\()(\d+)(?=\))",
    r"(?<=get_raw_stream\()(\d+)(?=\))",
    r"(?<=device\(type='cuda', index=)(\d+)(?=\))",
    r"(?<=DeviceProperties\(type='cuda', index=)(\d+)(?=[,)])",
    r"(?<=default_generators\[)(\d+)(?=\])",
    r"(?<=['\"]cuda:)(\d+)(?=['\"])",
)
_KNOWN = re.compile("|".join(_FORMS))
# What could name a device in a form not above: the module is then not rebound.
_SUSPECT = re.compile(r"_DeviceGuard\(|set_device\(|get_raw_stream\(|default_generators\[|cuda:|index=")
_PLACEHOLDER = "\x00"
_COMMENT = re.compile(r"^[ \t]*#.*$", re.MULTILINE)


def rebind_source(source: str, old: int, new: int) -> str:
    """``source`` naming CUDA device ``new`` where it named ``old``. Raises ValueError for a
    source naming another CUDA device, or a device in a form kiln does not know. (Comment
    lines, which show the graph's values as ``f32[8, 4]cuda:0``, follow along unchecked.)"""
    comments: list[str] = []

    def hide(m: re.Match) -> str:
        comments.append(re.sub(rf"cuda:{old}\b", f"cuda:{new}", m.group(0)))
        return "\x01"

    def swap(m: re.Match) -> str:
        if int(m.group(0)) != old:
            raise ValueError(f"the module names CUDA device {m.group(0)} besides {old}")
        return _PLACEHOLDER
    if "\x01" in source or _PLACEHOLDER in source:
        raise ValueError("the module holds control characters kiln uses to rebind it")
    marked = _KNOWN.sub(swap, _COMMENT.sub(hide, source))
    for m in _SUSPECT.finditer(marked):
        after = marked[m.end():m.end() + 1]
        if after != _PLACEHOLDER:
            line = marked.count("\n", 0, m.start()) + 1
            raise ValueError(f"the module names a device in a form kiln does not rebind (line {line}: "
                             f"{marked[m.start():m.end() + 24]!r})")
    restored = iter(comments)
    return re.sub("\x01", lambda m: next(restored), marked.replace(_PLACEHOLDER, str(new)))


def _rebind_code(code: dict, old: int, new: int) -> dict:
    """One graph's stored generated code (``cache_entry.GeneratedCode.stored``) rebound."""
    code = dict(code)
    code["source_code"] = rebind_source(code["source_code"], old, new)
    fast = code.get("fast")
    if fast:
        fast = dict(fast)
        # (recorded Triton kernels stay named by the module as compiled: they are device-free)
        fast["record_digest"] = generated_module.module_digest(fast)
        fast["source"] = rebind_source(fast["source"], old, new)
        code["fast"] = fast
    return code


def rebind(payload: bytes, old: int, new: int) -> bytes:
    """The entry's bytes (``cache_entry.dump``) for CUDA device ``new``, from those compiled for
    ``old``. Raises ValueError when it cannot be rebound (the caller then compiles)."""
    if fallback_entries.is_entry(payload):
        return fallback_entries.map_shapes(payload, lambda one: rebind(one, old, new))
    obj = _torch.load_tensors(payload, map_location={f"cuda:{old}": f"cuda:{new}"})
    if not isinstance(obj, dict) or "graphs" not in obj:
        raise ValueError("not a kiln Inductor entry")
    obj["artifact"] = AOTArtifact.rebind_cuda(obj["artifact"], old, new)
    obj["graphs"] = {kind: _rebind_code(code, old, new) for kind, code in obj["graphs"].items()}
    obj["late"] = {key: _rebind_code(code, old, new) for key, code in obj.get("late", {}).items()}
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
