"""The dynamic-shape profile of a code object: what its inputs looked like, which dims and ints
were found to vary, kept in memory and under ``KILN_CACHE_DIR`` so that the next process
compiles those dims dynamic at once instead of recompiling once more to rediscover them.

A profile is keyed by the code's identity (file, qualified name, first line, a hash of the
bytecode): an edited function starts a new profile. Files are written atomically (a temporary
file renamed over the old one), and one that cannot be read or parsed is ignored with a
warning, never trusted. With a remote cache (``kiln.remote_cache``) a profile is written there
too, by the same digest, and a process with no file of its own reads the remote one (checked by
its content hash there, and parsed as strictly as a file).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import types
import warnings

from .. import logs, remote_cache
from ..config import config
from ..process_state import dynamic_profiles as _profiles

FORMAT_VERSION = 1


def code_identity(code: types.CodeType, qualname: str | None = None, module: str | None = None) -> dict:
    """File, qualified name, first line and a bytecode hash. ``qualname``/``module`` name the
    function when one code serves several (kiln's per-module-class callers)."""
    h = hashlib.sha256()
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
    h.update(repr([c for c in code.co_consts if isinstance(c, (int, float, str, bytes, bool, type(None)))]).encode())
    return {"file": code.co_filename, "module": module or "",
            "qualname": qualname or getattr(code, "co_qualname", code.co_name),
            "firstlineno": code.co_firstlineno, "bytecode": h.hexdigest()[:32]}


class FrameProfile:
    """What kiln saw of one code object's inputs, by source name (``L['x']``)."""

    def __init__(self, identity: dict, path: str | None):
        self.identity = identity
        self.path = path
        self.tensor_sizes: dict[str, list[int]] = {}     # last sizes seen
        self.dynamic_dims: dict[str, set[int]] = {}      # dims found to vary
        self.tensor_strides: dict[str, tuple] = {}       # last (sizes, strides) seen
        self.dynamic_strides: dict[str, set[int]] = {}   # strides found to vary, sizes aside
        self.int_values: dict[str, int] = {}
        self.dynamic_ints: set[str] = set()
        self.dirty = False

    # -- observations ---------------------------------------------------------------------------
    def observe_tensor(self, name: str, sizes: tuple) -> set[int]:
        """Record ``sizes``; return the dims of ``name`` found dynamic so far (a dim whose size
        differs from the one seen before becomes dynamic; a change of rank resets nothing)."""
        sizes = [int(s) for s in sizes]
        before = self.tensor_sizes.get(name)
        dyn = self.dynamic_dims.setdefault(name, set())
        if before is not None and len(before) == len(sizes):
            changed = {i for i, (a, b) in enumerate(zip(before, sizes)) if a != b}
            self._mark(dyn, changed, f"{name} dims", before, sizes)
        self.tensor_sizes[name] = sizes
        return set(dyn)

    def observe_strides(self, name: str, sizes: tuple, strides: tuple) -> set[int]:
        """Record ``strides``; return the dims of ``name`` whose stride is found dynamic so far.
        A stride becomes dynamic when it changes while the sizes stay (the last token of a
        growing sequence, ``ids[:, -1:]``, has a new stride on every call and the same sizes)
        and it is not what the sizes make it (the next dim's size times its stride, or 1 for
        the last dim, as in a contiguous tensor). Strides that change with the sizes follow
        the symbolic sizes by themselves. A dim of size 1, whose stride nothing reads, never
        counts."""
        sizes, strides = [int(s) for s in sizes], [int(s) for s in strides]
        before = self.tensor_strides.get(name)
        dyn = self.dynamic_strides.setdefault(name, set())
        if before is not None and before[0] == sizes:
            changed = {i for i, (a, b) in enumerate(zip(before[1], strides))
                       if a != b and sizes[i] != 1 and not _follows_sizes(sizes, strides, i)}
            self._mark(dyn, changed, f"{name} strides", before[1], strides)
        self.tensor_strides[name] = (sizes, strides)
        return set(dyn)

    def _mark(self, dynamic: set, changed: set, what: str, before: list, now: list) -> None:
        """Add ``changed`` to ``dynamic`` (the profile is then written again), logged."""
        changed = changed - dynamic
        if not changed:
            return
        dynamic |= changed
        self.dirty = True
        if logs.enabled.dynamic:
            logs.log("dynamic", f"automatic dynamic: {what} {sorted(changed)} changed ({before} -> {now}) "
                     f"in {self.identity['qualname']}")

    def observe_int(self, name: str, value: int) -> bool:
        before = self.int_values.get(name)
        if before is not None and before != value and name not in self.dynamic_ints:
            self.dynamic_ints.add(name)
            self.dirty = True
            if logs.enabled.dynamic:
                logs.log("dynamic", f"automatic dynamic: int {name} changed ({before} -> {value}) "
                         f"in {self.identity['qualname']}")
        self.int_values[name] = value
        return name in self.dynamic_ints

    # -- disk -----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        names = sorted(k for k in {*self.dynamic_dims, *self.dynamic_strides}
                       if self.dynamic_dims.get(k) or self.dynamic_strides.get(k))
        return {"version": FORMAT_VERSION, "code": self.identity,
                "tensors": {k: {"dynamic": sorted(self.dynamic_dims.get(k, ())), "sizes": self.tensor_sizes.get(k),
                                "dynamic_strides": sorted(self.dynamic_strides.get(k, ()))} for k in names},
                "ints": sorted(self.dynamic_ints)}

    def load_json(self, data: dict) -> None:
        if data.get("version") != FORMAT_VERSION or data.get("code") != self.identity:
            raise ValueError("written for another code object or format")
        tensors, ints = data["tensors"], data["ints"]
        if not isinstance(tensors, dict) or not isinstance(ints, list):
            raise ValueError("malformed")
        for name, rec in tensors.items():
            dims, strides = rec["dynamic"], rec.get("dynamic_strides", [])
            if not all(isinstance(d, int) and d >= 0 for d in [*dims, *strides]):
                raise ValueError(f"bad dims for {name}")
            self.dynamic_dims[str(name)] = set(dims)
            self.dynamic_strides[str(name)] = set(strides)
        self.dynamic_ints = {str(n) for n in ints}

    def save(self) -> None:
        if not self.dirty or self.path is None:
            return
        self.dirty = False
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            text = json.dumps(self.to_json(), indent=1)
            remote_cache.put("profile", _remote_key(self.path), text.encode())
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, self.path)
            if logs.enabled.dynamic:
                logs.log("dynamic", f"wrote profile {self.path}")
        except OSError as e:
            warnings.warn(f"kiln: could not write the dynamic-shape profile {self.path} ({e}); "
                          "the next process will rediscover the dynamic dims", RuntimeWarning)


