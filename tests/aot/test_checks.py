"""Checks inside a graph (``aten._assert_async``: ``F.one_hot``'s bounds, ``torch._assert_async``
of the user's) read nothing back, yet they are the graph's work: the AOT stages keep them, in
inference and training graphs, so a compiled call raises where eager raises."""
import pytest
import torch
import torch.nn.functional as F

import kiln


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("bad", [[-1, 0], [0, 5]])
def test_one_hot_checks_its_classes(backend, bad):
    def f(a):
        return F.one_hot(a, 3)

    compiled = kiln.compile(f, backend=backend)
    good = torch.tensor([0, 2])
    torch.testing.assert_close(compiled(good), f(good))
    with pytest.raises(RuntimeError, match="[Cc]lass values must be"):
        f(torch.tensor(bad))
    with pytest.raises(RuntimeError, match="[Cc]lass values must be"):
        compiled(torch.tensor(bad))


def test_one_hot_checks_its_classes_in_a_training_graph():
    def f(w, a):
        return (F.one_hot(a, 4).float() @ w).sum()

    compiled = kiln.compile(f, backend="aot_eager")
    w = torch.randn(4, 3, requires_grad=True)
    good = torch.tensor([0, 3, 1])
    compiled(w, good).backward()
    grad, w.grad = w.grad, None
    f(w, good).backward()
    torch.testing.assert_close(grad, w.grad)
    with pytest.raises(RuntimeError, match="[Cc]lass values must be"):
        compiled(w, torch.tensor([0, 4]))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_users_assert_async_is_kept(requires_grad):
    def f(x):
        torch._assert_async(x.sum() > 0, "the sum must be positive")
        return x * 2

    compiled = kiln.compile(f, backend="aot_eager")
    x = torch.ones(3, requires_grad=requires_grad)
    torch.testing.assert_close(compiled(x), f(x))
    with pytest.raises(RuntimeError, match="the sum must be positive"):
        compiled(-x.detach().requires_grad_(requires_grad))
