"""Symbolic (dynamic) shapes in kiln's AOT autograd.

A dynamic graph from the frontend has placeholders whose ``meta["example_value"]`` are fake
tensors with SymInt sizes of the capture's ShapeEnv, and SymInt placeholders (``s6377``) that
receive Python ints at runtime. The stages trace with those fakes, so the graphs take the
SymInts as inputs and work for every size.

Anything the runtime needs as a number (the size, stride and offset of an output view to
regenerate, a symbolic int output, a guard) is a sympy expression over the input symbols.
``ShapeCode`` turns such expressions into Python code, generated once, that binds each symbol
from the runtime arguments (``s6377 = a[0]``, ``s12 = a[1].shape[0]``) and evaluates them: a
size is never baked in from a trace-time hint.

Nothing here adds a guard to the ShapeEnv: sizes are compared with ``statically_known_true``
and measured with hints.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import torch

from .. import _torch
from ..errors import Unsupported
from ..lazy_imports import LazyModule

# (imported at first use: a warm start of static graphs reads none of them)
sympy = LazyModule("sympy")
_shapes = LazyModule("torch.fx.experimental.symbolic_shapes")
_sympy_numbers = LazyModule("torch.utils._sympy.numbers")
_sympy_printers = LazyModule("torch.utils._sympy.printers")

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


class SymbolicUnsupported(Unsupported):
    """This dynamic graph cannot be compiled symbolically; the ``aot_backend`` compiles it per
    concrete input shapes instead (see ``kiln.aot.dynamic``)."""


def is_sym(v: Any) -> bool:
    return isinstance(v, SYM_TYPES)


def has_symbols(v: Any) -> bool:
    """A SymInt/SymBool with free symbols, or a tensor with a symbolic size, stride or offset."""
    if is_sym(v):
        return bool(_shapes.free_symbols(v))
    if isinstance(v, torch.Tensor):
        return any(has_symbols(s) for s in (*v.shape, *v.stride(), v.storage_offset()))
    if isinstance(v, (tuple, list)):
        return any(has_symbols(x) for x in v)
    return False


def refuse_unbacked(v: Any, what: str) -> None:
    """Data-dependent sizes (``nonzero``, ``.item()``) are refused, as in static graphs."""
    if isinstance(v, (tuple, list)):
        for x in v:
            refuse_unbacked(x, what)
        return
    if (is_sym(v) or isinstance(v, torch.Tensor)) and _shapes.has_free_unbacked_symbols(v):
        raise Unsupported(f"AOT autograd: {what} has a data-dependent size or value "
                          f"({', '.join(sorted(map(str, _shapes.free_unbacked_symbols(v))))})")


def is_sym_function(f: Any) -> bool:
    """Python-level functions make_fx records on SymInts: ``operator.*``, ``math.*`` and
    torch's ``sym_*`` helpers (``torch.sym_max``...)."""
    mod = getattr(f, "__module__", None)
    if mod in ("_operator", "math"):
        return True
    name = getattr(f, "__name__", "")
    return name.startswith(("sym_", "_sym_")) and getattr(torch, name, None) is f


def expr_of(v: Any) -> sympy.Expr:
    if is_sym(v):
        return v.node.expr
    if isinstance(v, bool):
        return sympy.true if v else sympy.false
    return sympy.Integer(int(v))


def hint(v: Any) -> int:
    """The value a (Sym)Int had when traced, without adding a guard (for cost estimates and
    consistency checks only, never for what the graph computes)."""
    if not isinstance(v, torch.SymInt):
        return int(v)
    node = v.node
    h = getattr(node, "_hint", None)
    if h is None:
        h = node.shape_env.size_hint(node.expr)
    return int(h)


def nbytes_hint(t: torch.Tensor) -> int:
    return hint(t.numel()) * t.element_size()


def known_equal(a: Any, b: Any) -> bool:
    """``a == b`` for ints, SymInts or sequences of them, True only when provable without a
    guard (the caller treats False as "may differ")."""
    if isinstance(a, (tuple, list)):
        a, b = tuple(a), tuple(b)
    return _shapes.statically_known_true(_shapes.sym_eq(a, b))


