"""backward() through some of a compiled graph's outputs only.

Eager's autograd runs only the nodes on the way from the outputs backward() was called on: a
leaf nothing reaches keeps ``.grad`` None, and what the other outputs' gradients would have
needed is never computed. The compiled backward is one graph for every output. For a call
where some tangents are missing (the autograd.Function gets None for them):

* ``grad_dependencies``: which tangents each gradient is computed from; a gradient none of
  whose tangents is given is None, as in eager;
* ``without_tangents``: the backward graph for the given tangents only. A missing tangent is
  passed as zeros, and the backward is linear in its tangents, so every value computed from
  missing tangents only is zero; but computed, it can be NaN (zero times an infinite local
  derivative, ``sqrt`` at 0) and poison a gradient eager computes cleanly. Where such a value
  meets one computed from a given tangent, the graph uses zeros of its shape instead (an
  ``aten.full``, which every backend lowers: this graph is made after the AOT trace, so the
  backend's decompositions never see it).
"""
from __future__ import annotations

import torch
import torch.fx

from . import fake_propagation, fake_tensors, fx_graphs

aten = torch.ops.aten


def tangent_sets(graph: torch.fx.Graph, tangents: list) -> dict:
    """node -> the tangents (indices into ``tangents``) it is computed from."""
    deps: dict = {t: frozenset((j,)) for j, t in enumerate(tangents)}
    for n in graph.nodes:
        if n not in deps:
            deps[n] = frozenset().union(*[deps.get(a, frozenset()) for a in n.all_input_nodes])
    return deps


def grad_dependencies(joint: torch.fx.GraphModule, num_fw_outputs: int) -> list[list[int]]:
    """For each gradient the joint graph returns, the tangents it is computed from (indices in
    placeholder order)."""
    tangents = [n for n in joint.graph.nodes if n.op == "placeholder" and n.meta.get("kiln_tangent")]
    deps = tangent_sets(joint.graph, tangents)
    grads = fx_graphs.flat_outputs(joint.graph)[num_fw_outputs:]
    # eager's autograd reaches a leaf through its graph, whatever the values: a gradient that
    # is a constant (zeros) still comes from the outputs that reach it (graph_capture._reached_by)
    reach = joint.meta.get("kiln_grad_reach", {})
    return [sorted(set(deps.get(g, ())) | set(reach.get(i, ()))) if isinstance(g, torch.fx.Node) else []
            for i, g in enumerate(grads)]


def without_tangents(backward: torch.fx.GraphModule, num_tangents: int, given: frozenset) -> torch.fx.GraphModule:
    """A copy of ``backward`` (saved values + tangents -> gradients) in which a value computed
    from missing tangents only is replaced by ``zeros_like`` of it where a value computed from
    a given tangent uses it, and gradients computed from missing tangents only are None."""
    fake_tensors.ensure_vals(backward)     # (a loaded graph's: the zeros are sized from them)
    ensure_node_vals(backward)
    gm = torch.fx.GraphModule(backward, _copy(backward.graph), class_name=type(backward).__name__)
    # (what a backend knows of the backward: its saved values, its forward's partition; a
    # partial backward may run again for other outputs, so none of its inputs is donated)
    gm.meta.update(backward.meta, kiln_donated=[])
    g = gm.graph
    phs = [n for n in g.nodes if n.op == "placeholder"]
    tangents = phs[len(phs) - num_tangents:]
    deps = tangent_sets(g, tangents)

    def dead(n) -> bool:
        d = deps.get(n)
        return bool(d) and d.isdisjoint(given)

    # a symbolic size of a missing value, read from an input the graph keeps: a given tangent
    # first (backward() brought it), then a saved value an op that still runs reads (a node of
    # a segmented graph keeps what its backward for all its tangents reads: not a value only the
    # ops of a missing tangent read), then any other
    given_tangents = [t for j, t in enumerate(tangents) if j in given]
    read_live = [p for p in phs if not dead(p) and any(not dead(u) for u in p.users)]
    sizes = {}
    for p in given_tangents + read_live + phs:
        v = p.meta.get("val")
        if isinstance(v, torch.Tensor) and not dead(p):
            for i, d in enumerate(v.shape):
                if isinstance(d, torch.SymInt):
                    sizes.setdefault(d.node.expr, (p, i))
    zeros: dict = {}
    for n in list(g.nodes):
        if n.op == "output" or not deps.get(n) or dead(n):
            continue
        for a in n.all_input_nodes:
            if dead(a):
                z = zeros.get(a)
                if z is None:
                    z = zeros[a] = _zeros_of(g, a, sizes)
                n.replace_input_with(a, z)
    out = fx_graphs.output_node(g)
    flat = list(out.args[0])
    out.args = (tuple(None if isinstance(v, torch.fx.Node) and dead(v) else v for v in flat),)
    # every user of a dead value is dead now: remove them all (the dead-code pass keeps ops it
    # cannot prove pure, which would keep reading the missing tangents)
    for n in reversed(list(g.nodes)):
        if n.op not in ("placeholder", "output") and dead(n) and not n.users:
            g.erase_node(n)
    g.eliminate_dead_code()
    g.lint()
    gm.recompile()
    return gm


