"""Reading code objects, with every CPython 3.11 / 3.12 difference kept in this module.

Code is read with the ``bytecode`` library. ``decode`` returns a flat list of ``Instr`` whose
opnames are normalized across versions, so the interpreter handles one instruction set:

* ``POP_JUMP_{FORWARD,BACKWARD}_IF_X`` (3.11) and ``POP_JUMP_IF_X`` (3.12) -> ``POP_JUMP_IF_X``
* ``JUMP_FORWARD`` / ``JUMP_BACKWARD`` / ``JUMP_BACKWARD_NO_INTERRUPT`` -> ``JUMP``
* ``LOAD_METHOD name`` (3.11) -> ``LOAD_ATTR (True, name)``; 3.11 ``LOAD_ATTR name`` -> ``(False, name)``
* ``FOR_ITER``: on exhaustion 3.12 also skips the ``END_FOR`` at the target (``for_iter_exit``)
* ``RETURN_CONST c`` (3.12) is kept; the interpreter treats it as ``LOAD_CONST c; RETURN_VALUE``
* ``PRECALL`` (3.11 only) is dropped
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any

import weakref

import bytecode
from bytecode import Label

PY312 = sys.version_info >= (3, 12)

CO_GENERATOR = 0x20
CO_COROUTINE = 0x80
CO_ASYNC_GENERATOR = 0x200
CO_ITERABLE_COROUTINE = 0x100
CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08

_RENAME = {
    "POP_JUMP_FORWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_FORWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_BACKWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "JUMP_FORWARD": "JUMP",
    "JUMP_BACKWARD": "JUMP",
    "JUMP_BACKWARD_NO_INTERRUPT": "JUMP",
    "JUMP_NO_INTERRUPT": "JUMP",
    "LOAD_FAST_CHECK": "LOAD_FAST",
}
_DROP = {"PRECALL", "CACHE", "EXTENDED_ARG"}

# SEND on an exhausted sub-iterator: 3.11 replaces the receiver with the return value;
# 3.12 keeps the receiver and pushes the value (END_SEND at the target pops the receiver).
SEND_KEEPS_RECEIVER = PY312

# CALL_INTRINSIC_1 operands (3.12)
INTRINSIC_STOPITERATION_ERROR = 3
INTRINSIC_UNARY_POSITIVE = 5
INTRINSIC_LIST_TO_TUPLE = 6


@dataclasses.dataclass
class Instr:
    opname: str
    arg: Any
    target: int | None  # instruction index a jump goes to
    lineno: int | None
    index: int
    raw: Any = None     # the bytecode.Instr it was decoded from
    handler: tuple | None = None   # (target index, stack depth, push lasti) of its try block


# weak in the code object: generated code (continuations, break functions) is dropped with
# the functions made from it, and must not keep what they held alive
_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def decode(code) -> list[Instr]:
    """The normalized instructions of a code object (cached per code object)."""
    hit = _cache.get(code)
    if hit is not None:
        return hit
    items = list(bytecode.Bytecode.from_code(code))
    set_exception_depths(code, items)
    out = decode_items(code, items)
    _cache[code] = out
    return out


def set_exception_depths(code, items: list) -> bool:
    """Give each TryBegin of ``items`` (abstract, from ``code``) the stack depth of its real
    exception-table entry: the abstract form does not keep it. False if they do not pair up."""
    from bytecode import TryBegin

    entries = bytecode.ConcreteBytecode.from_code(code).exception_table
    blocks = [it for it in items if isinstance(it, TryBegin)]
    if len(blocks) != len(entries) or any(b.push_lasti != e.push_lasti for b, e in zip(blocks, entries)):
        return False
    for block, entry in zip(blocks, entries):
        block.stack_depth = entry.stack_depth
    return True


def decode_with_raw(code, items: list) -> list[Instr]:
    """Decode a given list of abstract items (so that ``Instr.raw`` points into it)."""
    return decode_items(code, items)


def decode_items(code, items: list) -> list[Instr]:
    from bytecode import TryBegin, TryEnd

    raw = []
    blocks = []   # the try block active at each raw instruction
    label_at: dict[Label, int] = {}
    active = None
    for item in items:
        if isinstance(item, Label):
            label_at[item] = len(raw)
        elif isinstance(item, TryBegin):
            active = item
        elif isinstance(item, TryEnd):
            active = None
        elif isinstance(item, bytecode.Instr):
            if item.name in _DROP:
                continue
            raw.append(item)
            blocks.append(active)
    out: list[Instr] = []
    for i, ins in enumerate(raw):
        name = _RENAME.get(ins.name, ins.name)
        arg = ins.arg if ins.require_arg() else None
        target = None
        if isinstance(arg, Label):
            target = label_at[arg]
            arg = None
        if name == "LOAD_METHOD":
            name, arg = "LOAD_ATTR", (True, arg)
        elif name == "LOAD_ATTR" and not PY312:
            arg = (False, arg)
        if name == "FOR_ITER" and target is not None and target < len(raw) and raw[target].name == "END_FOR":
            target += 1  # 3.12: exhaustion skips END_FOR
        lineno = ins.location.lineno if ins.location is not None else None
        block = blocks[i]
        handler = None
        if block is not None and isinstance(block.stack_depth, int) and block.target in label_at:
            handler = (label_at[block.target], block.stack_depth, bool(block.push_lasti))
        out.append(Instr(name, arg, target, lineno, i, ins, handler))
    # carry line numbers forward for instructions without one
    last = code.co_firstlineno
    for ins in out:
        if ins.lineno is None:
            ins.lineno = last
        else:
            last = ins.lineno
    return out


def forward_jump_name(name: str) -> str:
    """The opname of a conditional jump retargeted forward (3.11 has direction variants)."""
    if PY312:
        return name
    return name.replace("_BACKWARD_", "_FORWARD_") if "_BACKWARD_" in name else name


def load_attr_instr(name: str, lineno: int):
    """A plain (non-method) attribute load."""
    return bytecode.Instr("LOAD_ATTR", (False, name) if PY312 else name, lineno=lineno)


def call_instructions(argc: int, lineno: int) -> list:
    """Instructions that call ``callable(*argc args)`` laid out as [NULL, callable, args]."""
    if PY312:
        return [bytecode.Instr("CALL", argc, lineno=lineno)]
    return [bytecode.Instr("PRECALL", argc, lineno=lineno), bytecode.Instr("CALL", argc, lineno=lineno)]


def cell_name(arg) -> str:
    """The variable name of a CellVar/FreeVar argument (LOAD_DEREF, MAKE_CELL, ...)."""
    return getattr(arg, "name", arg)


def intrinsic_number(arg) -> int:
    return int(getattr(arg, "value", arg))


def is_generator_code(code) -> bool:
    return bool(code.co_flags & CO_GENERATOR)


def is_async_code(code) -> bool:
    return bool(code.co_flags & (CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE))


def binary_op_name(arg) -> str:
    """``BINARY_OP`` operand -> enum name such as ``ADD`` or ``INPLACE_ADD``."""
    return getattr(arg, "name", None) or _BINARY_OP_NAMES[int(arg)]


_BINARY_OP_NAMES = ["ADD", "AND", "FLOOR_DIVIDE", "LSHIFT", "MATRIX_MULTIPLY", "MULTIPLY",
                    "REMAINDER", "OR", "POWER", "RSHIFT", "SUBTRACT", "TRUE_DIVIDE", "XOR",
                    "INPLACE_ADD", "INPLACE_AND", "INPLACE_FLOOR_DIVIDE", "INPLACE_LSHIFT",
                    "INPLACE_MATRIX_MULTIPLY", "INPLACE_MULTIPLY", "INPLACE_REMAINDER",
                    "INPLACE_OR", "INPLACE_POWER", "INPLACE_RSHIFT", "INPLACE_SUBTRACT",
                    "INPLACE_TRUE_DIVIDE", "INPLACE_XOR"]


def compare_op_name(arg) -> str:
    name = getattr(arg, "name", None)
    if name is None:
        return ["LT", "LE", "EQ", "NE", "GT", "GE"][int(arg) >> (4 if PY312 else 0)]
    return name.replace("_CAST", "")
