"""Objects that library code creates inside the compiled function: ``torch.nn`` modules
without parameters (``torch.nn.Softmax(dim=-1)(x)``) and ``collections.namedtuple`` classes.

Both are built for real at capture time from Python constants, as eager builds them on every
call. A module of ``torch.nn`` is a pure function of its constructor's arguments once it has
no parameters or buffers; it is then inlined like any module. If it escapes (returned, stored
on an object), a new one is built natively from the same arguments, so every call gets its
own, as in eager. A module with parameters (``torch.nn.Linear``) starts from random values
in eager: that is Unsupported. A namedtuple class made inside is made once per capture (eager
makes a new class per call: only the classes' identities across calls differ).

A module class of the user's (or a library's: transformers' ``ACT2FN["gelu"]`` builds a
``GELUActivation()`` on every call) is built the same way once its ``__init__`` is seen to
only configure the new module: it is inlined first, on a stand-in for the module
(``ModuleUnderConstruction``), and must leave no trace outside it: no graph op (a tensor
drawn at random, a buffer), no write to an object, cell or global that existed before, no
exception. Anything else is a graph break, as before. The real ``__init__`` then runs once, at
capture, on the same constant arguments.
"""
from __future__ import annotations

import collections

import torch

from ...errors import Unsupported
from ..side_effects import SideEffects
from ..sources import CaptureObjectSource
from .base import ConstantValue, Value, is_constant_object
from .builtins import handles
from .containers import ListValue, TupleValue
from .functions import UserFunctionValue
from .objects import NewObjectValue, NNModuleValue, store_on_new_object, user_layers_define
from .objects import static_lookup


def _constant(what, v: Value):
    """The Python value of a constant argument; lists and tuples of constants (namedtuple's
    field names) are rebuilt as new ones (nothing else holds them). A module created in the
    capture (``Sequential(ReLU(), Tanh())``) is its capture-time object."""
    if isinstance(v, NewModuleValue):
        return v.value
    if type(v) in (ListValue, TupleValue) and v.cls in (list, tuple):
        return v.cls(_constant(what, i) for i in v.items)
    if v.is_constant() and is_constant_object(v.as_constant()):
        return v.as_constant()
    raise Unsupported(f"{what} with arguments that are not Python constants ({v.describe()})")


def _constants(tx, what, args, kwargs):
    return (tuple(_constant(what, a) for a in args),
            {k: _constant(what, v) for k, v in kwargs.items()})


class NewModuleValue(NNModuleValue):
    """A parameterless ``torch.nn`` module created during capture (bound by identity)."""

    def __init__(self, module: torch.nn.Module, ctor: tuple):
        super().__init__(module, CaptureObjectSource(module))
        self.ctor = ctor        # (cls, arg values, kwarg values): how a call builds its own

    def describe(self):
        return f"new Module({type(self.value).__name__})"

    def module_setattr(self, tx, name, value):
        if not _is_torch_nn(type(self.value)):
            # (the capture-time object serves every call: state a forward keeps on it would
            # carry over to the next call, where eager starts from a new module)
            raise Unsupported(f"setting {name!r} on a {type(self.value).__name__} created in the compiled "
                              "function")
        self.changed = True
        super().module_setattr(tx, name, value)

    def reconstruct(self, cg):
        if getattr(self, "changed", False):
            raise Unsupported(f"a {type(self.value).__name__} created in the compiled function, "
                              "changed, then returned")
        cls, args, kwargs = self.ctor

        def build():
            parts = [a.reconstruct(cg) for a in args]
            parts += [f"{k}={v.reconstruct(cg)}" for k, v in kwargs.items()]
            return f"{cg.bind(cls)}({', '.join(parts)})"
        return cg.stash(self, build)


def _is_torch_nn(cls: type) -> bool:
    return (cls.__module__ or "").startswith("torch.nn.")


def create_module(tx, cls: type, args, kwargs) -> Value:
    cargs, ckwargs = _constants(tx, f"creating {cls.__name__}", args, kwargs)
    if not _is_torch_nn(cls):
        check_init_only_configures(tx, cls, args, kwargs)
    try:
        # the random state stays untouched: a module with parameters draws from it, and
        # is then refused (its constructor runs natively, at the break)
        with torch.random.fork_rng(devices=[]):
            module = cls(*cargs, **ckwargs)
    except Exception as e:
        raise tx.user_exception(e)
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise Unsupported(f"creating {cls.__name__} inside a compiled function (it has parameters "
                          "or buffers, whose initial values eager draws at random on every call)")
    return NewModuleValue(module, (cls, list(args), dict(kwargs)))


