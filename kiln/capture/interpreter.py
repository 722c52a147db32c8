"""The symbolic bytecode interpreter: opcode handlers over symbolic values.

One ``FrameInterpreter`` runs one code object (the compiled function, or a function it
inlines) with symbolic locals, cells and stack. Tensor operations become FX nodes in the
capture's ``OutputGraph``; Python values are computed at capture time where they are known,
with guards on everything read from the outside world. Anything not modelled raises
``Unsupported``; the caller then runs the frame eagerly (or reports it under fullgraph).
"""
from __future__ import annotations

import linecache
import operator
import types
from typing import Any, Callable

import torch

from ..config import config
from ..errors import Unsupported
from . import bytecode_utils as bu
from .sources import AttrSource, ItemSource, LocalSource
from .values.base import NULL, ConstantValue, LazyArgument, NullValue, Value
from .values.builtins import BuiltinValue, call_builtin
from .values.containers import (BaseSequenceValue, DictValue, DictViewValue, IteratorValue,
                                ListValue, SetValue, TupleValue)
from .values.functions import (BoundMethodValue, CellValue, MethodValue, NestedFunctionValue,
                               NewCellValue, UserFunctionValue)
from .values.objects import ClassValue, ObjectValue, PythonModuleValue, SuperValue, static_lookup
from .values.tensor import TensorValue


class UserException(Unsupported):
    """The user's code raised ``exc`` during capture. Capture stops (the frame runs eagerly,
    where the exception is raised, or caught, for real) unless a handler inside kiln catches
    it (``getattr`` with a default, ``hasattr``, ``next`` with a default)."""

    def __init__(self, exc: BaseException):
        self.exc = exc
        super().__init__(f"the function raised {type(exc).__name__}: {exc}")


class _Return(Exception):
    def __init__(self, value: Value):
        self.value = value


class _Unbound(Value):
    """What LOAD_FAST_AND_CLEAR pushes for an unbound local (3.12 inlined comprehensions)."""


UNBOUND = _Unbound()

_BINARY = {
    "ADD": operator.add, "AND": operator.and_, "FLOOR_DIVIDE": operator.floordiv,
    "LSHIFT": operator.lshift, "MATRIX_MULTIPLY": operator.matmul, "MULTIPLY": operator.mul,
    "REMAINDER": operator.mod, "OR": operator.or_, "POWER": operator.pow,
    "RSHIFT": operator.rshift, "SUBTRACT": operator.sub, "TRUE_DIVIDE": operator.truediv,
    "XOR": operator.xor,
    "INPLACE_ADD": operator.iadd, "INPLACE_AND": operator.iand,
    "INPLACE_FLOOR_DIVIDE": operator.ifloordiv, "INPLACE_LSHIFT": operator.ilshift,
    "INPLACE_MATRIX_MULTIPLY": operator.imatmul, "INPLACE_MULTIPLY": operator.imul,
    "INPLACE_REMAINDER": operator.imod, "INPLACE_OR": operator.ior, "INPLACE_POWER": operator.ipow,
    "INPLACE_RSHIFT": operator.irshift, "INPLACE_SUBTRACT": operator.isub,
    "INPLACE_TRUE_DIVIDE": operator.itruediv, "INPLACE_XOR": operator.ixor,
}
_COMPARE = {"LT": operator.lt, "LE": operator.le, "EQ": operator.eq, "NE": operator.ne,
            "GT": operator.gt, "GE": operator.ge}
# in-place operator -> its out-of-place twin and the dunder names Python tries
_INPLACE_TO_BINARY = {
    operator.iadd: operator.add, operator.iand: operator.and_, operator.ifloordiv: operator.floordiv,
    operator.ilshift: operator.lshift, operator.imatmul: operator.matmul, operator.imul: operator.mul,
    operator.imod: operator.mod, operator.ior: operator.or_, operator.ipow: operator.pow,
    operator.irshift: operator.rshift, operator.isub: operator.sub,
    operator.itruediv: operator.truediv, operator.ixor: operator.xor,
}
_DUNDER = {
    operator.add: "add", operator.and_: "and", operator.floordiv: "floordiv",
    operator.lshift: "lshift", operator.matmul: "matmul", operator.mul: "mul", operator.mod: "mod",
    operator.or_: "or", operator.pow: "pow", operator.rshift: "rshift", operator.sub: "sub",
    operator.truediv: "truediv", operator.xor: "xor",
}
_COMPARE_DUNDER = {operator.lt: ("__lt__", "__gt__"), operator.le: ("__le__", "__ge__"),
                   operator.eq: ("__eq__", "__eq__"), operator.ne: ("__ne__", "__ne__"),
                   operator.gt: ("__gt__", "__lt__"), operator.ge: ("__ge__", "__le__")}