def reading_only(gm: torch.fx.GraphModule, num_saved: int) -> tuple[torch.fx.GraphModule, list[int]]:
    """``gm`` (saved values + tangents -> gradients) without the inputs it does not read, and the
    positions of those it keeps. (Inductor: ``kiln_saved_positions`` says which forward outputs
    the kept saved values are, for their strides.)"""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    kept = []
    for i, p in enumerate(phs):
        if p.users:
            kept.append(i)
        else:
            gm.graph.erase_node(p)
    gm.graph.lint()
    gm.recompile()
    saved = [i for i in kept if i < num_saved]
    gm.meta["kiln_num_saved"] = len(saved)
    gm.meta["kiln_saved_positions"] = saved
    gm.meta["kiln_donated"] = []
    return gm, kept


def inputs_read(backward: torch.fx.GraphModule, num_tangents: int, given: frozenset, num_saved: int) -> list[int]:
    """The inputs (saved values, then tangents) that the backward for the tangents ``given``
    reads (what a node of a segmented graph keeps for its backward)."""
    return reading_only(without_tangents(backward, num_tangents, given), num_saved)[1]


def inputs_read_per_set(backward: torch.fx.GraphModule, num_tangents: int, givens: list,
                        num_saved: int) -> list[list[int]]:
    """``inputs_read`` for each set of tangents in ``givens``: what ``without_tangents`` keeps,
    found by walking the graph from the gradients it still computes, without building each
    partial graph (a model with a node per layer has as many sets as layers). Where the zeros
    it would insert read inputs of their own (sized from symbolic sizes, or values with no
    fake value), each partial graph is built."""
    g = backward.graph
    calls = [n for n in g.nodes if n.op == "call_function"]
    phs = [n for n in g.nodes if n.op == "placeholder"]
    if not all("val" in n.meta and _static_value(n.meta["val"]) for n in phs + calls):
        return [inputs_read(backward, num_tangents, frozenset(t), num_saved) for t in givens]
    deps = tangent_sets(g, phs[len(phs) - num_tangents:])
    outputs = [v for v in fx_graphs.flat_outputs(g) if isinstance(v, torch.fx.Node)]
    impure = [n for n in calls if n.is_impure()]
    found = []
    for given in givens:
        given = frozenset(given)

        def dead(n) -> bool:
            d = deps.get(n)
            return bool(d) and d.isdisjoint(given)
        live: set = set()
        stack = [n for n in outputs + impure if not dead(n)]
        while stack:
            n = stack.pop()
            if n in live:
                continue
            live.add(n)
            stack.extend(a for a in n.all_input_nodes if not dead(a) and a not in live)
        found.append([i for i, p in enumerate(phs) if p in live])
    return found


def _static_value(v) -> bool:
    """A tensor of static shape, None, or a tuple or list of them (a multi-output op's)."""
    if v is None:
        return True
    if isinstance(v, torch.Tensor):
        return not any(isinstance(d, torch.SymInt) for d in v.shape)
    if isinstance(v, (tuple, list)):
        return all(x is None or (isinstance(x, torch.Tensor) and _static_value(x)) for x in v)
    return False


def ensure_node_vals(gm: torch.fx.GraphModule) -> None:
    """Fake values for the nodes of a graph that has them on its placeholders only (a loaded
    static artifact's): the zeros that replace a value are sized from it. Without one they
    would be ``zeros_like``, which a compiler that lowers decomposed graphs (Inductor) has no
    kernel for: it would fail and the partial backward would run as ATen ops. (A segmented
    backward's fusion into one graph adds gradients by their values' shapes too.)"""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    if all("val" in n.meta for n in nodes):
        return
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    mode = fake_tensors.fake_mode_of(vals)
    if mode is None or any(v is None for v in vals):
        return
    try:
        fake_propagation.propagate_fake(gm, vals, mode)
    except Exception:         # (the zeros are then zeros_like: correct, only slower)
        return


