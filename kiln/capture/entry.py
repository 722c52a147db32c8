"""What a capture leaves for the call path: an ``Entry`` (one compiled specialization of a
function, with its guards), how a call's arguments bind to the function's parameters, and the
fields that describe a graph break.

Kept apart from the capture itself (``frame.py``, which imports the bytecode tracer): the call
path of a warm process, whose entries come from the cache or a package, imports this module
and never the tracer.
"""
from __future__ import annotations

import dataclasses
import inspect
import linecache
import types
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

    from ..errors import Unsupported
    from .codegen import GuardProgram
    from .guards import Guard


@dataclasses.dataclass(eq=False)
class Entry:
    """One compiled specialization of a function: its guards and what to run when they hold."""
    key: Any                       # the compile key (backend + options): BACKEND_MATCH
    backend_name: str
    fn: Callable                   # fused: returns MISS when a guard fails, else the result
    check: Callable                # the guards alone, with the user's signature
    guards: list[Guard]
    program: GuardProgram
    graph_module: torch.fx.GraphModule | None
    compiled_graph: Callable | None
    source: str                    # the generated code of `fn`
    eager_reason: Unsupported | None = None   # set when this entry runs the frame eagerly
    capture_seconds: float = 0.0
    graph_break: Unsupported | None = None    # set when the frame breaks: why, and where
    resumes: tuple = ()                       # the continuations' CompiledFunctions
    replaced_by: "Entry | None" = None        # its generated code failed: the eager entry now used
    inlined: dict = dataclasses.field(default_factory=dict)   # code -> (module, qualname) inlined
    break_plan: tuple | None = None           # (code, resume.BreakPlan) of a graph break
    # a weak reference to the module its first argument was at capture (``self`` of a module's
    # forward or method): the recompile limit counts entries per module. None: counted for
    # every call; ``loaded_entry``: loaded from a package or frame record, counted for none
    captured_for: Any = None

    @property
    def is_eager(self) -> bool:
        return self.eager_reason is not None

    @property
    def symbols(self) -> dict[str, str]:
        """The shape symbols of this entry: name -> where it is read (``s4821 ->
        L['x'].size()[0]``); empty when every shape is static."""
        shape = self.program.shape
        return shape.symbol_names() if shape is not None else {}

    def failure_reason(self, args: tuple, kwargs: dict) -> str | None:
        return self.program.failure(args, kwargs)

    def describe_guards(self) -> str:
        return "\n".join(g.describe() for g in self.guards)


def loaded_entry() -> None:
    """``Entry.captured_for`` of an entry loaded from a package or a frame record: captured
    in another process, for none of this process's modules."""
    return None


def make_check(fn, program: "GuardProgram"):
    """The guards of ``program`` alone, as a function with ``fn``'s signature."""
    return program.make_check("__kiln_check", like=fn.__code__, f_globals=fn.__globals__)


class ArgumentsDoNotBind(Exception):
    """The call's arguments do not fit the function's signature. The caller runs the function
    eagerly, which raises the user's own TypeError (eager's exact message)."""


def bind_call(fn: types.FunctionType, args: tuple, kwargs: dict) -> dict[str, Any]:
    # the code's own parameters: not those of __wrapped__ (functools.wraps) or of __signature__
    plain = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    plain.__kwdefaults__ = fn.__kwdefaults__
    code = fn.__code__
    if not all(n.isidentifier() for n in code.co_varnames[:code.co_argcount]):
        # parameters that are not identifiers (".0" of a 3.11 comprehension, pytest's
        # "@py_assert" locals in a resume function): such functions are called positionally
        if kwargs or len(args) != code.co_argcount:
            raise ArgumentsDoNotBind(f"{fn.__qualname__}() takes {code.co_argcount} positional arguments")
        return dict(zip(code.co_varnames, args))
    sig = inspect.signature(plain)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise ArgumentsDoNotBind(str(e)) from e
    bound.apply_defaults()
    return dict(bound.arguments)


def break_fields(reason) -> dict:
    """The trace fields of a graph break or an eager frame: its reason and the user's line, with
    the lines around it (a break deep in a call is in another function than the frame's)."""
    filename, lineno = getattr(reason, "filename", None), getattr(reason, "lineno", None)
    context = None
    if filename and lineno:
        first = max(1, lineno - 3)
        lines = [linecache.getline(filename, n).rstrip("\n") for n in range(first, lineno + 4)]
        while lines and not lines[-1]:
            lines.pop()
        context = {"first": first, "lines": lines} if lines else None
    return {"reason": str(getattr(reason, "construct", reason)), "break_file": filename, "break_line": lineno,
            "source_line": getattr(reason, "source_line", None), "context": context}
