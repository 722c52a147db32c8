"""Memory that NumPy and the graph would share differently.

Inside the graph an ndarray is a tensor, and torch._numpy makes views where NumPy does, with
a few exceptions: NumPy returns a view where torch._numpy copies (torch has no negative
strides: ``np.flip``, ``a[::-1]``, ``np.rot90``), and NumPy makes some views read-only
(``a.diagonal()``, ``np.broadcast_to``). Code that only reads them computes the same values.
A write that NumPy would see through such a view (or refuse) breaks the graph at the
instruction that made the view, so that NumPy makes it natively from there on.
"""
from __future__ import annotations

import torch

from ...errors import Unsupported
from ..values.base import ConstantValue, Value
from ..values.containers import TupleValue

# Where NumPy returns a view but torch._numpy a copy (torch has no negative strides): a write
# to either side would show through the other in NumPy and not in the graph.
NUMPY_VIEW_TNP_COPY = frozenset({"flip", "fliplr", "flipud", "rot90", "diag"})
# Where NumPy returns a read-only view: a write through it raises in NumPy.
NUMPY_READ_ONLY = frozenset({"diagonal", "diag", "broadcast_to", "broadcast_arrays"})


def _storage(fake) -> int:
    return fake.untyped_storage()._cdata


def _result_fakes(result) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [r for r in result if isinstance(r, torch.Tensor)]
    return []


def check_aliasing(tx, name, args, arg_fakes, versions, result) -> None:
    """Writes that NumPy and the graph would see differently: a write to memory that NumPy
    shares with a view torch._numpy copied (``np.flip``, ``a[::-1]``), or a write through a
    view NumPy makes read-only (``a.diagonal()``, ``np.broadcast_to``). The graph then breaks
    at the instruction that made the view, so that NumPy makes it, natively."""
    out = tx.output
    unshared = out.__dict__.setdefault("numpy_unshared_views", {})  # storage -> (reason, origin)
    read_only = out.__dict__.setdefault("numpy_read_only", {})      # id(fake) -> (fake, reason, origin)
    for fake, before in zip(arg_fakes, versions):
        if fake._version == before:
            continue
        hit = unshared.get(_storage(fake)) or read_only.get(id(fake), (None,))[1:]
        if hit:
            _break_at_origin(tx, f"NumPy {name} writes to {hit[0]}", hit[1])
    results = _result_fakes(result)
    negative_step = name == "__getitem__" and _has_negative_step(args[1])
    if name in NUMPY_VIEW_TNP_COPY or negative_step:
        why = (f"an array that NumPy shares with the view {'a[::-1]' if negative_step else 'np.' + name}"
               " returns (torch._numpy copies it)")
        origin = _origin(tx)
        for fake in [*arg_fakes, *results]:
            unshared.setdefault(_storage(fake), (why, origin))
    read_only_args = [read_only[id(f)] for f in arg_fakes if id(f) in read_only]
    if name in NUMPY_READ_ONLY or read_only_args:
        why, origin = (f"the read-only view np.{name} returns (NumPy raises)", _origin(tx)) \
            if name in NUMPY_READ_ONLY else read_only_args[0][1:]
        for r in results:
            if name in NUMPY_READ_ONLY or any(_storage(r) == _storage(f[0]) for f in read_only_args):
                read_only[id(r)] = (r, why, origin)


def _origin(tx):
    """Where the top frame is: (instruction, execution count), or None where it cannot break."""
    top = tx.output.tx_stack[0] if tx.output.tx_stack else None
    if top is None or not top.can_break or top.suspends or top.current is None:
        return None
    ip = top.current.index
    return ip, top.exec_counts.get(ip, 0)


def _break_at_origin(tx, why: str, origin) -> None:
    from ..interpreter import GraphBreakRequest  # cycle: the interpreter runs NumPy code

    if origin is None:
        raise Unsupported(why)
    top = tx.output.tx_stack[0]
    reason = Unsupported(why + f" (the frame goes on natively from line "
                               f"{top.instructions[origin[0]].lineno})")
    reason.located(*top.location())
    raise GraphBreakRequest(origin[0], origin[1], reason)


def _has_negative_step(index: Value) -> bool:
    parts = index.items if isinstance(index, TupleValue) else [index]
    for p in parts:
        if isinstance(p, ConstantValue) and isinstance(p.as_constant(), slice):
            step = p.as_constant().step
            if step is not None and step < 0:
                return True
        elif not p.is_constant():
            parts_of = getattr(p, "parts", None)   # a symbolic slice: its step
            if parts_of is not None and len(parts_of) == 3 and parts_of[2].is_constant() \
                    and (parts_of[2].as_constant() or 1) < 0:
                return True
    return False
