"""Python constants as arguments of FX graph nodes.

FX turns a graph into Python source, printing each constant argument with ``repr``. That
only works for values whose printed form evaluates back to the same value in the graph
code's namespace: a class (``torch.HalfTensor``), a function, a module or a user object
prints as ``<class ...>`` (a SyntaxError), and ``complex(0.0, -0.0)`` prints as ``-0j``
(another value). Such constants are held by the graph module as attributes and read with
``get_attr`` nodes: bound by reference, never printed.
"""
from __future__ import annotations

import enum
import math
from typing import Callable

import torch

# Types whose repr FX's generated code evaluates back to an equal value of the same type
# (``inf``, ``nan``, ``torch`` and ``device`` are globals of every FX graph's code).
_PRINTABLE = (type(None), bool, int, str, bytes, type(Ellipsis), type(NotImplemented),
              torch.dtype, torch.device, torch.layout, torch.memory_format, range)
_FX_NAMESPACE = {"inf": math.inf, "nan": math.nan, "torch": torch, "device": torch.device}


def fx_argument(obj, bind: Callable[[object], object]):
    """``obj`` as an FX node argument: as it is where FX prints it exactly; otherwise each
    part that would not print exactly replaced by ``bind(part)`` (a ``get_attr`` node)."""
    if type(obj) in _PRINTABLE or isinstance(obj, torch.fx.Node):
        return obj
    if type(obj) is float:
        return obj            # repr keeps the sign of zero; inf and nan are FX globals
    if type(obj) is complex:
        return obj if _prints_exactly(obj) else bind(obj)
    if type(obj) in (tuple, list):
        return type(obj)(fx_argument(x, bind) for x in obj)
    if type(obj) is slice:    # FX prints the parts of a slice one by one
        return slice(*(fx_argument(x, bind) for x in (obj.start, obj.stop, obj.step)))
    if type(obj) is torch.Size:
        return obj
    if isinstance(obj, enum.Enum) and type(obj).__name__.isidentifier():
        return obj            # FX binds the enum class itself and prints Class.member
    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return obj            # FX binds operators by reference
    if type(obj) is dict and all(type(k) in _PRINTABLE for k in obj):
        # printed with repr: keys must print exactly; values that are nodes print as names
        return {k: fx_argument(v, bind) for k, v in obj.items()}
    return bind(obj)


def _prints_exactly(obj) -> bool:
    try:
        back = eval(repr(obj), dict(_FX_NAMESPACE))  # noqa: S307 - repr of a builtin number
    except Exception:
        return False
    return type(back) is type(obj) and _same_bits(back, obj)


def _same_bits(a, b) -> bool:
    if isinstance(a, complex):
        return _same_bits(a.real, b.real) and _same_bits(a.imag, b.imag)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
