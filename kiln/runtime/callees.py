"""The tables behind the functions a graph break hands control to: which callees run as they
are (they read their callers' frames), one canonical object per nested function made anew on
every call, the closures seen per code, and each function's CompiledFunctions per compile key."""
from __future__ import annotations

import types

from ..process_state import callee_objects, canonical_functions, registry_lock, stack_walkers as _stack_walkers


# Names that read the caller's frame: sys._getframe(1), inspect.stack(), warnings' stacklevel...
_STACK_NAMES = frozenset({"_getframe", "_getframemodulename", "currentframe", "getouterframes",
                          "extract_stack", "format_stack", "print_stack", "walk_stack", "f_back",
                          "stacklevel"})


def walks_the_stack(code: types.CodeType) -> bool:
    """Whether a function's code may look at its callers' frames. Such a callee of a graph
    break runs as it is, not as its own compiled function: a compiled function is entered
    through kiln's frames, so ``sys._getframe(1)`` would see those instead of the caller (the
    module namedtuple() names, the line a warning with stacklevel=2 points at)."""
    hit = _stack_walkers.get(code)
    if hit is None:
        names = set(code.co_names)
        for c in code.co_consts:   # keyword names of calls (stacklevel=2) are constants
            if type(c) is tuple and all(type(x) is str for x in c):
                names.update(c)
        hit = _stack_walkers[code] = bool(names & _STACK_NAMES) or {"inspect", "stack"} <= names
    return hit


_COMPILED_ATTR = "__kiln_compiled__"


def compiled_per_key(fn: types.FunctionType) -> dict:
    """The CompiledFunctions of a continuation or callee ``fn``, per compile key. Kept in the
    function's own ``__dict__``: a cycle the garbage collector frees with the function (a
    global table weak in ``fn`` would still hold its values, and they hold ``fn``)."""
    held = fn.__dict__.get(_COMPILED_ATTR)
    if held is None or held[0] is not fn:   # (functools.wraps copies __dict__ to wrappers)
        with registry_lock:     # (a callee is compiled where its call runs, in any thread)
            held = fn.__dict__.get(_COMPILED_ATTR)
            if held is None or held[0] is not fn:
                held = (fn, {})
                fn.__dict__[_COMPILED_ATTR] = held
    return held[1]
