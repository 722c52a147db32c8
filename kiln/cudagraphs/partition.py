"""Partitions: an inference graph with ops a CUDA graph cannot hold (CPU work, a device sync,
a data-dependent shape) is split around them instead of running without CUDA graphs at all.

The graph's ops are cut into runs of consecutive ops of one kind (``torch.fx`` ``split_module``,
which routes every value between the pieces). Each run of CUDA ops is compiled on its own and
becomes a ``CudagraphFunction`` (recorded and replayed like any graph; what one piece passes to
the next is an output of a replay, read in place); the other runs execute as ATen ops between
them, each call logged (or raising under ``cudagraph_or_error``) with its reason.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx

from .. import logs
from .function import CudagraphFunction, _caller
from .reasons import GraphFacts, graph_facts, op_reason, skip


class _Replayed(torch.nn.Module):
    """A piece of CUDA ops, run as CUDA graph replays."""

    def __init__(self, fn: CudagraphFunction, single: bool):
        super().__init__()
        self.fn = fn
        self.single = single

    def forward(self, *args):
        out = self.fn(list(args))
        return out[0] if self.single else tuple(out)


class _Outside(torch.nn.Module):
    """A piece that runs outside CUDA graphs (as ATen ops), saying why on each call."""

    def __init__(self, sub: torch.fx.GraphModule, facts: GraphFacts, reason: str):
        super().__init__()
        self.sub = sub
        self.facts = facts
        self.reason = reason
        self.logged: set = set()

    def forward(self, *args):
        skip(self.facts, f"{self.reason} (this part of the graph runs between CUDA graphs)", self.logged)
        return self.sub(*args)


def _as_tuple_graph(sub: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, bool]:
    """``sub`` returning a tuple (what compilers take), and whether it returned one value."""
    out = next(n for n in sub.graph.nodes if n.op == "output")
    if isinstance(out.args[0], (tuple, list)):
        return sub, False
    g = torch.fx.Graph()
    env: dict = {}
    for n in sub.graph.nodes:
        if n.op == "output":
            g.output((env[out.args[0]],) if isinstance(out.args[0], torch.fx.Node) else (out.args[0],))
        else:
            env[n] = g.node_copy(n, lambda a: env[a])
    return torch.fx.GraphModule(sub, g, class_name=type(sub).__name__), True


def partitioned(gm: torch.fx.GraphModule, compile_piece: Callable, facts: GraphFacts,
                classify: Callable[[torch.fx.Node], str | None] = op_reason) -> Callable:
    """The boxed callable running ``gm`` (an inference graph) as CUDA-graph pieces and the ops
    between them. ``compile_piece(gm, example_inputs)`` compiles one piece of CUDA ops;
    ``classify(node)`` says why an op must run outside (None: inside)."""
    part: dict = {}
    reasons: dict = {}
    current, inside = -1, None
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        why = classify(n) if n.op != "get_attr" else None
        here = why is None
        if here is not inside:
            current, inside = current + 1, here
        part[n] = current
        if why is not None:
            reasons.setdefault(current, why)
    from torch.fx.passes.split_module import split_module

    split = split_module(gm, None, lambda n: part[n], keep_original_order=True)
    pieces = 0
    for name, sub in list(split.named_children()):
        index = int(name.rsplit("_", 1)[1])
        if index in reasons:
            setattr(split, name, _Outside(sub, facts, reasons[index]))
            continue
        tupled, single = _as_tuple_graph(sub)
        examples = [p.meta.get("val") for p in tupled.graph.nodes if p.op == "placeholder"]
        piece_facts = graph_facts(tupled, "inference")
        piece_facts.name = f"{facts.name} (part {index + 1})"
        setattr(split, name, _Replayed(CudagraphFunction(compile_piece(tupled, examples), piece_facts), single))
        pieces += 1
    split.recompile()
    if logs.enabled.cudagraphs:
        logs.event("cudagraphs", "cudagraph", f"the {facts.name} is split: {pieces} part(s) recorded as CUDA graphs, "
                                              f"{len(reasons)} run between them ({'; '.join(reasons.values())})",
                   action="partitioned", graph=facts.name, parts=pieces, reasons=list(reasons.values()))
    run = _caller(split)

    def run_partitioned(args: list):
        a = list(args)
        args.clear()
        return run(a)
    run_partitioned._boxed_call = True
    run_partitioned.kiln_partitioned = split
    return run_partitioned


def can_partition(facts: GraphFacts) -> bool:
    """Whether a refused graph may be split instead: an inference graph of static shapes
    whose only problem is some of its ops."""
    return facts.kind == "inference" and facts.skip is not None and facts.op_level and not facts.size_inputs


def try_partition(gm: torch.fx.GraphModule, compile_piece: Callable, facts: GraphFacts) -> Callable | None:
    """``gm`` split around the ops CUDA graphs cannot hold (``partitioned``), or None when it
    is not to be split (or splitting failed: then it runs whole, without CUDA graphs)."""
    if not can_partition(facts):
        return None
    try:
        return partitioned(gm, compile_piece, facts)
    except Exception as e:      # kiln's failure: the graph runs whole, its skip logged
        if logs.enabled.cudagraphs:
            logs.event("cudagraphs", "cudagraph", f"could not split the {facts.name} ({type(e).__name__}: {e}); "
                                                  "it runs without CUDA graphs",
                       action="skipped", graph=facts.name, reason=f"could not split: {type(e).__name__}: {e}")
        return None
