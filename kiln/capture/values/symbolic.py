"""Symbolic Python numbers: sizes that vary between calls, and int inputs made dynamic.

A ``SymNodeValue`` is a Python int (or float) whose value is an expression of the ShapeEnv's
symbols (``s4821 * 2``); its ``node`` computes it in the graph. Arithmetic stays symbolic.
Anything that needs the concrete number (a branch, a list index, a format string, a loop
over ``range(n)``) *specializes* it: the ShapeEnv records a guard (``Eq(s4821, 8)``) that
becomes a kiln guard, so the entry only runs where the assumption holds.
"""
from __future__ import annotations

import operator

import torch

from ...errors import Unsupported
from .base import ConstantValue, Value
from .containers import TupleValue
from .functions import MethodValue

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_PLAIN_TYPE = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}
_NUMBER_TYPES = (int, float, bool)

# Comparisons of symbolic numbers are decided at capture time (the ShapeEnv guards the
# outcome): a SymBool rarely flows anywhere but a branch.
COMPARISONS = frozenset({operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne})
_INPLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
            operator.ifloordiv: operator.floordiv, operator.itruediv: operator.truediv,
            operator.imod: operator.mod, operator.ipow: operator.pow}
# What SymInt/SymFloat model symbolically; other operators specialize their operands.
SYMBOLIC_BINARY = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv,
                             operator.truediv, operator.mod, operator.pow}) | COMPARISONS
SYMBOLIC_UNARY = frozenset({operator.neg, operator.pos, abs})


def is_symbolic(v) -> bool:
    return isinstance(v, _SYM_TYPES)


class SymNodeValue(Value):
    """A symbolic int/float: ``fake`` is the SymInt, ``node`` the graph value computing it."""

    def __init__(self, node, fake, source=None):
        self.node = node
        self.fake = fake
        self.source = source

    def python_type(self):
        return _PLAIN_TYPE[type(self.fake)]

    def describe(self):
        return f"Sym({self.fake.node.expr})"

    def is_constant(self):
        return False

    def as_constant(self):
        """The concrete number, specialized: the ShapeEnv guards that it stays this value."""
        return _PLAIN_TYPE[type(self.fake)](self.fake)

    def specialize(self) -> ConstantValue:
        return ConstantValue(self.as_constant())

    def truthy(self, tx):
        return bool(self.fake)

    def getattr(self, tx, name):
        return self.specialize().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name in ("__index__", "__int__") and self.python_type() is int:
            return self
        return self.specialize().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg):
        if self.source is not None and self.node.op == "placeholder":
            return cg.source_expr(self.source)  # an int input handed back unchanged
        return cg.graph_output(self.node)


class SymSliceValue(Value):
    """``a[i:n]`` where a bound is symbolic: kept symbolic for tensor indexing."""

    def __init__(self, parts: list[Value]):
        self.parts = parts

    def python_type(self):
        return slice

    def describe(self):
        return f"slice({', '.join(p.describe() for p in self.parts)})"

    def as_constant(self):
        return slice(*[p.as_constant() for p in self.parts])


class SymRangeValue(Value):
    """``range(n)`` with a symbolic bound: stays symbolic until iterated or indexed (which
    specializes it)."""

    def __init__(self, args: list[Value]):
        self.args = args

    def python_type(self):
        return range

    def describe(self):
        return f"range({', '.join(a.describe() for a in self.args)})"

    def as_constant(self):
        return range(*[a.as_constant() for a in self.args])


    def unpack(self, tx):
        return [ConstantValue(i) for i in self.as_constant()]

    def length(self, tx) -> Value:
        args = self.args
        if len(args) == 1 or (len(args) == 2 and args[0].is_constant() and args[0].as_constant() == 0):
            # len(range(0, n)) == max(n, 0)
            n = args[-1]
            return sym_call(tx.output, torch.sym_max, [n, ConstantValue(0)])
        return ConstantValue(len(self.as_constant()))

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__":
            return self.length(tx)
        return ConstantValue(self.as_constant()).call_method(tx, name, args, kwargs)


