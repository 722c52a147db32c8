"""The symbolic bytecode interpreter: opcode handlers over symbolic values.

One ``FrameInterpreter`` runs one code object (the compiled function, or a function it
inlines) with symbolic locals, cells and stack. Tensor operations become FX nodes in the
capture's ``OutputGraph``; Python values are computed at capture time where they are known,
with guards on everything read from the outside world. Anything not modelled raises
``Unsupported``; the caller then runs the frame eagerly (or reports it under fullgraph).
"""
from __future__ import annotations

import builtins
import contextlib

import linecache
import operator
import types

import torch


from .. import _torch
from ..config import config
from ..errors import FrameRunsEagerly, Unsupported
from ..internal_errors import internal_error, is_users
from ..names import functions_under, resolve_name
from . import bytecode_utils, resume
from .guards import Guard, GuardKind
from .imports import import_from, import_name
from .resume import CellAccess, FrameIntrospection
from .side_effects import DELETED_GLOBAL
from .sources import ConstSource, GlobalSource, ItemSource
from .values.base import NULL, UNBOUND, ConstantValue, LazyArgument, NullValue, Value
from .values.builtins import _classes
from .values.containers import DictValue, IteratorValue, ListValue, SetValue, TupleValue
from .values.exceptions import ExceptionValue, PrevExcValue
from .values.functions import CellAccessValue, CellValue, MethodValue, NestedFunctionValue, NewCellValue, UserFunctionValue
from .values.objects import ClassValue, SuperValue
from .values.symbolic import SymNodeValue, SymSliceValue, specialize
from .values.tensor import TensorValue
from .semantics import _BINARY, _COMPARE, PythonSemantics, UserException, bind_arguments


_CONTEXTMANAGER_INIT = contextlib._GeneratorContextManagerBase.__init__.__code__


# torch functions that differentiate: code -> position of create_graph among their arguments
_DIFFERENTIATING = {torch.autograd.grad.__code__: 4, torch.autograd.backward.__code__: 3}


def refuse_higher_order_grad(name: str, args: list, kwargs: dict, position: int) -> None:
    """``create_graph=True`` differentiates through the backward of the graphs before it;
    the AOT backends' backward graphs are not differentiable, so the frame runs eagerly (a
    graph break would still have compiled the graph the gradient goes through)."""
    flag = kwargs.get("create_graph", args[position] if len(args) > position else None)
    if flag is None:
        return
    try:
        on = bool(flag.as_constant())
    except Exception:   # not a constant: it may be on
        on = True
    if on:
        raise FrameRunsEagerly(f"{name}(create_graph=True) (a higher-order gradient)")


class GraphBreakRequest(Exception):
    """Raised out of a capture: instruction ``ip`` of the top frame (its ``count``-th
    execution) cannot be captured. The capture restarts and stops cleanly before it."""

    def __init__(self, ip: int, count: int, reason: Unsupported):
        self.ip, self.count, self.reason = ip, count, reason


class BreakHere(Exception):
    """The restarted capture reached the break point: the frame state is intact."""

    def __init__(self, tx: "FrameInterpreter", ip: int):
        self.tx, self.ip = tx, ip


class _Return(Exception):
    def __init__(self, value: Value):
        self.value = value


class _Yield(Exception):
    """A suspended generator frame (``SuspendedGenerator``) reached a ``yield``."""

    def __init__(self, value: Value):
        self.value = value


