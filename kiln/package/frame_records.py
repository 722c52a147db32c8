"""Frame records: a warm process skips capture too.

The graph-level cache (``kiln.cache.cached``) still needs a capture to find its key: bytecode
interpretation, fake tensors (torch's FakeTensorMode imports ``torch._dynamo``: about a
second). So each function given to ``kiln.compile`` (cache on, a cacheable backend) also keeps
*frame records*:
``<cache_dir>/frames/<frame key>/<writer>.rec``, the package form (``kiln.package``) of the
entries this process captured for it, with the continuations of their graph breaks: an
artifact envelope (``kiln.cache.envelope``) holding the record's header and a package's
members. One file per writing process (rewritten whole, atomically, after each call that
compiled something): concurrent writers never share a file.

In a fresh process, the first miss of a function (before capture) loads its frame's records,
installs their entries as ``load_package`` does (guards and generated code re-resolve against
the live globals, closures and defaults), and retries the guard lookup; only when nothing
matches does it capture. A record is ignored (logged under ``KILN_LOGS=cache``) when its hash
does not match (also warned once), when it was written by another kiln, torch, Python or device,
or when the code of the function or of a function inlined into its graphs changed.

The frame key: the function's module, qualified name and code hash, the compile key (backend,
mode, options, fullgraph, dynamic), the settings that shape a capture (``config.capture_settings``:
repeated blocks, CUDA graphs, int specialization, automatic dynamic shapes...), the kiln (with a
digest of its source), torch, Python versions, the machine and the CUDA device.
"""
from __future__ import annotations

import os
import types
import uuid

import torch

from .. import _torch, logs
from ..backends.inductor import vec_isa_memo
from ..cache import key as cache_key, store
from ..capture.codegen import MISS
from ..config import config
from ..names import defining_name, resolve_name
from . import fileformat, identity
from .entries import install, link_shared_groups, load_entries
from .errors import PackageError
from .identity import code_hash, codes_of
from .save import walk_entries, build_manifest, key_of

# this process's record in each frame's directory (pid + random: pids are reused)
_WRITER = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
_MAX_RECORDS = 8                       # records read per frame, newest first
_CACHEABLE = ("inductor", "aot_eager")

def _log(message: str, **fields) -> None:
    """A frame-record event: ``fields`` has its ``action`` (frame_hit, frame_miss...)."""
    if logs.enabled.cache:
        logs.event("cache", "cache", message, **fields)


def _not_recorded(cf) -> str | None:
    """Why ``cf``'s frames are not recorded (None: they are), the cache being on."""
    key = cf.key
    if key.backend_name not in _CACHEABLE and getattr(key.backend, "cache_key", None) is None:
        return f"backend {key.backend_name!r} declares no cache_key"
    try:
        key_of(cf)
    except ValueError as e:
        return str(e)
    return None


def frame_key(cf) -> str | None:
    """The key of ``cf``'s records (cached on it), None when they are not kept (logged once)."""
    if not config.cache or not config.cache_frames:
        return None
    settings = config.capture_settings()
    known = cf.records_key
    if known is None or known[0] != settings:
        why = _not_recorded(cf)
        if why is not None:
            fk = ""
            _log(f"frame records off for {cf.original.__qualname__}: {why}", action="frame_off",
                 function=cf.original.__qualname__, reason=why)
        else:
            fn = cf.original
            fk = cache_key.digest({"module": fn.__module__, "qualname": fn.__qualname__,
                           "code": identity.code_hash(fn.__code__), "compile": key_of(cf),
                           "settings": dict(settings),
                           # (the ranks of one machine, each on its own GPU, guard on their own
                           # device: each keeps its record, where the remote cache keeps one per key)
                           "cuda_device": _torch.current_cuda_device(),
                           "versions": cache_key.versions(), "environment": fileformat.environment()})
        known = cf.records_key = (settings, fk)
    return known[1] or None


# -- loading ---------------------------------------------------------------------------------------

def lookup(cf, args: tuple, kwargs: dict):
    """``cf``'s first miss in this process (``CompiledFunction`` before it captures): the
    call's result from an entry of its frame records, or MISS (then it captures)."""
    cf.cache.frames_tried.add(cf.key)
    if frame_key(cf) is None:
        return MISS
    name = cf.original.__qualname__
    # (a module's forward or method: the entries of every instance, each counted for its own)
    n, why = load(cf, per_module=bool(args) and isinstance(args[0], torch.nn.Module))
    if n:
        result = cf.retry_entries(args, kwargs)     # (the user's exceptions propagate)
        if result is not MISS:
            store.count("frame_hits")
            _log(f"frame hit {name}: {n} entries installed, no capture", action="frame_hit", function=name,
                 entries=n)
            return result
        mine = [e for e in cf.cache.entries if e.key is cf.key]
        why = f"the guards of its {n} entries fail: {mine[0].failure_reason(args, kwargs) if mine else '?'}"
    store.count("frame_misses")
    _log(f"frame miss {name} ({why}); capturing", action="frame_miss", function=name, reason=why)
    return MISS


