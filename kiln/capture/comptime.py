"""comptime: run Python at capture time, with access to kiln's state.

    from kiln import comptime
    comptime(lambda ctx: ctx.print_graph())     # at capture time: the graph so far
    comptime.print(x)                            # the symbolic value of x (a fake tensor...)
    comptime.graph_break()                       # force a graph break here
    comptime.breakpoint()                        # pdb at capture time, `ctx` in scope

Outside capture (eager, or the compiled code at run time) every comptime call does nothing.
"""
from __future__ import annotations

import builtins
import types
from typing import Any, Callable

from ..errors import Unsupported
from ..internal_errors import call_user
from .resume import CELL_PREFIX
from .values.base import ConstantValue, LazyArgument, Value
from .values.functions import ExistingCellValue, NestedFunctionValue, NewCellValue, UserFunctionValue
from .values.tensor import TensorValue


class Comptime:
    """The ``comptime`` object. Calls are no-ops at run time; the capture interprets them."""

    def __call__(self, fn: Callable | None = None, fn_post: Callable | None = None) -> None:
        return None

    @staticmethod
    def print(value: Any) -> None:
        return None

    @staticmethod
    def graph_break() -> None:
        return None

    @staticmethod
    def breakpoint() -> None:
        return None

    @staticmethod
    def print_graph() -> None:
        return None

    @staticmethod
    def print_locals() -> None:
        return None

    @staticmethod
    def print_guards() -> None:
        return None

    def __repr__(self) -> str:
        return "kiln.comptime"


comptime = Comptime()


class ComptimeVar:
    """A value as the capture sees it."""

    def __init__(self, value):
        self._v = value

    def as_fake(self):
        """The fake tensor of a tensor value (shape, dtype, device, requires_grad)."""
        if not isinstance(self._v, TensorValue):
            raise TypeError(f"{self._v.describe()} is not a tensor")
        return self._v.fake

    def is_tensor(self) -> bool:
        return isinstance(self._v, TensorValue)

    def as_python_constant(self):
        return self._v.as_constant()

    def is_python_constant(self) -> bool:
        return self._v.is_constant()

    def python_type(self) -> type:
        return self._v.python_type()

    @property
    def source(self):
        return self._v.source

    @property
    def node(self):
        """The FX node of a tensor value."""
        return getattr(self._v, "node", None)

    def __repr__(self) -> str:
        if self.is_tensor():
            f = self._v.fake
            return (f"Tensor(node={self._v.node.name}, {str(f.dtype).replace('torch.', '')}"
                    f"{list(f.shape)}, device={f.device}, requires_grad={f.requires_grad}"
                    + (f", source={self._v.source.describe()}" if self._v.source is not None else "") + ")")
        if self._v.is_constant():
            return repr(self._v.as_constant())
        return self._v.describe()


class ComptimeContext:
    """What a comptime function receives: a view of the capture at this instruction."""

    def __init__(self, tx):
        self._tx = tx

    def _frame(self, stacklevel: int):
        tx = self._tx
        for _ in range(stacklevel):
            if tx.parent is None:
                raise ValueError("stacklevel beyond the outermost captured frame")
            tx = tx.parent
        return tx

    def get_local(self, name: str, *, stacklevel: int = 0) -> ComptimeVar:
        tx = self._frame(stacklevel)
        return ComptimeVar(_local_value(tx, name))

    def graph(self):
        return self._tx.output.graph

    def print_graph(self, *, file=None) -> None:
        print(self._tx.output.graph.python_code("self").src.strip(), file=file)

    def print_locals(self, *, stacklevel: int = 0, file=None) -> None:
        tx = self._frame(stacklevel)
        for name in _user_local_names(tx):
            try:
                print(f"{name} = {self.get_local(name, stacklevel=stacklevel)!r}", file=file)
            except Exception as e:  # an unbound cell
                print(f"{name} = <{type(e).__name__}>", file=file)

    def print_guards(self, *, file=None) -> None:
        print(self._tx.output.guards.describe(), file=file)

    def print(self, value, *, file=None) -> None:
        print(value if isinstance(value, ComptimeVar) else ComptimeVar(value) if hasattr(value, "describe")
              else value, file=file)

    def graph_break(self) -> None:
        raise Unsupported("comptime.graph_break()")

    def breakpoint(self) -> None:
        ctx = self  # noqa: F841  (in scope for the debugger)
        builtins.breakpoint()


