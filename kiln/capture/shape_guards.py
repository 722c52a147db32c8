"""Shape guards: what the ShapeEnv learned during a capture, as checks of the entry.

A dynamic capture reads each symbol from one place (its *binding*, e.g. ``L['x'].size()[0]``)
and then checks, with plain Python arithmetic on those ints:

* every other symbolic size, stride or storage offset of the inputs equals its expression
  (``L['y'].size()[0] == L['x'].size()[0]`` under duck sizing, a stride ``== s1 * 64``);
* each symbol stays in its value range (``>= 2``: sizes 0 and 1 are specialized);
* every guard the ShapeEnv recorded while the program branched on sizes (``s1 > 4``) or an
  operator required them (``Eq(s1 % 8, 0)``).

The ShapeEnv is torch's (``_torch.KilnShapeEnv``); the guard semantics and the code generated
from them are kiln's. torch's ``produce_guards`` is not used: it depends on dynamo's sources.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..errors import Unsupported
from ..lazy_imports import LazyModule
from .sources import STORAGE_OFFSET, STRIDE, SIZE, Source, TensorPropertySource
from .values.symbolic import is_symbolic

sympy = LazyModule("sympy")       # (a warm start of static graphs builds no shape guard)


def _printer():
    from torch.utils._sympy.printers import PythonPrinter

    return PythonPrinter()


def _is_infinite(bound) -> bool:
    from torch.utils._sympy.numbers import int_oo

    return bound in (int_oo, -int_oo, sympy.oo, -sympy.oo)


def local_name(symbol: sympy.Symbol) -> str:
    """The local variable of the generated entry that holds a symbol's value."""
    return f"___{symbol.name}"


@dataclasses.dataclass
class ShapeGuards:
    bindings: list[tuple[sympy.Symbol, Source]]          # symbol <- where it is read
    checks: list[tuple[Source, sympy.Expr]]              # a source equals an expression
    conditions: list[sympy.Basic]                        # boolean expressions of symbols
    symbol_args: dict[sympy.Symbol, sympy.Expr]          # a graph input's value, as an expression

    # -- code --------------------------------------------------------------------------------
    def _to_locals(self, expr) -> str:
        subs = {s: sympy.Symbol(local_name(s), integer=True) for s in expr.free_symbols}
        return _printer().doprint(expr.xreplace(subs))

    def _to_sources(self, expr) -> str:
        names = {s: src.describe() for s, src in self.bindings}
        subs = {s: sympy.Symbol(names.get(s, s.name)) for s in expr.free_symbols}
        return _printer().doprint(expr.xreplace(subs))

    def code(self, render: Callable[[Source], str]) -> tuple[list[str], list[str]]:
        """(binding statements, boolean expressions) of the entry's shape check."""
        binds = [f"{local_name(s)} = {render(src)}" for s, src in self.bindings]
        # each in parentheses: they are joined with ``and``, and a condition may be an ``or``
        # (``a and b or c`` would pass on ``c`` alone)
        conds = [f"({render(src)} == {self._to_locals(e)})" for src, e in self.checks]
        conds += [f"({self._to_locals(c)})" for c in self.conditions]
        return binds, conds

    def arg_expr(self, symbol: sympy.Symbol) -> str:
        return self._to_locals(self.symbol_args[symbol])

    # -- text ---------------------------------------------------------------------------------
    def descriptions(self) -> list[str]:
        out = [f"{src.describe()} == {self._to_sources(e)}" for src, e in self.checks]
        out += [self._to_sources(c) for c in self.conditions]
        return out

    def symbol_names(self) -> dict[str, str]:
        """Symbol name -> the source it is read from (``s4821 -> L['x'].size()[0]``)."""
        return {s.name: src.describe() for s, src in self.bindings}


