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
    torch._foreach_mul_, a custom op whose schema writes an argument: ``Tensor(a!)``,
    ``torch.library.custom_op(..., mutates_args=...)``)."""
    if target is operator.setitem or inplace_name(kind, target) is not None:
        return True
    # (``torch.Tensor.__setitem__(x, i, v)``, the unbound method, is ``x[i] = v``)
    return kind == "call_function" and (getattr(target, "__name__", None) == "__setitem__" or _schema_writes(target))


def _schema_writes(target) -> bool:
    """Whether an operator's schema writes one of its arguments (an ATen or library overload,
    a packet's default overload, a ``torch.library.custom_op``)."""
    op = getattr(target, "_opoverload", target)     # (a custom_op: its registered overload)
    schema = getattr(op, "_schema", None)
    if schema is None and type(op).__name__ == "OpOverloadPacket":
        try:
            schema = op.default._schema
        except AttributeError:      # (a packet without a default overload)
            return False
    return bool(getattr(schema, "is_mutable", False))