def load(cf, per_module: bool = False) -> tuple[int, str]:
    """Install the entries of ``cf``'s frame records into its cache: (entries installed, why
    none were, or the records ignored). ``per_module``: ``cf`` is called with a module first,
    whose recompile limit counts each instance's entries apart, so that up to
    ``accumulated_recompile_limit`` are installed. Never raises: a failure is a miss."""
    try:
        fk = frame_key(cf)
        if fk is None:
            return 0, "frame records off"
        return _install_records(cf, fk, per_module)
    except Exception as e:                  # kiln's own failure: capture as usual
        return 0, f"kiln could not load the records ({type(e).__name__}: {e}); please report this"


def _install_records(cf, fk: str, per_module: bool) -> tuple[int, str]:
    fn, cache = cf.original, cf.cache
    found = store.fetch_records(fk)[:_MAX_RECORDS]     # (or the remote cache's record)
    if not found:
        return 0, "no record"
    env = _environment()
    limit = config.accumulated_recompile_limit if per_module else config.recompile_limit
    room = limit - 1 - len(cache.entries)   # (a capture must still fit)
    installed, ignored = 0, []
    for _, path in found:
        if installed >= room:
            break
        found = store.read_record(path)       # (a damaged file: None, warned once)
        if found is None:
            ignored.append(f"{os.path.basename(path)}: damaged or unreadable")
            try:
                os.unlink(path)               # (never usable: records are replaced whole)
            except OSError:
                pass
            continue
        header = found.header
        if header.get("kind") != "frame" or header.get("frame_key") != fk or header.get("environment") != env:
            ignored.append(f"{os.path.basename(path)}: written for another frame, kiln, torch or device")
            continue
        try:
            pkg = fileformat.Package(found, path)
            m = pkg.manifest
            identity.check(m["identity"], fn, fn)
        except PackageError as e:
            ignored.append(f"{os.path.basename(path)}: {e}")
            continue
        changed = _changed_defaults(m.get("callable_defaults", {}), fn)
        if changed:
            ignored.append(f"{os.path.basename(path)}: {changed}")
            continue
        if m.get("vec_isa"):
            vec_isa_memo.offer(m["vec_isa"])
        link_shared_groups(m["entries"])
        entries = load_entries(m["entries"], fn, cf, pkg.blob, origin=f"frame record {path}")
        before = len(cache.entries)
        install(cache, entries[:room - installed])
        installed += len(cache.entries) - before
    why = "; ".join(ignored) if ignored else ("no entry loaded" if not installed else "")
    return installed, why


def _environment() -> dict:
    return {**fileformat.environment(), "versions": cache_key.versions()}


# -- recording -------------------------------------------------------------------------------------

def _captured_here(entry) -> bool:
    return not getattr(entry, "loaded_from_package", False)


def record(cf) -> None:
    """After ``cf`` (a function that keeps frame records) or a continuation of it compiled
    something (``CompiledFunction.record_frames``): rewrite this process's record of its frame.
    An entry that cannot be saved is left out (logged); kiln's own failure only logs."""
    fk = frame_key(cf)
    if fk is None:
        return
    name = cf.original.__qualname__
    try:
        _write(cf, fk, name)
    except Exception as e:
        _log(f"frame not recorded {name}: kiln error ({type(e).__name__}: {e}); please report this",
             action="frame_not_recorded", function=name, reason=f"{type(e).__name__}: {e}")


