"""Callables: user functions (inlined), nested functions and cells, bound methods, partials,
methods of values, pure methods of constants, and torch operators (graph nodes)."""
from __future__ import annotations

import inspect
import traceback
import types
from inspect import signature as _inspect_signature

import torch

from ...errors import Unsupported
from .. import regions
from ..guards import GuardKind
from ..sources import AttrSource, CellSource, ItemSource, is_argument_rooted
from .base import ConstantValue, MadeInOrder, RealCallableValue, Value

# standard-library functions that read the frames of their callers (see builtins.FRAME_READERS)
_FRAME_READERS = frozenset((inspect.currentframe, inspect.stack, inspect.getouterframes, traceback.extract_stack,
                            traceback.format_stack, traceback.print_stack, traceback.walk_stack))

# torch.autograd.Function.apply: called on a user's Function, it is captured, not inlined
_FUNCTION_APPLY = torch.autograd.Function.apply.__func__


class UserFunctionValue(Value):
    """A real Python function; calls are inlined into the capture."""

    def __init__(self, fn: types.FunctionType, source=None):
        self.fn = fn
        self.source = source
        # set for a function of the call (guarded by its code): the identity guard to add
        # where its identity is used (``is``, ``==``, a dict key)
        self.on_identity = None

    def python_type(self):
        return types.FunctionType

    def real_object(self):
        if self.on_identity is not None:
            self.on_identity()
            self.on_identity = None
        return self.fn

    def describe(self):
        return f"Function({self.fn.__qualname__})"

    def call(self, tx, args, kwargs):
        if self.fn is _inspect_signature and len(args) == 1 and not kwargs:
            return signature_of(tx, args[0])
        if self.fn is _FUNCTION_APPLY and args:   # MyFn.apply(...): see autograd_function.py
            from .autograd_function import call_apply  # cycle: they are function values

            return call_apply(tx, args[0], args[1:], kwargs)
        from .attributes import MODELLED, call_modelled  # cycle: attribute lookup calls functions

        if self.fn in MODELLED:   # nn.Module.__setattr__(self, ...): the module store itself
            return call_modelled(tx, self.fn, args, kwargs)
        if _is_stdlib_function(self.fn):
            e = Unsupported(f"call to standard-library function "
                            f"{self.fn.__module__}.{self.fn.__qualname__} (runs natively)")
            if self.fn in _FRAME_READERS:
                e.reads_frames = True       # (see builtins.FRAME_READERS)
            raise e
        if self.source is not None:
            # inlined as its code is now: ``f.__code__ = other`` later is a new function
            tx.output.builder.guard(GuardKind.ID_MATCH, AttrSource(self.source, "__code__"), self.fn.__code__)
        marked = regions.marked_region(self.fn)
        if marked is not None:      # torch.compiler.nested_compile_region: a block of its own
            # (the wrapper's code is the same for every wrapped function: the function it
            # wraps is guarded as any inlined function is, by its code and what it reads)
            inner = UserFunctionValue(marked, regions.marked_region_source(self.fn, self.source))
            if inner.source is not None:
                tx.output.builder.guard(GuardKind.ID_MATCH, AttrSource(inner.source, "__code__"), marked.__code__)
            return regions.record(tx, getattr(marked, "__qualname__", "region"), True,
                                  lambda: tx.inline_function(inner, args, kwargs))
        return tx.inline_function(self, args, kwargs)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__code__"):
            value = getattr(self.fn, name)
            if self.source is not None:     # (all of them may be assigned)
                kind = GuardKind.ID_MATCH if name == "__code__" else GuardKind.EQUALS_MATCH
                tx.output.builder.guard(kind, AttrSource(self.source, name), value)
            return ConstantValue(value)
        if self.source is not None:
            return tx.wrap_attribute(self, name)
        raise Unsupported(f"attribute {name!r} of function {self.fn.__qualname__}")

    def truthy(self, tx):
        return True

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.bind(self.fn, "fn")

    # What the interpreter needs to inline it.
    def code(self):
        return self.fn.__code__

    def globals(self):
        return self.fn.__globals__

    def name(self):
        return self.fn.__qualname__

    def defaults(self, tx) -> list[Value]:
        d = self.fn.__defaults__ or ()
        return [tx.wrap_function_part(self, "__defaults__", i, v) for i, v in enumerate(d)]

    def kwdefaults(self, tx) -> dict[str, Value]:
        d = self.fn.__kwdefaults__ or {}
        return {k: tx.wrap_function_part(self, "__kwdefaults__", k, v) for k, v in d.items()}

    def closure_cells(self, tx) -> list["CellValue"]:
        cells = zip(self.fn.__closure__ or (), self.fn.__code__.co_freevars)
        if self.source is not None and is_argument_rooted(self.source):
            # a function of the call (made by the caller): its cells are read through it, so
            # that the entry does not keep them (and the call's values in them) alive
            closure = AttrSource(self.source, "__closure__")
            return [ExistingCellValue(c, name, ItemSource(closure, i)) for i, (c, name) in enumerate(cells)]
        return [ExistingCellValue(c, name) for c, name in cells]


