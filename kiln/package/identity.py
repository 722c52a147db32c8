"""Is the function given to ``load_package`` the one the package was saved from?

Compared: the qualified name, the signature, and a hash of the code of the function and of
every function the capture inlined into its graphs (recorded at capture time, see
``OutputGraph.inlined``). The hash is over the bytecode, names and constants (not the file
name or line numbers: a package moved elsewhere, or a comment added, still loads).

A decorated function and its decorator's wrapper share a qualified name (``functools.wraps``
copies it): the name finds the outermost wrapper, and the codes under that name are those of
the functions its ``__wrapped__`` chain reaches. Each inlined code must be one of them.
"""
from __future__ import annotations

import hashlib
import inspect
import re
import types

from .errors import PackageMismatch
from ..names import defining_name, functions_under, resolve_name


def code_hash(code: types.CodeType) -> str:
    h = hashlib.sha256()
    _feed(h, code)
    return h.hexdigest()[:20]


def _feed(h, code: types.CodeType) -> None:
    h.update(code.co_code)
    for part in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                 (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)):
        h.update(repr(part).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _feed(h, c)
        else:
            h.update(_constant_text(c).encode())


def _constant_text(c) -> str:
    """A code constant as text that is the same in every process: a frozenset (``x in {"a",
    "b"}``) iterates in an order that string hashing, randomized per process, decides."""
    if isinstance(c, frozenset):
        return "frozenset:{" + ",".join(sorted(_constant_text(x) for x in c)) + "}"
    if isinstance(c, tuple):
        return "tuple:(" + ",".join(_constant_text(x) for x in c) + ")"
    return f"{type(c).__name__}:{c!r}"


def signature_of(fn) -> str:
    """The signature as text, without the addresses object reprs carry (a default
    ``act=<function gelu at 0x7f...>`` is at another address in every process)."""
    try:
        return re.sub(r" at 0x[0-9a-fA-F]+", "", str(inspect.signature(fn)))
    except (TypeError, ValueError):
        return "?"


def describe(target, fn: types.FunctionType, inlined: dict) -> dict:
    """The identity of what was compiled: ``target`` (the user's function or module) and
    ``fn`` (the function kiln compiled for it), with the callees inlined into any entry."""
    callees: dict = {}
    for code, (module, qualname) in inlined.items():
        hashes = callees.setdefault(f"{module}:{qualname}", set())
        hashes.add(code_hash(code))
        outer = defining_name(qualname)
        if outer is not None:
            # a nested function: its code is a constant of the named function that defines it
            # (a library's validator factory), whose hash covers it
            try:
                callees.setdefault(f"{module}:{outer}", set()).update(
                    code_hash(c) for c in codes_of(resolve_name(module, outer)))
            except Exception:
                pass
        if "<" not in qualname:
            # every function under the name (a decorator's wrappers, whose own code is nested
            # in the decorator): a change to any of them is a change
            try:
                hashes.update(code_hash(c) for c in codes_of(resolve_name(module, qualname)))
            except Exception:
                pass
    return {"qualname": qualname_of(target), "signature": signature_of(_user_callable(target)),
            "code": code_hash(fn.__code__), "inlined": {k: sorted(v) for k, v in sorted(callees.items())}}


def qualname_of(target) -> str:
    if isinstance(target, types.FunctionType):
        return f"{target.__module__}.{target.__qualname__}"
    t = type(target)
    return f"{t.__module__}.{t.__qualname__}"


def _user_callable(target):
    import torch

    if isinstance(target, torch.nn.Module):
        return type(target).forward
    return target


def codes_of(obj) -> list[types.CodeType]:
    """The codes of the functions a qualified name reaches (``names.functions_under``)."""
    return [f.__code__ for f in functions_under(obj)]


def check(saved: dict, target, fn: types.FunctionType) -> None:
    """Raise PackageMismatch naming every difference between ``saved`` and ``target``."""
    diffs = []
    name = qualname_of(target)
    if name != saved["qualname"]:
        diffs.append(f"qualified name: package has {saved['qualname']}, given {name}")
    sig = signature_of(_user_callable(target))
    if sig != saved["signature"]:
        diffs.append(f"signature of {name}: package has {saved['signature']}, given {sig}")
    if code_hash(fn.__code__) != saved["code"]:
        diffs.append(f"the code of {name} changed")
    for key, h in saved["inlined"].items():
        module, qualname = key.split(":", 1)
        if "<" in qualname:               # (a nested function has no name to find it by)
            continue
        try:
            callee = resolve_name(module, qualname)
        except Exception:
            diffs.append(f"inlined function {module}.{qualname} is not found")
            continue
        codes = codes_of(callee)
        if not codes:                     # (found, but not as Python code: nothing to compare)
            continue
        found = {code_hash(c) for c in codes}
        if any(x not in found for x in ([h] if isinstance(h, str) else h)):
            diffs.append(f"the code of inlined function {module}.{qualname} changed")
    if diffs:
        raise PackageMismatch("the package was saved from a different function: " + "; ".join(diffs) +
                              " (save the package again, or pass check_source=False to load anyway)")