def _write(cf, fk: str, name: str) -> None:
    fn = cf.original
    entries = []
    for e in cf.entries:
        if not _captured_here(e) or e.replaced_by is not None:
            continue
        why = _uncheckable_callee(fn, e)
        if why is not None:
            _log(f"not recorded: an entry of {name}: {why}", action="frame_not_recorded", function=name, reason=why)
            continue
        entries.append(e)
    if not entries:
        return
    blobs, left = fileformat.Blobs(), []
    manifest, counts = build_manifest(fn, fn, cf, "function", entries, blobs, left, keep=_captured_here)
    for function, _, reason in left:
        _log(f"not recorded: an entry of {function}: {reason}", action="frame_not_recorded", function=function,
             reason=reason)
    if not manifest["entries"]:
        return
    manifest["callable_defaults"] = {where: _callable_defaults(f) for where, f in _defining(fn, entries).items()}
    header = {"kind": "frame", "frame_key": fk, "function": name, "backend": cf.key.backend_name,
              "entries": sum(counts.values()), "environment": _environment()}
    members = fileformat.members(manifest, blobs)
    if store.write_record(fk, _WRITER, header, members):
        size = sum(map(len, members.values()))
        _log(f"frame recorded {name}: {header['entries']} entries ({size} bytes)", action="frame_recorded",
             function=name, entries=header["entries"], bytes=size)
    for e in walk_entries(entries):                   # a continuation's later compiles rewrite it too
        for r in e.resumes:
            r.records_owner = cf


def _uncheckable_callee(fn: types.FunctionType, entry) -> str | None:
    """A function inlined into ``entry`` (or its continuations) whose code a fresh process
    cannot find by name (a nested function) is checked through the code that defines it: the
    compiled function's, a named inlined one's, or the named function it is nested in. One
    defined elsewhere cannot be checked, and an edit to it would go unseen: such an entry is
    not recorded."""
    inlined: dict = {}
    for e in walk_entries([entry]):
        inlined.update(e.inlined)
    roots = [fn.__code__]
    for code, (module, qualname) in inlined.items():
        if "<" not in qualname:
            try:
                found = codes_of(resolve_name(module, qualname))
            except Exception:
                return f"inlined function {module}.{qualname} cannot be found by its name"
            if found and all(c is not code for c in found):
                return f"inlined function {module}.{qualname} is not what its name finds"
            roots.append(code)
            roots += found      # (a decorator's wrappers: their codes are checked by the name)
        elif defining_name(qualname) is not None:
            # (the named function that defines it: the identity check hashes its code, and
            # with it the nested one's)
            try:
                roots += codes_of(resolve_name(module, defining_name(qualname)))
            except Exception:
                pass
    reachable = set()
    stack = list(roots)
    while stack:
        c = stack.pop()
        if id(c) in reachable:
            continue
        reachable.add(id(c))
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    for code, (module, qualname) in inlined.items():
        if "<" in qualname and id(code) not in reachable:
            return f"it inlines {module}.{qualname}, a nested function whose code a new process cannot check"
    return None


# -- functions held by defaults --------------------------------------------------------------------
# An entry finds the default values of the compiled function (and of the functions it inlined)
# where they are, so its identity guard on a default holds whatever the default is now. For a
# function that is a default (``def f(x, act=gelu)``), what the entry inlined is its code: the
# record keeps each callable default's name and code hash, and a load compares them.

def _callable_defaults(f: types.FunctionType) -> dict:
    out = {}
    items = [(str(i), d) for i, d in enumerate(f.__defaults__ or ())] + \
        [(k, d) for k, d in (f.__kwdefaults__ or {}).items()]
    for where, d in items:
        if callable(d) and not isinstance(d, type):
            code = getattr(getattr(d, "__func__", d), "__code__", None)
            out[where] = [getattr(d, "__module__", None), getattr(d, "__qualname__", type(d).__qualname__),
                          code_hash(code) if isinstance(code, types.CodeType) else None]
    return out


def _defining(fn: types.FunctionType, entries: list) -> dict:
    """The compiled function and the named functions its entries inlined, by name."""
    found = {"": fn}
    for e in walk_entries(entries):
        for module, qualname in e.inlined.values():
            if "<" in qualname:
                continue
            try:
                f = _function_of(resolve_name(module, qualname))
            except Exception:
                continue
            if isinstance(f, types.FunctionType):
                found[f"{module}:{qualname}"] = f
    return found


def _changed_defaults(saved: dict, fn: types.FunctionType | None = None) -> str | None:

    for name, defaults in saved.items():
        if not defaults:
            continue
        if name == "":
            f = fn
        else:
            try:
                module, qualname = name.split(":", 1)
                f = _function_of(resolve_name(module, qualname))
            except Exception:
                return f"inlined function {name} is not found"
        if not isinstance(f, types.FunctionType) or _callable_defaults(f) != defaults:
            return f"a function given as a default argument of {name or 'the function'} changed"
    return None


def _function_of(obj):
    """The Python function behind a name: a function, a method, a property's getter."""
    if isinstance(obj, property):
        obj = obj.fget
    return getattr(obj, "__func__", obj)