# Standard-library modules whose Python functions kiln does inline (pure helpers that models
# use in their forward). Others (logging, warnings, threading, ...) are called natively.
_INLINED_STDLIB = frozenset({"functools", "operator", "collections", "itertools", "typing",
                             "dataclasses", "enum", "copy", "abc", "math", "numbers", "contextlib",
                             "_collections_abc", "types", "copyreg"})


def signature_of(tx, v: Value) -> Value:
    """``inspect.signature(f)`` of a function known at capture time, evaluated then. It relies
    on what inlining the function relies on: its identity, guarded where it was read, and its
    code; its defaults are guarded as values (as an inlined call reads them)."""
    target, bound = v, False
    if isinstance(v, BoundMethodValue):
        target, bound = v.func, True
    fn = getattr(target, "fn", None) if type(target) is UserFunctionValue else None
    if fn is None or "__wrapped__" in fn.__dict__ or "__signature__" in fn.__dict__:
        raise Unsupported(f"inspect.signature of {v.describe()} (runs natively)")
    defaults = [*target.defaults(tx), *target.kwdefaults(tx).values()]  # guarded as read
    if not all(d.is_constant() for d in defaults):
        raise Unsupported(f"inspect.signature of {v.describe()}, whose defaults are not constants")
    for d in defaults:
        d.as_constant()  # the signature embeds their values: guard them (EQUALS_MATCH)
    sig = _inspect_signature(types.MethodType(fn, object()) if bound else fn)
    return ConstantValue(sig)


def _is_stdlib_function(fn) -> bool:
    import sys

    mod = getattr(fn, "__module__", None) or ""
    top = mod.split(".", 1)[0]
    return top in sys.stdlib_module_names and top not in _INLINED_STDLIB


class NestedFunctionValue(UserFunctionValue):
    """A function created by MAKE_FUNCTION during capture (a closure, lambda, comprehension)."""

    def __init__(self, code: types.CodeType, fn_globals: dict, qualname: str,
                 defaults: list[Value] | None, kwdefaults: dict[str, Value] | None,
                 closure: list["CellValue"] | None, annotations: list[Value] | None = None):
        self.code_obj = code
        # (MAKE_FUNCTION's flat tuple: name, value, name, value, ...)
        self.annotations_v = annotations or []
        self.fn_globals = fn_globals
        self.qualname = qualname
        self.defaults_v = defaults or []
        self.kwdefaults_v = kwdefaults or {}
        self.closure = closure or []
        self.source = None

    def real_object(self):
        return None

    def describe(self):
        return f"NestedFunction({self.qualname})"

    def call(self, tx, args, kwargs):
        return tx.inline_function(self, args, kwargs)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__"):
            return ConstantValue(self.qualname.rsplit(".", 1)[-1] if name == "__name__" else self.qualname)
        raise Unsupported(f"attribute {name!r} of nested function {self.qualname}")

    def code(self):
        return self.code_obj

    def globals(self):
        return self.fn_globals

    def name(self):
        return self.qualname

    def defaults(self, tx):
        return list(self.defaults_v)

    def kwdefaults(self, tx):
        return dict(self.kwdefaults_v)

    def closure_cells(self, tx):
        return list(self.closure)

    def reconstruct(self, cg):
        def build():
            defaults = "(" + "".join(d.reconstruct(cg) + ", " for d in self.defaults_v) + ")" \
                if self.defaults_v else "None"
            kwd = "{" + ", ".join(f"{k!r}: {v.reconstruct(cg)}" for k, v in self.kwdefaults_v.items()) + "}" \
                if self.kwdefaults_v else "None"
            closure = "(" + "".join(c.reconstruct(cg) + ", " for c in self.closure) + ")" \
                if self.closure else "None"
            annotations = "(" + "".join(a.reconstruct(cg) + ", " for a in self.annotations_v) + ")" \
                if self.annotations_v else "None"
            return (f"{cg.bind(_make_function)}({cg.bind(self.code_obj, 'code')}, {cg.bind(self.fn_globals, 'G')}, "
                    f"{self.qualname!r}, {defaults}, {kwd}, {closure}, {annotations})")
        return cg.stash(self, build)


def _make_function(code, fn_globals, qualname, defaults, kwdefaults, closure, annotations=None):
    fn = types.FunctionType(code, fn_globals, code.co_name, defaults, closure)
    fn.__qualname__ = qualname
    if kwdefaults:
        fn.__kwdefaults__ = kwdefaults
    if annotations:
        fn.__annotations__ = dict(zip(annotations[::2], annotations[1::2]))
    return fn