def _follows_sizes(sizes: list[int], strides: list[int], i: int) -> bool:
    return strides[i] == (1 if i == len(sizes) - 1 else sizes[i + 1] * strides[i + 1])


def profile_path(identity: dict) -> str:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    return os.path.join(os.path.expanduser(config.cache_dir), "dynamic", f"{digest}.json")


def _remote_key(path: str) -> str:
    return os.path.basename(path)[:-len(".json")]


def profile_for(fn: types.FunctionType) -> FrameProfile:
    """The profile of ``fn``'s code: in memory, else read from the cache directory, else new."""
    identity = code_identity(fn.__code__, fn.__qualname__, getattr(fn, "__module__", None))
    key = json.dumps(identity, sort_keys=True)
    prof = _profiles.get(key)
    if prof is not None:
        return prof
    path = profile_path(identity) if config.cache_dir else None
    prof = _profiles[key] = FrameProfile(identity, path)
    remote = None
    if path is not None and not os.path.exists(path):
        remote = remote_cache.get("profile", _remote_key(path))
    if path is not None and (remote is not None or os.path.exists(path)):
        try:
            if remote is not None:
                prof.load_json(json.loads(remote))
                prof.dirty = True               # (written here at the next capture)
            else:
                with open(path) as f:
                    prof.load_json(json.load(f))
            if logs.enabled.dynamic:
                logs.log("dynamic", f"read profile {path} for {identity['qualname']}: "
                         f"dynamic {dict((k, sorted(v)) for k, v in prof.dynamic_dims.items())}"
                         f" strides {dict((k, sorted(v)) for k, v in prof.dynamic_strides.items() if v)}"
                         f" ints {sorted(prof.dynamic_ints)}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            prof.dynamic_dims.clear()
            prof.dynamic_strides.clear()
            prof.dynamic_ints.clear()
            prof.dirty = True   # replaced by a good file at the next capture
            warnings.warn(f"kiln: ignoring the unreadable dynamic-shape profile {path} "
                          f"({type(e).__name__}: {e}); it will be rewritten", RuntimeWarning)
    return prof
