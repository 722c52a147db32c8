"""A compiled graph's output that meets a tensor subclass in eager code gets a subclass as its
gradient: the backward, compiled for plain tensors (whose memory Inductor's code reads
directly: a wrapper subclass has none, and the process crashed), runs as ATen ops for that
call, which dispatch to the subclass as eager's do."""
import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import kiln


def f(a, b):
    return a * 6 + b / 2       # (a TwoTensor: the graph breaks; b / 2 is a graph of its own)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_subclass_gradient_reaches_a_compiled_backward(backend, tmp_path):
    with kiln.config.patch(cache_dir=str(tmp_path)):
        compiled = kiln.compile(f, backend=backend)
        for seed in range(2):
            torch.manual_seed(seed)
            a1, a2, b = (torch.randn(3, 3) for _ in range(3))
            ref_a = TwoTensor(a1.clone().requires_grad_(), a2.clone().requires_grad_())
            got_a = TwoTensor(a1.clone().requires_grad_(), a2.clone().requires_grad_())
            ref_b, got_b = b.clone().requires_grad_(), b.clone().requires_grad_()
            want, got = f(ref_a, ref_b), compiled(got_a, got_b)
            torch.testing.assert_close(got.a, want.a)
            torch.testing.assert_close(got.b, want.b)
            want.sum().backward()
            got.sum().backward()
            assert type(got_b.grad) is type(ref_b.grad)
            torch.testing.assert_close(got_b.grad, ref_b.grad)
            torch.testing.assert_close(got_a.grad.a, ref_a.grad.a)
            # a plain gradient still takes the compiled backward
            c_b = b.clone().requires_grad_()
            compiled(torch.zeros(3, 3), c_b).sum().backward()
            torch.testing.assert_close(c_b.grad, torch.full((3, 3), 0.5))
