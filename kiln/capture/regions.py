"""Repeated blocks: calls that trace to the same code, moved into one shared subgraph.

A model's layers are usually one class called in a loop (``for layer in self.layers``). Each
call is inlined and guarded as any call is, so a layer that differs (another class, another
config, a hook) traces to different code. The capture records the nodes each candidate call
added (a *span*); when the graph is finished (``outline``), spans whose code and input layouts
are the same are each replaced by one ``invoke_region(block, *operands)`` node reading one
shared GraphModule, which the AOT stages trace once and Inductor lowers once
(``kiln/aot/regions.py``).

Candidates: a module called as an item of an ``nn.ModuleList`` or ``nn.Sequential``
(``kiln.config.repeated_blocks``), and a function under ``torch.compiler.nested_compile_region``
(always). A block is outlined only when its code occurs at least twice in the graph, or when
the user marked it. Only the outermost candidate of nested ones is recorded.

A span stays inlined (with the reason under ``KILN_LOGS=aot``) where a shared block could
differ from the inlined code: it changes grad mode or enters autocast without leaving it, writes
a tensor it did not create (or a view of one) in place, returns a non-tensor value, an
input, or two views of one tensor, or a tensor that later code writes in place.

**Gradients.** One node is one autograd node. Where a block's output is a graph output (the
keys and values a model returns as its KV cache) and the block also computes further from it,
the span is cut there into blocks of its own, so that the graph's segments (``aot/segments.py``)
see that output feed the later one, as eager's autograd graph does.
"""
from __future__ import annotations

import collections
import operator
from dataclasses import dataclass, field

import torch
import torch.amp.autocast_mode as am
from torch.multiprocessing.reductions import StorageWeakRef

from .. import logs
from ..aot import regions as aot_regions
from .sources import AttrSource, ItemSource
from .values.subgraphs import mutated_operands, new_nodes, subgraph

_getitem = operator.getitem



@dataclass
class Span:
    """The nodes one call of a candidate added, in graph order."""
    name: str                   # the block's class or function name (names its subgraph)
    nodes: list
    marked: bool                # nested_compile_region: outlined even when called once


@dataclass
class _Part:
    span: Span
    nodes: list
    key: str | None = None
    why: str | None = None
    extra: dict = field(default_factory=dict)


def is_repeated_block(module_value) -> bool:
    """A module read as an item of a ModuleList or Sequential (``layers[3]``, or
    ``for layer in layers``)."""
    src = module_value.source
    return isinstance(src, ItemSource) and isinstance(src.base, AttrSource) and \
        src.base.name == "_modules" and isinstance(src.key, str) and src.key.isdigit()


def marked_region(fn) -> object | None:
    """The function a ``nested_compile_region`` wrapper stands for, or None."""
    inner = getattr(fn, "__marked_compile_region_fn__", None)
    while inner is not None and hasattr(inner, "__marked_compile_region_fn__"):
        inner = inner.__marked_compile_region_fn__
    return inner


def marked_region_source(fn, source):
    """Where ``marked_region(fn)`` is read from, given ``fn``'s source (None without one)."""
    if source is None:
        return None
    while hasattr(fn, "__marked_compile_region_fn__"):
        source = AttrSource(source, "__marked_compile_region_fn__")
        fn = fn.__marked_compile_region_fn__
    return source


def record(tx, name: str, marked: bool, call):
    """``call()`` (inlining a candidate), its nodes recorded as a span when no span is open."""
    output = tx.output
    if output.region_open:
        return call()
    before = set(output.graph.nodes)
    output.region_open = True
    try:
        result = call()
    finally:
        output.region_open = False
    nodes = new_nodes(output.graph, before)
    if nodes:
        output.region_spans.append(Span(name, nodes, marked))
    return result


# -- finishing the graph ---------------------------------------------------------------------------

