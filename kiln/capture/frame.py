"""Drive the capture of one frame: wrap the arguments, interpret the bytecode, generate the
entry (guards + graph call + output reconstruction), and compile the graph with a backend."""
from __future__ import annotations

import itertools
import time
import types
import weakref
from typing import Callable

import torch

from .. import _torch, cache, logs
from ..errors import Unsupported
from ..internal_errors import (EFFECTS_MARK, call_user, forget_frames, graph_has_effects,
                               internal_error, is_kiln_backend, is_users, mark_users)
from . import bytecode_utils, ddp_buckets, regions
from .entry import ArgumentsDoNotBind, Entry, bind_call, break_fields, make_check  # noqa: F401  (re-exported)
from .codegen import (EntryCodegen, GuardProgram, alias_parameters, compile_function, readable_source,
                      signature_text)
from .guards import Guard, GuardKind, TensorMeta
from . import resume
from .interpreter import BreakHere, FrameInterpreter, GeneratorAtBreak, GraphBreakRequest
from . import shape_guards
from .output_graph import OutputGraph, SymbolInput
from .values.attributes import _MISSING, has_user_getattribute, static_lookup
from .values.base import LazyArgument, NullValue, RealCallableValue
from ..errors import ConstraintViolation
from ..process_state import break_tables as _break_functions, continuation_code as _continuation_code
from ..process_state import registry_lock
from ..shapes.policy import ShapePolicy
from .sources import LocalSource, RenderContext
from .values.containers import IteratorValue
from .values.functions import ExistingCellValue, MethodValue
from .values.objects import GradModeValue, _enter_context


# each captured graph's id in the structured trace (its graph, stage-time and partition records)
_graph_ids = itertools.count(1)


def capture(fn: types.FunctionType, args: tuple, kwargs: dict, *, key, backend: Callable,
            backend_name: str, compiled_factory: Callable | None = None, max_breaks_retries: int = 8,
            dynamic: bool | None = None) -> Entry:
    """Capture ``fn`` for these arguments. At an instruction that cannot be captured, the
    capture restarts and stops before it, producing an entry that ends in a graph break
    (``compiled_factory(function)`` makes the continuations' CompiledFunctions). Raises
    Unsupported if the frame cannot be captured at all (the partial guards gathered so far
    are attached as ``exc.guards``)."""
    t0 = time.perf_counter()
    code = fn.__code__
    if bytecode_utils.is_generator_code(code) or bytecode_utils.is_async_code(code):
        kind = "generator" if bytecode_utils.is_generator_code(code) else "coroutine / async function"
        raise Unsupported(f"{kind} {fn.__qualname__} (runs eagerly)", code.co_filename, code.co_firstlineno)
    policy = ShapePolicy(dynamic, fn)
    try:
        return _capture(fn, args, kwargs, key, backend, backend_name, compiled_factory,
                        max_breaks_retries, policy, t0)
    finally:
        policy.finish()   # dims found dynamic go to the profile, on disk too