class CellValue(Value):
    """A closure cell: ``get``/``set`` its contents."""

    def get(self, tx) -> Value:
        raise NotImplementedError

    def set(self, tx, value: Value) -> None:
        raise NotImplementedError


class NewCellValue(MadeInOrder, CellValue):
    """A cell created by this frame (MAKE_CELL): its contents are tracked symbolically."""

    def __init__(self, name: str, contents: Value | None = None):
        self.name = name
        self.contents = contents

    def get(self, tx):
        if self.contents is None:
            raise tx.user_exception(NameError(
                f"cannot access free variable {self.name!r} where it is not associated with a value "
                "in enclosing scope"))
        return self.contents

    def set(self, tx, value):
        tx.output.side_effects.wrote(self)
        self.contents = value

    def getattr(self, tx, name):
        if name == "cell_contents":
            if self.contents is None:
                raise tx.user_exception(ValueError("Cell is empty"))
            return self.contents
        raise Unsupported(f"attribute {name!r} of a cell")

    def reconstruct(self, cg):
        # one real cell, shared by every closure rebuilt over it and by a continuation
        def build():
            inner = self.contents.reconstruct(cg) if self.contents is not None else ""
            return f"{cg.bind(types.CellType)}({inner})"
        return cg.stash(self, build)


class CellAccessValue(Value):
    """A continuation's read (or ``del``) of the frame's own cell variable, which it holds as a
    cell in a local (``resume.CellAccess``): an empty cell raises UnboundLocalError. A ``del``
    runs natively, as a ``del`` of a cell's contents did before."""

    def __init__(self, access):
        self.access = access

    def describe(self):
        return repr(self.access)

    def call(self, tx, args, kwargs):
        if self.access.deletes or kwargs or len(args) != 1 or not isinstance(args[0], CellValue):
            raise Unsupported(f"{self.access!r} of {args[0].describe() if args else 'nothing'}")
        try:
            return args[0].getattr(tx, "cell_contents")
        except tx.UserException as e:
            if isinstance(e.exc, ValueError):
                raise tx.user_exception(self.access.unbound()) from None
            raise

    def reconstruct(self, cg):
        return cg.bind(self.access)


class ExistingCellValue(CellValue):
    """A cell that existed before the call: reads are guarded, writes replayed afterwards.

    A closure cell of the compiled function is bound by identity; a cell handed to a resume
    function as an argument (``source``) is read through that argument."""

    def __init__(self, cell, name: str, source=None):
        self.cell = cell
        self.name = name
        self.source = source

    def python_type(self):
        return types.CellType

    def describe(self):
        return f"Cell({self.name})"

    def contents_source(self):
        return AttrSource(self.source, "cell_contents") if self.source is not None else CellSource(self.cell, self.name)

    def get(self, tx):
        written = tx.output.side_effects.cell_value(self.cell)
        if written is not None:
            return written
        try:
            contents = self.cell.cell_contents
        except ValueError:
            # (an empty cell of the outside world can be filled before the next call, and no
            # guard reads an empty cell without raising: the read runs natively)
            raise Unsupported(f"a read of the empty closure cell {self.name!r}") from None
        return tx.wrap(contents, self.contents_source())

    def set(self, tx, value):
        tx.output.side_effects.store_cell(self.cell, self.name, value, self)

    def getattr(self, tx, name):
        if name == "cell_contents":
            return self.get(tx)
        raise Unsupported(f"attribute {name!r} of a cell")

    def setattr(self, tx, name, value):
        if name != "cell_contents":
            raise Unsupported(f"setting {name!r} on a cell")
        self.set(tx, value)

    def reconstruct(self, cg):
        return cg.source_expr(self.source) if self.source is not None else cg.bind(self.cell, "cell")


class BoundMethodValue(Value):
    def __init__(self, func: Value, self_value: Value):
        self.func = func
        self.self_value = self_value

    def python_type(self):
        return types.MethodType

    def describe(self):
        return f"BoundMethod({self.func.describe()} of {self.self_value.describe()})"

    def call(self, tx, args, kwargs):
        return self.func.call(tx, [self.self_value, *args], kwargs)

    def reconstruct(self, cg):
        return cg.stash(self, lambda: (f"{cg.bind(types.MethodType)}({self.func.reconstruct(cg)}, "
                                       f"{self.self_value.reconstruct(cg)})"))

    def getattr(self, tx, name):
        if name == "__self__":
            return self.self_value
        if name == "__func__":
            return self.func
        return self.func.getattr(tx, name)

    def truthy(self, tx):
        return True


