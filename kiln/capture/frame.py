"""Drive the capture of one frame: wrap the arguments, interpret the bytecode, generate the
entry (guards + graph call + output reconstruction), and compile the graph with a backend."""
from __future__ import annotations

import dataclasses
import inspect
import time
import types
from typing import Any, Callable

import torch

from .. import _torch, logs
from ..errors import Unsupported
from . import bytecode_utils as bu
from .codegen import EntryCodegen, GuardProgram, compile_function, signature_text
from .guards import Guard, GuardKind
from .interpreter import FrameInterpreter
from .output_graph import OutputGraph
from .sources import LocalSource, RenderContext
from .values.base import LazyArgument
from .values.functions import ExistingCellValue


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

    @property
    def is_eager(self) -> bool:
        return self.eager_reason is not None

    def failure_reason(self, args: tuple, kwargs: dict) -> str | None:
        return self.program.failure(args, kwargs)

    def describe_guards(self) -> str:
        return "\n".join(g.describe() for g in self.guards)


def bind_call(fn: types.FunctionType, args: tuple, kwargs: dict) -> dict[str, Any]:
    sig = inspect.signature(fn)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        raise  # the user's own TypeError, as eager would raise it
    bound.apply_defaults()
    return dict(bound.arguments)


def capture(fn: types.FunctionType, args: tuple, kwargs: dict, *, key, backend: Callable,
            backend_name: str) -> Entry:
    """Capture ``fn`` for these arguments. Raises Unsupported if the frame cannot be captured
    (the partial guards gathered so far are attached as ``exc.guards``)."""
    t0 = time.perf_counter()
    code = fn.__code__
    if bu.is_generator_code(code) or bu.is_async_code(code):
        kind = "generator" if bu.is_generator_code(code) else "coroutine / async function"
        raise Unsupported(f"{kind} {fn.__qualname__} (runs eagerly)", code.co_filename, code.co_firstlineno)
    output = OutputGraph(fn.__qualname__)
    # The generated entry has fn's signature and defaults: guard that they stay fn's.
    output.guards.add(Guard(GuardKind.FUNCTION_MATCH, None,
                            (fn, fn.__code__, fn.__defaults__, fn.__kwdefaults__)))
    try:
        bound = bind_call(fn, args, kwargs)
        # Arguments are wrapped (and guarded) when the code first reads them.
        f_locals = {name: LazyArgument(v, LocalSource(name)) for name, v in bound.items()}
        cells = {name: ExistingCellValue(c, name)
                 for name, c in zip(code.co_freevars, fn.__closure__ or ())}
        tx = FrameInterpreter(output, code, fn.__globals__, f_locals, cells, name=fn.__qualname__)
        result = tx.run()
        entry = _finish(fn, output, result, key, backend, backend_name)
    except Unsupported as e:
        e.guards = list(output.guards)
        e.output = output
        raise
    finally:
        output.restore_grad_mode()
    for inp in output.tensor_inputs:
        inp.real = None  # do not keep the caller's tensors alive
    entry.capture_seconds = time.perf_counter() - t0
    return entry


def _finish(fn, output: OutputGraph, result, key, backend, backend_name) -> Entry:
    cg = EntryCodegen()
    ret = result.reconstruct(cg)
    effects = output.side_effects.codegen(cg)  # may stash more objects: statements come first
    graph = output.graph
    graph.output(tuple(cg.output_nodes))
    output.remove_unused()
    has_ops = any(n.op not in ("placeholder", "output") for n in graph.nodes)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph, class_name=f"Kiln_{_ident(fn.__qualname__)}")
    inputs = output.graph_inputs()
    compiled = None
    if has_ops:
        gm.meta["kiln_static_inputs"] = [i for i, inp in enumerate(inputs) if inp.static]
        example = [_real_input(inp) for inp in inputs]
        if logs.enabled.graph:
            logs.log("graph", f"graph of {fn.__qualname__}:\n{gm.print_readable(print_output=False)}")
        compiled = backend(gm, example)
        if not callable(compiled):
            raise TypeError(f"backend {backend_name!r} returned {type(compiled).__name__}, not a callable")
    guards = list(output.guards)
    program, params, fwd = _program(fn, output, guards, cg.ctx)
    lines = [f"def __kiln_entry({params}):", *program.prelude()]
    index_of = {id(inp): i for i, inp in enumerate(output.tensor_inputs)}
    if compiled is not None:
        cg.ctx.namespace["___graph"] = compiled
        call_args = ", ".join(f"___in{index_of[id(inp)]}" for inp in inputs)
        lines.append(f"    ___out = ___graph({call_args})")
    lines += [f"    {line}" for line in cg.statements]
    lines += [f"    {line}" for line in effects]
    lines.append(f"    return {ret}")
    src = "\n".join(lines)
    entry_fn = compile_function(src, "__kiln_entry", cg.ctx.namespace)
    if logs.enabled.guards:
        logs.log("guards", f"guards of {fn.__qualname__}:\n" + "\n".join(
            "  " + g.describe() for g in guards))
    return Entry(key, backend_name, entry_fn, program.make_check("__kiln_check"), guards, program,
                 gm if has_ops else None, compiled, src)


def eager_entry(fn, exc: Unsupported, key, backend_name: str) -> Entry:
    """An entry that runs ``fn`` eagerly whenever the guards gathered before the failure hold
    (under them, capture would fail the same way)."""
    guards = [g for g in getattr(exc, "guards", [])]
    output = getattr(exc, "output", None)
    ctx = RenderContext()
    if output is None:
        output = OutputGraph(fn.__qualname__)
        guards = list(output.guards)
    program, params, fwd = _program(fn, output, guards, ctx)
    ctx.namespace["___fn"] = fn
    lines = [f"def __kiln_eager({params}):", *program.prelude(), f"    return ___fn({fwd})"]
    src = "\n".join(lines)
    entry_fn = compile_function(src, "__kiln_eager", ctx.namespace)
    return Entry(key, backend_name, entry_fn, program.make_check("__kiln_check"), guards, program,
                 None, None, src, eager_reason=exc)


def _program(fn, output: OutputGraph, guards: list[Guard], ctx: RenderContext):
    params, fwd = signature_text(fn.__code__, fn.__defaults__, fn.__kwdefaults__, ctx)
    tg = _torch.make_tensor_guards([_real_input(inp) for inp in output.tensor_inputs])
    program = GuardProgram(guards, [inp.source for inp in output.tensor_inputs], tg,
                           output.global_state, ctx, params)
    return program, params, fwd


def _real_input(inp) -> torch.Tensor:
    return inp.real


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)
