"""An entry made again from its saved parts, with no capture: the generated source compiled
over a namespace as at capture, its guard program, its graph. Packages and frame records
(``kiln.package``) rebuild their entries with these."""
from __future__ import annotations

import functools
import types

from ..lazy_imports import LazyModule
from .codegen import alias_parameters, compile_function, global_names, readable_source
from .entry import Entry, make_check
from .sources import RenderContext

# the bytecode tracer, imported for an entry whose frame breaks its graph: a record or package
# of whole graphs loads without it
_frame = LazyModule("kiln.capture.frame")


@functools.lru_cache(maxsize=8192)
def _names_read(source: str) -> tuple[str, ...]:
    return tuple(global_names(compile(source, "<kiln entry>", "exec")))


def names_read(source: str) -> list[str]:
    """The names generated ``source`` reads as globals (in code nested in it too). Memoized:
    a frame record is written again after each compile of its function, and the layers of a
    model compiled one by one share most of their guard expressions."""
    return list(_names_read(source))


def entry_context(fn: types.FunctionType) -> RenderContext:
    """The context a rebuilt entry of ``fn`` decodes its namespace into: its parameters
    aliased as the generated code spells them."""
    ctx = RenderContext()
    alias_parameters(fn.__code__, ctx)
    return ctx


def rebuild_entry(fn: types.FunctionType, key, source: str, name: str, ctx: RenderContext, program,
                  graph_module, compiled_graph) -> Entry:
    """The entry of ``fn`` whose generated ``source`` defines the function ``name``, compiled
    over ``ctx``'s namespace, guarded by ``program``."""
    entry_fn = compile_function(source, name, ctx.namespace, aliases=ctx.local_alias,
                                like=fn.__code__, f_globals=fn.__globals__)
    return Entry(key, key.backend_name, entry_fn, make_check(fn, program), program.guards, program,
                 graph_module, compiled_graph, readable_source(source, ctx.local_alias))


def rebuild_break_function(fn: types.FunctionType, plan, key, compiled_factory):
    """The break function of ``fn`` for a break ``plan`` of its own frame, and the
    CompiledFunctions of its continuations (made by ``compiled_factory``), as capture makes
    them."""
    return _frame.break_function(fn, fn.__code__, plan, key, compiled_factory)
