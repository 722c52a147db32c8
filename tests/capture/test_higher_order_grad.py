"""``torch.autograd.grad(..., create_graph=True)`` / ``loss.backward(create_graph=True)``
inside a compiled function differentiate through the backward of the graph before them. The
AOT backends' backward graphs are not differentiable (that raised kiln.Unsupported at the
user), so such a frame runs eagerly; ``create_graph=False`` still breaks the graph only."""
import pytest
import torch

import kiln
from kiln.testing import CompileCounter, assert_same


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_second_derivative_with_autograd_grad(backend):
    def f(x):
        y = (x ** 3).sum()
        g, = torch.autograd.grad(y, x, create_graph=True)
        g2, = torch.autograd.grad(g.sum(), x)
        return g, g2

    x = torch.randn(4, requires_grad=True)
    assert_same(kiln.compile(f, backend=backend)(x), f(x))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_backward_with_create_graph(backend):
    def f(x, w):
        loss = (x * w ** 2).sum()
        loss.backward(create_graph=True)
        return w.grad * 2

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    ew = w.detach().clone().requires_grad_()
    out, ref = kiln.compile(f, backend=backend)(x, w), f(x, ew)
    assert_same(out, ref)
    out.sum().backward()
    ref.sum().backward()
    assert_same(w.grad, ew.grad)


def test_plain_backward_still_breaks_the_graph_only():
    counter = CompileCounter()

    def f(x, w):
        loss = (x * w).sum()
        loss.backward()
        return w.grad * 2

    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    ew = w.detach().clone().requires_grad_()
    assert_same(kiln.compile(f, backend=counter)(x, w), f(x, ew))
    assert counter.frame_count == 2
