"""Custom operators (``torch.library.custom_op``, ``torch.library.Library`` definitions) in a
compiled function: one op node each, its fake implementation for the capture, its autograd
formula for training, and a write into an argument that its schema declares (``Tensor(a!)``,
``mutates_args=``) made as eager makes it, even when the op returns nothing."""
import pytest
import torch

import kiln
from kiln.testing import CompileCounter


@torch.library.custom_op("kiln_tests::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x.sin() * scale


@scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _scaled_sin_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * x.cos() * ctx.scale, None


def _scaled_sin_setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = scale


scaled_sin.register_autograd(_scaled_sin_backward, setup_context=_scaled_sin_setup)


@torch.library.custom_op("kiln_tests::fill_cos", mutates_args={"out"})
def fill_cos(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x.cos())


_LIB = torch.library.Library("kiln_tests", "FRAGMENT")
_LIB.define("add_into(Tensor x, Tensor(a!) acc) -> ()")


def _add_into(x, acc):
    acc.add_(x)


_LIB.impl("add_into", _add_into, "CompositeExplicitAutograd")
_LIB.impl("add_into", lambda x, acc: None, "Meta")

BACKENDS = ["eager", "aot_eager"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_functional_custom_op_trains(backend):
    def f(x):
        return scaled_sin(x * 2, 3.0).sum()

    cnt = CompileCounter()
    compiled = kiln.compile(f, backend=backend if backend != "eager" else cnt)
    x = torch.randn(5, requires_grad=True)
    want = f(x)
    want.backward()
    grad, x.grad = x.grad, None
    got = compiled(x)
    got.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, grad)
    if backend == "eager":
        assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["custom_op", "library"])
def test_a_custom_op_that_writes_an_argument_and_returns_nothing(backend, op):
    def f(x, out):
        if op == "custom_op":
            fill_cos(x, out)
        else:
            torch.ops.kiln_tests.add_into(x, out)
        return out + 1

    x = torch.randn(4)
    want_out, got_out = torch.ones(4), torch.ones(4)
    want = f(x, want_out)
    got = kiln.compile(f, backend=backend)(x, got_out)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_out, want_out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_unbound_setitem_writes(backend):
    """``torch.Tensor.__setitem__(x, i, v)`` (how operator-style code calls it) is ``x[i] = v``."""
    def f(x):
        torch.Tensor.__setitem__(x, 0, 7.0)
        return x + 1

    want_x, got_x = torch.zeros(3), torch.zeros(3)
    want = f(want_x)
    got = kiln.compile(f, backend=backend)(got_x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_x, want_x)