def outline(output) -> None:
    """Replace the spans whose code repeats (or that the user marked) by ``invoke_region``
    nodes, one shared GraphModule per distinct block."""
    spans = output.region_spans
    output.region_spans = []
    if not spans:
        return
    graph = output.graph
    live = set(graph.nodes)
    outputs_of_graph = set(_flat_nodes(next(n for n in reversed(graph.nodes) if n.op == "output").args))
    parts: list[_Part] = []
    for span in spans:
        nodes = [n for n in span.nodes if n in live]
        if any(n not in live and not _is_getitem(n) for n in span.nodes):
            continue            # (moved into another subgraph: a cond branch, a checkpoint)
        why = _refusal(nodes)
        if why is not None:
            _log(f"{span.name} stays inlined: {why}")
            continue
        for piece in _cut(nodes, outputs_of_graph):
            part = _Part(span, piece)
            part.key, part.why = _key(part.nodes, output)
            if part.why is not None:
                _log(f"{span.name} stays inlined: {part.why}")
            parts.append(part)
    counts = collections.Counter(p.key for p in parts if p.key is not None)
    shared: dict[str, torch.fx.GraphModule] = {}
    calls: collections.Counter = collections.Counter()
    stopped: set = set()      # spans a piece of which stayed inlined: their later pieces too
    for part in parts:
        if id(part.span) in stopped:
            continue
        why = None
        if part.key is None or (counts[part.key] < 2 and not part.span.marked):
            why = part.why or "its code occurs once"
        else:
            why = _outline_part(output, part, shared)
            if why is not None:
                _log(f"{part.span.name} stays inlined: {why}")
        if why is not None:
            stopped.add(id(part.span))
        else:
            calls[part.key] += 1
    if calls and logs.enabled.aot:
        by_name = collections.defaultdict(list)
        for key, gm in shared.items():
            by_name[gm.meta["kiln_region_name"]].append(calls[key])
        for name, counts_of in by_name.items():
            _log(f"{name}: {sum(counts_of)} calls share {len(counts_of)} block(s)")


def _log(message: str) -> None:
    if logs.enabled.aot:
        logs.log("aot", f"repeated block {message}")


def _is_getitem(n) -> bool:
    return n.op == "call_function" and n.target is _getitem


def _flat_nodes(a) -> list:
    if isinstance(a, torch.fx.Node):
        return [a]
    if isinstance(a, (list, tuple)):
        return [x for item in a for x in _flat_nodes(item)]
    if isinstance(a, dict):
        return [x for item in a.values() for x in _flat_nodes(item)]
    return []


def _refusal(nodes: list) -> str | None:
    inside = set(nodes)
    outer = {_storage(a) for n in nodes for a in n.all_input_nodes if a not in inside} - {None}
    depth = 0
    for n in nodes:
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            return "it changes grad mode"
        if n.op == "call_function" and n.target is am._enter_autocast:
            depth += 1
        if n.op == "call_function" and n.target is am._exit_autocast:
            depth -= 1
        if any(a not in inside or _storage(a) in outer for a in mutated_operands(n)):
            return "it writes in place a tensor it did not create (or a view of one)"
    if depth != 0:
        return "it enters autocast without leaving it, or leaves one it did not enter"
    return None


def _storage(n) -> StorageWeakRef | None:
    v = n.meta.get("example_value") if isinstance(n, torch.fx.Node) else None
    return StorageWeakRef(v.untyped_storage()) if isinstance(v, torch.Tensor) else None


def _cut(nodes: list, outputs_of_graph: set) -> list[list]:
    """The span in pieces: a graph output that requires grad and that the span computes
    further from ends a piece (see the module's docstring)."""
    inside = set(nodes)
    cuts = {n for n in nodes if n in outputs_of_graph and _requires_grad(n) and any(u in inside for u in n.users)}
    if not cuts:
        return [nodes]
    level: dict = {}
    for n in nodes:
        level[n] = max([level[a] + (a in cuts) for a in n.all_input_nodes if a in inside], default=0)
    pieces = collections.defaultdict(list)
    for n in nodes:
        pieces[level[n]].append(n)
    return [pieces[k] for k in sorted(pieces)]


def _requires_grad(n) -> bool:
    v = n.meta.get("example_value")
    return isinstance(v, torch.Tensor) and v.requires_grad


def _boundary(nodes: list) -> tuple[list, list]:
    """(the outer nodes ``nodes`` read, in first-read order, constants aside; the nodes read
    after them)."""
    inside = set(nodes)
    inputs: list = []
    seen: set = set()
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in inside and a.op != "get_attr" and a not in seen:
                seen.add(a)
                inputs.append(a)
    outs = [n for n in nodes if any(u not in inside for u in n.users)]
    return inputs, outs


def _key(nodes: list, output) -> tuple[str | None, str | None]:
    """(the text two calls of one block share, None) or (None, why the piece stays inlined)."""
    inputs, outs = _boundary(nodes)
    inside = set(nodes)
    if not outs:
        return None, "nothing reads what it computes"
    for o in outs:
        if not isinstance(o.meta.get("example_value"), torch.Tensor):
            return None, f"it hands on a non-tensor value ({o.name})"
        for u in o.users:
            if u not in inside and o in mutated_operands(u):
                return None, f"later code writes its output {o.name} in place"
    storages = [StorageWeakRef(a.meta["example_value"].untyped_storage()) for a in inputs
                if isinstance(a.meta.get("example_value"), torch.Tensor)]
    seen_storages = set(storages)
    for o in outs:
        s = StorageWeakRef(o.meta["example_value"].untyped_storage())
        if s in seen_storages:
            return None, "it returns one of its inputs, or two views of one tensor"
        seen_storages.add(s)
    names = {a: f"in{i}" for i, a in enumerate(inputs)}
    lines = [f"in{i}: {_value_text(a.meta.get('example_value'))}" for i, a in enumerate(inputs)]
    for j, n in enumerate(nodes):
        names[n] = f"n{j}"
    for n in nodes:
        lines.append(f"{names[n]} = {n.op} {_target_text(n)} {_arg_text(n.args, names, output)} "
                     f"{_arg_text(n.kwargs, names, output)}")
    lines.append("out " + ",".join(names[o] for o in outs))
    return "\n".join(lines), None


