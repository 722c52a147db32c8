"""A one-element tensor given where a method takes a Scalar (``alpha``, ``value``): an
optimizer's step size, a scheduled learning rate. Eager reads its number, which a graph
cannot; the capture computes the same expression with tensor ops, in the order of eager's
kernel. Compared with eager (values within float rounding, gradients), in one graph; a
scalar that requires grad is refused as eager refuses it."""
import pytest
import torch

import kiln
from kiln.backends.registry import lookup_backend
from kiln.testing import CompileCounter


def step(p, a, b, v, g):
    p = p * 1.0
    p.addcdiv_(a, b, value=-v)
    q = p.add(g, alpha=v * 2)
    p.sub_(a, alpha=v)
    return p, q, q.addcmul(a, b, value=v)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_tensor_scalar_is_one_graph_and_matches_eager(backend):
    def args():
        g = torch.Generator().manual_seed(0)
        return [torch.randn(5, generator=g, requires_grad=True), torch.randn(5, generator=g),
                torch.rand(5, generator=g) + 0.5, torch.tensor(0.3),
                torch.randn(5, generator=g)]

    kiln.reset()
    inner, graphs = lookup_backend(backend)[0], []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inner(gm, example_inputs)

    compiled = kiln.compile(step, backend=counting)
    mine, ref = args(), args()
    got, want = compiled(*mine), step(*ref)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y)
    sum(t.sum() for t in got).backward()
    sum(t.sum() for t in want).backward()
    torch.testing.assert_close(mine[0].grad, ref[0].grad)
    assert len(graphs) == 1


def test_a_scalar_that_requires_grad_raises_as_in_eager():
    def f(x, v):
        return x.add(x, alpha=v)

    compiled = kiln.compile(f, backend="aot_eager")
    x, v = torch.randn(3), torch.tensor(2.0, requires_grad=True)
    with pytest.raises(TypeError, match="must be Number"):
        f(x, v)
    with pytest.raises(TypeError, match="must be Number"):
        compiled(x, v)


def test_other_uses_still_break_and_run_as_eager():
    def f(x, v):
        return x.add(2, alpha=v), x.to(torch.int64).add_(torch.ones(3, dtype=torch.int64), alpha=v.long())

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    x, v = torch.randn(3), torch.tensor(2.0)
    for a, b in zip(compiled(x, v), f(x, v)):
        torch.testing.assert_close(a, b)