def wrap_sym(output, value, make_node) -> Value:
    """The value for a number computed at capture time: a constant, or (symbolic) a
    SymNodeValue whose node ``make_node()`` creates (unless it is a symbol the graph already
    takes as an input)."""
    if not is_symbolic(value):
        return output.builder.wrap_pure_result(value)
    if isinstance(value, torch.SymBool):
        return ConstantValue(bool(value))   # decided now, guarded by the ShapeEnv
    expr = output.shape_env.replace(value.node.expr)
    if expr.is_number:
        return ConstantValue(_PLAIN_TYPE[type(value)](expr))
    node = output.symbol_nodes.get(expr)
    if node is None:
        node = make_node()
        node.meta["example_value"] = value
    return SymNodeValue(node, value)


def operand(v: Value):
    """(fake, fx argument) of an operand of symbolic arithmetic, or None if it is not a number."""
    if isinstance(v, SymNodeValue):
        return v.fake, v.node
    if v.is_constant():
        c = v.as_constant()
        if type(c) in _NUMBER_TYPES:
            return c, c
    return None


def sym_call(output, fn, args: list[Value]) -> Value:
    """``fn(*args)`` on symbolic numbers: one graph node (``operator.add(s0, 2)``)."""
    parts = [operand(a) for a in args]
    if any(p is None for p in parts):
        raise Unsupported(f"{getattr(fn, '__name__', fn)} of a symbolic number and a non-number")
    result = fn(*[p[0] for p in parts])
    return wrap_sym(output, result, lambda: output.graph.call_function(fn, tuple(p[1] for p in parts)))


def sym_binary(tx, op, a: Value, b: Value) -> Value | None:
    """A binary operator with a symbolic operand; None when the other operand is not a
    number (the caller specializes and goes on)."""
    op = _INPLACE.get(op, op)
    if op not in SYMBOLIC_BINARY or operand(a) is None or operand(b) is None:
        return None
    try:
        if op in COMPARISONS:
            return ConstantValue(bool(op(operand(a)[0], operand(b)[0])))
        return sym_call(tx.output, op, [a, b])
    except ZeroDivisionError as e:
        raise tx.user_exception(e)


def sym_unary(tx, op, v: Value) -> Value | None:
    if op not in SYMBOLIC_UNARY:
        return None
    return sym_call(tx.output, op, [v])


def specialize(v: Value) -> Value:
    """``v`` with symbolic numbers replaced by their (guarded) concrete values."""
    if isinstance(v, SymNodeValue):
        return v.specialize()
    if isinstance(v, (SymSliceValue, SymRangeValue)):
        return ConstantValue(v.as_constant())
    return v


class SizeValue(TupleValue):
    """A ``torch.Size`` with symbolic entries (``x.shape`` of a dynamic tensor)."""

    def __init__(self, items, source=None, cls=None):
        super().__init__(items, source, torch.Size)

    def override(self, name):
        return None

    def is_constant(self):
        return all(i.is_constant() for i in self.items)

    def as_constant(self):
        return torch.Size([i.as_constant() for i in self.items])

    def getitem(self, tx, index):
        if isinstance(index, SymNodeValue):
            index = index.specialize()
        idx = index.as_constant()
        if isinstance(idx, slice):
            return SizeValue(self.items[idx])
        try:
            return self.items[operator.index(idx)]
        except IndexError as e:
            raise tx.user_exception(e)

    def base_method(self, tx, name, args, kwargs):
        if name == "numel" and not args and not kwargs:
            out = ConstantValue(1)
            for item in self.items:
                out = tx.binary(operator.mul, out, item)
            return out
        return super().base_method(tx, name, args, kwargs)

    def getattr(self, tx, name):
        if name == "numel":
            return MethodValue(self, name)
        return super().getattr(tx, name)


def size_value(items: list[Value], keep_items: bool = False) -> Value:
    """A torch.Size of these items: a constant when none is symbolic (unless ``keep_items``:
    items read from an input keep their own sources and lazily installed guards)."""
    if not keep_items and all(i.is_constant() for i in items):
        return ConstantValue(torch.Size([i.as_constant() for i in items]))
    return SizeValue(items)