# ------------------------------------------------------------------------------------------------
# Binding symbols at runtime and evaluating expressions
# ------------------------------------------------------------------------------------------------

# torch's Python printer: symbols print as their names, which ``ShapeCode`` binds; functions
# print as Python (``//``, ``max``) or ``math.*``/``torch.sym_*`` calls
@functools.lru_cache(maxsize=None)
def _printer():
    return _sympy_printers.PythonPrinter()


_NAMESPACE = {"math": math, "torch": torch}


def _tensor_exprs(t: torch.Tensor) -> tuple[list, list, Any]:
    return [expr_of(s) for s in t.shape], [expr_of(s) for s in t.stride()], expr_of(t.storage_offset())


def _finite(b: Any) -> bool:
    # torch's int_oo claims is_finite; compare with the infinities instead
    return isinstance(b, sympy.Integer) and b not in (_sympy_numbers.int_oo, -_sympy_numbers.int_oo)


class ShapeCode:
    """Where each symbol of a list of traced inputs can be read from the runtime arguments
    (the first place it appears as a bare symbol), and code generation over it."""

    def __init__(self, fakes: Sequence[Any]):
        self.fakes = list(fakes)
        self.where: dict[sympy.Symbol, str] = {}
        for i, f in enumerate(self.fakes):
            if is_sym(f):
                self._note(expr_of(f), f"a[{i}]")
            elif isinstance(f, torch.Tensor):
                sizes, strides, offset = _tensor_exprs(f)
                for d, e in enumerate(sizes):
                    self._note(e, f"a[{i}].shape[{d}]")
                for d, e in enumerate(strides):
                    self._note(e, f"a[{i}].stride({d})")
                self._note(offset, f"a[{i}].storage_offset()")

    def _note(self, e: Any, code: str) -> None:
        if isinstance(e, sympy.Symbol) and e not in self.where:
            self.where[e] = code

    def _bindings(self, exprs: Sequence[Any]) -> list[str]:
        syms: set = set()
        for e in exprs:
            syms |= getattr(e, "free_symbols", set())
        missing = [s for s in syms if s not in self.where]
        if missing:
            raise SymbolicUnsupported(
                f"AOT autograd: symbol(s) {', '.join(sorted(map(str, missing)))} appear only inside "
                "compound sizes of the inputs; kiln cannot read them from the runtime arguments")
        return [f"    {s} = {self.where[s]}" for s in sorted(syms, key=str)]

    @staticmethod
    def _compile(name: str, lines: list[str]) -> Callable:
        src = f"def {name}(a):\n" + "\n".join(lines) + "\n"
        ns = dict(_NAMESPACE)
        exec(compile(src, f"<kiln.aot.symbolic {name}>", "exec"), ns)
        fn = ns[name]
        fn.source = src
        return fn

    def values(self, exprs: Sequence[Any]) -> Callable[[Sequence], tuple]:
        """``f(args) -> tuple`` of the expressions' values (ints/bools) for these arguments."""
        exprs = [expr_of(e) if not isinstance(e, sympy.Basic) else e for e in exprs]
        body = ", ".join(_printer().doprint(e) for e in exprs)
        return self._compile("kiln_shape_values", self._bindings(exprs) + [f"    return ({body}{',' if exprs else ''})"])

    def _shape_env(self):
        for f in self.fakes:
            if is_sym(f):
                return f.node.shape_env
            if isinstance(f, torch.Tensor) and getattr(f, "fake_mode", None) is not None:
                return f.fake_mode.shape_env
        return None

    def ranges(self) -> dict:
        """Each bound symbol's value range now, ``{symbol: (lower, upper)}`` (None: unbounded):
        the ShapeEnv proves facts from ranges (a size symbol is >= 2, so broadcasting never
        sees a 1) without adding guards."""
        env = self._shape_env()
        out = {}
        for sym in sorted(self.where, key=str):
            vr = env.var_to_range.get(sym) if env is not None else None
            if vr is not None:
                out[sym] = (int(vr.lower) if _finite(vr.lower) else None,
                            int(vr.upper) if _finite(vr.upper) else None)
        return out

    @staticmethod
    def _range_conditions(ranges: dict) -> list[str]:
        conds = []
        for sym in sorted(ranges, key=str):
            lower, upper = ranges[sym]
            if lower is not None:
                conds.append(f"{sym} >= {lower}")
            if upper is not None:
                conds.append(f"{sym} <= {upper}")
        return conds

    def input_check(self, guards: Sequence[sympy.Basic] = (), ranges: dict | None = None) -> "InputCheck":
        """A check that runtime arguments fit the traced inputs: each tensor has the traced
        sizes, strides and storage offset (evaluated for the bound symbols), each symbol is
        within its value range (``ranges``, default: the ShapeEnv's now, see ``ranges()``),
        and every extra ``guard`` (added to the ShapeEnv while tracing) holds."""
        ranges = self.ranges() if ranges is None else ranges
        conds: list[str] = []
        exprs: list = list(self.where)
        for i, f in enumerate(self.fakes):
            if isinstance(f, torch.Tensor):
                sizes, strides, offset = _tensor_exprs(f)
                exprs += sizes + strides + [offset]
                conds.append(f"a[{i}].shape == ({''.join(_printer().doprint(e) + ', ' for e in sizes)})")
                conds.append(f"a[{i}].stride() == ({''.join(_printer().doprint(e) + ', ' for e in strides)})")
                if offset.free_symbols:     # a static offset is relative to nothing the graphs read
                    conds.append(f"a[{i}].storage_offset() == {_printer().doprint(offset)}")
            elif is_sym(f):
                e = expr_of(f)
                exprs.append(e)
                if self.where.get(e) != f"a[{i}]":   # specialized, or its symbol is read elsewhere
                    conds.append(f"a[{i}] == {_printer().doprint(e)}")
        conds += self._range_conditions(ranges)
        for g in guards:
            exprs.append(g)
            conds.append(f"({_printer().doprint(g)})")
        binds = self._bindings(exprs)
        # Reading a binding can fail on a wrong argument (an int where a tensor was traced):
        # that is a mismatch, not an error.
        head = ["    try:"] + ["    " + b for b in binds] + [
            "    except (AttributeError, TypeError, IndexError, RuntimeError):",
            "        return None"]
        each = self._compile("kiln_shape_conditions",
                             head + ["    return (" + "".join(f"\n        {c}," for c in conds) + ")"])
        every = self._compile("kiln_shape_check",
                              head + ["    return (" + " and".join(f"\n        {c}" for c in conds or ["True"]) + ")"])
        return InputCheck(every, each, conds, len(self.fakes), list(guards), dict(ranges))