def _capture(fn, args, kwargs, key, backend, backend_name, compiled_factory, max_breaks_retries,
             policy, t0) -> Entry:
    code = fn.__code__
    break_at = None
    reason = None
    native_generators: frozenset = frozenset()
    for _ in range(max_breaks_retries):
        output = OutputGraph(fn.__qualname__, policy)
        output.native_generators = native_generators
        output.fullgraph = bool(getattr(key, "fullgraph", False))   # backends may fall back unless set
        output.capture_started = t0          # (KILN_LOGS=perf: seconds in capture per graph)
        # The generated entry has fn's signature and defaults: guard that they stay fn's.
        output.guards.add(Guard(GuardKind.FUNCTION_MATCH, None,
                                (weakref.ref(fn), fn.__code__, fn.__defaults__, fn.__kwdefaults__)))
        try:
            bound = bind_call(fn, args, kwargs)
            # Arguments are wrapped (and guarded) when the code first reads them.
            f_locals = {name: LazyArgument(v, LocalSource(name)) for name, v in bound.items()}
            cells = {name: ExistingCellValue(c, name)
                     for name, c in zip(code.co_freevars, fn.__closure__ or ())}
            tx = FrameInterpreter(output, code, fn.__globals__, f_locals, cells, name=fn.__qualname__)
            tx.can_break = compiled_factory is not None
            tx.break_at = break_at
            output.replaying = break_at is not None
            try:
                result = tx.run()
                suspended = _suspended_generators(output, in_handlers=True)
                if suspended:
                    # dropped while suspended in a try block: eager runs its handlers then
                    native_generators, break_at, reason = native_generators | suspended, None, None
                    output.release()
                    continue
                entry = _finish(fn, output, result, key, backend, backend_name)
            except GraphBreakRequest as req:
                break_at, reason = (req.ip, req.count), req.reason
                # (torch's fake-tensor dispatch cache may keep this capture's ShapeEnv)
                output.release()
                continue
            except BreakHere as here:
                suspended = _suspended_generators(output, in_handlers=True)
                if suspended:
                    # a break while a generator made here is suspended in a try block (a
                    # @contextlib.contextmanager's, around the with body): captured again with
                    # that generator made natively, before the break. One the code after the
                    # break needs (a loop over it) raises GeneratorAtBreak as it is handed on;
                    # one nothing refers to any more is dropped, as eager drops it
                    native_generators, break_at, reason = native_generators | suspended, None, None
                    output.release()
                    continue
                try:
                    entry = _finish_break(fn, output, here.tx, here.ip, reason, key, backend, backend_name,
                                          compiled_factory)
                except GeneratorAtBreak as e:
                    native_generators, break_at, reason = native_generators | {e.code}, None, None
                    output.release()
                    continue
            except GeneratorAtBreak as e:
                # a suspended generator returned or stored: captured again, made natively
                native_generators, break_at, reason = native_generators | {e.code}, None, None
                output.release()
                continue
        except Unsupported as e:
            e.guards = list(output.guards)
            e.output = output   # eager_entry builds its tensor check from it, then drops it
            raise
        except (ArgumentsDoNotBind, ConstraintViolation, RecursionError):
            raise
        except Exception as e:
            if is_users(e):
                raise
            # kiln's own failure (generating code, building guards, a kiln backend): the
            # frame runs eagerly under the guards gathered so far
            u = internal_error(e, f"compiling {fn.__qualname__}").located(
                code.co_filename, code.co_firstlineno, None)
            u.guards = list(output.guards)
            u.output = output
            raise u from e
        finally:
            output.restore_grad_mode()
        _drop_real_inputs(output)
        entry.capture_seconds = time.perf_counter() - t0
        return entry
    raise reason or Unsupported("graph break could not be located")


def _finish(fn, output: OutputGraph, result, key, backend, backend_name) -> Entry:
    cg = EntryCodegen(fn.__code__)
    ret = result.reconstruct(cg)
    prepare, apply = output.side_effects.codegen(cg)  # may stash more objects: statements first
    output.check_frozen_outputs(cg.output_nodes)
    gm, inputs, net_grad, compiled = _compile_graph(fn, output, cg, backend, backend_name, "")
    guards, program, lines, marked = _entry_head(fn, output, cg, inputs, net_grad, compiled)
    # read everything (outputs, final states) before writing anything back
    lines += [f"    {line}" for line in cg.statements + prepare]
    lines.append(f"    ___result = {ret}")
    if apply and not marked:
        lines.append(f"    {EFFECTS_MARK} = True")
    lines += [f"    {line}" for line in apply]
    lines.append("    return ___result")
    src = "\n".join(lines)
    entry_fn = _compile_entry(fn, src, cg.ctx)
    if logs.enabled.guards:
        _log_guards(fn, guards, program)
    return Entry(key, backend_name, entry_fn, make_check(fn, program), program.guards, program,
                 gm, compiled, readable_source(src, cg.ctx.local_alias), inlined=dict(output.inlined))


def _suspended_generators(output: OutputGraph, in_handlers: bool = False) -> frozenset:
    """The codes of generators made in this capture that are suspended (started, not done;
    ``in_handlers``: at a yield inside a try block, whose handlers eager runs when the
    generator is collected)."""
    codes = set()
    for g in output.suspended_generators:
        if g.done or (in_handlers and not (g.started and _yield_has_handler(g))):
            continue
        codes.add(g.frame.code)
    return frozenset(codes)


def _yield_has_handler(g) -> bool:
    instructions = g.frame.instructions
    at = instructions[g.frame.ip - 1]
    for _ in range(len(instructions)):
        if at.handler is None:
            return False
        handler = instructions[at.handler[0]]
        if handler.opname == "CALL_INTRINSIC_1":
            # 3.12's implicit handler of every generator: it only turns StopIteration into
            # RuntimeError
            return False
        if handler.opname != "CLEANUP_THROW":
            return True
        # 3.12's handler of the yield inside a ``yield from``: it hands a throw() on to the
        # delegate (a generator made here is checked on its own); a try block around the
        # ``yield from`` is the handler of that instruction
        at = handler
    return True


