"""A module class's own ``__call__`` runs in compiled code as in eager: inlined, its
``super().__call__`` reaching nn.Module's (hooks, forward). Hugging Face's layers checkpoint
themselves in their ``__call__`` in some releases; other classes change their arguments there."""
import functools

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import kiln


class Doubling(nn.Module):
    """Same signature as forward: skipping this __call__ would be a silent wrong answer."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def __call__(self, x):
        return super().__call__(x * 2)

    def forward(self, x):
        return self.lin(x)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def __call__(self, x, scale=1.0):
        return super().__call__(x, scale=scale * 3)

    def forward(self, x, scale):
        return self.lin(x) * scale


class SelfCheckpointing(nn.Module):
    """As transformers' GradientCheckpointingLayer (5.17): the whole call checkpointed."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self._ckpt = functools.partial(checkpoint, use_reentrant=False)

    def __call__(self, *args, **kwargs):
        return self._ckpt(functools.partial(super().__call__, **kwargs), *args)

    def forward(self, x, bias=0.0):
        return torch.tanh(self.lin(x)) * torch.sigmoid(x) + bias


class Stack(nn.Module):
    def __init__(self, cls, n=2):
        super().__init__()
        self.layers = nn.ModuleList(cls() for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum(-1)


class Counting:
    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm


def _check(model, backend="aot_eager"):
    x1 = torch.randn(3, 4, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    ref = model(x1)
    ref.sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    cc = Counting()
    out = kiln.compile(model, backend=cc if backend is None else backend)(x2)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x2.grad, x1.grad)
    for p, g in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, g)
    model.zero_grad()
    return cc


@pytest.mark.parametrize("cls", [Doubling, Scaled, SelfCheckpointing])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_class_own_call_runs_as_in_eager(cls, backend):
    _check(Stack(cls), backend)


@pytest.mark.parametrize("cls", [Doubling, Scaled, SelfCheckpointing])
def test_a_class_own_call_is_one_graph(cls):
    r = kiln.explain(Stack(cls))(torch.randn(3, 4))
    assert (r.graph_count, r.graph_break_count) == (1, 0)


def test_checkpointing_in_call_is_a_recompute_region():
    cc = _check(Stack(SelfCheckpointing, n=3), backend=None)
    assert len(cc.graphs) == 1
    regions = {n.meta.get("ac_graph_id") for n in cc.graphs[0].graph.nodes} - {None}
    assert len(regions) == 3


def test_hooks_still_run_under_a_class_own_call():
    model = Stack(Doubling)
    seen = []
    model.layers[1].register_forward_hook(lambda m, args, out: seen.append(out.shape) or out * 5)
    _check(model)
    assert seen       # (eager's call and the capture's)


def test_changing_the_class_call_recompiles():
    class Local(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def __call__(self, x):
            return super().__call__(x + 1)

        def forward(self, x):
            return self.lin(x)

    model = Stack(Local)
    f = kiln.compile(model, backend="aot_eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(f(x), model(x))
    Local.__call__ = lambda self, x: nn.Module.__call__(self, x - 1)
    torch.testing.assert_close(f(x), model(x))


def test_overriding_call_impl_runs_eagerly_and_right():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def _call_impl(self, *args, **kwargs):
            return super()._call_impl(*args, **kwargs) * 2

        def forward(self, x):
            return self.lin(x)

    _check(Stack(Odd))


class _BreakingDoubling(nn.Module):
    """A class ``__call__`` whose body breaks the graph."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def __call__(self, x):
        print("", end="")       # a graph break inside the call
        return super().__call__(x * 2)

    def forward(self, x):
        return self.lin(x)


class _OwnCallImpl(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def _call_impl(self, *args, **kwargs):
        return self.forward(*args, **kwargs) * 10

    def forward(self, x):
        print("", end="")
        return self.lin(x)


def _instance_forward_module():
    m = nn.Linear(3, 3)
    plain = m.forward

    def wrapped(x):
        print("", end="")       # (accelerate-style wrapper with a break in it)
        return plain(x) - 100
    m.forward = wrapped
    return m


@pytest.mark.parametrize("make", [_BreakingDoubling, _OwnCallImpl, _instance_forward_module,
                                  lambda: torch.compiler.disable(nn.Linear(3, 3))],
                         ids=["class __call__", "_call_impl", "instance forward", "disabled module"])
def test_a_module_called_across_a_graph_break_runs_what_eager_runs(make):
    """The call breaks the graph (inside the module's own code): the code after the break
    calls the module as eager does, not its class's plain forward."""
    torch.manual_seed(0)
    m = make()

    def f(x):
        return m(x + 1) * 2
    x = torch.randn(2, 3)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))
    torch.testing.assert_close(kiln.compile(f, backend="aot_eager")(x), f(x))
