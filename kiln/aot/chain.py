"""The fallback for a graph that needs segments (``segments.py``) and cannot have them: a chain
of graphs, each compiled on its own.

A later segment that writes into a value an earlier one hands over (``y[2:5].mul_(3)`` after
``y`` was returned and read) must see eager's write on that very tensor, its aliases and its
autograd history; so must the caller. The graph is split after the first differentiable
output that another differentiable output is computed from (program order is kept: the first
part is a prefix of the graph), and the parts are compiled on their own and run one after the
other: the second part takes the first part's values as inputs (its input mutations are
written into them as into any input), and autograd links the parts as eager does. The second
part may be segmented, or split again.

The second part is compiled for the values the first part really hands it (per their sizes,
strides and aliasing: ``PerShapeCompiled``), never for the layout the capture traced: a
compiler may return another layout than eager's. Values that cross the cut must be tensors;
otherwise the graph runs as captured.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx

from ..inplace_ops import mutates
from .segments import cut_outputs


def cut_position(gm: torch.fx.GraphModule) -> int | None:
    """The position (in graph order) where the graph is split: after the first differentiable
    output that another differentiable output is computed from, and after the writes into it
    that come before anything else reads it; None when there is none."""
    if not torch.is_grad_enabled():
        return None
    cut = cut_outputs(gm)
    nodes = list(gm.graph.nodes)
    positions = [i for i, n in enumerate(nodes) if n in cut]
    return _past_first_writes(nodes, min(positions)) if positions else None


def _past_first_writes(nodes: list, at: int) -> int:
    """The position of the last in-place write into ``nodes[at]`` (``y[i] = v``, ``y.mul_(2)``,
    ``y[:, 1].mul_(2)``) made before any other op reads it, or ``at``. Those writes are part of
    the value the first part hands over: eager's output is the written tensor, with the writes
    in its autograd history, and the later outputs are computed from it as written, so
    ``autograd.grad(loss, [y])`` finds ``y`` on the loss's path. Left to the second part, a
    write would be an input mutation there, and ``y``'s history would leave the loss's path."""
    part = {nodes[at]}          # y, what a write into it returns, views of it made only to write
    end = at
    for i in range(at + 1, len(nodes)):
        n = nodes[i]
        if not any(a in part for a in n.all_input_nodes):
            continue
        if _writes_into(n, part) or _made_to_be_written(n, part):
            part.add(n)
            end = i
            continue
        break
    return end


def _writes_into(n: torch.fx.Node, part: set) -> bool:
    """``n`` writes in place into a member of ``part`` and reads no member otherwise."""
    return (n.op in ("call_function", "call_method") and mutates(n.op, n.target) and bool(n.args)
            and n.args[0] in part and not any(a in part for a in _flat((n.args[1:], n.kwargs))))


def _made_to_be_written(n: torch.fx.Node, part: set) -> bool:
    """``n`` is computed from a member of ``part`` alone (its first argument: a view such as
    ``y[:, 1]``), and every use of it writes into it or is such a value again. (Were it not a
    view, it would be a computation whose result nothing reads: harmless in either part.)"""
    if n.op not in ("call_function", "call_method") or not n.args or n.args[0] not in part:
        return False
    if any(a in part for a in _flat((n.args[1:], n.kwargs))) or not n.users:
        return False
    return all(_writes_into(u, {n}) or _made_to_be_written(u, {n}) for u in n.users)


def _flat(args) -> list:
    out: list = []
    torch.fx.node.map_arg(args, out.append)
    return out


def split(gm: torch.fx.GraphModule, cut: int):
    """(first, second, inputs of the second taken from the call's arguments (by position),
    number of values the first hands over) or None when a value crossing the cut is not a
    tensor."""
    nodes = list(gm.graph.nodes)
    output = nodes[-1]
    prefix, suffix = nodes[:cut + 1], [n for n in nodes[cut + 1:] if n.op != "output"]
    if any(n.op == "placeholder" for n in suffix):
        return None
    in_suffix = set(suffix) | {output}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    crossing = [n for n in prefix if n.op != "get_attr" and any(u in in_suffix for u in n.users)]
    passed = [n for n in crossing if n.op == "placeholder"]
    handed = [n for n in crossing if n.op != "placeholder"]
    if any(not isinstance(n.meta.get("example_value"), torch.Tensor) for n in handed):
        return None

    # the first part: the prefix, returning what the second part reads
    g1 = torch.fx.Graph()
    env1: dict = {}
    for n in prefix:
        env1[n] = g1.node_copy(n, lambda a: env1[a])
    g1.output(tuple(env1[n] for n in handed))

    # the second part: the arguments it reads, the handed-over values, then the rest
    g2 = torch.fx.Graph()
    env2: dict = {}
    for n in passed + handed:
        p = g2.placeholder(n.name)
        p.meta.update(n.meta)
        if n.op != "placeholder":
            p.meta["kiln_source"] = f"value {n.name} of the graph's first part"
            p.meta["kiln_static"] = False
        env2[n] = p
    for n in prefix:
        if n.op == "get_attr" and any(u in in_suffix for u in n.users):
            env2[n] = g2.node_copy(n, lambda a: env2[a])
    for n in suffix:
        env2[n] = g2.node_copy(n, lambda a: env2[a])
    g2.output(torch.fx.node.map_arg(output.args[0], lambda a: env2[a]))

    def module(graph: torch.fx.Graph, suffix_name: str) -> torch.fx.GraphModule:
        m = torch.fx.GraphModule(gm, graph, class_name=f"{type(gm).__name__}{suffix_name}")
        m.meta.update(gm.meta)
        m.meta["kiln_static_inputs"] = [i for i, p in enumerate(n for n in graph.nodes if n.op == "placeholder")
                                        if p.meta.get("kiln_static")]
        return m
    return module(g1, "_part1"), module(g2, "_part2"), [placeholders.index(n) for n in passed], handed


def compile_chained(gm: torch.fx.GraphModule, example_inputs: list,
                    compile_part: Callable[[torch.fx.GraphModule, list], Callable],
                    compile_per_call: Callable[[torch.fx.GraphModule], Callable]) -> Callable | None:
    """The graph compiled as a chain (see the module's docstring), or None when it needs none:
    the first part by ``compile_part(gm, example_inputs)``, the second by
    ``compile_per_call(gm)``, which compiles it for the values of each call."""
    cut = cut_position(gm)
    if cut is None:
        return None
    parts = split(gm, cut)
    if parts is None:
        # a value that is not a tensor crosses the cut: the graph runs as captured (eager's
        # autograd), not as one node that would cut the path
        forward = gm.forward

        def as_captured(*args):
            return forward(*args)
        as_captured.graph_module = gm
        return as_captured
    first, second, passed, handed = parts
    run_first = compile_part(first, list(example_inputs))
    for p in second.graph.nodes:
        if p.op == "placeholder":
            p.meta.pop("example_value", None)     # (the real values' layouts decide)
    run_second = compile_per_call(second)

    def chained(*args):
        handed_values = run_first(*args)
        return run_second(*[args[i] for i in passed], *handed_values)
    chained.kiln_chain = (run_first, run_second)
    return chained
