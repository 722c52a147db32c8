"""The saved-tensor hooks' part of the AOT cache key: hooks that cannot be hashed
need a ``user_cache_hash``, else the cache is bypassed (with the reason logged)."""
from __future__ import annotations

import hashlib
import types
from typing import Any

import torch

from .inlining import _CONSTANT_TYPES, _global_names, _name


def cache_key(hooks: tuple | None) -> Any:
    """The part of the AOT cache key for the active inlineable hooks: each hook's
    ``user_cache_hash`` attribute when it has one, else a digest of its code and of every value
    it reads (closure cells, globals, defaults). Raises ValueError for a hook that reads
    something that cannot be hashed (the cache is then bypassed, with the reason logged)."""
    if hooks is None:
        return None
    return [_hook_key(fn, "pack" if i == 0 else "unpack") for i, fn in enumerate(hooks)]


def _hook_key(fn: Any, what: str) -> str:
    explicit = getattr(fn, "user_cache_hash", None)
    if explicit is None and hasattr(fn, "__wrapped__"):
        explicit = getattr(fn.__wrapped__, "user_cache_hash", None)
    if explicit is not None:
        return f"user_cache_hash:{explicit}"
    h = hashlib.sha256()
    try:
        _digest(getattr(fn, "__wrapped__", fn), h, set(), 0)
    except ValueError as e:
        raise ValueError(f"the {what} saved-tensor hook {_name(fn)} cannot be hashed ({e}); "
                         "set its user_cache_hash attribute (a string naming what it computes)") from e
    return "code:" + h.hexdigest()


def _digest(x: Any, h, seen: set, depth: int) -> None:
    if depth > 20:
        raise ValueError("its code reaches too deep")
    if isinstance(x, _CONSTANT_TYPES) or isinstance(x, (complex, bytes)):
        h.update(f"{type(x).__name__}:{x!r};".encode())
        return
    if isinstance(x, (tuple, list, frozenset)):
        h.update(f"{type(x).__name__}[".encode())
        for v in (sorted(x, key=repr) if isinstance(x, frozenset) else x):
            _digest(v, h, seen, depth + 1)
        h.update(b"];")
        return
    if isinstance(x, types.ModuleType):
        h.update(f"module:{x.__name__};".encode())
        return
    if isinstance(x, types.CodeType):
        h.update(x.co_code)
        h.update(repr(x.co_names).encode())
        h.update(repr(x.co_varnames).encode())
        for c in x.co_consts:
            _digest(c, h, seen, depth + 1)
        return
    if isinstance(x, types.MethodType):
        _digest(x.__func__, h, seen, depth + 1)
        _digest(x.__self__, h, seen, depth + 1)
        return
    if isinstance(x, types.FunctionType):
        mod = x.__module__ or ""
        if mod.split(".")[0] in ("torch", "kiln"):     # versions are in the key
            h.update(f"fn:{mod}.{x.__qualname__};".encode())
            return
        if id(x) in seen:
            h.update(b"recursion;")
            return
        seen.add(id(x))
        _digest(x.__code__, h, seen, depth + 1)
        _digest(x.__defaults__, h, seen, depth + 1)
        for cell in x.__closure__ or ():
            try:
                _digest(cell.cell_contents, h, seen, depth + 1)
            except ValueError as e:
                if "empty" in str(e):
                    continue
                raise
        for name in _global_names(x.__code__):
            if name in x.__globals__:
                h.update(f"global {name}=".encode())
                _digest(x.__globals__[name], h, seen, depth + 1)
        return
    if isinstance(x, (types.BuiltinFunctionType, types.BuiltinMethodType)) or \
            (callable(x) and (getattr(x, "__module__", "") or "").split(".")[0] in ("torch", "builtins", "math")):
        h.update(f"builtin:{getattr(x, '__module__', '')}.{getattr(x, '__qualname__', repr(x))};".encode())
        return
    if isinstance(x, torch._ops.OpOverload) or isinstance(x, torch._ops.OpOverloadPacket):
        h.update(f"op:{x};".encode())
        return
    raise ValueError(f"it reads a {type(x).__name__}")
