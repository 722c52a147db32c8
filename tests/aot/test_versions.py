"""The version checks of saved values: what they keep alive."""
import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

import kiln


def test_a_watched_saved_output_is_freed_by_the_backward():
    """An output saved for one other output's gradient only is watched (its in-place change
    is allowed while backward() does not go through that output). After the backward, the
    watch holds nothing: the output's memory goes with the user's reference, while the graph
    (``loss``) is still alive."""
    def f(x):
        a = x.sin()
        return a, a * a

    compiled = kiln.compile(f, backend="aot_eager")
    x = torch.randn(64, requires_grad=True)
    a, b = compiled(x)
    loss = a.sum() + b.sum()
    gone = StorageWeakRef(a.untyped_storage())
    loss.backward()
    torch.testing.assert_close(x.grad, x.cos() + 2 * x.sin() * x.cos())
    del a, b
    assert gone.expired()
    assert loss.grad_fn is not None


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_backward_through_one_output_frees_what_only_it_read(backend, dynamic):
    """Eager frees each node's saved tensors when backward() goes through it: after a
    backward through ``a``, what only ``a``'s gradient read is gone while the outputs live,
    and a backward through ``b`` later still gives eager's gradients. (Symbolic shapes keep
    everything: a later partial backward may read a size from any saved tensor.)"""
    torch.manual_seed(0)
    w1 = torch.randn(32, requires_grad=True)
    w2 = torch.randn(32, 32, requires_grad=True)

    def f(x):
        h = x * 2 + w1
        return torch.tanh(h @ w2).sum(), h.cos()

    compiled = kiln.compile(f, backend=backend, dynamic=dynamic)
    for n in (16, 24):
        x = torch.randn(n, 32)
        got = []
        for fn in (f, compiled):
            w1.grad = w2.grad = None
            a, b = fn(x)
            watched = [StorageWeakRef(t.untyped_storage()) for t in getattr(a.grad_fn, "saved_tensors", ())
                       if t is not None and t.untyped_storage().data_ptr() not in
                       {x.untyped_storage().data_ptr(), w1.untyped_storage().data_ptr(), w2.untyped_storage().data_ptr()}]
            a.backward()
            if fn is compiled:
                # h (for b's cos) stays; tanh's output (for a's gradient only) goes
                assert len(watched) == 2 and sum(not s.expired() for s in watched) == (2 if dynamic else 1)
            b.sum().backward()
            got.append((a.detach(), b.detach(), w1.grad.clone(), w2.grad.clone()))
        for want, have in zip(*got):
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_second_backward_raises_where_eager_saved_a_wrapped_scalar(backend):
    """``x * 0.5`` saves its wrapped scalar (the saved-tensor hooks never see it): eager's second
    backward() through it raises, and so does the compiled graph's, though its backward reads
    nothing (fuzz seed 74230)."""
    def f(x):
        return x * 0.5

    x = torch.randn(3, requires_grad=True)
    y = kiln.compile(f, backend=backend)(x)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 0.5))