def _compile_entry(fn, src: str, ctx: RenderContext, lines: dict[int, int] | None = None):
    """The generated entry as the user's function: its globals, names and lines (see
    ``codegen.compile_function``), so that code it calls and tracebacks through it see
    the user's function, not kiln's."""
    return compile_function(src, "__kiln_entry", ctx.namespace, aliases=ctx.local_alias,
                            like=fn.__code__, f_globals=fn.__globals__, lines=lines)


def _compile_graph(fn, output: OutputGraph, cg: EntryCodegen, backend, backend_name: str, note: str):
    """Close the graph (outputs collected by ``cg``), drop what it does not need, and compile it
    with the backend. Returns (GraphModule or None, graph inputs, net grad-mode change to make
    inline when the graph only toggled modes, compiled callable or None)."""
    graph = output.graph
    graph.output(tuple(cg.output_nodes))
    output.remove_unused()
    if getattr(backend, "kiln_regions", False):
        regions.outline(output)     # (a backend tracing the graph's blocks once)
    # (a graph that only hands back a symbol input still runs: the entry reads its outputs)
    has_ops = any(n.op not in ("placeholder", "output") for n in graph.nodes) or bool(cg.output_nodes)
    net_grad = None
    if has_ops and not cg.output_nodes and _mode_only(graph):
        # no tensor work and nothing read back from the graph: no graph; the mode change inline
        has_ops, net_grad = False, _net_grad_mode(graph, output._grad_enabled_at_start)
    inputs = output.graph_inputs()
    if not has_ops:
        return None, inputs, net_grad, None
    gm = torch.fx.GraphModule(output.graph_root(), graph, class_name=f"Kiln_{_ident(fn.__qualname__)}")
    gm.meta["kiln_static_inputs"] = [i for i, inp in enumerate(inputs) if getattr(inp, "static", False)]
    gm.meta["kiln_fullgraph"] = getattr(output, "fullgraph", False)
    graph_id = next(_graph_ids)
    if logs.enabled.graph:
        ops = sum(1 for n in graph.nodes if n.op not in ("placeholder", "output", "get_attr"))
        logs.event("graph", "graph", f"graph of {fn.__qualname__}{note}:\n{gm.print_readable(print_output=False)}",
                   **logs.where(fn), graph_id=graph_id, ops=ops, up_to_break=bool(note),
                   resumes_at=getattr(fn, "__kiln_resumes_at__", None))
    if _symbolic_arithmetic_only(graph):
        # only Python int arithmetic on sizes (``n + 1`` of a dynamic int): nothing for a
        # tensor compiler to do; the graph runs as it is
        return gm, inputs, net_grad, gm
    backend_started = time.perf_counter()
    # Backends run in the state the graph starts in (grad mode, autocast), as torch.compile's
    # do: the graph's own mode changes are in the graph.
    output.restore_grad_mode()
    kilns = is_kiln_backend(backend)
    examples = [_example_input(inp, symbolic=not kilns) for inp in inputs]

    def compile_one(graph_module, example_inputs):
        if kilns:
            return _call_backend(backend, backend_name, graph_module, example_inputs)
        # A backend of the user's own sees the capture's fake mode, as dynamo's backends do:
        # one built on torch's (aot_module_simplified, compile_fx) then traces the graph with
        # the capture's symbolic sizes instead of specializing them to this call's (a graph
        # compiled for dynamic sizes must serve every size its guards admit)
        with _torch.tracing_over(output.fake_mode):
            return _call_backend(backend, backend_name, graph_module, example_inputs)
    ddp = _torch.active_ddp_module()
    pieces = ddp_buckets.plan_pieces(gm, inputs, ddp) if ddp is not None else None
    if pieces is not None:
        # DDP runs the wrapped module: the graph cut at its gradient buckets, for overlap
        compiled = ddp_buckets.compile_pieces(gm, pieces, examples, compile_one)
    else:
        compiled = compile_one(gm, examples)
    if logs.enabled.perf:
        # a backend may report its phases (the inductor backend: aot, inductor)
        phases = {"capture": backend_started - getattr(output, "capture_started", backend_started)}
        phases.update(getattr(compiled, "kiln_compile_seconds", None)
                      or {backend_name: time.perf_counter() - backend_started})
        logs.log_compile_times(f"graph of {fn.__qualname__}{note}", phases, **logs.where(fn), graph_id=graph_id)
    return gm, inputs, net_grad, compiled