_UNARY = {operator.neg: "__neg__", operator.pos: "__pos__", operator.invert: "__invert__",
          operator.abs: "__abs__"}


class FrameInterpreter:
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
        self.instructions = bu.decode(code)
        self.ip = 0
        self.current: bu.Instr | None = None
        self.kw_names: tuple = ()
        self.generator_items: list[Value] | None = [] if bu.is_generator_code(code) else None
        self.trusted_globals = output.is_trusted_globals(f_globals)

    # -- driving --------------------------------------------------------------------------
    def run(self) -> Value:
        instrs = self.instructions
        try:
            while True:
                ins = instrs[self.ip]
                self.current = ins
                self.ip += 1
                self.output.count_instruction()
                handler = getattr(self, ins.opname, None)
                if handler is None:
                    raise Unsupported(f"bytecode {ins.opname}")
                handler(ins)
        except _Return as r:
            return r.value
        except Unsupported as e:
            raise e.located(*self.location())
        except (RecursionError, MemoryError):
            raise
        except Exception as e:  # a bug in kiln must not become a wrong answer: run eagerly
            raise Unsupported(f"internal error while capturing ({type(e).__name__}: {e})"
                              ).located(*self.location()) from e

    def location(self) -> tuple[str, int | None, str | None]:
        lineno = self.current.lineno if self.current is not None else self.code.co_firstlineno
        filename = self.code.co_filename
        return filename, lineno, linecache.getline(filename, lineno or 0) or None

    def user_exception(self, exc: BaseException) -> UserException:
        return UserException(exc)

    def push(self, v: Value) -> None:
        self.stack.append(v)

    def pop(self) -> Value:
        return self.stack.pop()

    def popn(self, n: int) -> list[Value]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, ins: bu.Instr) -> None:
        self.ip = ins.target

    # -- values: helpers used by value classes ---------------------------------------------
    def wrap(self, obj: Any, source, static: bool = False) -> Value:
        return self.output.builder.wrap(obj, source, static)

    def wrap_attribute(self, value: Value, name: str) -> Value:
        obj = value.real_object() if value.real_object() is not None else None
        if value.source is None:
            raise Unsupported(f"attribute {name!r} of {value.describe()} without a source")
        from .sources import RenderContext  # noqa: F401

        real = _real_of(self, value)
        try:
            attr = getattr(real, name)
        except AttributeError as e:
            raise self.user_exception(e)
        return self.wrap(attr, AttrSource(value.source, name))

    def wrap_function_part(self, fn_value: UserFunctionValue, attr: str, key, v) -> Value:
        src = fn_value.source
        if src is None:
            return self.wrap(v, None) if not isinstance(v, torch.Tensor) else self.wrap(
                v, ItemSource(AttrSource(_const_source(self, fn_value.fn), attr), key))
        return self.wrap(v, ItemSource(AttrSource(src, attr), key))

    def bind_user_attribute(self, self_value: Value, fn, name: str) -> Value:
        if isinstance(fn, types.FunctionType):
            return BoundMethodValue(UserFunctionValue(fn), self_value)
        if isinstance(fn, staticmethod):
            return self.wrap(fn.__func__, None)
        if isinstance(fn, classmethod):
            return BoundMethodValue(self.wrap(fn.__func__, None), ClassValue(self_value.python_type()))
        if isinstance(fn, property):
            return self.call(UserFunctionValue(fn.fget), [self_value], {})
        raise Unsupported(f"attribute {name!r} of type {type(fn).__name__}")

    def call(self, fn: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return fn.call(self, args, kwargs)

    def call_method(self, obj: Value, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
        return obj.call_method(self, name, args, kwargs)

    def getattr(self, obj: Value, name: str) -> Value:
        return obj.getattr(self, name)

    def setattr(self, obj: Value, name: str, value: Value) -> None:
        obj.setattr(self, name, value)

    def hasattr(self, obj: Value, name: str) -> bool:
        try:
            obj.getattr(self, name)
            return True
        except UserException as e:
            if not isinstance(e.exc, AttributeError):
                raise
            if obj.source is not None:
                from .guards import GuardKind

                self.output.builder.guard(GuardKind.HASATTR, obj.source, (name, False))
            return False

    def truthy(self, v: Value) -> bool:
        return v.truthy(self)

    def get_iter(self, v: Value) -> Value:
        if isinstance(v, IteratorValue):
            return v
        if isinstance(v, (ListValue, DictValue, DictViewValue, TupleValue)):
            it = v.call_method(self, "__iter__", [], {})
            return it if isinstance(it, IteratorValue) else self.get_iter(it)
        if isinstance(v, ObjectValue) and not isinstance(v, ClassValue):
            fn = static_lookup(v.python_type(), "__iter__")
            if isinstance(fn, types.FunctionType):
                return self.get_iter(self.call(UserFunctionValue(fn), [v], {}))
            nxt = static_lookup(v.python_type(), "__next__")
            if isinstance(nxt, types.FunctionType):
                raise Unsupported(f"iterating over a user iterator object {v.describe()}")
        return IteratorValue(v.unpack(self))

    def unpack_iterable(self, v: Value) -> list[Value]:
        if isinstance(v, IteratorValue):
            return v.unpack(self)
        if isinstance(v, (BaseSequenceValue,)) and v.override("__iter__") is None:
            return list(v.items)
        return self.get_iter(v).unpack(self)

    def contains(self, items: list[Value], x: Value) -> bool:
        return any(self.values_equal(i, x) for i in items)

    def values_equal(self, a: Value, b: Value) -> bool:
        if a is b:
            return True
        if a.is_constant() and b.is_constant():
            return a.as_constant() == b.as_constant()
        ra, rb = a.real_object(), b.real_object()
        if ra is not None and rb is not None and not isinstance(ra, torch.Tensor):
            return ra == rb if type(ra).__eq__ is object.__eq__ else bool(ra == rb)
        if isinstance(a, TensorValue) or isinstance(b, TensorValue):
            raise Unsupported("comparing tensors by value (needs data)")
        if (a.is_constant() and a.as_constant() is None) or (b.is_constant() and b.as_constant() is None):
            return False
        raise Unsupported(f"equality of {a.describe()} and {b.describe()}")

    def dict_key(self, v: Value):
        if isinstance(v, TensorValue):
            return v  # tensors hash by identity, and values preserve tensor identity
        if v.is_constant():
            return v.as_constant()
        r = v.real_object()
        if r is not None and not isinstance(r, torch.Tensor):
            try:
                hash(r)
                return r
            except TypeError:
                pass
        raise Unsupported(f"a dict key that is not a Python constant ({v.describe()})")

    def key_value(self, k) -> Value:
        if isinstance(k, Value):
            return k
        return self.wrap(k, None)

    def zero_arg_super(self) -> tuple[type, Value]:
        cell = self.cells.get("__class__")
        if cell is None or self.code.co_argcount == 0:
            raise Unsupported("super() without arguments outside a method")
        cls = cell.get(self).as_constant()
        first = self.code.co_varnames[0]
        obj = self.locals.get(first)
        if isinstance(obj, LazyArgument):
            obj = self.locals[first] = obj.realize(self)
        if obj is None and first in self.cells:
            obj = self.cells[first].get(self)
        return cls, obj

    # -- inlining --------------------------------------------------------------------------
    def inline_function(self, fn: UserFunctionValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
        code = fn.code()
        if bu.is_async_code(code):
            raise Unsupported(f"calling async function {fn.name()}")
        if self.depth >= config.max_inline_depth:
            raise Unsupported(f"inlining deeper than config.max_inline_depth={config.max_inline_depth}")
        f_locals = bind_arguments(self, code, fn.name(), args, kwargs, fn.defaults(self), fn.kwdefaults(self))
        cells: dict[str, CellValue] = {}
        for name, cell in zip(code.co_freevars, fn.closure_cells(self)):
            cells[name] = cell
        child = FrameInterpreter(self.output, code, fn.globals(), f_locals, cells, parent=self,
                                 name=fn.name())
        result = child.run()
        if child.generator_items is not None:
            return IteratorValue(child.generator_items)
        return result

    # -- operators --------------------------------------------------------------------------
    def operator_handler(self, fn) -> Callable | None:
        if fn in _DUNDER or fn in _INPLACE_TO_BINARY or fn in _COMPARE_DUNDER:
            return lambda args, kwargs: self.binary(fn, *args)
        if fn in _UNARY:
            return lambda args, kwargs: self.unary(fn, args[0])
        if fn is operator.getitem:
            return lambda args, kwargs: self.getitem(*args)
        if fn is operator.setitem:
            return lambda args, kwargs: (self.setitem(*args), ConstantValue(None))[1]
        if fn is operator.not_:
            return lambda args, kwargs: ConstantValue(not self.truthy(args[0]))
        if fn is operator.truth:
            return lambda args, kwargs: ConstantValue(self.truthy(args[0]))
        if fn in (operator.is_, operator.is_not):
            return lambda args, kwargs: ConstantValue(self.is_same(*args) == (fn is operator.is_))
        if fn is operator.contains:
            return lambda args, kwargs: ConstantValue(self.contains_op(args[1], args[0]))
        if fn is operator.index:
            return lambda args, kwargs: ConstantValue(operator.index(args[0].as_constant()))
        return None

    def binary(self, op, a: Value, b: Value) -> Value:
        if isinstance(a, TensorValue) or isinstance(b, TensorValue):
            if isinstance(a, ObjectValue) or isinstance(b, ObjectValue):
                raise Unsupported("operator between a tensor and a user object")
            return self.output.call_op("call_function", op, (a, b), {},
                                       inplace_of=a if op in _INPLACE_TO_BINARY else None)
        if a.is_constant() and b.is_constant() and not isinstance(a, (ListValue, DictValue)) \
                and not isinstance(b, (ListValue, DictValue)):
            try:
                return _wrap_result(op(a.as_constant(), b.as_constant()))
            except Exception as e:
                raise self.user_exception(e)
        base_op = _INPLACE_TO_BINARY.get(op, op)
        if isinstance(a, ObjectValue) and not isinstance(a, ClassValue) or \
                isinstance(b, ObjectValue) and not isinstance(b, ClassValue):
            return self._user_binary(op, base_op, a, b)
        if isinstance(a, ListValue) and op is operator.iadd:
            a.base_method(self, "extend", [b], {})
            return a
        if isinstance(a, BaseSequenceValue) and isinstance(b, BaseSequenceValue) and base_op is operator.add:
            if a.base_type is not b.base_type:
                raise self.user_exception(TypeError("can only concatenate list/tuple to same type"))
            return type(a)(a.items + b.items, None, a.base_type)
        if isinstance(a, BaseSequenceValue) and base_op is operator.mul and b.is_constant():
            n = b.as_constant()
            if isinstance(a, ListValue) and op is operator.imul:
                a._mutate(self)
                a.items[:] = a.items * n
                return a
            return type(a)(a.items * n, None, a.base_type)
        if isinstance(b, BaseSequenceValue) and base_op is operator.mul and a.is_constant():
            return type(b)(b.items * a.as_constant(), None, b.base_type)
        if isinstance(a, DictValue) and isinstance(b, DictValue) and base_op is operator.or_:
            if op is operator.ior:
                a.base_method(self, "update", [b], {})
                return a
            return DictValue({**a.items, **b.items})
        if op in _COMPARE_DUNDER:
            return self.compare(op, a, b)
        if isinstance(a, SetValue) and isinstance(b, SetValue):
            keys = base_op(set(a.items), set(b.items))
            known = {**b.items, **a.items}
            return SetValue({k: known[k] for k in keys}, a.cls)
        raise Unsupported(f"operator {getattr(op, '__name__', op)} on {a.describe()} and {b.describe()}")

    def _user_binary(self, op, base_op, a, b):
        name = _DUNDER.get(base_op)
        if op in _COMPARE_DUNDER:
            fwd, rev = _COMPARE_DUNDER[op]
        else:
            fwd, rev = f"__{name}__", f"__r{name}__"
        if op in _INPLACE_TO_BINARY and isinstance(a, ObjectValue):
            ifn = static_lookup(a.python_type(), f"__i{name}__")
            if isinstance(ifn, types.FunctionType):
                r = self.call(UserFunctionValue(ifn), [a, b], {})
                if not (r.is_constant() and r.as_constant() is NotImplemented):
                    return r
        for x, y, meth in ((a, b, fwd), (b, a, rev)):
            if isinstance(x, ObjectValue) and not isinstance(x, ClassValue):
                fn = static_lookup(x.python_type(), meth)
                if isinstance(fn, types.FunctionType):
                    r = self.call(UserFunctionValue(fn), [x, y], {})
                    if not (r.is_constant() and r.as_constant() is NotImplemented):
                        return r
        if op in (operator.eq, operator.ne):
            same = self.is_same(a, b)
            return ConstantValue(same if op is operator.eq else not same)
        raise Unsupported(f"operator {getattr(op, '__name__', op)} on {a.describe()} and {b.describe()}")

    def compare(self, op, a: Value, b: Value) -> Value:
        if isinstance(a, TensorValue) or isinstance(b, TensorValue):
            other = b if isinstance(a, TensorValue) else a
            if other.is_constant() and other.as_constant() is None and op in (operator.eq, operator.ne):
                return ConstantValue(op is operator.ne)
            return self.binary(op, a, b)
        if isinstance(a, (BaseSequenceValue,)) and isinstance(b, BaseSequenceValue) and op in (operator.eq, operator.ne):
            eq = a.base_type is b.base_type and len(a.items) == len(b.items) and all(
                self.values_equal(x, y) for x, y in zip(a.items, b.items))
            return ConstantValue(eq if op is operator.eq else not eq)
        if a.is_constant() and b.is_constant():
            try:
                return _wrap_result(op(a.as_constant(), b.as_constant()))
            except Exception as e:
                raise self.user_exception(e)
        if op in (operator.eq, operator.ne):
            if isinstance(a, ObjectValue) or isinstance(b, ObjectValue):
                return self._user_binary(op, op, a, b)
            eq = self.values_equal(a, b)
            return ConstantValue(eq if op is operator.eq else not eq)
        raise Unsupported(f"comparison {op.__name__} of {a.describe()} and {b.describe()}")

    def unary(self, op, v: Value) -> Value:
        if isinstance(v, TensorValue):
            return self.output.call_op("call_function", op, (v,), {})
        if v.is_constant():
            try:
                return _wrap_result(op(v.as_constant()))
            except Exception as e:
                raise self.user_exception(e)
        if isinstance(v, ObjectValue):
            fn = static_lookup(v.python_type(), _UNARY[op])
            if isinstance(fn, types.FunctionType):
                return self.call(UserFunctionValue(fn), [v], {})
        raise Unsupported(f"unary {op.__name__} on {v.describe()}")

    def is_same(self, a: Value, b: Value) -> bool:
        if a is b:
            return True
        if isinstance(a, NullValue) or isinstance(b, NullValue):
            return False
        ac, bc = a.is_constant(), b.is_constant()
        if ac and bc and not isinstance(a, (BaseSequenceValue, SetValue)) and not isinstance(b, (BaseSequenceValue, SetValue)):
            return a.as_constant() is b.as_constant()
        ra, rb = a.real_object(), b.real_object()
        if ra is not None and rb is not None:
            return ra is rb
        if (ac and a.as_constant() is None) or (bc and b.as_constant() is None):
            return False
        if isinstance(a, (TensorValue, BaseSequenceValue, DictValue, NestedFunctionValue)) or \
                isinstance(b, (TensorValue, BaseSequenceValue, DictValue, NestedFunctionValue)):
            return False  # distinct symbolic objects (in-place ops return their receiver's value)
        raise Unsupported(f"identity of {a.describe()} and {b.describe()}")

    def contains_op(self, container: Value, x: Value) -> bool:
        if isinstance(container, ConstantValue):
            if not x.is_constant():
                if isinstance(x, TensorValue):
                    raise Unsupported("`in` test of a tensor (compares values)")
                return False
            try:
                return x.as_constant() in container.as_constant()
            except TypeError as e:
                raise self.user_exception(e)
        if isinstance(container, ObjectValue):
            fn = static_lookup(container.python_type(), "__contains__")
            if isinstance(fn, types.FunctionType):
                return self.truthy(self.call(UserFunctionValue(fn), [container, x], {}))
            return self.contains(self.unpack_iterable(container), x)
        if isinstance(container, TensorValue):
            raise Unsupported("`in` test on a tensor (needs data)")
        return self.truthy(container.call_method(self, "__contains__", [x], {}))

    def getitem(self, obj: Value, index: Value) -> Value:
        if isinstance(obj, TensorValue):
            return obj.call_method(self, "__getitem__", [index], {})
        if isinstance(obj, (BaseSequenceValue, DictValue)):
            return obj.call_method(self, "__getitem__", [index], {})
        if isinstance(obj, ConstantValue):
            try:
                return _wrap_result(obj.as_constant()[index.as_constant()])
            except Exception as e:
                raise self.user_exception(e)
        if isinstance(obj, ClassValue):
            cg = static_lookup(obj.value, "__class_getitem__")
            if cg is not None:
                return _wrap_result(obj.value[index.as_constant()])
        return obj.call_method(self, "__getitem__", [index], {})

    def setitem(self, obj: Value, index: Value, value: Value) -> None:
        obj.call_method(self, "__setitem__", [index, value], {})

    # -- opcode handlers ---------------------------------------------------------------------
    def NOP(self, ins):
        pass

    RESUME = NOP
    COPY_FREE_VARS = NOP  # cells of free variables are installed when the frame is created

    def MAKE_CELL(self, ins):
        name = bu.cell_name(ins.arg)
        if name in self.cells and not isinstance(self.cells[name], NewCellValue):
            return
        v = self.locals.pop(name, None)
        self.cells[name] = NewCellValue(name, v.realize(self) if isinstance(v, LazyArgument) else v)

    def LOAD_CONST(self, ins):
        self.push(_wrap_const(ins.arg))

    def RETURN_CONST(self, ins):
        self.push(_wrap_const(ins.arg))
        self.RETURN_VALUE(ins)

    def RETURN_VALUE(self, ins):
        raise _Return(self.pop())

    def RETURN_GENERATOR(self, ins):
        if self.generator_items is None:
            raise Unsupported("generator")
        self.push(ConstantValue(None))

    def YIELD_VALUE(self, ins):
        if self.generator_items is None:
            raise Unsupported("yield outside a generator being materialized")
        self.generator_items.append(self.pop())
        self.push(ConstantValue(None))  # the value sent in by next()

    def GET_YIELD_FROM_ITER(self, ins):
        self.push(self.get_iter(self.pop()))

    def SEND(self, ins):
        self.pop()  # the value sent in: always None when a generator is materialized
        receiver = self.stack[-1]
        if not isinstance(receiver, IteratorValue):
            raise Unsupported(f"yield from {receiver.describe()}")
        item = receiver.next(self)
        if item is None:
            if bu.SEND_KEEPS_RECEIVER:
                self.push(ConstantValue(None))
            else:
                self.stack[-1] = ConstantValue(None)
            self.jump(ins)
        else:
            self.push(item)

    def END_SEND(self, ins):
        value = self.pop()
        self.pop()
        self.push(value)

    def LOAD_FAST(self, ins):
        v = self.locals.get(ins.arg)
        if v is None:
            raise self.user_exception(UnboundLocalError(
                f"local variable {ins.arg!r} referenced before assignment"))
        if isinstance(v, LazyArgument):
            v = self.locals[ins.arg] = v.realize(self)
        self.push(v)

    def LOAD_FAST_AND_CLEAR(self, ins):
        v = self.locals.pop(ins.arg, UNBOUND)
        self.push(v.realize(self) if isinstance(v, LazyArgument) else v)

    def STORE_FAST(self, ins):
        v = self.pop()
        if v is UNBOUND:
            self.locals.pop(ins.arg, None)
        else:
            self.locals[ins.arg] = v

    def DELETE_FAST(self, ins):
        self.locals.pop(ins.arg, None)

    def LOAD_GLOBAL(self, ins):
        push_null, name = ins.arg
        if push_null:
            self.push(NULL)
        self.push(self.load_global(name))

    def load_global(self, name: str) -> Value:
        from .guards import GuardKind
        from .sources import GlobalSource

        g = self.f_globals
        if name in g:
            src = GlobalSource(g, name)
            if self.trusted_globals:
                return self.wrap(g[name], None) if not isinstance(g[name], torch.Tensor) else self.wrap(g[name], src)
            return self.wrap(g[name], src)
        if name in self.f_builtins:
            if not self.trusted_globals:
                self.output.guards.add(_guard(GuardKind.GLOBAL_ABSENT, None, (g, name)))
            return self.wrap(self.f_builtins[name], None)
        raise self.user_exception(NameError(f"name {name!r} is not defined"))

    def STORE_GLOBAL(self, ins):
        raise Unsupported(f"assignment to global {ins.arg!r}")

    def LOAD_DEREF(self, ins):
        name = bu.cell_name(ins.arg)
        cell = self.cells.get(name)
        if cell is None:
            raise Unsupported(f"closure variable {name!r} without a cell")
        self.push(cell.get(self))

    def STORE_DEREF(self, ins):
        name = bu.cell_name(ins.arg)
        cell = self.cells.get(name)
        if cell is None:
            cell = self.cells[name] = NewCellValue(name)
        cell.set(self, self.pop())

    def LOAD_CLOSURE(self, ins):
        name = bu.cell_name(ins.arg)
        cell = self.cells.get(name)
        if cell is None:
            cell = self.cells[name] = NewCellValue(name, self.locals.pop(name, None))
        self.push(cell)

    def POP_TOP(self, ins):
        self.pop()

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
        attr = obj.getattr(self, name)
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
        obj = self.pop()
        value = self.pop()
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
        args = self.popn(argc)
        second = self.pop()
        first = self.pop()
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
        if flags & 0x04:
            self.pop()  # annotations
        kwdefaults = self.pop() if flags & 0x02 else None
        defaults = self.pop() if flags & 0x01 else None
        self.push(NestedFunctionValue(
            code, self.f_globals, code.co_qualname,
            list(defaults.items) if defaults is not None else None,
            {k: v for k, v in kwdefaults.items.items()} if kwdefaults is not None else None,
            list(closure.items) if closure is not None else None))

    # containers
    def BUILD_TUPLE(self, ins):
        self.push(TupleValue(self.popn(ins.arg)))

    def BUILD_LIST(self, ins):
        self.push(ListValue(self.popn(ins.arg)))

    def BUILD_SET(self, ins):
        items = self.popn(ins.arg)
        self.push(SetValue({self.dict_key(i): i for i in items}))

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
        parts = [p.as_constant() if not isinstance(p, TensorValue) else _no_tensor_slice()
                 for p in self.popn(ins.arg)]
        self.push(ConstantValue(slice(*parts)))

    def LIST_APPEND(self, ins):
        v = self.pop()
        self.stack[-ins.arg].base_method(self, "append", [v], {})

    def SET_ADD(self, ins):
        v = self.pop()
        self.stack[-ins.arg].items.setdefault(self.dict_key(v), v)

    def MAP_ADD(self, ins):
        value = self.pop()
        key = self.pop()
        self.stack[-ins.arg].items[self.dict_key(key)] = value

    def LIST_EXTEND(self, ins):
        v = self.pop()
        self.stack[-ins.arg].items.extend(self.unpack_iterable(v))

    def SET_UPDATE(self, ins):
        v = self.pop()
        for i in self.unpack_iterable(v):
            self.stack[-ins.arg].items.setdefault(self.dict_key(i), i)

    def DICT_UPDATE(self, ins):
        v = self.pop()
        target = self.stack[-ins.arg]
        if isinstance(v, DictValue):
            target.items.update(v.items)
        else:
            target.base_method(self, "update", [v], {})

    def DICT_MERGE(self, ins):
        v = self.pop()
        target = self.stack[-ins.arg]
        if not isinstance(v, DictValue):
            raise Unsupported(f"**{v.describe()} in a call")
        for k in v.items:
            if k in target.items:
                raise self.user_exception(TypeError(f"got multiple values for keyword argument {k!r}"))
        target.items.update(v.items)

    def LIST_TO_TUPLE(self, ins):
        self.push(TupleValue(self.pop().items))

    def CALL_INTRINSIC_1(self, ins):
        n = bu.intrinsic_number(ins.arg)
        if n == bu.INTRINSIC_LIST_TO_TUPLE:
            self.LIST_TO_TUPLE(ins)
        elif n == bu.INTRINSIC_UNARY_POSITIVE:
            self.push(self.unary(operator.pos, self.pop()))
        else:
            raise Unsupported(f"CALL_INTRINSIC_1 {n}")

    def UNPACK_SEQUENCE(self, ins):
        items = self.unpack_iterable(self.pop())
        if len(items) != ins.arg:
            raise self.user_exception(ValueError(
                f"expected {ins.arg} values to unpack, got {len(items)}"))
        for v in reversed(items):
            self.push(v)

    def UNPACK_EX(self, ins):
        before, after = ins.arg & 0xFF, ins.arg >> 8
        items = self.unpack_iterable(self.pop())
        if len(items) < before + after:
            raise self.user_exception(ValueError("not enough values to unpack"))
        head = items[:before]
        mid = items[before:len(items) - after]
        tail = items[len(items) - after:]
        for v in reversed([*head, ListValue(mid), *tail]):
            self.push(v)

    def FORMAT_VALUE(self, ins):
        flags = ins.arg
        spec = self.pop().as_constant() if flags & 0x04 else ""
        v = self.pop()
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
        index = self.pop()
        obj = self.pop()
        self.push(self.getitem(obj, index))

    def BINARY_SLICE(self, ins):
        end = self.pop()
        start = self.pop()
        obj = self.pop()
        self.push(self.getitem(obj, ConstantValue(slice(start.as_constant(), end.as_constant()))))

    def STORE_SUBSCR(self, ins):
        index = self.pop()
        obj = self.pop()
        value = self.pop()
        self.setitem(obj, index, value)

    def STORE_SLICE(self, ins):
        end = self.pop()
        start = self.pop()
        obj = self.pop()
        value = self.pop()
        self.setitem(obj, ConstantValue(slice(start.as_constant(), end.as_constant())), value)

    def DELETE_SUBSCR(self, ins):
        index = self.pop()
        obj = self.pop()
        obj.call_method(self, "__delitem__", [index], {})

    # operators
    def BINARY_OP(self, ins):
        b = self.pop()
        a = self.pop()
        self.push(self.binary(_BINARY[bu.binary_op_name(ins.arg)], a, b))

    def COMPARE_OP(self, ins):
        b = self.pop()
        a = self.pop()
        self.push(self.compare(_COMPARE[bu.compare_op_name(ins.arg)], a, b))

    def IS_OP(self, ins):
        b = self.pop()
        a = self.pop()
        self.push(ConstantValue(self.is_same(a, b) != bool(ins.arg)))

    def CONTAINS_OP(self, ins):
        container = self.pop()
        x = self.pop()
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
        if not self.truthy(self.stack[-1]):
            self.jump(ins)
        else:
            self.pop()

    def JUMP_IF_TRUE_OR_POP(self, ins):
        if self.truthy(self.stack[-1]):
            self.jump(ins)
        else:
            self.pop()

    def GET_ITER(self, ins):
        self.push(self.get_iter(self.pop()))

    def FOR_ITER(self, ins):
        it = self.stack[-1]
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
        exc = args[0] if args else None
        if isinstance(exc, ClassValue):
            raise self.user_exception(exc.value())
        raise Unsupported("raise statement")

    def IMPORT_NAME(self, ins):
        import sys

        self.pop()
        self.pop()
        name = ins.arg
        mod = sys.modules.get(name)
        if mod is None:
            raise Unsupported(f"import of a module not yet imported ({name})")
        top = sys.modules[name.split(".")[0]]
        self.push(PythonModuleValue(top if "." in name else mod, None))

    def IMPORT_FROM(self, ins):
        mod = self.stack[-1]
        self.push(mod.getattr(self, ins.arg))


# -- helpers -------------------------------------------------------------------------------

def _guard(kind, source, expected):
    from .guards import Guard

    return Guard(kind, source, expected)


def _no_tensor_slice():
    raise Unsupported("slicing with a tensor bound (needs data)")


def _wrap_const(c) -> Value:
    if isinstance(c, tuple) and type(c) is tuple:
        return TupleValue([_wrap_const(x) for x in c])
    if isinstance(c, frozenset):
        return SetValue(c, frozenset)
    return ConstantValue(c)


def _wrap_result(v) -> Value:
    from .values.builder import wrap_pure_result

    return wrap_pure_result(v)


def _real_of(tx, value: Value):
    r = value.real_object()
    if r is not None:
        return r
    if value.source is not None:
        return tx.output.evaluate_source(value.source)
    raise Unsupported(f"no real object for {value.describe()}")


def _const_source(tx, obj):
    from .sources import ConstSource

    return ConstSource(obj)


def bind_arguments(tx, code: types.CodeType, name: str, args: list[Value], kwargs: dict[str, Value],
                   defaults: list[Value], kwdefaults: dict[str, Value]) -> dict[str, Value]:
    """Python's argument binding, over symbolic values."""
    nargs = code.co_argcount
    nposonly = code.co_posonlyargcount
    nkwonly = code.co_kwonlyargcount
    names = code.co_varnames
    pos_names = names[:nargs]
    kwonly_names = names[nargs:nargs + nkwonly]
    i = nargs + nkwonly
    varargs_name = names[i] if code.co_flags & bu.CO_VARARGS else None
    if varargs_name:
        i += 1
    varkw_name = names[i] if code.co_flags & bu.CO_VARKEYWORDS else None

    def err(msg):
        return tx.user_exception(TypeError(f"{name}() {msg}"))

    bound: dict[str, Value] = {}
    for pname, v in zip(pos_names, args):
        bound[pname] = v
    extra = args[nargs:]
    if extra and varargs_name is None:
        raise err(f"takes {nargs} positional arguments but {len(args)} were given")
    if varargs_name:
        bound[varargs_name] = TupleValue(list(extra))
    varkw: dict[str, Value] = {}
    for k, v in kwargs.items():
        if k in pos_names[nposonly:] or k in kwonly_names:
            if k in bound:
                raise err(f"got multiple values for argument {k!r}")
            bound[k] = v
        elif varkw_name is not None:
            varkw[k] = v
        else:
            raise err(f"got an unexpected keyword argument {k!r}")
    first_default = nargs - len(defaults)
    for j, pname in enumerate(pos_names):
        if pname not in bound:
            if j >= first_default:
                bound[pname] = defaults[j - first_default]
            else:
                raise err(f"missing required positional argument {pname!r}")
    for pname in kwonly_names:
        if pname not in bound:
            if pname in kwdefaults:
                bound[pname] = kwdefaults[pname]
            else:
                raise err(f"missing required keyword-only argument {pname!r}")
    if varkw_name is not None:
        bound[varkw_name] = DictValue(varkw)
    return bound