class FrameInterpreter(PythonSemantics):
    UserException = UserException

    def __init__(self, output, code: types.CodeType, f_globals: dict, f_locals: dict[str, Value],
                 cells: dict[str, CellValue], parent: "FrameInterpreter | None" = None,
                 name: str = "", closure_cells: list[CellValue] | None = None):
        self.output = output
        self.code = code
        self.f_globals = f_globals
        self.f_builtins = f_globals.get("__builtins__", __builtins__)
        if isinstance(self.f_builtins, types.ModuleType):
            self.f_builtins = self.f_builtins.__dict__
        self.locals: dict[str, Value] = dict(f_locals)
        self.cells: dict[str, CellValue] = dict(cells)
        self.stack: list[Value] = []
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.name = name or code.co_qualname
        self.instructions = bytecode_utils.decode(code)
        self.ip = 0
        self.current: bytecode_utils.Instr | None = None
        self.kw_names: tuple = ()
        self.trusted_globals = output.is_trusted_globals(f_globals)
        self.handled_exc = None   # the exception of the except block being run (sys.exc_info)
        self.break_at: tuple[int, int] | None = None   # (ip, execution count), top frame only
        self.exec_counts: dict[int, int] = {}
        self.can_break = parent is None
        self.f_locals_dict: DictValue | None = None   # what locals() returns, kept per frame
        self.suspends = False     # a generator run lazily: a yield hands its value out (_Yield)
        self.delegating = False   # suspended at a ``yield from``'s yield (the item is its inner's)

    # -- driving --------------------------------------------------------------------------
    def run(self) -> Value:
        self.output.tx_stack.append(self)
        try:
            return self._run()
        finally:
            self.output.tx_stack.pop()

    def _run(self) -> Value:
        instrs = self.instructions
        try:
            while True:
                ins = instrs[self.ip]
                self.current = ins
                if self.can_break:
                    count = self.exec_counts[self.ip] = self.exec_counts.get(self.ip, 0) + 1
                    if self.break_at == (self.ip, count):
                        raise BreakHere(self, self.ip)
                self.ip += 1
                self.output.count_instruction()
                handler = getattr(self, ins.opname, None)
                if handler is None:
                    raise Unsupported(f"bytecode {ins.opname}")
                try:
                    handler(ins)
                except UserException as e:
                    # the user's code raised: its own try block handles it, as in eager
                    if ins.handler is not None and self.unwind_to_handler(ins, e):
                        continue
                    if self.can_break:
                        e.located(*self.location())
                        raise self._break_request(ins, e)
                    raise
                except Unsupported as e:
                    if self.can_break and not isinstance(e, FrameRunsEagerly):
                        e.located(*self.location())
                        raise self._break_request(ins, e)
                    raise
        except _Return as r:
            return r.value
        except _Yield:
            raise       # (a suspended generator's frame: SuspendedGenerator.next catches it)
        except Unsupported as e:
            raise e.located(*self.location())
        except (RecursionError, MemoryError, GraphBreakRequest, BreakHere):
            raise
        except Exception as e:  # a bug in kiln must not become a wrong answer: run eagerly
            if is_users(e):
                raise   # the user's own code run at capture time (a comptime callback)
            raise internal_error(e, "capturing").located(*self.location()) from e

    def unwind_to_handler(self, ins, e: UserException) -> bool:
        """Continue in the except/finally block that covers ``ins`` (exception table)."""
        target, depth, push_lasti = ins.handler
        if depth > len(self.stack):
            return False
        del self.stack[depth:]
        if push_lasti:
            self.push(ConstantValue(ins.index))
        exc = ExceptionValue(e.exc)
        if self.can_break:
            exc.raised_at = (self.output.instructions, ins.index, self.exec_counts.get(ins.index, 0))
        self.push(exc)
        self.ip = target
        return True

    def _break_request(self, ins, reason: Unsupported) -> "GraphBreakRequest":
        """A graph break at ``ins``; or, while an exception this capture raised is still
        live (being handled, or held), at the instruction that raised it: from there the
        frame goes on natively, so the exception is the real one (its traceback, identity
        and chaining), not a copy handed over to a continuation."""
        live = [v.raised_at for v in self._live_values()
                if isinstance(v, ExceptionValue) and v.raised_at is not None]
        if live:
            _, ip, count = min(live)
            redirected = Unsupported(f"{reason.construct} (while handling an exception raised at "
                                     f"line {self.instructions[ip].lineno}: the frame goes on "
                                     "natively from there)")
            redirected.located(reason.filename, reason.lineno, reason.source_line)
            return GraphBreakRequest(ip, count, redirected)
        return GraphBreakRequest(ins.index, self.exec_counts[ins.index], reason)

    def _live_values(self):
        if self.handled_exc is not None:
            yield self.handled_exc
        for v in [*self.stack, *self.locals.values()]:
            if isinstance(v, PrevExcValue):
                yield v.prev
                yield v.handled
            else:
                yield v

    def location(self) -> tuple[str, int | None, str | None]:
        lineno = self.current.lineno if self.current is not None else self.code.co_firstlineno
        filename = self.code.co_filename
        return filename, lineno, linecache.getline(filename, lineno or 0) or None

    def user_exception(self, exc: BaseException) -> UserException:
        return UserException(exc)

    def push(self, v: Value) -> None:
        self.stack.append(v)

    def pop(self) -> Value:
        v = self.stack.pop()
        return v.realize(self) if isinstance(v, LazyArgument) else v

    def pop_raw(self) -> Value:
        """Pop without realizing an unread argument (moves, not uses: STORE_FAST, POP_TOP)."""
        return self.stack.pop()

    def popn(self, n: int) -> list[Value]:
        if n == 0:
            return []
        items = [v.realize(self) if isinstance(v, LazyArgument) else v for v in self.stack[-n:]]
        del self.stack[-n:]
        return items

    def peek(self, depth: int) -> Value:
        """The value ``depth`` slots down (1: the top), realized in place (a continuation's
        stack slots are unread arguments)."""
        v = self.stack[-depth]
        if isinstance(v, LazyArgument):
            v = self.stack[-depth] = v.realize(self)
        return v

    def top(self) -> Value:
        v = self.stack[-1]
        if isinstance(v, LazyArgument):
            v = self.stack[-1] = v.realize(self)
        return v

    def jump(self, ins: bytecode_utils.Instr) -> None:
        self.ip = ins.target

    # -- locals() ---------------------------------------------------------------------------
    def frame_locals(self) -> DictValue:
        """``locals()``: the frame's locals dict, one per frame as in CPython (each call
        writes the bound names into it and removes the unbound ones; other keys stay), in
        the order of the user's code (for a continuation, the code it resumes): its
        variables, its cells' contents, its free variables' contents. kiln's own
        parameters and cell holders never appear."""
        code = resume.original_code(self.code)
        names = [*code.co_varnames, *(c for c in code.co_cellvars if c not in code.co_varnames),
                 *code.co_freevars]
        cells = set(code.co_cellvars) | set(code.co_freevars)
        if self.f_locals_dict is None:
            # (a continuation: the dict of the frame it continues, handed over)
            handed = self._bound_local(resume.FRAME_LOCALS)
            self.f_locals_dict = handed if isinstance(handed, DictValue) else DictValue({})
        items = self.f_locals_dict.items
        for name in names:
            value = self._cell_contents(name) if name in cells else self._bound_local(name)
            if value is None:
                items.pop(name, None)
            else:
                items[name] = value
        return self.f_locals_dict

    def _bound_local(self, name: str) -> Value | None:
        v = self.locals.get(name)
        if isinstance(v, LazyArgument):
            v = self.locals[name] = v.realize(self)
        return v

    def _cell_contents(self, name: str) -> Value | None:
        cell = self.cells.get(name)
        if cell is None:
            holder = self._bound_local(resume.CELL_PREFIX + name)   # a continuation's cell
            if holder is None:
                return None
            if not isinstance(holder, CellValue):
                raise Unsupported(f"locals() with the cell of {name!r} held as {holder.describe()}")
            cell = holder
        try:
            return cell.get(self)
        except UserException as e:
            if isinstance(e.exc, NameError):
                return None   # an empty cell: not in locals()
            raise

    # -- inlining --------------------------------------------------------------------------
    def inline_function(self, fn: UserFunctionValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
        original = _torch.optimizer_init_group_under_dynamo(getattr(fn, "fn", None))
        if original is not None:    # (the wrapper is guarded by identity: so is its original)
            fn = UserFunctionValue(original)
        code = fn.code()
        if _torch.runs_outside_graphs(getattr(fn, "fn", None)):   # (a nested function: made here)
            # torch marks it to run natively (FSDP2's hooks gather and free parameters, talk to
            # the other ranks): a break at its call, where it runs as it is
            raise Unsupported(f"{fn.name()} is marked by torch to run outside compiled graphs "
                              "(torch._disable_dynamo)")
        if bytecode_utils.is_async_code(code):
            raise Unsupported(f"calling async function {fn.name()}")
        if self.depth >= config.max_inline_depth:
            raise Unsupported(f"inlining deeper than config.max_inline_depth={config.max_inline_depth}")
        f_locals = bind_arguments(self, code, fn.name(), args, kwargs, fn.defaults(self), fn.kwdefaults(self))
        if code not in self.output.inlined:
            self.output.inlined[code] = _inlined_name(fn, code)
        cells: dict[str, CellValue] = {}
        for name, cell in zip(code.co_freevars, fn.closure_cells(self)):
            cells[name] = cell
        if code in _DIFFERENTIATING:
            refuse_higher_order_grad(fn.name(), args, kwargs, _DIFFERENTIATING[code])
        child = FrameInterpreter(self.output, code, fn.globals(), f_locals, cells, parent=self,
                                 name=fn.name())
        if bytecode_utils.is_generator_code(code):
            if code in self.output.native_generators:
                # suspended at a graph break in an earlier capture of this frame: the frame
                # after the break could not take it over, so it is made natively
                what = ("@contextlib.contextmanager " if self.code is _CONTEXTMANAGER_INIT else "generator ")
                raise Unsupported(f"{what}{fn.name()} suspended at a graph break (made natively, its "
                                  "suspended frame cannot be handed to the code after the break)")
            # its frame runs lazily, to the next yield at each next(): effects interleave with
            # the consumer's as in eager, and nothing runs past the last item read
            child.suspends = True
            gen = SuspendedGenerator(child)
            self.output.suspended_generators.append(gen)
            return gen
        try:
            return child.run()
        except Unsupported as e:
            # the callee's body cannot be captured: a break at this call lets the callee
            # run as its own compiled function; one that reads its callers' frames runs as it
            # is, so that those are real frames
            e.inside_callee = not getattr(e, "reads_frames", False)
            raise

    # -- opcode handlers ---------------------------------------------------------------------
    def NOP(self, ins):
        pass

    RESUME = NOP
    COPY_FREE_VARS = NOP  # cells of free variables are installed when the frame is created

    def MAKE_CELL(self, ins):
        name = bytecode_utils.cell_name(ins.arg)
        if name in self.cells and not isinstance(self.cells[name], NewCellValue):
            return
        v = self.locals.pop(name, None)
        self.cells[name] = NewCellValue(name, v.realize(self) if isinstance(v, LazyArgument) else v)

    def LOAD_CONST(self, ins):
        if isinstance(ins.arg, FrameIntrospection):   # locals() etc. in a continuation: the name's value
            self.push(self.load_global(ins.arg.name))
            return
        if isinstance(ins.arg, CellAccess):          # a continuation's read or del of its own cell
            self.push(CellAccessValue(ins.arg))
            return
        self.push(_wrap_const(ins.arg))

    def RETURN_CONST(self, ins):
        self.push(_wrap_const(ins.arg))
        self.RETURN_VALUE(ins)

    def RETURN_VALUE(self, ins):
        raise _Return(self.pop_raw())  # returning an unread argument returns it by source

    def RETURN_GENERATOR(self, ins):
        if not self.suspends:
            raise Unsupported("generator")
        self.push(ConstantValue(None))

    def YIELD_VALUE(self, ins):
        if not self.suspends:
            raise Unsupported("yield outside a generator")
        raise _Yield(self.pop())      # (SuspendedGenerator pushes the value sent in on resuming)

    def GET_YIELD_FROM_ITER(self, ins):
        self.push(self.get_iter(self.pop()))

    def SEND(self, ins):
        sent = self.pop()
        receiver = self.top()
        if not isinstance(receiver, IteratorValue):
            raise Unsupported(f"yield from {receiver.describe()}")
        self.delegating = False
        if isinstance(receiver, SuspendedGenerator):
            item = receiver.send(self, sent)
        elif sent.is_constant() and sent.as_constant() is None:
            item = receiver.next(self)
        else:
            raise Unsupported(f"send() through yield from {receiver.describe()}")
        if item is None:
            # (the value of ``yield from``: the inner generator's return value)
            if isinstance(receiver, SuspendedGenerator):
                value = receiver.return_value
            elif hasattr(receiver, "stop_iteration"):      # (a user iterator's StopIteration value)
                value = self.wrap(receiver.stop_iteration().value, None)
            else:
                value = ConstantValue(None)
            if bytecode_utils.SEND_KEEPS_RECEIVER:
                self.push(value)
            else:
                self.stack[-1] = value
            self.jump(ins)
        else:
            self.delegating = True
            self.push(item)

    def END_SEND(self, ins):
        value = self.pop()
        self.pop()
        self.push(value)

    def LOAD_FAST(self, ins):
        v = self.locals.get(ins.arg)
        if v is None:
            raise self.user_exception(_unbound_local(ins.arg))
        self.push(v)  # an unread argument stays lazy until an instruction consumes it

    def LOAD_FAST_AND_CLEAR(self, ins):
        v = self.locals.pop(ins.arg, UNBOUND)
        self.push(v.realize(self) if isinstance(v, LazyArgument) else v)

    def STORE_FAST(self, ins):
        v = self.pop_raw()
        if v is UNBOUND:
            self.locals.pop(ins.arg, None)
        else:
            self.locals[ins.arg] = v

    def DELETE_FAST(self, ins):
        if self.locals.pop(ins.arg, None) is None and not str(ins.arg).startswith("___"):
            # ``del x`` of an unbound local raises, as reading it does (kiln's own ___names
            # are deleted unconditionally)
            raise self.user_exception(_unbound_local(ins.arg))

    def LOAD_GLOBAL(self, ins):
        push_null, name = ins.arg
        if push_null:
            self.push(NULL)
        self.push(self.load_global(name))

    def _globals_value(self):
        """The frame's globals dict as a value of the capture, when the code reached the dict
        itself (``globals()``, ``module.__dict__``): reads and writes of globals go through it."""
        prior = self.output.builder.by_id.get(id(self.f_globals))
        if prior is not None and prior[0] is self.f_globals and isinstance(prior[1], DictValue):
            return prior[1]
        return None

    def load_global(self, name: str) -> Value:
        g = self.f_globals
        pending = self.output.side_effects.global_value(g, name)
        if pending is DELETED_GLOBAL:
            if name in self.f_builtins:
                return self.wrap(self.f_builtins[name], None)
            self._guard_absent(self.f_builtins, name)
            raise self.user_exception(NameError(f"name {name!r} is not defined"))
        if pending is not None:   # assigned earlier in this capture (STORE_GLOBAL)
            return pending
        as_dict = self._globals_value()
        if as_dict is not None and name in as_dict.items:
            return as_dict.items[name]
        if name in g and as_dict is None:
            src = GlobalSource(g, name)
            return self.wrap(g[name], src)  # trusted modules' globals: a source, but no guards
        if name in self.f_builtins:
            value = self.f_builtins[name]
            if self.trusted_globals:
                return self.wrap(value, None)
            self.output.guards.add(_guard(GuardKind.GLOBAL_ABSENT, None, (g, name)))
            if _STARTUP_BUILTINS.get(name, _STARTUP_BUILTINS) is value:
                # Python's own builtin, modelled as the constant it is, and guarded to stay so:
                # a test or a library may replace it after the capture (``mock.patch(
                # "builtins.len")``)
                self.output.builder.guard(GuardKind.ID_MATCH, ItemSource(ConstSource(self.f_builtins), name), value)
                return self.wrap(value, None)
            # a name added to builtins, or one replaced there: read as the global it is
            return self.wrap(value, ItemSource(ConstSource(self.f_builtins), name))
        # (a NameError the code catches: a later call that finds the name must not replay it)
        if as_dict is None:
            self._guard_absent(g, name)
        self._guard_absent(self.f_builtins, name)
        raise self.user_exception(NameError(f"name {name!r} is not defined"))

    def _guard_absent(self, names: dict, name: str) -> None:
        if not self.trusted_globals:
            self.output.guards.add(_guard(GuardKind.GLOBAL_ABSENT, None, (names, name)))

    def STORE_GLOBAL(self, ins):
        # later reads in this capture see the value; it is written back after the graph
        as_dict = self._globals_value()
        if as_dict is not None:
            as_dict.base_method(self, "__setitem__", [ConstantValue(ins.arg), self.pop()], {})
        else:
            self.output.side_effects.store_global(self.f_globals, ins.arg, self.pop())

    def DELETE_GLOBAL(self, ins):
        name, as_dict = ins.arg, self._globals_value()
        if as_dict is not None:
            as_dict.base_method(self, "__delitem__", [ConstantValue(name)], {})
            return
        pending = self.output.side_effects.global_value(self.f_globals, name)
        if pending is None:
            # whether the global is there decides between deleting it and NameError: guarded,
            # for a later call that finds it gone (or back)
            if name not in self.f_globals:
                self._guard_absent(self.f_globals, name)
            elif not self.trusted_globals:
                value = self.f_globals[name]
                self.output.guards.add(_guard(GuardKind.TYPE_MATCH, GlobalSource(self.f_globals, name), type(value)))
        if pending is DELETED_GLOBAL or (pending is None and name not in self.f_globals):
            raise self.user_exception(NameError(f"name {name!r} is not defined"))
        # later reads in this capture find it gone; it is removed after the graph
        self.output.side_effects.store_global(self.f_globals, name, DELETED_GLOBAL)

    def LOAD_DEREF(self, ins):
        name = bytecode_utils.cell_name(ins.arg)
        cell = self.cells.get(name)
        if cell is None:
            raise Unsupported(f"closure variable {name!r} without a cell")
        try:
            self.push(cell.get(self))
        except UserException as e:
            code = resume.original_code(self.code)
            if type(e.exc) is NameError and name in code.co_cellvars:
                # an empty cell of this frame's own variable: CPython reads it as a local
                raise self.user_exception(_unbound_local(name)) from None
            raise

    def STORE_DEREF(self, ins):
        name = bytecode_utils.cell_name(ins.arg)
        cell = self.cells.get(name)
        if cell is None:
            cell = self.cells[name] = NewCellValue(name)
        cell.set(self, self.pop())

    def LOAD_CLOSURE(self, ins):
        name = bytecode_utils.cell_name(ins.arg)
        cell = self.cells.get(name)
        if cell is None:
            cell = self.cells[name] = NewCellValue(name, self.locals.pop(name, None))
        self.push(cell)

    def POP_TOP(self, ins):
        self.pop_raw()

    def END_FOR(self, ins):
        self.pop()
        self.pop()

    def COPY(self, ins):
        self.push(self.stack[-ins.arg])

    def SWAP(self, ins):
        i = ins.arg
        self.stack[-1], self.stack[-i] = self.stack[-i], self.stack[-1]

    def PUSH_NULL(self, ins):
        self.push(NULL)

    # attributes
    def LOAD_ATTR(self, ins):
        is_method, name = ins.arg
        obj = self.pop()
        attr = self.getattr(obj, name)
        if is_method:
            self.push(NULL)
        self.push(attr)

    def LOAD_SUPER_ATTR(self, ins):
        is_method, _two_arg, name = ins.arg if isinstance(ins.arg, tuple) and len(ins.arg) == 3 else (
            False, False, ins.arg)
        obj = self.pop()
        cls = self.pop()
        self.pop()  # the global `super`
        attr = SuperValue(cls.as_constant(), obj).getattr(self, name)
        if is_method:
            self.push(NULL)
        self.push(attr)

    def STORE_ATTR(self, ins):
        value, obj = self.popn(2)
        obj.setattr(self, ins.arg, value)

    def DELETE_ATTR(self, ins):
        obj = self.pop()
        if not hasattr(obj, "delattr"):
            raise Unsupported(f"del of attribute {ins.arg!r} on {obj.describe()}")
        obj.delattr(self, ins.arg)

    # calls
    def KW_NAMES(self, ins):
        self.kw_names = ins.arg

    def CALL(self, ins):
        argc = ins.arg
        first, second, *args = self.popn(argc + 2)
        if isinstance(first, NullValue):
            fn = second
        else:
            fn, args = first, [second, *args]
        kwargs = {}
        if self.kw_names:
            n = len(self.kw_names)
            kwargs = dict(zip(self.kw_names, args[-n:]))
            args = args[:-n]
            self.kw_names = ()
        self.push(self.call(fn, args, kwargs))

    def CALL_FUNCTION_EX(self, ins):
        kwargs_v = self.pop() if ins.arg & 1 else None
        args_v = self.pop()
        fn = self.pop()
        if self.stack and isinstance(self.stack[-1], NullValue):
            self.pop()
        args = self.unpack_iterable(args_v)
        kwargs: dict[str, Value] = {}
        if kwargs_v is not None:
            if not isinstance(kwargs_v, DictValue):
                raise Unsupported(f"**kwargs from {kwargs_v.describe()}")
            kwargs = {str(k): v for k, v in kwargs_v.items.items()}
        self.push(self.call(fn, args, kwargs))

    def MAKE_FUNCTION(self, ins):
        flags = ins.arg
        code = self.pop().as_constant()
        closure = self.pop() if flags & 0x08 else None
        annotations = self.pop() if flags & 0x04 else None
        kwdefaults = self.pop() if flags & 0x02 else None
        defaults = self.pop() if flags & 0x01 else None
        self.push(NestedFunctionValue(
            code, self.f_globals, code.co_qualname,
            list(defaults.items) if defaults is not None else None,
            {k: v for k, v in kwdefaults.items.items()} if kwdefaults is not None else None,
            list(closure.items) if closure is not None else None,
            list(annotations.items) if annotations is not None else None))

    # containers
    def BUILD_TUPLE(self, ins):
        self.push(TupleValue(self.popn(ins.arg)))

    def BUILD_LIST(self, ins):
        self.push(ListValue(self.popn(ins.arg)))

    def BUILD_SET(self, ins):
        items = self.popn(ins.arg)
        self.push(SetValue.of(self, items))

    def BUILD_MAP(self, ins):
        flat = self.popn(2 * ins.arg)
        self.push(DictValue({self.dict_key(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}))

    def BUILD_CONST_KEY_MAP(self, ins):
        keys = self.pop().as_constant()
        values = self.popn(ins.arg)
        self.push(DictValue(dict(zip(keys, values))))

    def BUILD_STRING(self, ins):
        parts = self.popn(ins.arg)
        self.push(ConstantValue("".join(p.as_constant() for p in parts)))

    def BUILD_SLICE(self, ins):
        self.push(_make_slice(self.popn(ins.arg)))

    def LIST_APPEND(self, ins):
        v = self.pop()
        self.peek(ins.arg).base_method(self, "append", [v], {})

    # (through the containers' methods: a set or dict being built that a graph break handed
    # to a continuation has a source, and its mutation is a side effect to write back)
    def SET_ADD(self, ins):
        v = self.pop()
        self.peek(ins.arg).call_method(self, "add", [v], {})

    def MAP_ADD(self, ins):
        value = self.pop()
        key = self.pop()
        self.peek(ins.arg).base_method(self, "__setitem__", [key, value], {})

    def LIST_EXTEND(self, ins):
        v = self.pop()
        self.peek(ins.arg).items.extend(self.unpack_iterable(v))

    def SET_UPDATE(self, ins):
        v = self.pop()
        self.peek(ins.arg).call_method(self, "update", [v], {})

    def DICT_UPDATE(self, ins):
        v = self.pop()
        target = self.peek(ins.arg)
        if isinstance(v, DictValue):
            target.items.update(v.merged_items())
            return
        cls = v.python_type()
        if not hasattr(cls, "keys"):
            # ``{**x}`` takes a mapping only (dict.update would take key/value pairs too)
            raise self.user_exception(TypeError(f"'{cls.__name__}' object is not a mapping"))
        target.base_method(self, "update", [v], {})

    def DICT_MERGE(self, ins):
        v = self.pop()
        target = self.peek(ins.arg)
        if not isinstance(v, DictValue):
            raise Unsupported(f"**{v.describe()} in a call")
        merged = v.merged_items()
        for k in merged:
            if k in target.items:
                raise self.user_exception(TypeError(f"got multiple values for keyword argument {k!r}"))
        target.items.update(merged)

    def LIST_TO_TUPLE(self, ins):
        self.push(TupleValue(self.pop().items))

    def CALL_INTRINSIC_1(self, ins):
        n = bytecode_utils.intrinsic_number(ins.arg)
        if n == bytecode_utils.INTRINSIC_LIST_TO_TUPLE:
            self.LIST_TO_TUPLE(ins)
        elif n == bytecode_utils.INTRINSIC_UNARY_POSITIVE:
            self.push(self.unary(operator.pos, self.pop()))
        elif n == bytecode_utils.INTRINSIC_STOPITERATION_ERROR:
            # a generator's own handler (PEP 479): a StopIteration leaving it is a RuntimeError
            exc = self.pop()
            if isinstance(exc, ExceptionValue) and isinstance(exc.exc, StopIteration):
                error = RuntimeError("generator raised StopIteration")
                error.__cause__ = exc.exc
                exc = ExceptionValue(error)
            self.push(exc)
        else:
            raise Unsupported(f"CALL_INTRINSIC_1 {n}")

    def UNPACK_SEQUENCE(self, ins):
        items = self.unpack_iterable(self.pop())
        if len(items) > ins.arg:
            raise self.user_exception(ValueError(f"too many values to unpack (expected {ins.arg})"))
        if len(items) < ins.arg:
            raise self.user_exception(ValueError(
                f"not enough values to unpack (expected {ins.arg}, got {len(items)})"))
        for v in reversed(items):
            self.push(v)

    def UNPACK_EX(self, ins):
        before, after = ins.arg & 0xFF, ins.arg >> 8
        items = self.unpack_iterable(self.pop())
        if len(items) < before + after:
            raise self.user_exception(ValueError(
                f"not enough values to unpack (expected at least {before + after}, got {len(items)})"))
        head = items[:before]
        mid = items[before:len(items) - after]
        tail = items[len(items) - after:]
        for v in reversed([*head, ListValue(mid), *tail]):
            self.push(v)

    def FORMAT_VALUE(self, ins):
        flags = ins.arg
        spec = self.pop().as_constant() if flags & 0x04 else ""
        v = self.pop()
        if isinstance(v, SymNodeValue):
            v = specialize(v)   # the text needs the number: guarded by the ShapeEnv
        if not v.is_constant():
            raise Unsupported(f"formatting {v.describe()} into a string")
        c = v.as_constant()
        conv = flags & 0x03
        if conv == 1:
            c = str(c)
        elif conv == 2:
            c = repr(c)
        elif conv == 3:
            c = ascii(c)
        self.push(ConstantValue(format(c, spec)))

    # subscripts
    def BINARY_SUBSCR(self, ins):
        obj, index = self.popn(2)
        self.push(self.getitem(obj, index))

    def BINARY_SLICE(self, ins):
        obj, start, end = self.popn(3)
        self.push(self.getitem(obj, _make_slice([start, end])))

    def STORE_SUBSCR(self, ins):
        value, obj, index = self.popn(3)
        self.setitem(obj, index, value)

    def STORE_SLICE(self, ins):
        value, obj, start, end = self.popn(4)
        self.setitem(obj, _make_slice([start, end]), value)

    def DELETE_SUBSCR(self, ins):
        obj, index = self.popn(2)
        obj.call_method(self, "__delitem__", [index], {})

    # operators
    def BINARY_OP(self, ins):
        a, b = self.popn(2)
        self.push(self.binary(_BINARY[bytecode_utils.binary_op_name(ins.arg)], a, b))

    def COMPARE_OP(self, ins):
        a, b = self.popn(2)
        self.push(self.compare(_COMPARE[bytecode_utils.compare_op_name(ins.arg)], a, b))

    def IS_OP(self, ins):
        a, b = self.popn(2)
        self.push(ConstantValue(self.is_same(a, b) != bool(ins.arg)))

    def CONTAINS_OP(self, ins):
        x, container = self.popn(2)
        self.push(ConstantValue(self.contains_op(container, x) != bool(ins.arg)))

    def UNARY_NEGATIVE(self, ins):
        self.push(self.unary(operator.neg, self.pop()))

    def UNARY_POSITIVE(self, ins):
        self.push(self.unary(operator.pos, self.pop()))

    def UNARY_INVERT(self, ins):
        self.push(self.unary(operator.invert, self.pop()))

    def UNARY_NOT(self, ins):
        self.push(ConstantValue(not self.truthy(self.pop())))

    # control flow
    def JUMP(self, ins):
        self.jump(ins)

    def POP_JUMP_IF_FALSE(self, ins):
        if not self.truthy(self.pop()):
            self.jump(ins)

    def POP_JUMP_IF_TRUE(self, ins):
        if self.truthy(self.pop()):
            self.jump(ins)

    def POP_JUMP_IF_NONE(self, ins):
        if self.is_same(self.pop(), ConstantValue(None)):
            self.jump(ins)

    def POP_JUMP_IF_NOT_NONE(self, ins):
        if not self.is_same(self.pop(), ConstantValue(None)):
            self.jump(ins)

    def JUMP_IF_FALSE_OR_POP(self, ins):
        if not self.truthy(self.top()):
            self.jump(ins)
        else:
            self.pop()

    def JUMP_IF_TRUE_OR_POP(self, ins):
        if self.truthy(self.top()):
            self.jump(ins)
        else:
            self.pop()

    def GET_ITER(self, ins):
        self.push(self.get_iter(self.pop()))

    def FOR_ITER(self, ins):
        it = self.top()
        if not isinstance(it, IteratorValue):
            raise Unsupported(f"iteration over {it.describe()}")
        v = it.next(self)
        if v is None:
            self.pop()
            self.jump(ins)
        else:
            self.push(v)

    # with-blocks (the normal path; exceptions inside a captured frame stop the capture)
    def BEFORE_WITH(self, ins):
        ctx = self.pop()
        exit_fn = ctx.getattr(self, "__exit__")
        entered = ctx.call_method(self, "__enter__", [], {})
        self.push(exit_fn)
        self.push(entered)

    def LOAD_ASSERTION_ERROR(self, ins):
        self.push(ClassValue(AssertionError))

    def RAISE_VARARGS(self, ins):
        args = self.popn(ins.arg)
        if not args:
            if self.handled_exc is None:
                raise Unsupported("bare raise outside an except block")
            raise self.user_exception(self.handled_exc.exc)
        exc = self._exception_instance(args[0])
        if exc.source is not None:
            raise Unsupported("raising an exception object that existed before the call")
        if len(args) == 2:   # raise exc from cause
            cause = args[1]
            if cause.is_constant() and cause.as_constant() is None:
                exc.exc.__cause__ = None
            else:
                cause = self._exception_instance(cause)
                if cause.source is not None:
                    raise Unsupported("raise ... from an exception that existed before the call")
                exc.exc.__cause__ = cause.exc
            exc.exc.__suppress_context__ = True
        if self.handled_exc is not None and self.handled_exc.exc is not exc.exc:
            # raised while handling another: chained to it, as in eager
            if self.handled_exc.source is not None:
                raise Unsupported("raising while handling an exception that existed before the call")
            exc.exc.__context__ = self.handled_exc.exc
        raise self.user_exception(exc.exc)

    def _exception_instance(self, v: Value) -> "ExceptionValue":
        if isinstance(v, ClassValue) and isinstance(v.value, type) and issubclass(v.value, BaseException):
            try:
                return ExceptionValue(v.value())   # raise ValueError: the class is instantiated
            except Exception as e:
                raise self.user_exception(e)
        if isinstance(v, ExceptionValue):
            return v
        raise Unsupported(f"raise of {v.describe()}")

    # exception handlers (entered by unwind_to_handler)
    def PUSH_EXC_INFO(self, ins):
        exc = self.pop()
        prev = self.handled_exc if self.handled_exc is not None else ConstantValue(None)
        self.push(PrevExcValue(prev, exc))
        self.handled_exc = exc
        self.push(exc)

    def CHECK_EXC_MATCH(self, ins):
        match = self.pop()
        exc = self.peek(1)
        self.push(ConstantValue(issubclass(exc.python_type(), _classes(match))))

    def POP_EXCEPT(self, ins):
        slot = self.pop()
        prev = slot.prev if isinstance(slot, PrevExcValue) else slot
        self.handled_exc = prev if isinstance(prev, ExceptionValue) else None

    def RERAISE(self, ins):
        exc = self.pop()
        if not isinstance(exc, ExceptionValue):
            raise Unsupported(f"re-raising {exc.describe()}")
        raise self.user_exception(exc.exc)

    def WITH_EXCEPT_START(self, ins):
        exc = self.peek(1)
        exit_fn = self.peek(4)
        self.push(self.call(exit_fn, [ClassValue(type(exc.exc)), exc, ConstantValue(None)], {}))

    def IMPORT_NAME(self, ins):
        fromlist = self.pop()
        level = self.pop()
        self.push(import_name(self, ins.arg, fromlist.as_constant(), level.as_constant()))

    def IMPORT_FROM(self, ins):
        self.push(import_from(self, self.top(), ins.arg))


# -- helpers -------------------------------------------------------------------------------

def _guard(kind, source, expected):
    return Guard(kind, source, expected)


def _make_slice(parts: list[Value]) -> Value:
    """A slice of constants, or (a bound is a symbolic size) a symbolic slice."""
    if any(isinstance(p, TensorValue) for p in parts):
        raise Unsupported("slicing with a tensor bound (needs data)")
    if any(isinstance(p, SymNodeValue) for p in parts):
        return SymSliceValue(list(parts))
    return ConstantValue(slice(*[p.as_constant() for p in parts]))


def _wrap_const(c) -> Value:
    if isinstance(c, tuple) and type(c) is tuple:
        return TupleValue([_wrap_const(x) for x in c])
    if isinstance(c, frozenset):
        return SetValue(c, frozenset, keys=c)
    return ConstantValue(c)





def _inlined_name(fn, code: types.CodeType) -> tuple:
    """(module, qualified name) an inlined function is found by in another process: its
    ``__qualname__`` where that finds it (a dataclass's generated ``__init__`` is
    ``Output.__init__``, its code ``__create_fn__.<locals>.__init__``), else its code's."""
    module = fn.globals().get("__name__")
    real = getattr(fn, "fn", None)
    # its qualified name; a factory's function by the name its module binds it to
    # (``torch.nn.functional.max_pool2d`` is ``boolean_dispatch.<locals>.fn``)
    for where, qual in ((module, getattr(real, "__qualname__", None)),
                        (getattr(real, "__module__", None), getattr(real, "__name__", None))):
        if not (isinstance(where, str) and isinstance(qual, str)) or "<" in qual or qual == code.co_qualname:
            continue
        try:
            under = functions_under(resolve_name(where, qual))
        except Exception:
            under = []
        if any(f.__code__ is code for f in under):     # (the name may find a decorator's wrapper)
            return where, qual
    return module, code.co_qualname


class SuspendedGenerator(IteratorValue):
    """A generator made in the captured code. Its frame runs lazily, to its next ``yield`` at
    each ``next()`` (``send``, ``throw``, ``close`` as in eager), and lives on between the
    calls: its effects interleave with its consumer's as in eager, and nothing runs past the
    last item read. One still suspended at a graph break cannot be handed to the code after
    the break: the frame is then captured again with the generator made natively
    (``OutputGraph.native_generators``)."""

    lazy = True

    def __init__(self, frame: FrameInterpreter):
        super().__init__([])
        self.frame = frame
        self.started = False
        self.done = False
        self.return_value: Value = ConstantValue(None)

    def python_type(self):
        return types.GeneratorType

    def describe(self):
        return f"generator {self.frame.name} (run lazily)"

    def next(self, tx) -> Value | None:
        return self.send(tx, ConstantValue(None))

    def send(self, tx, value: Value) -> Value | None:
        """The next item, None once the generator returns (its value: ``return_value``)."""
        if self.done:
            return None
        if not self.started:
            if not (value.is_constant() and value.as_constant() is None):
                raise tx.user_exception(TypeError("can't send non-None value to a just-started generator"))
        else:
            self.frame.push(value)
        self.started = True
        return self._resume(tx)

    def throw(self, tx, exc: BaseException) -> Value | None:
        """``gen.throw(exc)``: raised where the generator is suspended, handled by its own try
        blocks; the next item, or None once it returns."""
        if self.done or not self.started:
            self.done = True
            raise tx.user_exception(exc)
        if self.frame.delegating:
            # eager throws into the inner generator of the ``yield from`` first
            raise Unsupported(f"throw() or close() into {self.describe()} while it delegates with yield from")
        at_yield = self.frame.instructions[self.frame.ip - 1]
        error = UserException(exc)
        if at_yield.handler is None or not self.frame.unwind_to_handler(at_yield, error):
            self.done = True
            raise error
        return self._resume(tx)

    def close(self, tx) -> None:
        if self.done or not self.started:
            self.done = True
            return
        try:
            item = self.throw(tx, GeneratorExit())
        except UserException as e:
            if isinstance(e.exc, (GeneratorExit, StopIteration)):
                return
            raise
        if item is not None:
            self.done = True
            raise tx.user_exception(RuntimeError("generator ignored GeneratorExit"))

    def _resume(self, tx) -> Value | None:
        try:
            self.return_value = self.frame.run()
        except _Yield as y:
            return y.value
        except UserException as e:
            self.done = True
            if isinstance(e.exc, StopIteration):      # (PEP 479)
                raise tx.user_exception(RuntimeError("generator raised StopIteration")) from None
            raise
        except BaseException:
            self.done = True
            raise
        self.done = True
        return None

    def stop_iteration(self) -> StopIteration:
        value = self.return_value
        if value.is_constant() and value.as_constant() is None:
            return StopIteration()
        if not value.is_constant():
            raise Unsupported(f"the return value of {self.describe()} in its StopIteration")
        return StopIteration(value.as_constant())

    def unpack(self, tx):
        return self.take_all(tx)

    def getattr(self, tx, name):
        if name in ("send", "throw", "close", "__next__", "__iter__"):
            return MethodValue(self, name)
        raise Unsupported(f"generator attribute {name}")

    def call_method(self, tx, name, args, kwargs):
        if kwargs:
            raise Unsupported(f"generator.{name}() with keywords")
        if name == "__iter__" and not args:
            return self
        if name in ("__next__", "send"):
            item = self.send(tx, args[0] if args else ConstantValue(None))
        elif name == "throw":
            item = self.throw(tx, _thrown(tx, args))
        elif name == "close" and not args:
            self.close(tx)
            return ConstantValue(None)
        else:
            return super().call_method(tx, name, args, kwargs)     # (``in``: taking items)
        if item is None:
            raise tx.user_exception(self.stop_iteration())
        return item

    def reconstruct_remaining(self, cg) -> str:
        raise GeneratorAtBreak(self)

    def reconstruct(self, cg):
        raise GeneratorAtBreak(self)


class GeneratorAtBreak(Unsupported):
    """A generator made in the captured code, suspended, is needed after the captured code (at
    a graph break, or returned, or stored): its frame cannot be handed over."""

    def __init__(self, gen: SuspendedGenerator):
        super().__init__(f"{gen.describe()} needed after the captured code")
        self.code = gen.frame.code


def _thrown(tx, args) -> BaseException:
    """What ``gen.throw(exc)`` raises: an exception class or instance known at capture time."""
    if len(args) != 1:
        raise Unsupported("generator.throw() with a traceback or value")
    v = args[0]
    exc = v.exc if isinstance(v, ExceptionValue) else v.as_constant() if v.is_constant() else None
    if isinstance(exc, type) and issubclass(exc, BaseException):
        exc = exc()
    if not isinstance(exc, BaseException):
        if exc is None and not v.is_constant():
            raise Unsupported(f"generator.throw({v.describe()})")
        raise tx.user_exception(TypeError("exceptions must be classes or instances deriving from BaseException"))
    return exc


# the builtins as they were when kiln was imported: a name added or replaced later is read as a
# global
_STARTUP_BUILTINS: dict = dict(vars(builtins))


def _unbound_local(name) -> UnboundLocalError:
    """What CPython 3.11+ raises reading (or deleting) an unbound local variable."""
    return UnboundLocalError(f"cannot access local variable {name!r} where it is not associated with a value")
