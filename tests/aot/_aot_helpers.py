"""Compare a kiln AOT-compiled function or module with eager: outputs, gradients of inputs and
parameters (float64), input mutations and module state."""
from __future__ import annotations

import copy

import torch

import kiln
from kiln.testing import assert_same

DT = torch.float64


def rg(*shape):
    return torch.randn(*shape, dtype=DT, requires_grad=True)


def rn(*shape):
    return torch.randn(*shape, dtype=DT)


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def _loss(outs):
    total = 0
    for o in outs:
        if o.requires_grad:
            w = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)
            total = total + (o * w).sum()
    return total


def check_training(fn=None, make_args=None, *, module=None, backend="aot_eager", seed=None, steps=2,
                   rtol=None, atol=None):
    """Run ``steps`` fresh calls (compile on the first) and compare everything with eager.

    ``make_args()`` is called twice per step from the same RNG state: once for kiln, once for
    eager. Gradients are compared for the leaf tensors among the arguments and the module's
    parameters."""
    if module is not None:
        ref_module = copy.deepcopy(module)
        compiled = kiln.compile(module, backend=backend, fullgraph=True)
    else:
        compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    for _ in range(steps):
        rng = torch.get_rng_state()
        args = make_args()
        torch.set_rng_state(rng)
        e_args = make_args()          # the same values, fresh objects (and the same aliasing)
        if seed is not None:
            torch.manual_seed(seed)
        out = compiled(*args)
        if seed is not None:
            torch.manual_seed(seed)
        ref = (ref_module if module is not None else fn)(*e_args)
        assert_same(out, ref, rtol=rtol, atol=atol)
        outs, refs = _tensors(out), _tensors(ref)
        assert [o.requires_grad for o in outs] == [r.requires_grad for r in refs], "requires_grad of outputs"
        leaves = [a for a in _tensors(list(args)) if a.is_leaf and a.requires_grad]
        e_leaves = [a for a in _tensors(list(e_args)) if a.is_leaf and a.requires_grad]
        if module is not None:
            leaves += list(module.parameters())
            e_leaves += list(ref_module.parameters())
        if any(o.requires_grad for o in outs):
            for p in leaves + e_leaves:
                p.grad = None
            _loss(outs).backward()
            _loss(refs).backward()
            for i, (a, b) in enumerate(zip(leaves, e_leaves)):
                assert (a.grad is None) == (b.grad is None), f"grad {i}: {a.grad} vs {b.grad}"
                if b.grad is not None:
                    assert_same(a.grad, b.grad, rtol=rtol, atol=atol, path=f"grad[{i}]")
        assert_same(list(args), list(e_args), rtol=rtol, atol=atol, path="args after call")
        if module is not None:
            sd, esd = module.state_dict(), ref_module.state_dict()
            for k in esd:
                assert_same(sd[k], esd[k], rtol=rtol, atol=atol, path=f"state[{k}]")
    return compiled


class Recorder:
    """fw/bw compilers that record the graphs they get and run them as FX."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append((gm, list(example_inputs)))
        return gm.forward