class InputCheck:
    """``holds(args)``: the runtime arguments fit the shapes the graphs were traced for."""

    def __init__(self, every: Callable, each: Callable, conds: list[str], n: int,
                 guards: list | None = None, ranges: dict | None = None):
        self._every = every       # one short-circuiting expression: the per-call check
        self._each = each         # each condition's value: only to explain a failure
        self.conditions = conds
        self.n = n
        # what it was made from (a cache entry stores them: kiln.aot.symbolic_codec)
        self.guards = guards or []
        self.ranges = ranges or {}

    def holds(self, args: Sequence) -> bool:
        if len(args) != self.n:
            return False
        try:
            return bool(self._every(args))
        except (AttributeError, TypeError, IndexError, RuntimeError):
            return False

    def explain(self, args: Sequence) -> str:
        if len(args) != self.n:
            return f"expected {self.n} arguments, got {len(args)}"
        try:
            res = self._each(args)
        except Exception as e:
            return f"the arguments do not fit the traced inputs ({type(e).__name__}: {e})"
        if res is None:
            return "an argument is not of the traced kind (tensor or int)"
        bad = [c for c, ok in zip(self.conditions, res) if not ok]
        return "the arguments do not fit the shapes the graph was traced for: failed " + "; ".join(bad[:3])

    def __call__(self, args: Sequence) -> bool:
        return self.holds(args)


# ------------------------------------------------------------------------------------------------
# The inputs a dynamic graph is traced with
# ------------------------------------------------------------------------------------------------

