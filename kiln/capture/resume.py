"""Graph breaks: the break function and the resume functions (continuations).

At a graph break before instruction *i* of a frame, the compiled entry runs the graph
captured so far, writes side effects back, rebuilds the live stack and locals, and calls the
**break function**: a copy of the frame's code (made with the ``bytecode`` library) whose
prologue pushes the stack back and jumps to *i*. Instruction *i* runs natively (a call that
broke the graph; another instruction with the rest of its expression, until no NULL is left
on the stack), inside the original code's try/with regions, so exceptions are handled exactly
as in eager. Then an epilogue, placed
outside every try region, packs the stack and the live locals and calls the **continuation**:
the original code resumed at that point, compiled lazily as its own ``CompiledFunction``
(its own guards and entries). A conditional jump at *i* has two continuations, one per
successor. Nothing already executed is executed again.
"""
from __future__ import annotations

import builtins
import dataclasses
import sys
import types
import weakref
from typing import Callable

import bytecode
from bytecode import Bytecode, Instr, Label

from ..errors import Unsupported
from ..process_state import continuation_starts as _STARTS, generated_code_origins as _ORIGINAL
from . import bytecode_utils
from .values.base import UNBOUND as UNBOUND_VALUE, NullValue
from .values.containers import IteratorValue
from .values.exceptions import PrevExcValue

NULL, VALUE, ITER = "null", "value", "iter"
# The slot PUSH_EXC_INFO leaves under an except/finally handler (the exception handled
# before it). It is handed over as the exception the handler handles; the prologue re-enters
# the handler with PUSH_EXC_INFO, so that ``raise``, ``sys.exc_info()`` and exception
# chaining see it, and the epilogue restores the caller's before the continuation runs.
PREV_EXC = "prev_exc"
# The slot a 3.12 inlined comprehension (PEP 709) keeps below its iterator for the whole
# loop: LOAD_FAST_AND_CLEAR saved the loop variable's outer binding there, and the variable
# was unbound, so the slot is a NULL that the STORE_FAST after the loop writes back (which
# unbinds the variable again). Nothing is handed over for it: an epilogue spills the stack to
# locals (STORE_FAST takes a NULL), and a prologue pushes it back with LOAD_FAST_AND_CLEAR of
# a local that is never bound. (A saved binding that exists is an ordinary VALUE slot.)
UNBOUND = "unbound"
_NEVER_BOUND = "___kiln_unbound"
# a break function's flag: its jump to a continuation is still to be taken
_ARMED = "___kiln_armed"
_JUMP_IF_FALSE = "POP_JUMP_IF_FALSE" if bytecode_utils.PY312 else "POP_JUMP_FORWARD_IF_FALSE"
# slots that are not parameters of a break function or continuation
_NOT_HANDED = (NULL, UNBOUND)

# Instructions that cannot start a break: their successor is not a plain fall-through, or
# they belong to machinery that must stay whole (generators, with-entry, loops' FOR_ITER,
# which on 3.12 skips the instruction after its target).
_NOT_BREAKABLE = {"FOR_ITER", "SEND", "YIELD_VALUE", "RETURN_VALUE", "RETURN_CONST",
                  "RETURN_GENERATOR", "RERAISE", "BEFORE_WITH", "END_FOR",
                  "END_SEND", "GET_YIELD_FROM_ITER", "MAKE_CELL", "COPY_FREE_VARS", "RESUME",
                  "LOAD_CLOSURE", "KW_NAMES", "PUSH_EXC_INFO", "POP_EXCEPT", "CHECK_EXC_MATCH",
                  "WITH_EXCEPT_START", "LOAD_FAST_AND_CLEAR", "JUMP"}
# fine to run natively in the rest of an expression after a break (just not to start one)
_NATIVE_OK = {"KW_NAMES", "LOAD_CLOSURE"}
_COND_JUMPS = {"POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE",
               "JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP"}
_PUSHES_NULL = {"PUSH_NULL"}
_CALLS = {"CALL", "CALL_FUNCTION_EX"}
# where a continuation may start with NULLs on its stack: plain control flow inside an
# expression, not exception or generator machinery
_RESUMABLE_WITH_NULLS = {"JUMP", "FOR_ITER", "LOAD_FAST_AND_CLEAR"} | _COND_JUMPS