def _call_backend(backend, backend_name: str, gm: torch.fx.GraphModule, examples: list) -> Callable:
    """``backend(gm, examples)``. A backend kiln provides fails as kiln (the frame then runs
    eagerly); one the user passed is the user's code: its exceptions, and a result that is
    not callable, are theirs."""
    kilns = is_kiln_backend(backend)
    if not kilns:
        _log_user_backend_bypass(gm, backend, backend_name)
    compiled = backend(gm, examples) if kilns else call_user(backend, gm, examples)
    if not callable(compiled):
        e = TypeError(f"backend {backend_name!r} returned {type(compiled).__name__}, not a callable "
                      "(a backend is (gm, example_inputs) -> callable)")
        if not kilns:
            mark_users(e)
        raise e
    return compiled


def _log_user_backend_bypass(gm, backend, backend_name: str) -> None:
    """A backend of the user's own is compiled every time: kiln can store only AOT results
    (``kiln.backends.aot_backend(..., cache_key=...)``); say so under ``KILN_LOGS=cache``."""
    if getattr(backend, "cache_key", None) is None:
        cache.bypass(gm, f"backend {backend_name!r} is your own and declares no cache_key")
    else:
        cache.bypass(gm, f"backend {backend_name!r} declares a cache_key, but kiln stores AOT results only: "
                         "build it with kiln.backends.aot_backend(fw_compiler=..., cache_key=...)")


def _entry_head(fn, output: OutputGraph, cg: EntryCodegen, inputs, net_grad, compiled):
    """(guards, guard program, first lines of the entry): the guard prelude, the graph call and
    an inline grad-mode change."""
    output.shape_guards = shape = shape_guards.produce(output)  # after the backend: it may guard too
    _check_marked_dynamic(output)
    guards = _with_final_tensor_metas(output, list(output.guards))
    if shape is not None:
        guards += [Guard(GuardKind.SHAPE_ENV, None, text) for text in shape.descriptions()]
    program, params, _ = _program(fn, output, guards, cg.ctx)
    lines = [f"def __kiln_entry({params}):", *program.prelude()]
    index_of = {id(inp): i for i, inp in enumerate(output.tensor_inputs)}
    # EFFECTS_MARK goes right before the first step with an effect outside the frame: a
    # failure before it can be answered by running the frame eagerly (``internal_errors``)
    marked = False
    if compiled is not None:
        cg.ctx.namespace["___graph"] = compiled
        graph_args = [shape.arg_expr(inp.symbol) if isinstance(inp, SymbolInput) else _graph_arg(inp, index_of, cg)
                      for inp in inputs]
        if graph_has_effects(output.graph):
            lines.append(f"    {EFFECTS_MARK} = True")
            marked = True
        lines.append(f"    ___out = ___graph({', '.join(graph_args)})")
    if net_grad is not None:
        if not marked:
            lines.append(f"    {EFFECTS_MARK} = True")
            marked = True
        lines.append(f"    {cg.bind(torch._C._set_grad_enabled)}({net_grad})")
    return guards, program, lines, marked


def _graph_arg(inp, index_of: dict, cg: EntryCodegen) -> str:
    """The entry's expression for a tensor input of the graph call: the tensor the guards
    checked, or for an AsyncCollectiveTensor the plain tensor it stands for."""
    name = f"___in{index_of[id(inp)]}"
    if inp.waits:
        return f"{cg.bind(_torch.waited_collective)}({name})"
    return name


def _with_final_tensor_metas(output: OutputGraph, guards: list[Guard]) -> list[Guard]:
    """TENSOR_MATCH texts of dynamic inputs as the capture ended: a dim the program
    specialized prints as its value, not as the symbol it started as."""
    final = {inp.source: TensorMeta.of(inp.guarded, inp.sizes, inp.strides)
             for inp in output.tensor_inputs if inp.dynamic and inp.real is not None}
    return [Guard(g.kind, g.source, final[g.source]) if g.kind is GuardKind.TENSOR_MATCH
            and g.source in final else g for g in guards]


