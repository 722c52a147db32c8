"""The backward of a segmented graph (segments.py) as one graph.

A segmented graph's backward (saved values + tangents -> one gradient per primal, the handoff
primals included) stops at each handoff primal: the segment that reads a handed value returns
its gradient, and autograd adds it to the tangent of the node that handed the value over. The
runtime's chain of nodes then runs one compiled piece per segment: a generated module, its
launches and the copies at its edges, per segment, where torch.compile runs one.

``fuse`` joins the pieces inside the graph: the tangent of each forward output that handoff
primals stand for becomes ``tangent + grad(handoff) + ...``, and the graph returns the
function's own gradients only::

    tangents_3 -> add(tangents_3, grad_of_handoff_0)      # the cache value layer 1 handed over

Compiled once, it is the whole backward, with fusion across the segments' edges. The runtime
(``function.py``) runs it when nothing can see the gradient at a handed output's node; the
gradient a handed output gets from outside the graph arrives there later and is added then, by
the linearity of the backward (see there).
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from ..lazy_imports import LazyModule
from . import fx_graphs

sympy = LazyModule("sympy")       # (imported when a backward is fused, not at a warm start)

_COPY_STRIDED = torch.ops.prims.copy_strided.default


def fuse(backward: torch.fx.GraphModule, *, num_saved: int, num_args: int, feeds: list,
         tangent_positions: list, views: dict) -> torch.fx.GraphModule | None:
    """The backward with each handoff primal's gradient added into the tangent of the output it
    stands for, returning the gradients of the function's ``num_args`` inputs only. A handed
    value the runtime rebuilds as a view of an output (``("view", base, k)`` feeds; ``views``:
    output k's size, stride and offset in its base) adds its gradient scattered into the base's,
    as autograd's view node does. None where that cannot be one graph: a symbolic view whose
    size, stride or offset the graph cannot compute from its values' sizes, an output without a
    tangent, values without fake tensors."""
    gm = fx_graphs.copy_graph_module(backward)
    g = gm.graph
    phs = [n for n in g.nodes if n.op == "placeholder"]
    tangents = phs[num_saved:]
    sizes = _size_sources(phs[:num_saved])
    out = next(n for n in reversed(g.nodes) if n.op == "output")
    flat = list(out.args[0])
    tangent_of = {k: j for j, k in enumerate(tangent_positions)}
    into: dict = {}
    for h, feed in enumerate(feeds):
        grad = flat[num_args + h]
        if grad is None:
            continue
        j = tangent_of.get(feed[1])
        if j is None or not isinstance(grad, torch.fx.Node):
            return None
        if grad.op == "call_function" and grad.target is _COPY_STRIDED:
            grad = grad.args[0]     # (made contiguous for the node that took it; here it is added)
        view = None
        if feed[0] == "view":
            view = views.get(feed[2])
            if view is None:
                return None
        into.setdefault(j, []).append((grad, view))
    for j, grads in into.items():
        t = tangents[j]
        users = list(t.users)
        total = t
        for grad, view in grads:
            if view is not None:
                grad = _scattered(g, out, t, grad, view, sizes)
            total = _add(g, out, total, grad) if grad is not None else None
            if total is None:
                return None
        for u in users:
            u.replace_input_with(t, total)
    # (re-read: a gradient that is a tangent itself, an input returned as it is, is the sum now)
    out.args = (tuple(list(out.args[0])[:num_args]),)
    try:
        _sort_topologically(g)
        g.eliminate_dead_code()
        g.lint()
    except RuntimeError:
        return None
    gm.recompile()
    return gm


def _add(g: torch.fx.Graph, before: torch.fx.Node, a: torch.fx.Node, b: torch.fx.Node) -> torch.fx.Node | None:
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not isinstance(va, torch.Tensor) or not isinstance(vb, torch.Tensor) or va.shape != vb.shape:
        return None
    mode = torch._guards.detect_fake_mode([va, vb])
    with g.inserting_before(before):
        if vb.dtype != va.dtype:
            b0 = b
            b = g.call_function(torch.ops.prims.convert_element_type.default, (b, va.dtype))
            with mode:
                vb = torch.ops.prims.convert_element_type.default(vb, va.dtype)
            b.meta.update({k: v for k, v in b0.meta.items() if k != "val"}, val=vb)
        node = g.call_function(torch.ops.aten.add.Tensor, (a, b))
    with mode:
        node.meta["val"] = torch.ops.aten.add.Tensor(va, vb)
    node.meta["kiln_phase"] = "backward"
    return node


def _size_sources(values: list) -> dict:
    """symbolic size -> (node, dim) of a value that has it."""
    out: dict = {}
    for n in values:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            for i, d in enumerate(v.shape):
                if isinstance(d, torch.SymInt):
                    out.setdefault(d.node.expr, (n, i))
    return out


def _shape_arg(g: torch.fx.Graph, shape, sources: dict) -> list | None:
    """``shape`` as a reshape's argument: ints, a ``sym_size`` of a value for each symbolic
    size, -1 for at most one size no value has."""
    out, unknown = [], 0
    for d in shape:
        if not isinstance(d, torch.SymInt):
            out.append(int(d))
            continue
        src = sources.get(d.node.expr)
        if src is None:
            unknown += 1
            out.append(-1)
            continue
        node = g.call_function(torch.ops.aten.sym_size.int, src)
        node.meta["val"] = d
        out.append(node)
    return out if unknown <= 1 else None


def _scattered(g: torch.fx.Graph, before: torch.fx.Node, base: torch.fx.Node, grad: torch.fx.Node,
               view: tuple, sizes: dict) -> torch.fx.Node | None:
    """The gradient of ``base.as_strided(*view)`` as one of ``base``'s shape (zeros elsewhere):
    what autograd's node of the rebuilt view gives the base. ``base`` (a tangent) is
    contiguous, as the runtime makes every tangent, and so is the output it stands for.
    ``sizes``: where symbolic sizes can be read (``_size_sources``)."""
    vb, vg = base.meta.get("val"), grad.meta.get("val")
    if not isinstance(vb, torch.Tensor) or not isinstance(vg, torch.Tensor) or not vb.is_contiguous():
        return None
    size, stride, offset = view
    mode = torch._guards.detect_fake_mode([vb, vg])
    if vg.dtype != vb.dtype:
        return None
    order = _memory_order(size, stride, vb.numel()) if _expr(offset) == 0 else None
    if order is not None:
        # a permutation of the base's elements (a transpose of a reshape, as a key/value
        # cache is): the gradient laid out in memory order is the base's, and a compiler
        # fuses these index changes into the sum that reads it
        with g.inserting_before(before):
            shape = _shape_arg(g, vb.shape, {**_size_sources([grad]), **sizes})
            if shape is None:
                return None
            perm = g.call_function(torch.ops.aten.permute.default, (grad, order))
            node = g.call_function(torch.ops.aten.reshape.default, (perm, shape))
        with mode:
            perm.meta["val"] = vg.permute(order)
            node.meta["val"] = perm.meta["val"].reshape(vb.shape)
        perm.meta["kiln_phase"] = node.meta["kiln_phase"] = "backward"
        return node
    with g.inserting_before(before):
        # (a symbolic view, a slice of a projection: its size, stride and offset as graph
        # values, computed from the sizes the graph's values have)
        ints = _SymbolicInts(g, {**_size_sources([grad]), **sizes})
        try:
            shape, size_, stride_ = ([ints.node(d) for d in ds] for ds in (vb.shape, size, stride))
            offset_ = ints.node(offset)
        except _NoSource:
            for n in reversed(ints.made):
                g.erase_node(n)
            return None
        zeros = g.call_function(torch.ops.aten.full.default, (shape, 0),
                                {"dtype": vb.dtype, "layout": torch.strided, "device": vb.device,
                                 "pin_memory": False})
        node = g.call_function(torch.ops.aten.as_strided_scatter.default, (zeros, grad, size_, stride_, offset_))
    with mode:
        zeros.meta["val"] = torch.zeros(vb.shape, dtype=vb.dtype, device=vb.device)
        node.meta["val"] = torch.ops.aten.as_strided_scatter.default(zeros.meta["val"], vg.to(vb.dtype), list(size),
                                                                     list(stride), offset)
    for n in (*ints.made, zeros, node):
        n.meta["kiln_phase"] = "backward"
    return node


class _NoSource(Exception):
    """A symbolic int the graph cannot compute from the sizes of its values."""


class _SymbolicInts:
    """Graph values for ints of a traced graph: a constant as it is, a symbolic one as nodes
    that compute it (``sym_size`` of a value that has the size, then ``+``, ``*``, ``//``)."""

    def __init__(self, g: torch.fx.Graph, sources: dict):
        self.g = g
        self.sources = sources          # sympy expression -> (node, dim) of a value that has it
        self.done: dict = {}
        self.made: list = []

    def node(self, d):
        if not isinstance(d, torch.SymInt):
            return int(d)
        return self._emit(d.node.expr)[0]

    def _emit(self, e) -> tuple:
        """(graph value, traced value) of the expression ``e``."""
        if e in self.done:
            return self.done[e]
        if e.is_Integer:
            return int(e), int(e)
        if e in self.sources:
            node, dim = self.sources[e]
            out = self._call(torch.ops.aten.sym_size.int, (node, dim), node.meta["val"].shape[dim])
        elif isinstance(e, (sympy.Add, sympy.Mul)):
            op = operator.add if isinstance(e, sympy.Add) else operator.mul
            out = self._emit(e.args[0])
            for arg in e.args[1:]:
                (a, va), (b, vb) = out, self._emit(arg)
                out = self._call(op, (a, b), op(va, vb))
        elif type(e).__name__ == "FloorDiv":
            (a, va), (b, vb) = self._emit(e.args[0]), self._emit(e.args[1])
            out = self._call(operator.floordiv, (a, b), va // vb)
        else:
            raise _NoSource(str(e))
        self.done[e] = out
        return out

    def _call(self, target, args: tuple, value) -> tuple:
        if all(isinstance(a, int) for a in args):
            return value, value
        n = self.g.call_function(target, args)
        n.meta["val"] = value
        self.made.append(n)
        return n, value


def _memory_order(size: tuple, stride: tuple, numel) -> list | None:
    """The dims of a view of ``size`` and ``stride`` from the outermost in memory to the
    innermost, when the view covers ``numel`` elements densely (each once); else None.
    Symbolic sizes and strides are compared as expressions (true for every size), ordered by
    their traced values."""
    hints = [_hint(d) for d in (*size, *stride)]
    if any(h is None for h in hints):
        return None
    n = sympy.Integer(1)
    for d in size:
        n *= _expr(d)
    if sympy.expand(n - _expr(numel)) != 0:
        return None
    rank = len(size)
    order = sorted(range(rank), key=lambda i: (-hints[rank + i], -hints[i]))
    expected = sympy.Integer(1)
    for i in reversed(order):
        if _expr(size[i]) != 1 and sympy.expand(_expr(stride[i]) - expected) != 0:
            return None
        expected *= _expr(size[i])
    return order


def _expr(d):
    return d.node.expr if isinstance(d, torch.SymInt) else sympy.Integer(int(d))


def _hint(d):
    return d.node.hint if isinstance(d, torch.SymInt) else int(d)


def _sort_topologically(g: torch.fx.Graph) -> None:
    """Reorder ``g`` so that every node comes after its inputs, keeping the given order
    otherwise (the added sums sit at the end; their users come before them)."""
    order: list = []
    done: set = set()
    for root in list(g.nodes):
        fx_graphs.emit_inputs_first(root, done, order)
    for prev, n in zip(order, order[1:]):
        if prev.next is not n:
            prev.append(n)
