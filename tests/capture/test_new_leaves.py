"""A tensor created inside compiled code that requires grad (a new autograd leaf).

``torch.zeros(3, requires_grad=True)`` inside the function is a leaf of the caller's autograd
graph; an AOT graph is one autograd node and cannot hand out a leaf of its own (its outputs came
out with requires_grad=False). The creation is a graph break, like ``requires_grad_()``.
"""
import copy

import pytest
import torch

import kiln
from kiln.testing import assert_same

SETTINGS = [("eager", None), ("eager", True), ("aot_eager", None), ("aot_eager", True)]


def check(fn, make_args, backend, dynamic):
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic)
    for call in range(2):
        torch.manual_seed(call)
        args = make_args()
        e_args = copy.deepcopy(args)
        torch.manual_seed(10 + call)
        out = compiled(*args)
        torch.manual_seed(10 + call)
        ref = fn(*e_args)
        assert_same(out, ref)
        outs = out if isinstance(out, tuple) else (out,)
        refs = ref if isinstance(ref, tuple) else (ref,)
        assert [o.requires_grad for o in outs] == [r.requires_grad for r in refs]
        assert [o.is_leaf for o in outs] == [r.is_leaf for r in refs]
        sum(o.sum() for o in outs if o.requires_grad).backward()
        sum(r.sum() for r in refs if r.requires_grad).backward()
        for a, e in zip(args, e_args):
            assert_same(a.grad, e.grad) if e.grad is not None else None


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_factories_with_requires_grad(backend, dynamic):
    def f(x):
        z = torch.zeros(3, requires_grad=True)
        w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        e = x.new_ones(3, requires_grad=True)
        return z + x, w * x, e, torch.zeros_like(x, requires_grad=True)

    check(f, lambda: (torch.randn(3),), backend, dynamic)


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_random_leaf_times_an_input_that_requires_grad(backend, dynamic):
    def f(x):
        z = torch.randn(3, requires_grad=True)
        return z * x

    check(f, lambda: (torch.randn(3, requires_grad=True),), backend, dynamic)