def _check_marked_dynamic(output: OutputGraph) -> None:
    """A dim the user marked dynamic must still be symbolic at the end of the capture."""
    env = output.shape_env
    for inp in output.tensor_inputs:
        for d in sorted(inp.marked_dynamic):
            symbol = inp.size_symbols[d] if inp.size_symbols else None
            if symbol is None or not symbol.is_Symbol:
                continue      # 0 or 1: specialized by kiln's policy, not by the program
            value = env.replace(symbol)
            if value.is_number:
                where = shape_guards.specialization_site(output, symbol)
                raise ConstraintViolation(
                    f"{inp.source.describe()}.size()[{d}] was marked dynamic (kiln.mark_dynamic) "
                    f"but the program specialized it to {value} at {where}. Remove the "
                    "mark_dynamic call, or make that code work for any size.")


def _symbolic_arithmetic_only(graph) -> bool:
    work = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    return all(_torch.is_symbolic(n.meta.get("example_value")) for n in work)


def _mode_only(graph) -> bool:
    """True when the graph's only work is grad-mode/autocast toggles (no tensor work)."""
    import torch.amp.autocast_mode as am

    toggles = (torch._C._set_grad_enabled, am._enter_autocast, am._exit_autocast)
    work = [n for n in graph.nodes if n.op not in ("placeholder", "output")]
    return bool(work) and all(n.op == "call_function" and n.target in toggles for n in work)


def _net_grad_mode(graph, start: bool) -> bool | None:
    """The grad mode a mode-only graph leaves behind, when it differs from ``start``."""
    final = start
    for n in graph.nodes:
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            final = bool(n.args[0])
    return None if final == start else final


def _drop_real_inputs(output: OutputGraph) -> None:
    output.release()   # do not keep the caller's tensors (or anything else of the call) alive


def eager_entry(fn, exc: Unsupported, key, backend_name: str) -> Entry:
    """An entry that runs ``fn`` eagerly whenever the guards gathered before the failure hold
    (under them, capture would fail the same way)."""
    guards = list(getattr(exc, "guards", None) or [])
    output = getattr(exc, "output", None)
    exc.output = None
    if output is None:
        output = OutputGraph(fn.__qualname__)
        guards = list(output.guards)
    try:
        program = _program(fn, output, guards, _parameter_context(fn))[0]
    except Exception:   # kiln cannot build these guards: an entry that always runs eagerly
        guards = []
        program = _program(fn, OutputGraph(fn.__qualname__), guards, _parameter_context(fn))[0]
    finally:
        _drop_real_inputs(output)
    return eager_entry_for(fn, program, guards, key, backend_name, exc)


def _parameter_context(fn) -> RenderContext:
    ctx = RenderContext()
    alias_parameters(fn.__code__, ctx)
    return ctx


def eager_entry_for(fn, program: GuardProgram, guards: list[Guard], key, backend_name: str,
                    exc: Unsupported) -> Entry:
    """An entry that runs ``fn`` eagerly whenever ``program``'s guards hold."""
    ctx = program.ctx
    ns = dict(ctx.namespace)
    ns["___fn"] = weakref.ref(fn)   # (the function owns its entries: they must not keep it alive)
    # what fn raises is the user's: the mark says so to the call path (internal_errors)
    lines = [f"def __kiln_eager({program.params}):", *program.prelude(), f"    {EFFECTS_MARK} = True",
             f"    return ___fn()({program.fwd})"]
    src = "\n".join(lines)
    entry_fn = compile_function(src, "__kiln_eager", ns, aliases=ctx.local_alias, like=fn.__code__,
                                f_globals=fn.__globals__)
    forget_frames(exc)   # kept by the entry: without the capture's frames (and the call's tensors)
    return Entry(key, backend_name, entry_fn, make_check(fn, program), program.guards, program,
                 None, None, readable_source(src, ctx.local_alias), eager_reason=exc)


def _log_guards(fn, guards: list[Guard], program: GuardProgram) -> None:
    lines = [f"guards of {fn.__qualname__}:", *("  " + g.describe() for g in guards)]
    if program.unchanged_tree is not None:
        covered, of = program.unchanged_tree.covered, len(program.python_guards)
        lines.append(f"  ({covered} of these {of} Python-level guards are skipped on a call that finds the "
                     "module tree unchanged since its last check: kiln/capture/module_state.py)")
    logs.event("guards", "guards", "\n".join(lines), **logs.where(fn), guards=[g.describe() for g in guards])


