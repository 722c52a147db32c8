"""Moving traced code out of the capture's graph into a subgraph of its own.

Calls whose body runs as a unit of its own (a custom ``autograd.Function``'s forward and
backward, a ``torch.cond`` branch) are inlined like any call, so that what they read is guarded
as usual; the nodes they added are then copied into an FX ``GraphModule`` and erased from the
capture's graph.
"""
from __future__ import annotations

import inspect

import torch

from ...errors import Unsupported
from ...inplace_ops import mutates


def new_nodes(graph, before: set) -> list:
    """The nodes a trace added. Placeholders (inputs first read there) and ``get_attr``
    constants (shared through the capture's cache) stay with the outer graph."""
    return [n for n in graph.nodes if n not in before and n.op not in ("placeholder", "get_attr")]


def mutated_operands(node) -> list:
    """The graph values an in-place node may write (its self, ``out=``, ``inplace=True``)."""
    found = []
    if node.op in ("call_function", "call_method"):
        if mutates(node.op, node.target) and node.args:
            first = node.args[0]
            found += list(first) if isinstance(first, (list, tuple)) else [first]
        out = node.kwargs.get("out")
        if out is not None:
            found += list(out) if isinstance(out, (list, tuple)) else [out]
        if node.kwargs.get("inplace") is True or inplace_positional(node):
            found.append(node.args[0] if node.args else None)
    return [a for a in found if isinstance(a, torch.fx.Node)]


def inplace_positional(node) -> bool:
    """``F.relu(x, True)``: an ``inplace`` parameter passed by position."""
    if node.op != "call_function" or not callable(node.target):
        return False
    try:
        params = list(inspect.signature(node.target).parameters)
    except (TypeError, ValueError):
        return False
    if "inplace" not in params:
        return False
    i = params.index("inplace")
    return i < len(node.args) and node.args[i] is True


def subgraph(inputs: list, region: list, outputs: list, name: str, constants: dict) -> torch.fx.GraphModule:
    """A GraphModule of ``region``'s nodes (copied), reading ``inputs`` ((name, node) pairs:
    the nodes from outside it become its placeholders) and returning ``outputs`` (nodes, or
    None). Constants the outer graph holds (``get_attr``) are held by the subgraph too."""
    g = torch.fx.Graph()
    root = torch.nn.Module()
    env: dict = {}
    for ph_name, n in inputs:
        ph = g.placeholder(ph_name)
        ph.meta["example_value"] = n.meta.get("example_value")
        env.setdefault(n, ph)

    def lookup(a):
        if a not in env and a.op == "get_attr" and a.target in constants:
            object.__setattr__(root, a.target, constants[a.target])
            env[a] = g.get_attr(a.target)
        if a not in env:
            raise Unsupported(f"the {name} subgraph reads {a.name}, which it does not receive")
        return env[a]

    for n in region:
        env[n] = g.node_copy(n, lookup)
    g.output(tuple(lookup(o) if o is not None else None for o in outputs))
    return torch.fx.GraphModule(root, g, class_name=name)