class _Isolated(SideEffects):
    """The side effects of an inlined ``__init__`` alone, and the values it read that the
    call changed earlier (``stale``): those read through the outer record."""

    def __init__(self, outer: SideEffects):
        super().__init__()
        self.outer = outer
        self.stale: list[str] = []

    def _through(self, mine, theirs, what: str):
        if mine is None and theirs is not None:
            self.stale.append(what)
            return theirs
        return mine

    def attr_value(self, obj, name):
        return self._through(super().attr_value(obj, name), self.outer.attr_value(obj, name), f"attribute {name!r}")

    def cell_value(self, cell):
        return self._through(super().cell_value(cell), self.outer.cell_value(cell), "a closure cell")

    def global_value(self, fn_globals, name):
        return self._through(super().global_value(fn_globals, name), self.outer.global_value(fn_globals, name),
                             f"global {name!r}")


# what nn.Module.__init__ sets on every module (hooks' dicts, _parameters, _modules, ...)
_MODULE_INIT_ATTRS = frozenset(vars(torch.nn.Module()))


class ModuleUnderConstruction(NewObjectValue):
    """``self`` in a user module's ``__init__`` inlined by ``check_init_only_configures``:
    ``super().__init__()`` reaching ``nn.Module.__init__`` sets ``training``; attribute
    stores go to the stand-in (``nn.Module.__setattr__`` would file modules in ``_modules``:
    for the check, only that nothing else is touched matters)."""
    under_construction = True

    def describe(self):
        return f"new {self.cls.__name__} (being initialized)"

    def setattr(self, tx, name, value):
        store_on_new_object(tx, self, name, value)

    def getattr(self, tx, name):
        if name not in self.attrs and name in _MODULE_INIT_ATTRS:
            # (the stand-in holds what the user's __init__ stored; nn.Module.__init__'s own
            # state is not modelled: reading it must not look like an AttributeError of eager's)
            raise Unsupported(f"{self.cls.__qualname__}.__init__ reads {name!r}, which nn.Module.__init__ "
                              "sets (a module built inside a compiled function)")
        return super().getattr(tx, name)

    def module_init(self, tx, args, kwargs) -> Value:
        if args or kwargs:
            raise Unsupported(f"nn.Module.__init__ with arguments in {self.cls.__name__}.__init__")
        self.attrs["training"] = ConstantValue(True)
        return ConstantValue(None)


def check_init_only_configures(tx, cls: type, args, kwargs) -> None:
    """Unsupported unless ``cls(*args, **kwargs)`` only configures the new module (see the
    module docstring): its ``__init__`` inlined on a stand-in leaves no trace outside it."""
    import abc
    import types

    why = f"creating an instance of the module class {cls.__qualname__} inside a compiled function"
    if type(cls) not in (type, abc.ABCMeta) or user_layers_define(
            cls, ("__new__", "__slots__", "__setattr__", "__getattr__", "__getattribute__", "__delattr__"),
            (torch.nn.Module,)):
        raise Unsupported(f"{why} (its class customizes object creation or attribute access)")
    out = tx.output
    if out.side_effects.containers:
        # (its __init__ runs at capture, where this call's writes are not applied yet)
        raise Unsupported(f"{why} after the call changed containers that existed before it")
    init = static_lookup(cls, "__init__")
    if init is torch.nn.Module.__init__:
        if args or kwargs:
            raise Unsupported(f"{why} (arguments to nn.Module.__init__)")
        return
    if not isinstance(init, types.FunctionType):
        raise Unsupported(f"{why} (its __init__ is not Python code)")
    nodes = len(out.graph.nodes)
    outer = out.side_effects
    out.side_effects = _Isolated(outer)
    try:        # (an exception it raises is the user's, as eager would raise it)
        result = tx.call(UserFunctionValue(init), [ModuleUnderConstruction(cls), *args], kwargs)
    finally:
        effects, out.side_effects = out.side_effects, outer
    if effects.stale:
        raise Unsupported(f"{why} (its __init__ reads {', '.join(effects.stale)}, which this call changed "
                          "before: it runs at capture, where the change is not applied yet)")
    if effects or len(out.graph.nodes) != nodes:
        raise Unsupported(f"{why} (its __init__ does more than configure the new module: "
                          + (", ".join(effects.describe()) if effects else "it computes tensors") + ")")
    if not (result.is_constant() and result.as_constant() is None):
        raise Unsupported(f"{why} (its __init__ returned a value)")


@handles(collections.namedtuple)
def _namedtuple(tx, fn, args, kwargs):
    cargs, ckwargs = _constants(tx, "collections.namedtuple", args, kwargs)
    # eager names the class's module after its caller's frame: the user's function
    ckwargs.setdefault("module", tx.f_globals.get("__name__"))
    try:
        return tx.wrap_pure_result(collections.namedtuple(*cargs, **ckwargs))
    except Exception as e:
        raise tx.user_exception(e)