def _local_value(tx, name: str):
    """The symbolic value of local ``name`` of a captured frame. In a continuation after a
    graph break, a cell variable is a local holding the cell (``resume.CELL_PREFIX``)."""
    if name in tx.locals and not name.startswith(CELL_PREFIX):
        v = tx.locals[name]
        if isinstance(v, LazyArgument):
            v = tx.locals[name] = v.realize(tx)
        return v
    if name in tx.cells:
        return tx.cells[name].get(tx)
    held = CELL_PREFIX + name
    if held in tx.locals:
        cell = tx.locals[held]
        if isinstance(cell, LazyArgument):
            cell = tx.locals[held] = cell.realize(tx)
        return cell.getattr(tx, "cell_contents")
    raise KeyError(f"no local {name!r} in {tx.name}")


def _user_local_names(tx) -> list[str]:
    """The frame's locals as the user wrote them (no kiln temporaries of a continuation)."""
    names = []
    for n in list(tx.locals) + list(tx.cells):
        if n.startswith(CELL_PREFIX):
            n = n[len(CELL_PREFIX):]
        elif n.startswith("___"):
            continue
        if n not in names:
            names.append(n)
    return names


def call_at_capture(tx, fn_value, args: list) -> None:
    """Run a comptime function during capture. It is the user's code: what it raises
    propagates to the caller of the compiled function (``internal_errors.call_user``)."""
    fn = _real_function(tx, fn_value)
    call_user(fn, ComptimeContext(tx), *args)


def _real_function(tx, fn_value):
    """The callback as a real function. A callback defined in the compiled function (a
    closure over its locals) gets, for each free variable, the Python value when the capture
    knows it as a constant (``n = 3``), else a ``ComptimeVar`` (a tensor, a symbolic value);
    its default arguments likewise. A free variable of the compiled function itself is its
    real cell, so that what the callback does to it is seen outside."""
    if isinstance(fn_value, NestedFunctionValue):
        cells = []
        for c in fn_value.closure:
            if isinstance(c, ExistingCellValue) and tx.output.side_effects.cell_value(c.cell) is None:
                # a cell from outside the call (a free variable of the compiled function, such
                # as a list in its caller that the callback appends to): the real cell
                cells.append(c.cell)
                continue
            contents = c.contents if isinstance(c, NewCellValue) else c.get(tx)
            cells.append(types.CellType() if contents is None else types.CellType(_as_python(contents)))
        fn = types.FunctionType(fn_value.code_obj, fn_value.fn_globals, fn_value.qualname.rsplit(".", 1)[-1],
                                tuple(_as_python(d) for d in fn_value.defaults(tx)) or None,
                                tuple(cells) or None)
        fn.__kwdefaults__ = {k: _as_python(v) for k, v in fn_value.kwdefaults(tx).items()} or None
        fn.__qualname__ = fn_value.qualname
        return fn
    if isinstance(fn_value, UserFunctionValue):
        return fn_value.fn
    raise Unsupported(f"comptime() of {fn_value.describe()}")


def _as_python(value):
    try:
        if value.is_constant():
            return value.as_constant()
    except Exception:
        pass
    real = getattr(value, "value", None)   # an object from outside the frame, by identity
    if real is not None and getattr(value, "source", None) is not None:
        return real
    return ComptimeVar(value)


def comptime_value():
    class ComptimeValue(Value):
        """``comptime`` as the capture sees it: its calls run now, at capture time."""

        def __init__(self, method: str | None = None):
            self.method = method

        def python_type(self):
            return Comptime if self.method is None else types.FunctionType

        def describe(self):
            return "comptime" + (f".{self.method}" if self.method else "")

        def truthy(self, tx):
            return True

        def getattr(self, tx, name):
            if self.method is None and name in ("print", "graph_break", "breakpoint", "print_graph",
                                                "print_locals", "print_guards"):
                return ComptimeValue(name)
            raise Unsupported(f"comptime.{name}")

        def call(self, tx, args, kwargs):
            if tx.output.replaying and self.method != "graph_break":
                return ConstantValue(None)  # it already ran in the first pass of this capture
            ctx = ComptimeContext(tx)
            if self.method is None:
                call_at_capture(tx, args[0], [])
            elif self.method == "print":
                ctx.print(ComptimeVar(args[0]))
            else:
                getattr(ctx, self.method)()
            return ConstantValue(None)

        def reconstruct(self, cg):
            return cg.bind(comptime)

    return ComptimeValue()
