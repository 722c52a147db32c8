"""``torch._foreach_addcdiv`` / ``_foreach_addcmul`` (and their in-place forms) given their
``scalars`` as a tensor: one number per list item, on the CPU.

A foreach optimizer step builds that tensor while compiling (``torch.optim``'s
``_stack_if_compiling`` stacks Adam's step sizes, one 0-d tensor per parameter, instead of reading
them as Python floats). FakeTensor's rule for foreach ops runs the op's meta kernel, which sees
the scalars on the meta device and refuses them ("Expected scalars to be on CPU"), so the call
cannot be captured as it stands. The graph holds the same arithmetic as foreach ops over the
tensor's elements instead: ``self + scalars[i] * (tensor1[i] / tensor2[i])`` (or ``*``), which
is the order eager's CUDA foreach kernel computes in.
"""
from __future__ import annotations

import torch

from .containers import ListValue, TupleValue
from .tensor import TensorValue

# op -> (the pointwise op between tensor1 and tensor2, writes self in place)
_OPS = {
    torch._foreach_addcdiv: (torch._foreach_div, False),
    torch._foreach_addcdiv_: (torch._foreach_div, True),
    torch._foreach_addcmul: (torch._foreach_mul, False),
    torch._foreach_addcmul_: (torch._foreach_mul, True),
}


def rewrites(fn) -> bool:
    return fn in _OPS


def _items(v) -> list | None:
    if isinstance(v, (ListValue, TupleValue)) and all(isinstance(x, TensorValue) for x in v.items):
        return list(v.items)
    return None


def call(tx, fn, args: list, kwargs: dict):
    """The captured call, or None where it is not this case (the call is then captured as it
    stands, and whatever eager would raise is raised)."""
    names = ("self", "tensor1", "tensor2", "scalars")
    given = dict(zip(names, args))
    if len(args) > len(names) or set(kwargs) - set(names) or set(given) & set(kwargs):
        return None
    given.update(kwargs)
    scalars = given.get("scalars")
    lists = [_items(given.get(k)) for k in names[:3]]
    if not isinstance(scalars, TensorValue) or any(v is None for v in lists):
        return None
    n = len(lists[0])
    fake = scalars.fake
    # what eager accepts: one number per item, on the CPU; anything else is left to eager's checks
    if fake.device.type != "cpu" or fake.dim() != 1 or fake.shape[0] != n or fake.requires_grad \
            or any(len(v) != n for v in lists) or n == 0:
        return None
    pointwise, inplace = _OPS[fn]
    out = tx.output
    each = out.call_op("call_function", torch.unbind, (scalars,), {})
    term = out.call_op("call_function", pointwise, (given["tensor1"], given["tensor2"]), {})
    out.call_op("call_function", torch._foreach_mul_, (term, each), {})
    combine = torch._foreach_add_ if inplace else torch._foreach_add
    return out.call_op("call_function", combine, (given["self"], term), {})