def _value_text(v) -> str:
    if isinstance(v, torch.Tensor):
        return (f"T({[str(s) for s in v.shape]},{[str(s) for s in v.stride()]},{v.storage_offset()},{v.dtype},"
                f"{v.device},{v.requires_grad})")
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym {v}"
    return type(v).__name__


def _target_text(n) -> str:
    t = n.target
    if isinstance(t, str):
        return t
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or type(t).__name__
    return f"{getattr(t, '__module__', '')}.{name}@{id(t)}"


def _arg_text(a, names: dict, output) -> str:
    if isinstance(a, torch.fx.Node):
        if a in names:
            return names[a]
        if a.op == "get_attr":
            obj = output.constant_attrs.get(a.target)
            if isinstance(obj, torch.fx.GraphModule):
                return "gm(" + _graph_text(obj) + ")"
            return f"const@{id(obj)}"
        return f"?{a.name}"
    if isinstance(a, (list, tuple)):
        inner = ",".join(_arg_text(x, names, output) for x in a)
        return f"{type(a).__name__}({inner})"
    if isinstance(a, dict):
        return "{" + ",".join(f"{k!r}:{_arg_text(v, names, output)}" for k, v in a.items()) + "}"
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym({a})"
    if a is None or isinstance(a, (bool, int, str, torch.dtype, torch.device, torch.memory_format,
                                   torch.layout, type(Ellipsis))):
        return repr(a)
    if isinstance(a, float):
        return f"float({a!r})"
    if isinstance(a, slice):
        return f"slice({_arg_text(a.start, names, output)},{_arg_text(a.stop, names, output)}," \
               f"{_arg_text(a.step, names, output)})"
    return f"obj@{id(a)}"


def _graph_text(gm: torch.fx.GraphModule) -> str:
    names: dict = {}
    lines = []
    for i, n in enumerate(gm.graph.nodes):
        names[n] = f"g{i}"
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            lines.append(f"{names[n]} = get_attr {_arg_text_in(gm, n)}")
        else:
            lines.append(f"{names[n]} = {n.op} {_target_text(n) if n.op != 'placeholder' else ''} "
                         f"{_arg_text(n.args, names, None)} {_arg_text(n.kwargs, names, None)}")
    return ";".join(lines)


def _arg_text_in(gm, n) -> str:
    obj = gm
    for part in str(n.target).split("."):
        obj = getattr(obj, part)
    if isinstance(obj, torch.fx.GraphModule):
        return "gm(" + _graph_text(obj) + ")"
    return f"const@{id(obj)}"


def _outline_part(output, part: _Part, shared: dict) -> str | None:
    graph = output.graph
    nodes = part.nodes
    key, why = _key(nodes, output)      # (after earlier pieces were outlined: the same text)
    if why is not None:
        return why
    inputs, outs = _boundary(nodes)
    gm = shared.get(key)
    if gm is None:
        gm = subgraph([(f"arg{i}", a) for i, a in enumerate(inputs)], nodes, outs,
                      f"Block_{_ident(part.span.name)}", output.constant_attrs)
        gm.meta[aot_regions.STAGE] = aot_regions.CAPTURED
        gm.meta["kiln_region_name"] = part.span.name
        shared[key] = gm
    inside = set(nodes)
    # (before its first node: what it reads is there already, earlier pieces of its span
    # included, which were outlined before it; what reads it comes after)
    with graph.inserting_before(nodes[0]):
        block = output.constant_node(gm)
        call = graph.call_function(aot_regions.invoke_region, (block, *inputs))
        call.meta["example_value"] = tuple(o.meta["example_value"] for o in outs)
        items = []
        for i, o in enumerate(outs):
            item = graph.call_function(_getitem, (call, i))
            item.meta["example_value"] = o.meta["example_value"]
            items.append(item)
    for o, item in zip(outs, items):
        o.replace_all_uses_with(item, delete_user_cb=lambda u: u not in inside)
    for n in reversed(nodes):
        graph.erase_node(n)
    return None


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)