def produce(output) -> ShapeGuards | None:
    """The shape guards of a finished capture; None when nothing is symbolic."""
    env = output.shape_env
    entries: list[tuple[Source, sympy.Expr]] = []
    for inp in output.tensor_inputs:
        for prop, vals in ((SIZE, inp.sizes), (STRIDE, inp.strides)):
            for i, v in enumerate(vals):
                if is_symbolic(v):
                    entries.append((TensorPropertySource(inp.source, prop, i), v.node.expr))
        off = inp.storage_offset
        if is_symbolic(off):
            entries.append((TensorPropertySource(inp.source, STORAGE_OFFSET), off.node.expr))
    for sym_input in output.int_inputs:
        entries.append((sym_input.source, sym_input.fake.node.expr))
    if not entries:
        return None

    bound: dict[sympy.Symbol, Source] = {}
    bindings = []
    resolved = [(src, env.replace(e)) for src, e in entries]
    for src, e in resolved:
        if isinstance(e, sympy.Symbol) and e not in bound:
            bound[e] = src
            bindings.append((e, src))
    checks = []
    for src, e in resolved:
        if isinstance(e, sympy.Symbol) and bound[e] is src:
            continue
        if e.is_number and isinstance(src, TensorPropertySource) and src.prop != STORAGE_OFFSET:
            continue   # a specialized size/stride: TensorGuards compares it
        _require_bound(e, bound, src.describe())
        checks.append((src, e))

    conditions: list[sympy.Basic] = []
    seen: set[str] = set()

    def add(cond) -> None:
        if cond is sympy.true or cond is True:
            return
        if cond is sympy.false or cond is False:
            raise Unsupported("the shape guards of this capture can never hold")
        key = str(cond)
        if key not in seen:
            seen.add(key)
            conditions.append(cond)

    for s, _src in bindings:
        vr = env.var_to_range.get(s)
        if vr is None:
            continue
        if not _is_infinite(vr.lower):
            add(sympy.Ge(s, vr.lower))
        if not _is_infinite(vr.upper):
            add(sympy.Le(s, vr.upper))
    for g in env.guards:
        cond = env.simplify(g.expr)
        if cond is sympy.true:
            continue
        _require_bound(cond, bound, str(g.expr))
        add(cond)

    symbol_args = {}
    for sym_in in output.symbol_inputs:
        if sym_in.node is None:
            continue
        e = env.replace(sym_in.symbol)
        _require_bound(e, bound, sym_in.symbol.name)
        symbol_args[sym_in.symbol] = e
    return ShapeGuards(bindings, checks, conditions, symbol_args)


def _require_bound(expr, bound: dict, what: str) -> None:
    missing = expr.free_symbols - set(bound)
    if missing:
        raise Unsupported(f"a shape guard on {what} uses symbols that no input size provides "
                          f"({', '.join(sorted(s.name for s in missing))})")


def tensor_guard_dims(output) -> tuple[list, list] | None:
    """Per tensor input, the sizes and strides TensorGuards compares (None where symbolic);
    None when every input is static."""
    if not any(inp.dynamic for inp in output.tensor_inputs):
        return None
    env = output.shape_env
    sizes, strides = [], []
    for inp in output.tensor_inputs:
        sizes.append([_static_or_none(env, v) for v in inp.sizes])
        strides.append([_static_or_none(env, v) for v in inp.strides])
    return sizes, strides


def _static_or_none(env, v):
    if not is_symbolic(v):
        return int(v)
    e = env.replace(v.node.expr)
    return int(e) if e.is_number else None


def specialization_site(output, symbol) -> str:
    """Where the capture forced ``symbol`` to a constant (file:line and the source line)."""
    env = output.shape_env
    site = getattr(env, "specialized_at", {}).get(symbol)
    if site is None:
        for g, where in zip(env.guards, getattr(env.guards, "sites", [])):
            if symbol in g.expr.free_symbols and where is not None:
                site = where
                break
    if site is None:
        return "an unknown place"
    filename, lineno, text = site
    return f"{filename}:{lineno}" + (f" (`{text.strip()}`)" if text else "")
