"""A graph in which one differentiable output feeds another is compiled as a chain of graphs.

AOT autograd makes a graph one autograd node: every output's ``grad_fn`` is that node, so an
output that the graph also used to compute another output is not on that output's autograd
path. Eager's is: ``torch.autograd.grad(loss, [logits])``, ``logits.retain_grad()`` and hooks
on ``logits`` see the gradient flowing from ``loss``. Under one node they would see None (a
wrong answer, fuzz seed 3418)::

    y = torch.log_softmax(x @ w, -1)        # an output of the graph
    loss = (y * y).sum()                    # another, computed from it
    g, = torch.autograd.grad(loss, [y])     # (a break) eager: 2 * y; one node: None

So the graph is split after the first such output (program order is kept: the first part is
a prefix of the graph) and the parts are compiled on their own and run one after the other:
the second part takes the first part's output as an input, and autograd links them as eager
does. The second part is split again if it needs to be.

In a dynamic graph the second part is compiled per concrete shapes of the values it takes
(their symbolic sizes are bound by no input of its own). Values that cross the cut must be
tensors; otherwise the graph is not split.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx


def _requires_grad(node: torch.fx.Node) -> bool:
    v = node.meta.get("example_value")
    return isinstance(v, torch.Tensor) and v.requires_grad


def is_dynamic(gm: torch.fx.GraphModule, example_inputs: list) -> bool:
    return any(_is_symbolic(x) for x in example_inputs) or \
        any(_is_symbolic(n.meta.get("example_value")) for n in gm.graph.nodes if n.op == "placeholder")


def _is_symbolic(v: Any) -> bool:
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    return isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride()))


def cut_position(gm: torch.fx.GraphModule, example_inputs: list) -> int | None:
    """The position (in graph order) of the first differentiable output that another
    differentiable output is computed from; None when there is none (or the graph is not one
    this module splits)."""
    if not torch.is_grad_enabled():
        return None
    nodes = list(gm.graph.nodes)
    output = nodes[-1]
    outs = [o for o in torch.fx.node.map_arg(output.args[0], lambda n: n) if isinstance(o, torch.fx.Node)] \
        if output.op == "output" and isinstance(output.args[0], (tuple, list)) else []
    candidates = []
    seen_ids = set()
    for o in outs:
        if o.op != "placeholder" and o.op != "get_attr" and _requires_grad(o) and id(o) not in seen_ids:
            seen_ids.add(id(o))
            candidates.append(o)
    if len(candidates) < 2:
        return None
    position = {n: i for i, n in enumerate(nodes)}
    cut = None
    for later in candidates:
        todo, ancestors = list(later.all_input_nodes), set()
        while todo:
            n = todo.pop()
            if n in ancestors:
                continue
            ancestors.add(n)
            todo.extend(n.all_input_nodes)
        for earlier in candidates:
            if earlier is not later and earlier in ancestors:
                p = position[earlier]
                cut = p if cut is None else min(cut, p)
    return cut


def _example_like(v: torch.Tensor) -> torch.Tensor:
    """A real tensor with ``v``'s metadata (the example of a value the first part hands over;
    only its metadata is read): a non-leaf when it requires grad, as the value is."""
    t = torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=v.device)
    if v.requires_grad:
        t.requires_grad_(True)
        if _dense(t.shape, t.stride()):      # (clone keeps a dense layout's strides)
            t = t.clone(memory_format=torch.preserve_format)
    return t


def _dense(shape, stride) -> bool:
    """Whether sizes and strides describe memory with no gaps and no overlaps."""
    expected = 1
    for st, size in sorted((st, size) for size, st in zip(shape, stride) if size != 1):
        if st != expected:
            return False
        expected *= size
    return True


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
                    compile_part: Callable[[torch.fx.GraphModule, list], Callable]) -> Callable | None:
    """The graph compiled as a chain (see the module's docstring), or None when it needs none."""
    cut = cut_position(gm, example_inputs)
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
    if is_dynamic(gm, example_inputs):
        # the handed-over values have symbolic sizes no input of the second part binds: it
        # is compiled per concrete shapes of what it gets (never reused for other shapes)
        from .dynamic import PerShapeCompiled

        for p in second.graph.nodes:
            if p.op == "placeholder":
                p.meta.pop("example_value", None)
        run_second = PerShapeCompiled(lambda args: compile_part(second, list(args)),
                                      "the second part of a chained dynamic graph")
    else:
        second_examples = [example_inputs[i] for i in passed] + \
            [_example_like(n.meta["example_value"]) for n in handed]
        run_second = compile_part(second, second_examples)

    def chained(*args):
        handed_values = run_first(*args)
        return run_second(*[args[i] for i in passed], *handed_values)
    chained.kiln_chain = (run_first, run_second)
    return chained
