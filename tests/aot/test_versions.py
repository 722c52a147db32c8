"""The version checks of saved values: what they keep alive."""
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