def _zeros_of(g: torch.fx.Graph, a: torch.fx.Node, size_sources: dict | None = None) -> torch.fx.Node:
    """A node for zeros with ``a``'s shape, dtype and device, inserted after ``a`` (after the
    last placeholder, for a placeholder sized from ``size_sources``).
    ``size_sources``: symbolic size -> (placeholder, dim) to read it from instead of ``a`` (a
    missing tangent, or a value computed from missing tangents only)."""
    val = a.meta.get("val")
    if not isinstance(val, torch.Tensor):
        with g.inserting_after(a):
            z = g.call_function(aten.zeros_like.default, (a,))   # (no value recorded to size it)
        z.meta = dict(a.meta)
        return z
    last = a
    if size_sources and a.op == "placeholder":
        # (after every placeholder: a source may come after ``a``)
        last = [n for n in g.nodes if n.op == "placeholder"][-1]
    sizes = []
    for i, s in enumerate(val.shape):
        if isinstance(s, torch.SymInt):
            # (from a kept input rather than ``a``: reading a dead value's size would compute it,
            # from what may not be there)
            src = size_sources.get(s.node.expr) if size_sources else None
            with g.inserting_after(last):
                last = g.call_function(aten.sym_size.int, src or (a, i))
            last.meta["val"] = s
            sizes.append(last)
        else:
            sizes.append(int(s))
    with g.inserting_after(last):
        z = g.call_function(aten.full.default, (sizes, 0),
                            {"dtype": val.dtype, "layout": torch.strided, "device": val.device,
                             "pin_memory": False})
    z.meta = {k: v for k, v in a.meta.items() if k != "val"}
    z.meta["val"] = torch.empty_like(val, memory_format=torch.contiguous_format)
    return z


def _copy(graph: torch.fx.Graph) -> torch.fx.Graph:
    new = torch.fx.Graph()
    out = new.graph_copy(graph, {})
    new.output(out)
    return new


def components(parts, fw_out_nodes: list) -> list[tuple[list[int], list[int], list[int]]]:
    """The training callable's autograd nodes: ``(tangents, forward outputs, primals)`` each.

    Tangents whose gradients reach a common primal are one node; so are forward outputs that
    are one value. A primal goes to the node of the tangents its gradient comes from; a primal
    no tangent reaches goes to none (eager's autograd has no edge to it either: an edge would
    make backward() run, and free, the node that made it). Outputs without a tangent go to the
    first node."""
    deps = parts.grad_dependencies
    n_t = len(parts.tangent_positions)
    nfw = parts.num_fw_outputs
    if deps is None:
        return [(list(range(n_t)), list(range(nfw)), list(range(len(parts.primal_requires_grad))))]
    parent = list(range(n_t))

    def find(j):
        while parent[j] != j:
            parent[j] = parent[parent[j]]
            j = parent[j]
        return j

    def union(a, b):
        parent[find(a)] = find(b)

    for d in deps:
        for j in d[1:]:
            union(d[0], j)
    tangent_of = {k: j for j, k in enumerate(parts.tangent_positions)}
    first: dict = {}
    for k, node in enumerate(fw_out_nodes):
        if k in tangent_of and isinstance(node, torch.fx.Node):
            j = tangent_of[k]
            if node in first:
                union(first[node], j)
            else:
                first[node] = j
    roots = sorted({find(j) for j in range(n_t)}, key=lambda r: min(j for j in range(n_t) if find(j) == r))
    index = {r: c for c, r in enumerate(roots)}
    groups = [([j for j in range(n_t) if find(j) == r], [], []) for r in roots] or [([], [], [])]
    for k, node in enumerate(fw_out_nodes):
        if k in tangent_of:
            c = index[find(tangent_of[k])]
        elif isinstance(node, torch.fx.Node) and node in first:
            c = index[find(first[node])]
        else:
            c = 0
        groups[c][1].append(k)
    for i, d in enumerate(deps):
        if d:
            groups[index[find(d[0])]][2].append(i)
    _edges_without_gradients(parts, fw_out_nodes, groups)
    return groups


def _edges_without_gradients(parts, fw_out_nodes: list, groups: list) -> None:
    """A node whose outputs require grad but which no primal's gradient comes from (a custom
    Function whose backward returns None): eager's output requires grad, and backward()
    through it gives those inputs no gradient. The node takes the primals that require grad
    and that its outputs are computed from, so that its outputs require grad as eager's."""
    rg, prg = parts.fw_output_requires_grad, parts.primal_requires_grad
    placeholders = [n for n in parts.forward.graph.nodes if n.op == "placeholder"]
    primal_of = {n: i for i, n in enumerate(placeholders) if i < len(prg) and prg[i]}
    for _, outs, primals in groups:
        wanted = [fw_out_nodes[k] for k in outs if k < len(rg) and rg[k] and isinstance(fw_out_nodes[k], torch.fx.Node)]
        if primals or not wanted:
            continue
        seen, stack = set(), list(wanted)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            stack.extend(n.all_input_nodes)
        primals.extend(sorted(primal_of[n] for n in seen if n in primal_of))