def _program(fn, output: OutputGraph, guards: list[Guard], ctx: RenderContext):
    # TensorGuards snapshots thread-local dispatch state: build it in the state the frame
    # was called in, not inside an autocast/no_grad block the capture is still in.
    output.restore_grad_mode()
    params, fwd = signature_text(fn.__code__, fn.__defaults__, fn.__kwdefaults__, ctx)
    dims = shape_guards.tensor_guard_dims(output)
    tg = _torch.make_tensor_guards([_real_input(inp) for inp in output.tensor_inputs], dims)
    program = GuardProgram(guards, [inp.source for inp in output.tensor_inputs], tg,
                           output.global_state, ctx, params, output.shape_guards, fwd)
    program.tensor_dims = dims      # (a package rebuilds the TensorGuards from them)
    return program, params, fwd


def _real_input(inp) -> torch.Tensor:
    return inp.guarded


def _example_input(inp, symbolic: bool = False):
    """What the backend gets as the example of a graph input: the real tensor; for a symbol
    the int it has in this call, or (``symbolic``: a user's backend, as dynamo hands them) the
    SymInt of the capture."""
    if isinstance(inp, SymbolInput):
        value = inp.node.meta["example_value"]
        return value if symbolic else value.node.hint
    return inp.real


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _pushed_by_load(tx, ip: int) -> tuple[str, ...] | None:
    """The stack kinds that the attribute or global read at ``ip`` pushes when it runs
    natively, where they are certain: a global (NULL first when it is called), a plain
    attribute, and a property read to be called (CPython pushes NULL and the property's value,
    not a method and its receiver)."""
    ins = tx.instructions[ip]
    if ins.opname == "LOAD_GLOBAL":
        return (resume.NULL, resume.VALUE) if ins.arg[0] else (resume.VALUE,)
    if ins.opname != "LOAD_ATTR" or not tx.stack:
        return None
    if not ins.arg[0]:
        return (resume.VALUE,)
    receiver = tx.stack[-1]
    try:
        if isinstance(receiver, LazyArgument):
            receiver = receiver.realize(tx)       # (its type is guarded, as any argument read)
        cls = receiver.python_type()
    except Unsupported:
        return None
    attr = static_lookup(cls, ins.arg[1]) if isinstance(cls, type) else _MISSING
    if isinstance(attr, property) and not has_user_getattribute(cls) and getattr(receiver, "source", None) is not None:
        # the plan holds while the class still resolves the name to this property
        tx.output.guard_class_attribute(cls, ins.arg[1], attr)
        return (resume.NULL, resume.VALUE)
    return None


def _object_key(v) -> int:
    """The identity of the object a value stands for (an argument not read yet, or a real
    iterator passed in, is the object itself)."""
    if isinstance(v, LazyArgument):
        return id(v.obj)
    if isinstance(v, IteratorValue) and v.real is not None:
        return id(v.real)
    return id(v)