class MethodValue(Value):
    """``obj.name`` where obj is a symbolic value that implements the method itself."""

    def __init__(self, obj: Value, name: str):
        self.obj = obj
        self.name = name

    def python_type(self):
        return types.BuiltinMethodType

    def describe(self):
        return f"Method({self.obj.describe()}.{self.name})"

    def getattr(self, tx, name):
        # what a bound method says of itself
        if name == "__self__":
            return self.obj
        if name == "__name__":
            return ConstantValue(self.name)
        return super().getattr(tx, name)

    def call(self, tx, args, kwargs):
        return self.obj.call_method(tx, self.name, args, kwargs)

    def truthy(self, tx):
        return True

    def reconstruct(self, cg):
        if self.name == "__exit__" and hasattr(self.obj, "reconstruct_entered"):
            return self.obj.reconstruct_entered(cg)
        return f"getattr({self.obj.reconstruct(cg)}, {self.name!r})"


class BaseMethodValue(MethodValue):
    """``super().append`` on a list/dict subclass: the base class's method on the storage."""

    def call(self, tx, args, kwargs):
        return self.obj.base_method(tx, self.name, args, kwargs)


class PureMethodValue(Value):
    """A method of an immutable constant (``"a,b".split``, ``(3).bit_length``)."""

    def __init__(self, method, label: str):
        self.method = method
        self.label = label

    def describe(self):
        return f"PureMethod({self.label})"

    def call(self, tx, args, kwargs):
        try:
            cargs = [a.as_constant() for a in args]
            ckw = {k: v.as_constant() for k, v in kwargs.items()}
        except Unsupported:
            raise Unsupported(f"{self.label}() with non-constant arguments")
        try:
            return tx.wrap_pure_result(self.method(*cargs, **ckw))
        except Exception as e:  # the user's own error, raised as eager would
            raise tx.user_exception(e)

    def truthy(self, tx):
        return True

    def reconstruct(self, cg):
        return cg.bind(self.method, "m")


class PartialValue(Value):
    """``functools.partial``: its ``args`` tuple and ``keywords`` dict are values of their own,
    read as the same objects every time (eager's are), and a change to ``keywords`` is seen by
    the next call."""

    def __init__(self, func: Value, args: Value, keywords: Value, source=None):
        self.func = func
        self.args_v = args            # a TupleValue
        self.keywords_v = keywords    # a DictValue
        self.source = source

    @property
    def args(self) -> list[Value]:
        if self.args_v.is_constant():         # (a tuple of constants read from outside)
            return [ConstantValue(a) for a in self.args_v.as_constant()]
        return list(self.args_v.items)

    @property
    def kwargs(self) -> dict:
        return dict(self.keywords_v.items)

    def python_type(self):
        import functools

        return functools.partial

    def describe(self):
        return f"partial({self.func.describe()})"

    def call(self, tx, args, kwargs):
        keywords = self.kwargs
        if not all(type(k) is str for k in keywords):
            raise Unsupported("a functools.partial whose keywords are not all str")
        return self.func.call(tx, [*self.args, *args], {**keywords, **kwargs})

    def getattr(self, tx, name):
        if name == "func":
            return self.func
        if name == "args":
            return self.args_v
        if name == "keywords":
            return self.keywords_v
        raise Unsupported(f"attribute {name!r} of functools.partial")

    def truthy(self, tx):
        return True

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)

        def build():
            # (the args tuple and keywords dict handed over are the partial's own objects)
            return (f"{cg.bind(_make_partial)}({self.func.reconstruct(cg)}, {self.args_v.reconstruct(cg)}, "
                    f"{self.keywords_v.reconstruct(cg)})")
        return cg.stash(self, build)     # (one object however often it is referenced)


def _make_partial(func, args: tuple, keywords: dict):
    import functools

    p = functools.partial(func)
    p.__setstate__((func, args, keywords, None))      # (keeps that very dict as its keywords)
    return p


class TorchOpValue(RealCallableValue):
    """A torch callable that becomes one graph node (torch.*, F.*, torch.Tensor.*, aten ops)."""

    def describe(self):
        return f"TorchOp({getattr(self.fn, '__qualname__', None) or getattr(self.fn, '__name__', self.fn)})"

    def call(self, tx, args, kwargs):
        return tx.output.call_torch_function(tx, self.fn, args, kwargs)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__"):
            return tx.wrap_pure_result(getattr(self.fn, name, None))
        attr = getattr(self.fn, name, None)
        if attr is not None and callable(attr) and hasattr(self.fn, "overloads"):  # OpOverloadPacket
            return TorchOpValue(attr)
        raise Unsupported(f"attribute {name!r} of {self.describe()}")

    def truthy(self, tx):
        return True

    def reconstruct(self, cg):
        return cg.bind(self.fn)
