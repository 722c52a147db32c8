"""``torch.while_loop`` in compiled code: one graph with a ``higher_order.while_loop`` node
whose cond_fn and body_fn are subgraphs; the same results as eager for any trip count."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.errors import Unsupported
from kiln.testing import CompileCounter, assert_same

WHILE_LOOP = torch.ops.higher_order.while_loop
BACKENDS = ["eager", "aot_eager", "inductor"]


def doubling(x, w):
    """Doubles x (plus w) until its sum reaches 100 or five steps: the trip count is data's."""
    def cond_fn(i, a):
        return (i < 5) & (a.sum() < 100)

    def body_fn(i, a):
        return i + 1, a * 2 + w          # w: a closure, lifted into the additional inputs

    return torch.while_loop(cond_fn, body_fn, (torch.tensor(0), x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_dependent_trip_count_one_graph(backend):
    counter = CompileCounter()
    compiled = kiln.compile(doubling, backend=counter if backend == "eager" else backend, fullgraph=True)
    for scale in (1, 10, 0.1, 30):       # 0 to 5 trips
        x, w = torch.rand(4) * scale, torch.rand(4)
        assert_same(compiled(x, w), doubling(x, w))
    if backend == "eager":
        assert counter.frame_count == 1
        (node,) = [n for n in counter.graphs[0].graph.nodes if n.target is WHILE_LOOP]
        assert len(node.args[2]) == 2 and len(node.args[3]) == 1   # carried (i, x); additional (w,)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_dynamic_shapes(backend):
    counter = CompileCounter()
    compiled = kiln.compile(doubling, backend=counter if backend == "eager" else backend,
                            dynamic=True, fullgraph=True)
    for n in (3, 5, 8):
        x, w = torch.rand(n), torch.rand(n)
        assert_same(compiled(x, w), doubling(x, w))
    if backend == "eager":
        assert counter.frame_count == 1


def test_body_changing_a_carried_shape_is_refused():
    def f(x):
        return torch.while_loop(lambda a: a.sum() < 10, lambda a: (a[:-1] + 1,), (x,))

    with pytest.raises(Unsupported, match="different shapes"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.rand(4))


def test_cond_fn_not_returning_a_bool_tensor_is_refused():
    def f(x):
        return torch.while_loop(lambda a: a.sum(), lambda a: (a + 1,), (x,))

    with pytest.raises(Unsupported, match="one-element bool tensor"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.rand(4))


def test_training_is_refused():
    def f(x):
        return torch.while_loop(lambda a: a.sum() < 10, lambda a: (a * 2,), (x,))

    with pytest.raises(Unsupported, match="does not support training"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.rand(4, requires_grad=True))
    with torch.no_grad():           # no graph of gradients: captured
        counter = CompileCounter()
        x = torch.rand(4, requires_grad=True)
        assert_same(kiln.compile(f, backend=counter, fullgraph=True)(x), f(x))
        assert counter.frame_count == 1


def test_the_cond_subgraph_returns_the_bool_tensor_itself():
    # (torch's while_loop, run as ATen ops by the eager and aot_eager backends, takes the
    # tensor, not a tuple of it)
    counter = CompileCounter()
    compiled = kiln.compile(doubling, backend=counter, fullgraph=True)
    x, w = torch.rand(4), torch.rand(4)
    compiled(x, w)
    (node,) = [n for n in counter.graphs[0].graph.nodes if n.target is WHILE_LOOP]
    cond_gm = getattr(counter.graphs[0], node.args[0].target)
    out = next(n for n in cond_gm.graph.nodes if n.op == "output")
    assert isinstance(out.args[0], torch.fx.Node)
    assert_same(WHILE_LOOP(cond_gm, getattr(counter.graphs[0], node.args[1].target),
                           (torch.tensor(0), x), (w,)), doubling(x, w))