def graph_example_values(fn: Any, n: int) -> list | None:
    """The placeholders' ``example_value`` (or ``val``) of a GraphModule with ``n`` inputs when
    any of them is symbolic; None for a static graph or another callable."""
    if not isinstance(fn, torch.fx.GraphModule):
        return None
    phs = [p for p in fn.graph.nodes if p.op == "placeholder"]
    if len(phs) != n:
        return None
    vals = [p.meta.get("example_value", p.meta.get("val")) for p in phs]
    return vals if any(has_symbols(v) for v in vals) else None


def symbolic_inputs(fn: Any, example_inputs: Sequence[Any]) -> list | None:
    """What to trace a dynamic graph with, before checking: the graph's symbolic example values,
    else the example inputs themselves when some are symbolic; None when nothing is."""
    vals = graph_example_values(fn, len(example_inputs))
    if vals is not None:
        return vals
    if any(has_symbols(a) for a in example_inputs):
        return list(example_inputs)
    return None


def fake_mode_for(vals: Sequence[Any]):
    """The FakeTensorMode of the symbolic values (the capture's), one ShapeEnv for all."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    modes = {id(v.fake_mode): v.fake_mode for v in vals if isinstance(v, FakeTensor)}
    envs = {id(v.node.shape_env): v.node.shape_env for v in vals if is_sym(v)}
    if len(modes) > 1:
        raise ValueError("AOT autograd: the symbolic inputs come from different FakeTensorModes")
    mode = next(iter(modes.values()), None)
    if mode is None:
        # SymInt inputs only: trace tensors created inside under a mode over their ShapeEnv
        mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=next(iter(envs.values())))
    if mode.shape_env is None or any(e is not mode.shape_env for e in envs.values()):
        raise ValueError("AOT autograd: the symbolic inputs come from different ShapeEnvs")
    return mode


def _same_hinted(fake: torch.Tensor, real: torch.Tensor) -> bool:
    return (fake.dtype == real.dtype and fake.device == real.device
            and fake.requires_grad == real.requires_grad
            and [hint(s) for s in fake.shape] == list(real.shape)
            and [hint(s) for s in fake.stride()] == list(real.stride())
            and hint(fake.storage_offset()) == real.storage_offset())


def prepare_inputs(mode, vals: Sequence[Any], example_inputs: Sequence[Any]) -> list:
    """The fake inputs to trace with: each symbolic value where the graph has one, checked
    against the real example input (a capture may have changed its fake in place, e.g. with
    ``t_()`` or ``requires_grad_()``: then only a per-shape compile is sound); static fakes of
    the example inputs elsewhere."""
    from torch._subclasses.fake_tensor import FakeTensor

    out = []
    for i, (v, r) in enumerate(zip(vals, example_inputs)):
        if is_sym(v):
            if not isinstance(v, torch.SymInt):
                raise SymbolicUnsupported(f"AOT autograd: input {i} is a {type(v).__name__}; only SymInt inputs")
            if r is not v and (type(r) is not int or hint(v) != r):
                raise SymbolicUnsupported(f"AOT autograd: symbolic input {i} ({v}) was traced as {hint(v)} "
                                          f"but the example input is {r!r}")
            out.append(v)
        elif isinstance(v, FakeTensor) and isinstance(r, torch.Tensor):
            if v.fake_mode is not mode:
                raise ValueError("AOT autograd: the symbolic inputs come from different FakeTensorModes")
            if r is not v and not _same_hinted(v, r):
                raise SymbolicUnsupported(f"AOT autograd: the traced fake of input {i} no longer matches the "
                                          "example input (changed in place during capture?)")
            out.append(v)
        elif isinstance(r, FakeTensor):
            if r.fake_mode is not mode:
                raise ValueError("AOT autograd: example inputs come from different FakeTensorModes")
            out.append(r)
        elif isinstance(r, torch.Tensor):
            out.append(_torch.static_fake(mode, r))
        else:
            out.append(r)
    return out


def new_guards(shape_env, mark: int) -> list:
    """Guards added to the ShapeEnv since ``mark`` (by tracing: a decomposition that branched
    on a size), simplified; the compiled callable checks them on every call."""
    out = []
    for g in list(shape_env.guards)[mark:]:
        e = shape_env.simplify(g.expr)
        if e is sympy.true or e == sympy.true:
            continue
        out.append(e)
    return out
