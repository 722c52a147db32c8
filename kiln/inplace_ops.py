"""Which op writes its first argument in place, named by the in-place method it is:
``x.add_(y)``, ``x += y`` (``x.__iadd__(y)``), ``operator.iadd(x, y)``, ``torch.Tensor.add_``
and ATen's ``aten.add_.Tensor`` are all ``add_``. Capture and the AOT stages apply eager's
in-place checks (memory overlap, result type) by this name."""
from __future__ import annotations

import operator

# Python's in-place operators on a tensor: the writes of these in-place methods
OPERATORS = {"__iadd__": "add_", "__isub__": "sub_", "__imul__": "mul_", "__itruediv__": "div_",
             "__ifloordiv__": "floor_divide_", "__imod__": "remainder_", "__ipow__": "pow_",
             "__iand__": "bitwise_and_", "__ior__": "bitwise_or_", "__ixor__": "bitwise_xor_",
             "__ilshift__": "bitwise_left_shift_", "__irshift__": "bitwise_right_shift_"}


def inplace_name(kind: str, target) -> str | None:
    """The in-place method a ``call_method`` / ``call_function`` target is, or None."""
    if kind == "call_method":
        name = target
    else:
        # (an ATen overload's __name__ is "add_.Tensor": its op name is "add_")
        name = getattr(target, "_opname", None) or getattr(target, "__name__", "")
        if getattr(target, "__module__", None) in ("operator", "_operator"):
            name = f"__{name}__"
    if not isinstance(name, str):
        return None
    if name in OPERATORS:
        return OPERATORS[name]
    return name if name.endswith("_") and not name.endswith("__") else None


def mutates(kind: str, target) -> bool:
    """An op run for its effect on its arguments (x[i] = v, x.add_(1), x += 1,
    torch._foreach_mul_)."""
    return target is operator.setitem or inplace_name(kind, target) is not None