@dataclasses.dataclass(frozen=True)
class Exit:
    """Where native execution stops and a continuation takes over."""
    kind: str                    # "fallthrough" or "jump"
    decoded_index: int           # the instruction the continuation resumes at
    layout: tuple[str, ...]      # kinds of the stack slots handed over (no NULLs)
    local_names: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class BreakPlan:
    index: int                   # decoded index of the break instruction
    start_index: int             # decoded index the break function jumps to (KW_NAMES prefix)
    layout: tuple[str, ...]      # stack kinds before the instruction
    local_names: tuple[str, ...]
    exits: tuple[Exit, ...]      # empty when the native part returns


def _effect(ins: bytecode_utils.Instr) -> tuple[int, int, bool]:
    """(items popped, items pushed, whether the lowest pushed item may be NULL)."""
    op, arg = ins.opname, ins.arg
    if op == "CALL":
        return arg + 2, 1, False
    if op == "CALL_FUNCTION_EX":
        return 3 + (arg & 1), 1, False
    if op == "LOAD_GLOBAL":
        return 0, 1 + int(arg[0]), bool(arg[0])
    if op == "LOAD_ATTR":
        return 1, 1 + int(arg[0]), bool(arg[0])
    if op == "LOAD_SUPER_ATTR":
        return 3, 1 + int(arg[0]), bool(arg[0])
    if op in _PUSHES_NULL:
        return 0, 1, True
    if op in ("KW_NAMES", "NOP", "RESUME"):
        return 0, 0, False
    if op in ("JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP"):
        # (3.11's ``a and b`` kept as a value: the jump keeps the tested value, the fall-through
        # pops it; the library's effect, the larger of the two, pops nothing)
        return 1, 0, False
    # (the library gives (-pops, pushes) where it knows them, else (net effect, 0): a net
    # growth is counted as pushes, the slots below it untouched)
    pre, post = ins.raw.pre_and_post_stack_effect()
    return max(0, -pre), post + max(0, pre), False


