"""Symbolic sizes as plain data and back: what a dynamic graph's cache entry stores.

A dynamic AOT result holds sympy expressions over the capture's symbols (``s6377 - 1``): in
the sizes of its graphs' fake values, in the runtime wrappers' metadata, in the guards tracing
added. ``encode_expr`` writes an expression as a JSON tree (symbols by name and sympy
assumptions, numbers, and calls of sympy's and torch's sympy functions by qualified name);
``decode_expr`` rebuilds it, calling only those functions (a stored entry is data, never code).

Values (SymInt, SymBool, fake tensors with symbolic sizes) are rebuilt by a ``Decoder`` in
the FakeTensorMode of the capture that loads the entry: kiln's symbol names are stable (a hash
of the source name), so the loading capture has the same symbols, with its own hints. A
symbol that capture does not know makes the entry unusable (``ValueError``).
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from .. import _torch
from ..lazy_imports import LazyModule
from . import fake_tensors

sympy = LazyModule("sympy")       # (a warm start of static graphs decodes no expression)

SYM_TAG = "__kiln_sym__"


def _function_classes() -> dict:
    import sympy.functions.elementary.piecewise as piecewise
    import torch.utils._sympy.functions as torch_functions

    classes = [sympy.Add, sympy.Mul, sympy.Pow, sympy.Mod, sympy.Max, sympy.Min, sympy.Abs,
               sympy.floor, sympy.ceiling, sympy.Eq, sympy.Ne, sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge,
               sympy.And, sympy.Or, sympy.Not, sympy.Xor, sympy.Implies, sympy.Piecewise,
               piecewise.ExprCondPair]
    classes += [c for _, c in inspect.getmembers(torch_functions, inspect.isclass)
                if issubclass(c, sympy.Basic) and c.__module__ == torch_functions.__name__]
    return {f"{c.__module__}.{c.__name__}": c for c in classes}


_CLASSES: dict | None = None


def _classes() -> dict:
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _function_classes()
    return _CLASSES


def encode_expr(e: Any) -> Any:
    """A sympy expression (or int/bool) as JSON data. Raises ValueError for what it cannot
    write (the entry is then not stored)."""
    from torch.utils._sympy.numbers import int_oo

    if isinstance(e, bool):
        return {"b": e}
    if isinstance(e, int):
        return {"i": e}
    if e is sympy.true or e is sympy.false:
        return {"b": bool(e)}
    if e == int_oo:
        return {"inf": 1}
    if e == -int_oo:
        return {"inf": -1}
    if isinstance(e, sympy.Symbol):
        return {"s": e.name, "a": {k: v for k, v in sorted(e.assumptions0.items()) if v is not None}}
    if isinstance(e, sympy.Integer):
        return {"i": int(e)}
    if isinstance(e, sympy.Rational):
        return {"q": [int(e.p), int(e.q)]}
    if isinstance(e, sympy.Float):
        return {"f": repr(float(e))}
    name = f"{e.func.__module__}.{e.func.__name__}"
    if name not in _classes():
        raise ValueError(f"cannot store the symbolic expression {e} (function {name})")
    return {"f": name, "args": [encode_expr(a) for a in e.args]}


def decode_expr(d: Any) -> Any:
    from torch.utils._sympy.numbers import int_oo

    (k, v), *rest = d.items()
    if k == "b":
        return sympy.true if v else sympy.false
    if k == "i":
        return sympy.Integer(v)
    if k == "inf":
        return int_oo if v > 0 else -int_oo
    if k == "s":
        return sympy.Symbol(v, **d.get("a", {}))
    if k == "q":
        return sympy.Rational(*v)
    if k == "f" and "args" in d:
        cls = _classes().get(v)
        if cls is None:
            raise ValueError(f"unknown symbolic function {v!r} in a stored entry")
        return cls(*[decode_expr(a) for a in d["args"]])
    if k == "f":
        return sympy.Float(float(v))
    raise ValueError(f"unknown symbolic expression encoding {k!r}")


def _expr_of_int(s: Any) -> Any:
    return s.node.expr if isinstance(s, torch.SymInt) else int(s)


def encode_value(v: Any) -> Any:
    """SymInts, SymBools and (fake) tensors as tagged data, recursively in lists, tuples and
    dicts; other values as they are."""
    if isinstance(v, torch.SymInt):
        return {SYM_TAG: "int", "e": encode_expr(v.node.expr)}
    if isinstance(v, torch.SymBool):
        return {SYM_TAG: "bool", "e": encode_expr(v.node.expr)}
    if isinstance(v, torch.SymFloat):
        raise ValueError("cannot store a SymFloat")
    if isinstance(v, torch.Tensor):
        return {SYM_TAG: "tensor", "shape": [encode_expr(_expr_of_int(s)) for s in v.shape],
                "stride": [encode_expr(_expr_of_int(s)) for s in v.stride()],
                "offset": encode_expr(_expr_of_int(v.storage_offset())),
                "dtype": str(v.dtype).replace("torch.", ""), "device": str(v.device),
                "requires_grad": bool(v.requires_grad)}
    if isinstance(v, (list, tuple)):
        return [encode_value(x) for x in v]
    if isinstance(v, dict):
        return {k: encode_value(x) for k, x in v.items()}
    return v


def hints(shape_env) -> dict:
    return getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val


class Decoder:
    """Rebuilds encoded values in ``fake_mode`` (the loading capture's, with its ShapeEnv)."""

    def __init__(self, fake_mode):
        if fake_mode is None or fake_mode.shape_env is None:
            raise ValueError("a dynamic entry loads into the capture's FakeTensorMode and ShapeEnv; none given")
        self.fake_mode = fake_mode
        self.shape_env = fake_mode.shape_env

    def expr(self, d: Any) -> Any:
        e = decode_expr(d)
        unknown = [s for s in getattr(e, "free_symbols", ()) if s not in hints(self.shape_env)]
        if unknown:
            raise ValueError(f"the entry's symbol(s) {', '.join(sorted(map(str, unknown)))} are not the capture's")
        return e

    def hint(self, e: Any) -> Any:
        v = e.xreplace(hints(self.shape_env)) if isinstance(e, sympy.Basic) else e
        if isinstance(v, sympy.Integer) or isinstance(v, int):
            return int(v)
        if v is sympy.true or v is sympy.false:
            return bool(v)
        raise ValueError(f"cannot evaluate {e} for the capture's sizes")

    def int(self, d: Any) -> Any:
        e = self.expr(d)
        if isinstance(e, sympy.Integer):
            return int(e)
        return self.shape_env.create_symintnode(e, hint=self.hint(e))

    def value(self, v: Any) -> Any:
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if not isinstance(v, dict):
            return v
        tag = v.get(SYM_TAG)
        if tag is None:
            return {k: self.value(x) for k, x in v.items()}
        if tag == "int":
            return self.int(v["e"])
        if tag == "bool":
            e = self.expr(v["e"])
            return bool(e) if e in (sympy.true, sympy.false) else self.shape_env.create_symboolnode(e)
        if tag == "tensor":
            shape = [self.int(s) for s in v["shape"]]
            stride = [self.int(s) for s in v["stride"]]
            offset = self.int(v["offset"])
            with self.fake_mode:
                t = torch.empty_strided(shape, stride, dtype=fake_tensors.dtype_from_str(v["dtype"]),
                                        device=torch.device(v["device"]))
                if not (isinstance(offset, int) and offset == 0):
                    t = t.as_strided(shape, stride, offset)
            if v["requires_grad"]:
                t.requires_grad_(True)
            return t
        raise ValueError(f"unknown symbolic value tag {tag!r}")


class EntryDoesNotFit(ValueError):
    """The stored trace guarded on sizes that do not hold for the loading capture's: that
    capture would have traced differently (the cache counts a miss and compiles)."""


def replay_guards(shape_env, exprs: list) -> None:
    """Add the guards the compile added to its ShapeEnv (tracing, the backend) to the loading
    capture's, so that the entry's shape guards are the compile's: each must hold for the
    capture's sizes (else ``EntryDoesNotFit``, and nothing is added)."""
    env_hints = hints(shape_env)
    for e in exprs:
        v = e.xreplace(env_hints)
        if v is not sympy.true and v != sympy.true:
            raise EntryDoesNotFit(f"the stored graph was traced under {e}, which does not hold for these sizes")
    for e in exprs:
        shape_env.evaluate_expr(e)


# -- a dynamic entry with no capture to load into (a package load) ------------------------------

def encode_symbols(fakes: list) -> list:
    """``[symbol, hint, lower, upper]`` (JSON) for every symbol in the sizes of ``fakes`` (a
    dynamic graph's traced inputs): what ``standalone_fake_mode`` needs to rebuild them with
    no capture's ShapeEnv. The hint is the size when traced (used only for estimates: each
    call binds its symbols from its own arguments)."""
    from torch.fx.experimental.symbolic_shapes import free_symbols

    syms: dict = {}
    env = None
    for f in fakes:
        for v in ([f] if isinstance(f, torch.SymInt) else
                  [*f.shape, *f.stride(), f.storage_offset()] if isinstance(f, torch.Tensor) else []):
            if isinstance(v, torch.SymInt):
                env = v.node.shape_env
                for s in free_symbols(v):
                    syms[s.name] = s
    if env is None:
        return []
    out = []
    for name in sorted(syms):
        s = syms[name]
        vr = env.var_to_range.get(s)
        bound = [None, None]
        if vr is not None:
            bound = [int(b) if isinstance(b, sympy.Integer) and abs(b) != _int_oo() else None
                     for b in (vr.lower, vr.upper)]
        out.append([encode_expr(s), int(hints(env)[s]), *bound])
    return out


def _int_oo():
    from torch.utils._sympy.numbers import int_oo

    return int_oo


def standalone_fake_mode(symbols: list):
    """A FakeTensorMode over a ShapeEnv of its own that knows ``symbols`` (from
    ``encode_symbols``), with their hints and value ranges: a dynamic artifact's symbolic
    sizes are rebuilt there when no capture loads it (a package). Nothing is replayed into it:
    the artifact's per-call input check binds each symbol from the call's arguments and checks
    the ranges and the guards tracing added."""
    from torch.utils._sympy.value_ranges import ValueRanges

    mode = _torch.new_fake_mode()
    env = mode.shape_env
    values = getattr(env, "backed_var_to_val", None)
    if values is None:
        values = env.var_to_val
    for enc, hint, lower, upper in symbols:
        s = decode_expr(enc)
        if not isinstance(s, sympy.Symbol):
            raise ValueError(f"not a symbol: {s}")
        values[s] = sympy.Integer(hint)
        env.var_to_range[s] = ValueRanges(sympy.Integer(lower) if lower is not None else -_int_oo(),
                                          sympy.Integer(upper) if upper is not None else _int_oo())
    return mode
