"""``os.environ`` and ``os.getenv`` read during capture.

A read of one variable (``os.environ.get(k, d)``, ``os.environ[k]``, ``k in os.environ``,
``os.getenv(k, d)``) is folded into a constant, and the value it saw (a string, or the
variable's absence) becomes a guard on that variable: a later call with another value
recompiles. Libraries read flags this way in every layer (transformers' SDPA attention reads
``TRANSFORMERS_SDPA_FORCE_GQA`` per grouped-query layer), so a break here would cut a model
into one graph per layer.

Writes (``os.environ[k] = v``, ``pop``, ``update``, ``del``...) and reads of the whole mapping
(iteration, ``len``, ``copy``) are not modelled: they break the graph, and run natively. A write
changes the process's environment (``putenv``), which no replay after the graph could order
correctly against the native code at a later break; breaking keeps every read after it exact,
since the continuation guards what it reads again.
"""
from __future__ import annotations

import dataclasses
import os

from ...errors import Unsupported
from ..guards import Guard, GuardKind
from ..sources import Source
from .base import ConstantValue, Value
from .builtins import handles
from .functions import MethodValue

_READS = ("get", "__getitem__", "__contains__")


@dataclasses.dataclass(frozen=True)
class EnvironKeySource(Source):
    """``os.environ.get(key)``: one variable's value, or None when it is not set."""
    key: str

    def render(self, ctx):
        return f"{ctx.bind(os.environ, 'environ')}.get({self.key!r})"

    def describe(self):
        return f"os.environ.get({self.key!r})"


def read_variable(tx, key_value: Value) -> str | None:
    """The variable's value now, guarded (EQUALS_MATCH on a string, or ``is None``)."""
    if not key_value.is_constant() or not isinstance(key_value.as_constant(), str):
        if key_value.is_constant():   # what eager raises for os.environ[1]
            raise tx.user_exception(TypeError(f"str expected, not {type(key_value.as_constant()).__name__}"))
        raise Unsupported(f"os.environ read with a key that is not a constant ({key_value.describe()})")
    key = key_value.as_constant()
    value = os.environ.get(key)
    tx.output.guards.add(Guard(GuardKind.EQUALS_MATCH, EnvironKeySource(key), value))
    return value


class EnvironValue(Value):
    """``os.environ`` (reached through ``os``, or bound to a name and guarded by identity)."""

    def __init__(self, source=None):
        self.source = source

    def python_type(self):
        return type(os.environ)

    def real_object(self):
        return os.environ

    def describe(self):
        return "os.environ"

    def truthy(self, tx):
        raise Unsupported("truth value of os.environ (reads the whole environment)")

    def getattr(self, tx, name):
        return MethodValue(self, name)

    def call_method(self, tx, name, args, kwargs):
        if name in _READS and not kwargs:
            if name == "get" and 1 <= len(args) <= 2:
                value = read_variable(tx, args[0])
                if value is None:
                    return args[1] if len(args) == 2 else ConstantValue(None)
                return ConstantValue(value)
            if name == "__getitem__" and len(args) == 1:
                value = read_variable(tx, args[0])
                if value is None:
                    raise tx.user_exception(KeyError(args[0].as_constant()))
                return ConstantValue(value)
            if name == "__contains__" and len(args) == 1:
                return ConstantValue(read_variable(tx, args[0]) is not None)
        raise Unsupported(f"os.environ.{name} inside a compiled function (writes and whole-"
                          "environment reads run natively, at a graph break)")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.bind(os.environ)


@handles(os.getenv)
def _getenv(tx, fn, args, kwargs):
    # os.getenv(key, default=None) is os.environ.get(key, default)
    if len(args) + len(kwargs) not in (1, 2) or set(kwargs) - {"key", "default"}:
        return NotImplemented
    key = args[0] if args else kwargs["key"]
    default = args[1] if len(args) > 1 else kwargs.get("default", ConstantValue(None))
    value = read_variable(tx, key)
    return default if value is None else ConstantValue(value)
