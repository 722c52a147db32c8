"""``x.data``: x's memory with a version counter of its own, so an in-place op through it is
hidden from autograd, even when x was saved for the backward. With grad enabled it is read
natively (a graph break); under no_grad it is a detach() in the graph."""
import pytest
import torch

import kiln
from kiln.testing import CompileCounter


def scale_through_data(x, w):
    out = (x * w).sin()         # (saves x and w for the backward)
    x.data.mul_(2)
    w.data.add_(1)
    return out


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_inplace_through_data_is_hidden_from_autograd(backend):
    kiln.reset()
    compiled = kiln.compile(scale_through_data, backend=backend)
    for _ in range(2):
        x, w = torch.randn(4, requires_grad=True), torch.randn(4)
        xk, wk = x.detach().clone().requires_grad_(True), w.clone()
        scale_through_data(x, w).sum().backward()
        compiled(xk, wk).sum().backward()
        torch.testing.assert_close(xk.grad, x.grad)
        torch.testing.assert_close(xk, x)
        torch.testing.assert_close(wk, w)


def test_data_under_no_grad_stays_in_the_graph():
    def f(x):
        y = x.data * 2
        return y + 1

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True)
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 1


def test_storage_facts_are_the_real_tensors():
    """``is_shared()``, ``is_pinned()`` and ``is_set_to()`` are facts of the real tensor's
    storage (a fake tensor has none of them): read natively, as eager reads them."""
    def f(x, y):
        return x + 1, x.is_shared(), x.is_pinned(), x.is_set_to(y), y.is_set_to(x[1:])

    x = torch.ones(4)
    x.share_memory_()
    for args in ((x, x[:]), (torch.ones(4), torch.ones(4))):
        got, want = kiln.compile(f, backend="aot_eager")(*args), f(*args)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:]
    assert want[1:] == (False, False, False, False) and f(x, x[:])[1:] == (True, False, True, False)