def plan_break(instrs: list[bytecode_utils.Instr], index: int, layout: list[str], local_names: list[str],
               pushed: tuple[str, ...] | None = None) -> BreakPlan:
    """Decide how far native execution runs from ``index`` and what each exit hands over.

    Native execution runs the break's instruction; a call's result is then handed to the
    continuation, which compiles the rest of the expression (``self.w2(F.silu(self.w1(x)) *
    self.w3(x))`` broken at ``w1``: ``w3``, ``silu``, the product and ``w2`` are the
    continuation's), the stack's NULLs handed over as such. Another break instruction runs on
    natively to the end of the expression around it (until no NULL is left on the stack).
    Where that expression goes on with a jump (a 3.12 inlined
    comprehension inside a call: ``torch.stack([f(t) for t in xs])``, or a conditional
    expression as an argument), the exit is at the jump and its NULLs are handed over as
    such (spilled by the epilogue, pushed back by the continuation's prologue).

    ``pushed``: the kinds a load at ``index`` pushes, where the caller knows them (a property
    read in method form pushes NULL and its value). Only that read then runs natively: the
    call or expression it feeds is the continuation's, and is compiled."""
    first = instrs[index]
    if first.opname in _NOT_BREAKABLE:
        raise Unsupported(f"cannot resume after {first.opname}")
    for ins in instrs[index:]:
        # a continuation's prologue (a stack slot made an iterator again, say): the slots it
        # has not pushed yet are still its parameters, which a break does not hand over
        if ins.opname in ("LOAD_FAST", "DELETE_FAST") and str(ins.arg).startswith("___stack"):
            raise Unsupported("a graph break while a continuation pushes back the stack it was handed")
        if ins.target is not None:
            break
    start = index - 1 if index > 0 and instrs[index - 1].opname == "KW_NAMES" else index
    kinds = list(layout)   # the kind of each stack slot as native execution goes on
    names = list(local_names)
    exits: list[Exit] = []

    # the break's own call: once it returned, the rest of the expression is the continuation's
    # (compiled), its NULLs handed over as such. (The slots below the call's result are the
    # interpreter's, whose kinds are known, not guessed from the bytecode.)
    own_call = index + 1 if first.opname == "PRECALL" else index
    k = index
    while True:
        ins = instrs[k]
        if k > index and NULL not in kinds:
            exits.append(Exit("fallthrough", k, tuple(kinds), tuple(names)))
            break
        if k == own_call + 1 and instrs[own_call].opname in _CALLS and ins.target is None \
                and ins.opname not in _NOT_BREAKABLE:
            exits.append(Exit("fallthrough", k, tuple(kinds), tuple(names)))
            break
        if k > index and (ins.target is not None or (ins.opname in _NOT_BREAKABLE
                                                     and ins.opname not in _NATIVE_OK)):
            if ins.opname not in _RESUMABLE_WITH_NULLS:
                raise Unsupported(f"the expression around a graph break continues with {ins.opname}")
            exits.append(Exit("fallthrough", k, tuple(kinds), tuple(names)))
            break
        if ins.opname in ("RETURN_VALUE", "RETURN_CONST"):
            break  # the native part returns the frame's result
        if ins.opname == "RAISE_VARARGS":
            # the native part raises: the frame's own handlers (kept in the break function)
            # take it, and the rest of the frame runs natively from there
            break
        if ins.opname in ("SWAP", "COPY") and ins.arg > len(kinds):
            raise Unsupported("stack underflow while planning a graph break")
        if ins.opname == "SWAP":
            kinds[-1], kinds[-ins.arg] = kinds[-ins.arg], kinds[-1]
        elif ins.opname == "COPY":
            kinds.append(kinds[-ins.arg])
        else:
            pops, pushes, null = _effect(ins)
            low = len(kinds) - pops
            if low < 0:
                raise Unsupported("stack underflow while planning a graph break")
            del kinds[low:]
            if k == index and pushed is not None and k + 1 < len(instrs) and instrs[k + 1].target is None \
                    and instrs[k + 1].opname not in _NOT_BREAKABLE:
                kinds += list(pushed)
                exits.append(Exit("fallthrough", k + 1, tuple(kinds), tuple(names)))
                break
            if k == index and ins.opname in _COND_JUMPS:
                keep = 1 if ins.opname.startswith("JUMP_IF_") else 0
                exits.append(Exit("jump", ins.target, tuple(kinds) + (VALUE,) * keep, tuple(names)))
                if k + 1 >= len(instrs):
                    break
                k += 1
                continue
            kinds += [NULL if null and p == 0 else VALUE for p in range(pushes)]
        if ins.opname == "STORE_FAST" and ins.arg not in names:
            names.append(ins.arg)
        elif ins.opname == "DELETE_FAST" and ins.arg in names:
            names.remove(ins.arg)
        k += 1
        if k >= len(instrs):
            raise Unsupported("graph break at the end of the code")
    return BreakPlan(index, start, tuple(layout), tuple(local_names), tuple(exits))


# -- code generation --------------------------------------------------------------------------

def slot_kind(value) -> str:
    """How a stack slot of the interpreter is handed over (NULL, ITER, PREV_EXC, VALUE)."""
    if isinstance(value, NullValue):
        return NULL
    if value is UNBOUND_VALUE:
        return UNBOUND
    if isinstance(value, IteratorValue) and not getattr(value, "infinite", False):
        return ITER     # (an infinite itertools iterator is handed over as itself)
    if isinstance(value, PrevExcValue):
        return PREV_EXC
    return VALUE


_INTERNAL_PREFIXES = ("___stack", "___kiln_")


def handover_locals(code: types.CodeType, bound) -> list[str]:
    """The locals a break hands over, in order: the frame's bound locals (not the internal
    ``___stack`` parameters, dead once a prologue pushed them) and its cells (as cell
    objects, see ``_cells_as_locals``). The code's first parameter comes first: zero-argument
    ``super()`` reads the frame's first local, so it must stay the first parameter of every
    break function and continuation."""
    names = [n for n in bound if not n.startswith(_INTERNAL_PREFIXES)]
    names += [c for c in (CELL_PREFIX + n for n in code.co_cellvars) if c not in names]
    first = code.co_varnames[0] if code.co_argcount else None
    if "__class__" in code.co_freevars and first is not None:
        if first not in names:
            # deleted, or a cell (super() would read the cell object): only eager is exact
            raise Unsupported(f"a graph break in a method using super() whose first argument "
                              f"{first!r} is {'a closure cell' if first in code.co_cellvars else 'unbound'}")
    if first in names:
        names.remove(first)
        names.insert(0, first)
    return names


