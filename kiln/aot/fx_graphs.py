"""FX graph helpers of the AOT stages: ops that are views or random, the output node, dead
code that keeps effects, a subgraph extracted, nodes in dependency order, a graph copied."""
from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
import torch.fx

from .. import _torch

aten = torch.ops.aten


def is_random(node: torch.fx.Node) -> bool:
    t = node.target
    return node.op == "call_function" and isinstance(t, torch._ops.OpOverload) and \
        torch.Tag.nondeterministic_seeded in t.tags


def is_view(node: torch.fx.Node) -> bool:
    t = node.target
    return node.op == "call_function" and isinstance(t, torch._ops.OpOverload) and t.is_view


def rename_placeholders(gm: torch.fx.GraphModule, names: list[str]) -> None:
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(phs) == len(names), (len(phs), len(names))
    taken = {n.name for n in gm.graph.nodes if n.op != "placeholder"}
    for n, name in zip(phs, names):
        assert name not in taken, name
        n.target = name
        n.name = name
    gm.recompile()


def remove_aliases(gm: torch.fx.GraphModule) -> None:
    """``aten.alias``/``aten.detach`` are identities in a functional graph: drop them."""
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target in (aten.alias.default, aten.detach.default, aten.lift_fresh.default):
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)


def is_input_write(n: torch.fx.Node) -> bool:
    """An ``aten.copy_`` into a placeholder: the graph's write of a mutated input's new value
    (a functional graph has no other mutation; ``state.mark_mutations_in_graph``)."""
    return n.op == "call_function" and n.target is aten.copy_.default and \
        isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder"


def is_check(n: torch.fx.Node) -> bool:
    """An op that only checks, prints or marks (``aten._assert_async``: ``F.one_hot``'s bounds
    check, ``aten._assert_scalar``, ``aten._print``, the profiler's record_function ops): FX's
    side-effectful functions. Nothing reads its result; dropping it would drop the error."""
    return n.op == "call_function" and _torch.is_side_effectful(n.target)


def is_effect(n: torch.fx.Node) -> bool:
    """Nodes a graph runs for more than their value: random ops (eager draws their numbers),
    writes into inputs, and checks (``is_check``)."""
    return is_random(n) or is_input_write(n) or is_check(n)


def dce(gm: torch.fx.GraphModule, keep: Callable[[torch.fx.Node], bool] = is_effect) -> None:
    """Dead code elimination that never drops random ops (eager draws their numbers) or the
    graph's writes into its inputs."""
    for n in reversed(list(gm.graph.nodes)):
        if n.op in ("placeholder", "output") or n.users or keep(n):
            continue
        gm.graph.erase_node(n)


def output_node(graph: torch.fx.Graph) -> torch.fx.Node:
    for n in reversed(graph.nodes):
        if n.op == "output":
            return n
    raise ValueError("graph has no output node")


def ancestors(nodes: Iterable[Any]) -> set:
    """``nodes`` and every node they are computed from (non-nodes are skipped)."""
    seen: set = set()
    todo = [n for n in nodes if isinstance(n, torch.fx.Node)]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return seen


def emit_inputs_first(root: torch.fx.Node, done: set, order: list) -> None:
    """Append ``root`` to ``order`` after those of its inputs not ``done`` yet, inputs first
    (iteratively: a long chain would exceed Python's recursion limit). A node reached again from
    its own inputs is a cycle: RuntimeError."""
    entered: set = set()
    stack = [(root, False)]
    while stack:
        n, ready = stack.pop()
        if n in done:
            continue
        if ready:
            done.add(n)
            order.append(n)
            continue
        if n in entered:
            raise RuntimeError(f"the graph has a cycle through {n.name}")
        entered.add(n)
        stack.append((n, True))
        stack.extend((a, False) for a in reversed(n.all_input_nodes) if a not in done)


def flat_outputs(graph: torch.fx.Graph) -> list:
    out = output_node(graph).args[0]
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def extract_graph(joint: torch.fx.Graph, inputs: list[torch.fx.Node], outputs: list[Any],
                  *, keep: Callable[[torch.fx.Node], bool] | None = None,
                  input_names: list[str] | None = None) -> torch.fx.Graph:
    """A new graph computing ``outputs`` from ``inputs`` (nodes of ``joint``), copying the nodes
    needed in their original order. ``keep(node)`` forces nodes in (random ops that eager runs).
    Reaching a placeholder that is not an input is an error."""
    inputs_set = set(inputs)
    needed: set = set()
    stack = [o for o in outputs if isinstance(o, torch.fx.Node)]
    if keep is not None:
        stack += [n for n in joint.nodes if n.op == "call_function" and keep(n)]
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        if n in inputs_set:
            continue
        if n.op == "placeholder":
            raise RuntimeError(f"partition: {n.name} is needed but is not an input of this graph")
        stack.extend(n.all_input_nodes)
    g = torch.fx.Graph()
    env: dict = {}
    for i, n in enumerate(inputs):
        name = input_names[i] if input_names else n.name
        p = g.placeholder(name)
        p.meta = dict(n.meta)
        env[n] = p
    for n in joint.nodes:
        if n in env or n not in needed or n.op == "output":
            continue
        if n.op == "placeholder":  # pragma: no cover (rejected above)
            continue
        new = g.node_copy(n, lambda a: env[a])
        env[n] = new
    g.output(tuple(env[o] if isinstance(o, torch.fx.Node) else o for o in outputs))
    return g


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule over a copy of ``gm``'s graph (nodes' meta shallow-copied), same attributes."""
    g = torch.fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    new = _torch.lazy_graph_module(gm, g, class_name=type(gm).__name__)
    new.meta.update(gm.meta)
    return new


def without_kiln_meta(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with kiln's own graph-level meta removed from it, in place, and from its
    GraphModule attributes, which are replaced by copies (the caller's graphs keep theirs).
    Inductor's FX graph cache hashes a GraphModule's ``__dict__``, ``meta`` included: kiln's
    entries there (a memo keyed by object ids, a partition counter) differ between processes
    and between compile orders, and would make every such graph a cache miss."""
    for key in [k for k in gm.meta if isinstance(k, str) and k.startswith("kiln")]:
        del gm.meta[key]
    for name, child in list(gm.named_children()):
        if isinstance(child, torch.fx.GraphModule):
            setattr(gm, name, without_kiln_meta(copy_graph_module(child)))
    return gm


def op_name(n) -> str | None:
    """The schema name of a graph node's op (``kiln::prefetch``, ``aten::mm``...); None for a
    node that calls no op with a schema."""
    if n.op != "call_function":
        return None
    schema = getattr(n.target, "_schema", None)
    return schema.name if schema is not None else None
