"""``save_package``: every entry of a compiled function (and of the continuations of its
graph breaks) in one file, with what identifies the function and the setup it is valid for."""
from __future__ import annotations

import types

from .. import logs
from ..backends.inductor import vec_isa_memo
from ..backends.registry import lookup_backend
from ..runtime import CompiledFunction, CompiledMethod, CompiledModule
from . import fileformat, identity
from .entries import resume_groups, save_entries
from .report import LeftOut, SaveReport


def target_of(compiled) -> tuple[object, types.FunctionType, object, str]:
    """(the user's object, the function kiln compiles for it, its CompiledFunction, kind)."""
    if isinstance(compiled, CompiledModule):
        cf = compiled.compiled_function
        return compiled._orig_mod, cf.original, cf, "module"
    if isinstance(compiled, CompiledMethod):
        cf = compiled.compiled_function
        return cf.original, cf.original, cf, "method"
    if isinstance(compiled, CompiledFunction):
        return compiled.original, compiled.original, compiled, "function"
    raise TypeError(f"save_package: expected what kiln.compile returned (a CompiledFunction, "
                    f"CompiledMethod or CompiledModule), got {type(compiled).__name__}")


def key_of(cf) -> dict:
    key = cf.key
    name = key.backend_name
    try:
        same = lookup_backend(name, mode=key.mode, options=key.options)[0] is key.backend
    except Exception:
        same = False
    if not same:
        raise ValueError(f"save_package: backend {name!r} is not a registered kiln backend name; a "
                         "package records its backend by name (register it with kiln.backends.register_backend)")
    return {"backend": name, "mode": key.mode, "options": key.options, "fullgraph": key.fullgraph,
            "dynamic": cf.dynamic}


def walk_entries(entries, _seen: set | None = None):
    """Every entry, with those of the continuations of graph breaks, once (several entries
    may resume in one continuation, and a loop's continuation may resume in itself)."""
    seen = set() if _seen is None else _seen
    for e in entries:
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        for r in e.resumes:
            yield from walk_entries(r.entries, seen)


def save_package(compiled, path: str) -> SaveReport:
    """Write every entry of ``compiled`` (what ``kiln.compile`` returned) and of the
    continuations of its graph breaks to the file ``path`` (replaced atomically). An entry that
    cannot outlive this process (an identity guard on an object with no importable name, a
    graph the backend cannot save) is left out; the returned ``SaveReport`` says which and why."""
    target, fn, cf, kind = target_of(compiled)
    blobs = fileformat.Blobs()
    left: list = []
    manifest, counts = build_manifest(target, fn, cf, kind, cf.entries, blobs, left)
    size = fileformat.write(path, manifest, blobs)
    report = SaveReport(path, size, counts, [LeftOut(f, g, r) for f, g, r in left])
    if logs.enabled.package:
        logs.event("package", "package", str(report), action="saved", path=str(path), bytes=size,
                   function=getattr(fn, "__qualname__", None), left_out=[str(x) for x in report.left_out])
    return report


def build_manifest(target, fn: types.FunctionType, cf, kind: str, entries: list, blobs: fileformat.Blobs,
                   left: list, keep=None) -> tuple[dict, dict]:
    """(the manifest of ``entries`` of ``cf``, entries saved per function). Their artifacts go
    to ``blobs``; an entry that cannot be saved goes to ``left`` as (function, guards, reason).
    ``keep(entry)``: which entries of the continuations to save (default: all). Shared by
    packages and frame records (``frame_records``)."""
    key = key_of(cf)
    saved = save_entries(entries, fn, blobs.add, left, keep)
    inlined: dict = {}
    for e in walk_entries(entries):
        inlined.update(e.inlined)
    counts: dict[str, int] = {fn.__qualname__: len(saved)}
    for group in resume_groups(saved):           # (a continuation saved once is counted once)
        counts[group["function"]] = counts.get(group["function"], 0) + len(group["entries"])
    env = fileformat.environment()
    env["device_kind"] = "cuda" if any(m["device"].startswith("cuda") for m in _metas(saved)) else "cpu"
    manifest = {"environment": env, "kind": kind, "identity": identity.describe(target, fn, inlined),
                "key": key, "entries": saved,
                "left_out": [{"function": f, "guards": g, "reason": r} for f, g, r in left]}
    isa = vec_isa_memo.record()
    if isa is not None:     # (Inductor's CPU SIMD probe, answered for this machine: see load)
        manifest["vec_isa"] = [isa]
    return manifest, counts


def _metas(saved: list):
    for s in (*saved, *(e for g in resume_groups(saved) for e in g["entries"])):
        yield from s["program"]["tensor_metas"]
