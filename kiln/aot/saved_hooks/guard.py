"""The frontend's SAVED_TENSOR_HOOKS guard (saved_hooks.py): the inlineable hooks active when
a graph was captured, and every value their traced graphs bake in, checked by identity on each
call: the globals and closure cells their code reads, their defaults and code, a bound
method's instance attributes, and one level of the contents of the dicts and instances they
read (``cfg.scale``, ``state["scale"]``). Attributes and string keys the hooks themselves
assign (``self.calls += 1``) are bookkeeping and left out, so a counting hook is not
recompiled on every call."""
from __future__ import annotations

import types
from typing import Any

import torch

from .inlining import _global_names, _name, active


def guard_value(hooks: tuple | None) -> tuple | None:
    """What the frontend's SAVED_TENSOR_HOOKS guard expects: the hooks, and every value their
    traced graphs bake in (the globals and closure cells their code reads, their defaults, a
    bound method's instance attributes), each checked by identity on every call."""
    if hooks is None:
        return None
    reads: list = []
    seen: set = set()
    for fn in hooks:
        _reads(fn, reads, seen, 0)
    written = frozenset(name for kind, where, key, _ in reads if kind == "attr" and key == "__code__"
                        for name in _assigned_attrs(getattr(where, "__code__", None)))
    final = []
    for kind, where, key, value in reads:
        if kind == "contents":
            if written:
                value = _contents(where, written)
            key = written
        if kind == "item" and isinstance(where, dict) and key in written and not _is_globals(where):
            continue          # an attribute the hooks assign, read through a method's instance
        final.append((kind, where, key, value))
    return (hooks[0], hooks[1], tuple(final))


def _is_globals(d: dict) -> bool:
    return "__name__" in d and "__builtins__" in d


def _assigned_attrs(code) -> set:
    """Attribute names the code (and the functions it defines) assigns (``x.name = ...``), and
    the string keys of a code that assigns items."""
    import dis

    if not isinstance(code, types.CodeType):
        return set()
    ins = list(dis.get_instructions(code))
    names = {i.argval for i in ins if i.opname in ("STORE_ATTR", "DELETE_ATTR")}
    if any(i.opname in ("STORE_SUBSCR", "DELETE_SUBSCR") for i in ins):
        # ``counts["pack"] += 1``: string keys the code may assign (bookkeeping)
        names |= {c for c in code.co_consts if isinstance(c, str)}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _assigned_attrs(c)
    return names


def hooks_are(expected: tuple | None) -> bool:
    """The guard's check: the active inlineable hooks are ``expected`` (the same objects, reading
    the same values)."""
    now = active()
    if expected is None:
        return now is None
    if now is None or now[0] is not expected[0] or now[1] is not expected[1]:
        return False
    for kind, where, key, value in expected[2]:
        if kind == "item":
            if where.get(key, _MISSING) is not value:
                return False
        elif kind == "contents":
            if _contents(where, key) != value:
                return False
        elif kind == "cell":
            try:
                if where.cell_contents is not value:
                    return False
            except ValueError:
                return False
        elif getattr(where, key, _MISSING) is not value:
            return False
    return True


_MISSING = object()


def _contents(obj: Any, skip: frozenset = frozenset()) -> tuple | None:
    """One level of an object's contents, by identity: a dict's or list's items, an instance's
    attributes (a hook reading ``cfg.scale`` or ``state["scale"]`` bakes that value in), but
    not the attributes the hooks themselves assign (``self.calls += 1``: bookkeeping)."""
    if type(obj) is dict:
        return tuple((k, id(v)) for k, v in obj.items() if k not in skip)
    if isinstance(obj, (types.ModuleType, type, types.FunctionType, types.MethodType, torch.Tensor,
                        torch.dtype, torch.device)) or callable(obj):
        return None
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        return tuple((k, id(v)) for k, v in attrs.items() if k not in skip)
    return None


def _add(out: list, kind: str, where: Any, key: Any, value: Any) -> None:
    out.append((kind, where, key, value))
    c = _contents(value)
    if c is not None:
        out.append(("contents", value, None, c))


def _reads(fn: Any, out: list, seen: set, depth: int) -> None:
    if depth > 4 or id(fn) in seen:
        return
    seen.add(id(fn))
    if isinstance(fn, types.MethodType):
        attrs = getattr(fn.__self__, "__dict__", None)
        if isinstance(attrs, dict):
            for k, v in attrs.items():
                _add(out, "item", attrs, k, v)
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        return
    if (fn.__module__ or "").split(".")[0] == "torch":
        return
    out.append(("attr", fn, "__defaults__", fn.__defaults__))
    out.append(("attr", fn, "__code__", fn.__code__))
    g = fn.__globals__
    for name in _global_names(fn.__code__):
        if name in g:
            v = g[name]
            _add(out, "item", g, name, v)
            if isinstance(v, (types.FunctionType, types.MethodType)):
                _reads(v, out, seen, depth + 1)
    for cell in fn.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        _add(out, "cell", cell, None, v)
        if isinstance(v, (types.FunctionType, types.MethodType)):
            _reads(v, out, seen, depth + 1)


def describe(expected: tuple | None) -> str:
    if expected is None:
        return "no inlineable saved-tensor hooks are active"
    return (f"saved-tensor hooks are pack={_name(expected[0])}, unpack={_name(expected[1])} (by identity, "
            f"and the {len(expected[2]) if len(expected) > 2 else 0} values their code reads)")
