"""``torch.func.functional_call`` inside compiled code swaps a module's parameters by writing
its ``_parameters`` dict; reading a parameter afterwards must see the swapped tensor. kiln read
the module's real table (the original parameters: a wrong answer); a read from a module whose
tables the capture changed is now a graph break, and the call runs natively."""
import copy

import pytest
import torch
from torch import nn

import kiln
from kiln.testing import assert_same


@pytest.mark.parametrize("backend,dynamic", [("eager", None), ("aot_eager", None), ("aot_eager", True)])
def test_functional_call_uses_the_given_parameters(backend, dynamic):
    torch.manual_seed(0)
    m = nn.Linear(3, 3)

    def f(x, w):
        return torch.func.functional_call(m, {"weight": w, "bias": m.bias}, (x,)) * 2

    compiled = kiln.compile(f, backend=backend, dynamic=dynamic)
    for _ in range(2):
        x, w = torch.randn(2, 3), torch.randn(3, 3, requires_grad=True)
        ew = w.detach().clone().requires_grad_()
        out, ref = compiled(x, w), f(x, ew)
        assert_same(out, ref)
        out.sum().backward()
        ref.sum().backward()
        assert_same(w.grad, ew.grad)
    assert isinstance(m._parameters["weight"], nn.Parameter)   # restored


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_parameter_table_written_directly(backend):
    torch.manual_seed(0)
    m = nn.Linear(3, 3)
    orig = m.weight

    def f(x, w):
        m._parameters["weight"] = w
        y = m(x)
        m._parameters["weight"] = orig
        return y

    x, w = torch.randn(2, 3), torch.randn(3, 3)
    assert_same(kiln.compile(f, backend=backend)(x, w), f(x, w))
    assert m.weight is orig
