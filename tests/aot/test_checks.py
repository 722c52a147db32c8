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


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_binary_cross_entropy_checks_its_input(backend):
    """Eager's ``F.binary_cross_entropy`` raises for an input outside [0, 1] or NaN (the check
    is in its kernel); Inductor's kernel returned NaN. The check is a graph op now."""
    def f(x, y):
        return F.binary_cross_entropy(x, y), torch.nn.BCELoss()(x, y)

    compiled = kiln.compile(f, backend=backend)
    x, y = torch.rand(4, requires_grad=True), torch.rand(4)
    got, want = compiled(x, y), f(x, y)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got[0], x)[0], torch.autograd.grad(want[0], x)[0])
    for bad in ([0.5, 1.5, 0.2, 0.1], [0.5, float("nan"), 0.2, 0.1], [-0.1, 0.5, 0.2, 0.1]):
        with pytest.raises(RuntimeError, match="between 0 and 1"):
            f(torch.tensor(bad), y)
        with pytest.raises(RuntimeError, match="between 0 and 1"):
            compiled(torch.tensor(bad), y)