def _finish_break(fn, output: OutputGraph, tx, ip: int, reason: Unsupported, key, backend,
                  backend_name: str, compiled_factory: Callable) -> Entry:
    """The entry of a frame that breaks before instruction ``ip``: graph, side effects, the
    live stack and locals rebuilt, then the break function (see ``resume``)."""
    if output.frozen_storages:
        # values handed over would be a min()/max() select where eager holds one of the
        # candidate objects themselves (aliasing the continuation could observe)
        raise Unsupported(f"{reason} (and no graph break is possible after a min()/max() of "
                          "tensors in the same graph)").located(*tx.location())
    code = tx.code
    if resume.loops_back(code, ip):
        # (a break inside a loop, met again after many iterations: the continuation runs as is)
        raise Unsupported(f"{reason} (again, {resume.LOOP_LEVELS} iterations of a loop later: the "
                          "rest of the loop runs natively)").located(*tx.location())
    left = max((v.handed_over_items() for v in tx.stack if isinstance(v, IteratorValue)), default=0)
    if left > resume.LONG_LOOP_ITEMS and resume.loops_back(code, ip, levels=1):
        raise Unsupported(f"{reason} (again, in a loop with {left} items left: the rest of the loop "
                          "runs natively)").located(*tx.location())
    if left > resume.HANDED_ITEMS_LIMIT:
        # (handing them over would generate and guard one expression per item)
        raise Unsupported(f"{reason} (in a loop with {left} items left to hand over: the frame runs "
                          "natively)").located(*tx.location())
    layout = [resume.slot_kind(v) for v in tx.stack]
    # an iterator the code also reaches another way (``for v in it: ... next(it)``) is handed
    # over as itself, not as the tuple of its items: both must keep taking from one object
    held = [_object_key(v) for v in tx.locals.values()] + [_object_key(v) for v in tx.stack]
    layout = [resume.VALUE if kind == resume.ITER and held.count(_object_key(v)) > 1 else kind
              for kind, v in zip(layout, tx.stack)]
    # the arguments of a call that breaks to run natively are the call's, not a loop's: an
    # iterator among them (``length_hint(enumerate(xs))``) reaches it as itself, of its own
    # type. (A callee that runs as its own compiled function, a 3.11 comprehension's, takes
    # its iterator's items, which its capture compiles.)
    call_slot = _callee_slot(tx.instructions[ip], tx.stack)
    inside_callee = getattr(reason, "inside_callee", False)
    if call_slot is not None and not inside_callee:
        layout = [resume.VALUE if kind == resume.ITER and k >= call_slot else kind for k, kind in enumerate(layout)]
    if tx.f_locals_dict is not None:
        tx.locals[resume.FRAME_LOCALS] = tx.f_locals_dict
    try:
        local_names = resume.handover_locals(code, tx.locals)   # (first parameter first)
        plan = resume.plan_break(tx.instructions, ip, layout, local_names, _pushed_by_load(tx, ip))
    except Unsupported as e:
        raise Unsupported(f"{reason} (and no graph break is possible there: {e})").located(*tx.location())

    # grad mode: the graph ends in the mode outside the with-blocks still open on the stack;
    # the entry re-enters them before handing their __exit__ over.
    open_blocks = [v.obj for v in tx.stack if isinstance(v, MethodValue) and v.name == "__exit__"
                   and isinstance(v.obj, GradModeValue)]
    import torch

    target = open_blocks[0].prev if open_blocks else torch.is_grad_enabled()
    if target != torch.is_grad_enabled():
        output.set_grad_enabled(target)
    output.close_autocast_for_break()

    callee_slot = call_slot if inside_callee else None
    cg = EntryCodegen(fn.__code__)
    call_args = []   # the locals, then the stack (resume._param_names)
    for name in local_names:
        if name.startswith(resume.CELL_PREFIX) and name not in tx.locals:
            cell = tx.cells.get(name[len(resume.CELL_PREFIX):])
            call_args.append(cell.reconstruct(cg) if cell is not None else f"{cg.bind(types.CellType)}()")
        else:
            call_args.append(tx.locals[name].reconstruct(cg))
    for k, v in enumerate(tx.stack):
        if layout[k] in (resume.NULL, resume.UNBOUND):   # (pushed back by the prologue)
            continue
        if isinstance(v, IteratorValue) and layout[k] == resume.ITER:
            expr = v.reconstruct_remaining(cg)
        elif k == call_slot and isinstance(v, RealCallableValue) and resume.introspection_for(v.fn):
            # the break is at a call of locals()/vars()/dir(): the break function runs it
            # natively, in a generated frame whose own locals are not the user's
            expr = cg.bind(resume.introspection_for(v.fn))
        else:
            expr = v.reconstruct(cg)
        if k == callee_slot:
            expr = f"{cg.bind(compiled_factory.callee, 'callee')}({expr})"
        call_args.append(expr)
    prepare, apply = output.side_effects.codegen(cg)
    gm, inputs, net_grad, compiled = _compile_graph(fn, output, cg, backend, backend_name,
                                                    " (up to a graph break)")
    break_fn, resumes = break_function(fn, code, plan, key, compiled_factory)
    guards, program, lines, marked = _entry_head(fn, output, cg, inputs, net_grad, compiled)
    # read everything the break function gets before writing side effects back; the
    # native instruction then sees the written state. Entering open with-blocks (part of the
    # arguments) happens last, right before the call.
    lines += [f"    {line}" for line in cg.statements + prepare]
    if not marked and _enters_contexts(cg):
        lines.append(f"    {EFFECTS_MARK} = True")
        marked = True
    lines.append(f"    ___args = ({', '.join(call_args)}{',' if len(call_args) == 1 else ''})")
    if not marked:
        lines.append(f"    {EFFECTS_MARK} = True")
    lines += [f"    {line}" for line in apply]
    cg.ctx.namespace["___break"] = break_fn
    lines.append("    return ___break(*___args)")
    src = "\n".join(lines)
    # the call of the break function is at the user's line of the break
    entry_fn = _compile_entry(fn, src, cg.ctx, {len(lines): tx.instructions[ip].lineno or code.co_firstlineno})
    if logs.enabled.graph_breaks:
        logs.event("graph_breaks", "graph_break", f"graph break in {fn.__qualname__}: {reason}", **logs.where(fn),
                   **break_fields(reason), continues_at=[plan_line(code, e) for e in plan.exits])
    if logs.enabled.guards:
        _log_guards(fn, guards, program)
    entry = Entry(key, backend_name, entry_fn, make_check(fn, program), program.guards, program,
                  gm, compiled, readable_source(src, cg.ctx.local_alias))
    forget_frames(reason)   # kept by the entry: without the capture's frames
    entry.graph_break = reason
    entry.resumes = tuple(resumes)
    entry.inlined = dict(output.inlined)
    entry.break_plan = (code, plan)          # (a package rebuilds the break function from it)
    return entry


