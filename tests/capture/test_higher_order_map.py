"""``torch._higher_order_ops.map`` in compiled code: one graph with a ``higher_order.map_impl``
node whose body is a subgraph; the same outputs and gradients as eager."""
from __future__ import annotations

import pytest
import torch
from torch._higher_order_ops import map as hop_map

import kiln
from kiln.errors import Unsupported
from kiln.testing import CompileCounter, assert_same

MAP = torch.ops.higher_order.map_impl
BACKENDS = ["eager", "aot_eager", "inductor"]


def _map_nodes(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is MAP]


def _close(a, b):
    assert_same(a, b, atol=1e-5, rtol=1e-5)


def project(xs, w, b):
    # w is an extra argument, b a closure: both become the op's additional inputs
    return hop_map(lambda x, w: (x @ w).relu() + b, xs, w)


def pairs(xs):
    return hop_map(lambda t: (t[0] * t[1], [t[0].sin()]), xs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_over_leading_dim_one_graph(backend):
    counter = CompileCounter()
    be = counter if backend == "eager" else backend
    c_project = kiln.compile(project, backend=be, fullgraph=True)
    c_pairs = kiln.compile(pairs, backend=be, fullgraph=True)
    for _ in range(2):
        xs, w, b = torch.randn(5, 3), torch.randn(3, 4), torch.randn(4)
        _close(c_project(xs, w, b), project(xs, w, b))
        t = (torch.randn(4, 2), torch.randn(4, 2))
        out = c_pairs(t)
        assert type(out) is tuple and type(out[1]) is list
        _close(out, pairs(t))
    if backend == "eager":
        assert counter.frame_count == 2
        (node,) = _map_nodes(counter.graphs[0])
        assert len(node.args[1]) == 1 and len(node.args[2]) == 2     # xs; w and b


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_training_matches_eager(backend):
    w = torch.randn(3, 3, requires_grad=True)

    def f(xs):
        return hop_map(lambda x: torch.tanh(x @ w), xs).pow(2).sum()

    compiled = kiln.compile(f, backend=backend, fullgraph=True)
    xs = torch.randn(4, 3)
    xa, xe = xs.clone().requires_grad_(), xs.clone().requires_grad_()
    loss_a = compiled(xa)
    loss_a.backward()
    grad_a = w.grad.clone()
    w.grad = None
    loss_e = f(xe)
    loss_e.backward()
    _close(loss_a, loss_e)
    _close(xa.grad, xe.grad)
    _close(grad_a, w.grad)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_map_dynamic_shapes_one_graph(backend):
    counter = CompileCounter()
    compiled = kiln.compile(project, backend=counter if backend == "eager" else backend, dynamic=True,
                            fullgraph=True)
    for n, d in ((5, 4), (6, 2), (8, 7)):     # (no size equal to the output size 3)
        xs, w, b = torch.randn(n, d), torch.randn(d, 3), torch.randn(3)
        _close(compiled(xs, w, b), project(xs, w, b))
    if backend == "eager":
        assert counter.frame_count == 1


def test_map_refusals():
    log = []

    def effect(xs):
        def body(x):
            log.append(1)
            return x + 1
        return hop_map(body, xs)

    def aliased(xs):
        return hop_map(lambda x: x.view(-1), xs)

    def lengths(xs, ys):
        return hop_map(lambda t: t[0] + t[1].sum(), (xs, ys))

    with pytest.raises(Unsupported, match="changes Python state"):
        kiln.compile(effect, backend="eager", fullgraph=True)(torch.randn(3, 2))
    with pytest.raises(Unsupported, match="alias"):
        kiln.compile(aliased, backend="eager", fullgraph=True)(torch.randn(3, 2))
    with pytest.raises(Unsupported, match="different lengths"):
        kiln.compile(lengths, backend="eager", fullgraph=True)(torch.randn(3, 2), torch.randn(4, 2))
    xs, ys = torch.randn(3, 2), torch.randn(4, 2)
    with pytest.raises(RuntimeError):       # eager rejects it; the call runs natively
        lengths(xs, ys)
    with pytest.raises(RuntimeError):
        kiln.compile(lengths, backend="eager")(xs, ys)