def _param_names(layout, local_names) -> list[str]:
    """Parameters of a break function or continuation: the locals first (the frame's first
    local stays first, for ``super()``), then the stack slots."""
    return list(local_names) + [f"___stack{k}" for k, s in enumerate(layout) if s not in _NOT_HANDED]


CELL_PREFIX = "___cell_"
# the frame's ``locals()`` dict, once the function asked for it: handed over like a local, so
# that the continuation's ``locals()`` is the same dict (keys the function added stay, as in
# CPython before 3.13, where a frame keeps one dict)
FRAME_LOCALS = "___flocals"

# (_ORIGINAL: generated code object, its name blanked as it may be renamed after the user's
# function -> the user's code it was made from, what ``locals()`` lists)


def _unnamed(code: types.CodeType) -> types.CodeType:
    # also without the continuations a break function loads as constants: the key must not
    # keep them (and the closures and tensors they hold) alive
    consts = tuple(None if callable(c) and not isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    return code.replace(co_name="<kiln>", co_qualname="<kiln>", co_consts=consts)


def _register(generated: types.CodeType, code: types.CodeType) -> None:
    _ORIGINAL[_unnamed(generated)] = original_code(code)


def original_code(code: types.CodeType) -> types.CodeType:
    """The user's code a break function or continuation was generated from (else ``code``)."""
    if not _ORIGINAL:
        return code
    return _ORIGINAL.get(_unnamed(code), code)


def _cells_as_locals(code: types.CodeType, items: list) -> list:
    """Rewrite the frame's own cell variables into locals holding cell objects: a break
    hands the real cells over, so closures created before the break keep sharing them."""
    if not code.co_cellvars:
        return items
    out = []
    for it in items:
        if isinstance(it, Instr) and isinstance(it.arg, bytecode.CellVar):
            name, local = it.arg.name, CELL_PREFIX + it.arg.name
            loc = it.lineno
            if it.name == "MAKE_CELL":
                out.append(Instr("NOP", lineno=loc))
            elif it.name == "LOAD_CLOSURE":
                out.append(Instr("LOAD_FAST", local, lineno=loc))
            elif it.name == "LOAD_DEREF":
                out += [Instr("PUSH_NULL", lineno=loc), Instr("LOAD_CONST", CellAccess(name, False), lineno=loc),
                        Instr("LOAD_FAST", local, lineno=loc), *bytecode_utils.call_instructions(1, loc)]
            elif it.name == "STORE_DEREF":
                out += [Instr("LOAD_FAST", local, lineno=loc), Instr("STORE_ATTR", "cell_contents", lineno=loc)]
            elif it.name == "DELETE_DEREF":
                out += [Instr("PUSH_NULL", lineno=loc), Instr("LOAD_CONST", CellAccess(name, True), lineno=loc),
                        Instr("LOAD_FAST", local, lineno=loc), *bytecode_utils.call_instructions(1, loc),
                        Instr("POP_TOP", lineno=loc)]
            else:
                raise Unsupported(f"{it.name} of cell {name!r} across a graph break")
        else:
            out.append(it)
    return out


class CellAccess:
    """What a continuation calls to read (or ``del``) the frame's own cell variable ``name``,
    which it holds as a cell in a local: an empty cell raises UnboundLocalError, as
    LOAD_DEREF and DELETE_DEREF do (the cell's ``cell_contents`` raises ValueError on a read
    and nothing on a delete)."""

    __slots__ = ("name", "deletes")

    def __init__(self, name: str, deletes: bool):
        self.name = name
        self.deletes = deletes

    def unbound(self) -> UnboundLocalError:
        return UnboundLocalError(f"cannot access local variable '{self.name}' where it is not associated with a value")

    def __call__(self, cell):
        try:
            value = cell.cell_contents
        except ValueError:
            raise self.unbound() from None
        if self.deletes:
            del cell.cell_contents
            return None
        return value

    def __repr__(self) -> str:
        return f"<kiln: {'del' if self.deletes else 'read'} of cell variable {self.name!r}>"


class FrameIntrospection:
    """What ``locals()``, ``vars()`` and ``dir()`` (with no argument) are in a break function
    or continuation that runs the user's code natively: the user's frame as eager has it.
    The generated frame's own locals also hold kiln's parameters (stack slots, the holders of
    handed cells, the handed ``locals()`` dict), which the user never wrote. Called with
    arguments, or where the module shadows the builtin, it is whatever the name finds."""

    def __init__(self, name: str):
        self.name = name
        self.builtin = getattr(builtins, name)

    def __call__(self, /, *args, **kwargs):
        frame = sys._getframe(1)
        found = frame.f_globals.get(self.name, frame.f_builtins.get(self.name, self.builtin))
        if args or kwargs or found is not self.builtin:
            return found(*args, **kwargs)
        try:
            visible = user_frame_locals(frame)
        finally:
            del frame
        return sorted(visible) if self.name == "dir" else visible

    def __repr__(self) -> str:
        return f"<kiln: {self.name}() of the user's frame>"


_INTROSPECTION = {n: FrameIntrospection(n) for n in ("locals", "vars", "dir")}


def introspection_for(fn) -> FrameIntrospection | None:
    """The ``FrameIntrospection`` a generated frame calls where the user's code calls the
    builtin ``fn`` (``locals``, ``vars``, ``dir``), else None."""
    for name, wrapper in _INTROSPECTION.items():
        if fn is wrapper.builtin:
            return wrapper
    return None


def user_frame_locals(frame) -> dict:
    """The ``locals()`` of the user's frame that a generated frame runs: one dict per frame
    (the one handed over a break, if the function asked for it before), with the user's
    bound variables, its cells' and free variables' contents, in the user's code's order."""
    frame_dict = frame.f_locals
    own = dict(frame_dict)              # (read before kiln's names leave the frame's dict)
    handed = own.get(FRAME_LOCALS)
    out = handed if isinstance(handed, dict) else frame_dict
    code = original_code(frame.f_code)
    for name in [n for n in out if n.startswith("___")]:
        del out[name]
    if code is frame.f_code:      # (no longer registered: kiln's own names hidden is all it can do)
        return out
    cells = set(code.co_cellvars) | set(code.co_freevars)
    names = [*code.co_varnames, *(c for c in code.co_cellvars if c not in code.co_varnames), *code.co_freevars]
    for name in names:
        holder = own.get(CELL_PREFIX + name) if name in cells else None
        if isinstance(holder, types.CellType):     # a cell of the frame, handed as a local
            try:
                value, bound = holder.cell_contents, True
            except ValueError:                      # empty: not in locals()
                value, bound = None, False
        else:
            value, bound = own.get(name), name in own
        if bound:
            out[name] = value
        else:
            out.pop(name, None)
    return out


def _native_introspection(code: types.CodeType, items: list) -> list:
    """``locals``/``vars``/``dir`` loaded as globals become ``FrameIntrospection``."""
    if not any(n in code.co_names for n in _INTROSPECTION):
        return items
    out = []
    for it in items:
        arg = getattr(it, "arg", None) if isinstance(it, Instr) else None
        if isinstance(it, Instr) and it.name == "LOAD_GLOBAL":
            push_null, name = arg if isinstance(arg, tuple) else (False, arg)
            if name in _INTROSPECTION:
                if push_null:
                    out.append(Instr("PUSH_NULL", lineno=it.lineno))
                out.append(Instr("LOAD_CONST", _INTROSPECTION[name], lineno=it.lineno))
                continue
        out.append(it)
    return out


def _new_bytecode(code: types.CodeType, items: list, params: list[str], name: str) -> types.CodeType:
    bc = Bytecode(_cells_as_locals(code, _native_introspection(code, items)))
    bc.name = name
    bc.filename = code.co_filename
    bc.first_lineno = code.co_firstlineno
    bc.argcount = len(params)
    bc.posonlyargcount = 0
    bc.kwonlyargcount = 0
    bc.argnames = list(params)
    bc.cellvars = []  # they are locals holding the handed-over cells (_cells_as_locals)
    bc.freevars = list(code.co_freevars)
    flags = code.co_flags & ~(bytecode_utils.CO_VARARGS | bytecode_utils.CO_VARKEYWORDS
                              | bytecode_utils.CO_GENERATOR | bytecode_utils.CO_COROUTINE
                              | bytecode_utils.CO_ASYNC_GENERATOR | bytecode_utils.CO_ITERABLE_COROUTINE)
    bc.flags = flags
    if hasattr(bc, "qualname"):
        bc.qualname = name
    # The prologue rebuilds the exact stack of the jump target, so the original exception
    # table's stack depths stay right; flow analysis from the prologue would not reach the
    # try blocks it jumps into and would leave them unset. The stack size is a bound: the
    # stack at an original instruction is the original's (at most co_stacksize, one more
    # while the prologue re-enters a handler); an epilogue packs the stack and pushes at
    # most the locals and four more. The library's analysis is only a cross-check: it goes
    # wrong (a negative size) when a jump enters a try region in its middle, where it
    # never saw the region's start.
    bound = code.co_stacksize + len(params) + 8
    try:
        computed = bc.compute_stacksize()
    except RuntimeError:
        computed = 0
    return bc.to_code(stacksize=max(computed, bound), compute_exception_stack_depths=False)


def _prologue(code, layout, target: Label, lineno: int) -> list:
    out = []
    if code.co_freevars:
        out.append(Instr("COPY_FREE_VARS", len(code.co_freevars), lineno=lineno))
    out.append(Instr("RESUME", 0, lineno=lineno))
    for k, kind in enumerate(layout):
        if kind == NULL:
            out.append(Instr("PUSH_NULL", lineno=lineno))
        elif kind == UNBOUND:
            # a NULL that kiln's interpreter also reads as an unbound saved variable
            out.append(Instr("LOAD_FAST_AND_CLEAR", _NEVER_BOUND, lineno=lineno))
        else:
            out.append(Instr("LOAD_FAST", f"___stack{k}", lineno=lineno))
            if kind == ITER:
                out.append(Instr("GET_ITER", lineno=lineno))
            elif kind == PREV_EXC:
                # re-enter the handler: the slot becomes the exception handled before it
                # (the caller's, or the enclosing handler's), the handled one is current
                out += [Instr("PUSH_EXC_INFO", lineno=lineno), Instr("POP_TOP", lineno=lineno)]
    # the stack parameters are dead now: locals() must not show them
    out += [Instr("DELETE_FAST", f"___stack{k}", lineno=lineno) for k, kind in enumerate(layout)
            if kind not in _NOT_HANDED]
    out.append(Instr("JUMP_FORWARD", target, lineno=lineno))
    return out


def _original_items(code) -> list:
    """The abstract items of ``code`` (its own COPY_FREE_VARS/MAKE_CELL/RESUME become
    unreachable in the copy, which is harmless), with each try block's stack depth taken
    from the real exception table: the abstract form does not keep them, and flow analysis
    from our prologue would not reach the blocks it jumps into."""
    items = list(Bytecode.from_code(code))
    if not bytecode_utils.set_exception_depths(code, items):
        raise Unsupported("cannot map the code's exception table for a graph break")
    return items


def _raw_positions(code, items: list) -> dict[int, int]:
    """id(raw Instr) -> position in ``items``."""
    return {id(it): p for p, it in enumerate(items)}


def build_continuation(code: types.CodeType, exit: Exit, name: str) -> types.CodeType:
    items = _original_items(code)
    decoded = bytecode_utils.decode_with_raw(code, items)
    entry_label = Label()
    target = decoded[exit.decoded_index]
    pos = _start_position(items, decoded, exit.decoded_index)
    lineno = target.lineno or code.co_firstlineno
    items.insert(pos, entry_label)
    params = _param_names(exit.layout, exit.local_names)
    prologue = _prologue(code, exit.layout, entry_label, lineno)
    out = _new_bytecode(code, prologue + items, params, name)
    _register(out, code)
    # (the prologue's one jump, to where the continuation starts, and how deep it is nested:
    # see ``loops_back``)
    jump = next((i for i in bytecode_utils.decode(out) if i.target is not None), None)
    if jump is not None:
        outer = _STARTS.get(_unnamed(code)) if _STARTS else None
        _STARTS[_unnamed(out)] = (jump.index, jump.target, 1 + (outer[2] if outer else 0))
    return out


# Continuations of continuations a loop may nest before the rest of it runs natively: every
# iteration that breaks the graph resumes in a new continuation, called from the last one
# (a capture and about five Python frames more per iteration). Enough for a model's layers
# (each broken once); a loop of thousands would otherwise capture thousands of times and
# run into the interpreter's recursion limit.
LOOP_LEVELS = 64


# A loop with more items left than this, broken in every iteration, runs natively from its
# second iteration: each continuation is handed the items left (guarded one by one), so
# compiling it iteration by iteration would cost O(n) per iteration.
LONG_LOOP_ITEMS = 256
# More items than this left in an iterator at a graph break: the frame runs natively instead.
HANDED_ITEMS_LIMIT = 1024


def loops_back(code: types.CodeType, index: int, levels: int = LOOP_LEVELS) -> bool:
    """Whether ``code`` is a continuation nested ``levels`` deep whose decoded instruction
    ``index`` comes before the one it started at: a loop's back edge took it there, and a
    break would nest one more level for the next iteration."""
    start = _STARTS.get(_unnamed(code)) if _STARTS else None
    return start is not None and start[0] < index < start[1] and start[2] >= levels


def build_break_function(code: types.CodeType, plan: BreakPlan, continue_fns: list[Callable], name: str) -> types.CodeType:
    """The break function's code; it reads ``continue_fns`` through weak references: the
    function made from it must hold them (``__kiln_continuations__``)."""
    items = _original_items(code)
    decoded = bytecode_utils.decode_with_raw(code, items)
    start_raw = decoded[plan.start_index].raw
    pos_of = _raw_positions(code, items)
    lineno = decoded[plan.index].lineno or code.co_firstlineno
    epilogues = []
    for exit, cont in zip(plan.exits, continue_fns):
        label = Label()
        epilogues += [label, *_epilogue(exit, cont, lineno)]
        if exit.kind == "jump":
            raw = decoded[plan.index].raw  # a fresh copy: retarget it in place
            raw.set(bytecode_utils.forward_jump_name(raw.name), label)
        else:
            # to the continuation the first time only: the native part may run this code
            # again (its own handler took an exception, and a loop came back here), with the
            # stack as CPython lays it out, not as the plan does; from then on the rest of
            # the frame runs natively
            last = decoded[exit.decoded_index - 1].raw
            p = pos_of[id(last)]
            native = Label()
            items[p + 1:p + 1] = [Instr("LOAD_FAST", _ARMED, lineno=lineno),
                                  Instr(_JUMP_IF_FALSE, native, lineno=lineno),
                                  Instr("LOAD_CONST", False, lineno=lineno),
                                  Instr("STORE_FAST", _ARMED, lineno=lineno),
                                  Instr("JUMP_FORWARD", label, lineno=lineno), native]
            pos_of = _raw_positions(code, items)
    if any(exit.kind != "jump" for exit in plan.exits):
        # an exception the native part's own handler takes leaves that first pass for good
        handlers = {id(it.target) for it in items if isinstance(it, bytecode.TryBegin)}
        for i in reversed(range(len(items))):
            if isinstance(items[i], Label) and id(items[i]) in handlers:
                items[i + 1:i + 1] = [Instr("LOAD_CONST", False, lineno=lineno),
                                      Instr("STORE_FAST", _ARMED, lineno=lineno)]
    start_label = Label()
    items.insert(_position_of(items, start_raw), start_label)
    params = _param_names(plan.layout, plan.local_names)
    prologue = _prologue(code, plan.layout, start_label, lineno)
    resume_at = next(i for i, it in enumerate(prologue) if isinstance(it, Instr) and it.name == "RESUME")
    prologue[resume_at + 1:resume_at + 1] = [Instr("LOAD_CONST", True, lineno=lineno),
                                             Instr("STORE_FAST", _ARMED, lineno=lineno)]
    out = _new_bytecode(code, prologue + items + epilogues, params, name)
    _register(out, code)
    return out


def _start_position(items, decoded, index: int) -> int:
    return _position_of(items, decoded[index].raw)


def _position_of(items, raw) -> int:
    """Where execution of ``raw`` starts: before a 3.11 PRECALL that prefixes it."""
    p = next(i for i, it in enumerate(items) if it is raw)
    while p > 0 and isinstance(items[p - 1], Instr) and items[p - 1].name == "PRECALL":
        p -= 1
    return p


def _pack_stack(layout: tuple[str, ...], lineno: int) -> list:
    """Instructions that pop the whole stack into ``___kiln_stack``, a tuple of the handed
    slots (not the NULL and UNBOUND ones: NULLs, which BUILD_TUPLE must not see)."""
    if not any(s in _NOT_HANDED for s in layout):
        return [Instr("BUILD_TUPLE", len(layout), lineno=lineno),
                Instr("STORE_FAST", "___kiln_stack", lineno=lineno)]
    out = [Instr("STORE_FAST", f"___kiln_slot{k}", lineno=lineno) for k in reversed(range(len(layout)))]
    handed = [k for k, s in enumerate(layout) if s not in _NOT_HANDED]
    out += [Instr("LOAD_FAST", f"___kiln_slot{k}", lineno=lineno) for k in handed]
    return out + [Instr("BUILD_TUPLE", len(handed), lineno=lineno),
                  Instr("STORE_FAST", "___kiln_stack", lineno=lineno)]


def _epilogue(exit: Exit, cont: Callable, lineno: int) -> list:
    out = _pack_stack(exit.layout, lineno)
    # positions in the packed tuple
    prev = [i for i, s in enumerate(s for s in exit.layout if s not in _NOT_HANDED) if s == PREV_EXC]
    if prev:
        # the exception being handled (for the continuation), then the caller's restored
        # (the outermost handler's slot holds it) before the continuation runs
        out += [Instr("PUSH_NULL", lineno=lineno), Instr("LOAD_CONST", _handled_exception, lineno=lineno),
                *bytecode_utils.call_instructions(0, lineno), Instr("STORE_FAST", "___kiln_handled", lineno=lineno),
                Instr("LOAD_FAST", "___kiln_stack", lineno=lineno), Instr("LOAD_CONST", prev[0], lineno=lineno),
                Instr("BINARY_SUBSCR", lineno=lineno), Instr("POP_EXCEPT", lineno=lineno)]
    # The code holds the continuation only weakly (calling the weak reference gives it back):
    # code objects are invisible to the garbage collector, so a strong constant would keep
    # the continuation, its own break functions' code and theirs (and every closure cell and
    # tensor they hold) alive for one more collection per level of nesting. The break
    # function holds the continuations strongly (``__kiln_continuations__``).
    out += [Instr("PUSH_NULL", lineno=lineno),
            Instr("PUSH_NULL", lineno=lineno), Instr("LOAD_CONST", weakref.ref(cont), lineno=lineno),
            *bytecode_utils.call_instructions(0, lineno),
            Instr("LOAD_FAST", "___kiln_stack", lineno=lineno)]
    for n in exit.local_names:
        out.append(Instr("LOAD_FAST", n, lineno=lineno))
    out.append(Instr("BUILD_TUPLE", len(exit.local_names), lineno=lineno))
    if prev:
        out.append(Instr("LOAD_FAST", "___kiln_handled", lineno=lineno))
    out += bytecode_utils.call_instructions(3 if prev else 2, lineno)
    out.append(Instr("RETURN_VALUE", lineno=lineno))
    return out


def _handled_exception():
    return sys.exc_info()[1]


_LIST_ITERATORS = (type(iter([])), type(reversed([])))
_RANGE_ITERATORS = (type(iter(range(0))), type(iter(range(1 << 64))))


def _remaining(it):
    """What is left of a handed iterator, for the continuation's prologue to iterate: a range
    iterator as the range of its remaining numbers (the same class once iterated, and
    handed over in constant size however long the loop), others as the tuple of their items."""
    if type(it) in _RANGE_ITERATORS:
        _, (r,), pos = it.__reduce__()
        return r[pos:]
    return tuple(it)


def make_continue(resume: Callable, layout: tuple[str, ...]) -> Callable:
    """The function an epilogue calls: iterators are handed over as what remains of them
    (``_remaining``; the continuation's prologue turns it back into an iterator; an iterator
    over a list as itself, which sees what the continuation appends to the list), and each
    handler's slot as the exception that handler handles (the next handler's slot holds it;
    the innermost one is the exception being handled)."""
    handed = [s for s in layout if s not in _NOT_HANDED]   # (what the epilogue packs)
    iter_slots = [k for k, s in enumerate(handed) if s == ITER]
    prev_slots = [k for k, s in enumerate(handed) if s == PREV_EXC]
    if not iter_slots and not prev_slots:
        def ___kiln_continue(stack, local_values):
            return resume(*local_values, *stack)
    else:
        def ___kiln_continue(stack, local_values, handled=None):
            given = stack
            stack = list(stack)
            for k in iter_slots:
                if type(stack[k]) not in _LIST_ITERATORS:
                    stack[k] = _remaining(stack[k])
            for i, k in enumerate(prev_slots):
                stack[k] = given[prev_slots[i + 1]] if i + 1 < len(prev_slots) else handled
            return resume(*local_values, *stack)
    ___kiln_continue.__kiln_resume__ = resume
    return ___kiln_continue