def _enters_contexts(cg: EntryCodegen) -> bool:
    """Whether the break's arguments re-enter with-blocks (a change of global state)."""
    return any(v is _enter_context for v in cg.ctx.namespace.values())


def _callee_slot(ins, stack) -> int | None:
    """The stack slot of the callable when the break is at a call (the callee then runs as
    its own compiled function)."""
    if ins.opname == "CALL":
        first = len(stack) - ins.arg - 2
        if first < 0:
            return None
        return first + 1 if isinstance(stack[first], NullValue) else first
    if ins.opname == "CALL_FUNCTION_EX":
        return len(stack) - 2 - (ins.arg & 1)
    return None


class _BreakTable:
    """One function's {(code, plan, compile key): (break function, continuations)}."""
    __slots__ = ("entries", "__weakref__")

    def __init__(self) -> None:
        self.entries: dict = {}

    def clear(self) -> None:
        self.entries.clear()


def break_function(fn, code, plan: "resume.BreakPlan", key, compiled_factory):
    """The break function for this break point and compile key (cached), and the
    continuations it calls."""
    closure = fn.__closure__
    cache_key = (code, plan, key)
    # kept in the function's own __dict__ (a cycle freed with it): a table weak in ``fn``
    # would hold the break functions, whose closures and continuations hold ``fn``'s cells
    held = fn.__dict__.get("__kiln_breaks__")
    if held is None or held[0] is not fn:   # (functools.wraps copies __dict__ to wrappers)
        held = (fn, _BreakTable())
        fn.__dict__["__kiln_breaks__"] = held
        with registry_lock:
            _break_functions.add(held[1])
    per_fn = held[1].entries
    hit = per_fn.get(cache_key)
    if hit is not None:
        return hit
    # The code objects carry the user's names (code that walks the stack, and tracebacks, see
    # the user's function); the continuations' function objects say where they resume (logs,
    # explain, guards).
    base = _ident(code.co_name)
    conts, resumes = [], []
    for exit in plan.exits:
        ck = (code, exit)
        name = f"__kiln_resume_{base}_line{plan_line(code, exit)}"
        cont_code = _continuation_code.get(ck)
        if cont_code is None:
            cont_code = _continuation_code[ck] = _named_like(code, resume.build_continuation(code, exit, name))
        cont_fn = types.FunctionType(cont_code, fn.__globals__, name, None, closure)
        cont_fn.__qualname__ = name
        # (the trace links it to its break, and to the frame it continues)
        cont_fn.__kiln_resumes_at__ = plan_line(code, exit)
        cont_fn.__kiln_frame__ = getattr(fn, "__kiln_frame__", None) or fn.__qualname__
        compiled = compiled_factory(cont_fn)
        resumes.append(compiled)
        conts.append(resume.make_continue(compiled, exit.layout))
    bcode = _named_like(code, resume.build_break_function(code, plan, conts, f"__kiln_break_{base}"))
    break_fn = types.FunctionType(bcode, fn.__globals__, code.co_name, None, closure)
    break_fn.__kiln_continuations__ = conts   # its code refers to them weakly (resume._epilogue)
    per_fn[cache_key] = (break_fn, resumes)
    return break_fn, resumes


def _named_like(user: types.CodeType, generated: types.CodeType) -> types.CodeType:
    return generated.replace(co_name=user.co_name, co_qualname=user.co_qualname)


def plan_line(code, exit) -> int:
    return bytecode_utils.decode(code)[exit.decoded_index].lineno or code.co_firstlineno
