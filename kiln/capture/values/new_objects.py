"""Objects that library code creates inside the compiled function: ``torch.nn`` modules
without parameters (``torch.nn.Softmax(dim=-1)(x)``) and ``collections.namedtuple`` classes.

Both are built for real at capture time from Python constants, as eager builds them on every
call. A module of ``torch.nn`` is a pure function of its constructor's arguments once it has
no parameters or buffers; it is then inlined like any module. If it escapes (returned, stored
on an object), a new one is built natively from the same arguments, so every call gets its
own, as in eager. A module with parameters (``torch.nn.Linear``) starts from random values
in eager: that is Unsupported. A namedtuple class made inside is made once per capture (eager
makes a new class per call: only the classes' identities across calls differ).
"""
from __future__ import annotations

import collections

import torch

from ...errors import Unsupported
from ..sources import ConstSource
from .base import Value, is_constant_object
from .builtins import handles
from .objects import NNModuleValue


def _constant(what, v: Value):
    """The Python value of a constant argument; lists and tuples of constants (namedtuple's
    field names) are rebuilt as new ones (nothing else holds them). A module created in the
    capture (``Sequential(ReLU(), Tanh())``) is its capture-time object."""
    from .containers import ListValue, TupleValue

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
        super().__init__(module, ConstSource(module))
        self.ctor = ctor        # (cls, arg values, kwarg values): how a call builds its own

    def describe(self):
        return f"new Module({type(self.value).__name__})"

    def module_setattr(self, tx, name, value):
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


def create_module(tx, cls: type, args, kwargs) -> Value:
    if not (cls.__module__ or "").startswith("torch.nn."):
        raise Unsupported(f"creating an instance of the module class {cls.__qualname__} inside a "
                          "compiled function (its __init__ would run once, at capture)")
    cargs, ckwargs = _constants(tx, f"creating {cls.__name__}", args, kwargs)
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


@handles(collections.namedtuple)
def _namedtuple(tx, fn, args, kwargs):
    from .builder import wrap_pure_result

    cargs, ckwargs = _constants(tx, "collections.namedtuple", args, kwargs)
    # eager names the class's module after its caller's frame: the user's function
    ckwargs.setdefault("module", tx.f_globals.get("__name__"))
    try:
        return wrap_pure_result(collections.namedtuple(*cargs, **ckwargs))
    except Exception as e:
        raise tx.user_exception(e)
