"""Two constructs of training code captured without a break: reading an input's ``.grad``
(gradient clipping, a grad-norm log, an optimizer's step), and
``torch.autograd.profiler.record_function`` ranges (every ``optimizer.step()`` runs inside
one; model code marks its blocks with them). Compared with eager on fresh inputs, with the
graph counts asserted."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.testing import CompileCounter, assert_same


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _params(seed, n=3, with_grads=True):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(4, 3, generator=g)) for _ in range(n)]
    if with_grads:
        for p in ps:
            p.grad = torch.randn(4, 3, generator=g)
    return ps


def clip_by_norm(params, max_norm: float):
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.stack([g.norm() for g in grads]).norm()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale)
    return total


def test_clipping_gradients_reads_and_writes_them_in_one_graph():
    cc = CompileCounter()
    compiled = kiln.compile(clip_by_norm, backend=cc, fullgraph=True)
    for seed in (0, 1):
        mine, ref = _params(seed), _params(seed)
        assert_same(compiled(mine, 0.5), clip_by_norm(ref, 0.5))
        for p, q in zip(mine, ref):
            assert_same(p.grad, q.grad)
    assert cc.frame_count == 1


def test_a_gradient_that_is_none_is_guarded():
    cc = CompileCounter()
    compiled = kiln.compile(clip_by_norm, backend=cc)
    mine, ref = _params(2), _params(2)
    mine[1].grad = ref[1].grad = None
    assert_same(compiled(mine, 0.5), clip_by_norm(ref, 0.5))
    assert mine[1].grad is None
    # the same parameters after a backward gave the middle one a gradient: compiled again
    mine[1].grad, ref[1].grad = torch.ones(4, 3), torch.ones(4, 3)
    assert_same(compiled(mine, 0.5), clip_by_norm(ref, 0.5))
    assert_same(mine[1].grad, ref[1].grad)
    assert cc.frame_count == 2


def test_the_gradient_of_a_value_made_inside_still_breaks():
    def f(x):
        y = x * 2
        return y.grad is None, x + 1

    cc = CompileCounter()
    compiled = kiln.compile(f, backend=cc)
    x = torch.randn(3)
    assert_same(compiled(x), f(x))


def blocks_in_ranges(x, w):
    with torch.autograd.profiler.record_function("attention"):
        h = (x @ w).softmax(-1)
    with torch.autograd.profiler.record_function("mlp") as rf:
        out = torch.relu(h @ w.t())
    return out, rf.name


def test_profiler_ranges_are_one_graph():
    cc = CompileCounter()
    compiled = kiln.compile(blocks_in_ranges, backend=cc, fullgraph=True)
    x, w = torch.randn(2, 4), torch.randn(4, 4)
    assert_same(compiled(x, w), blocks_in_ranges(x, w))
    assert cc.frame_count == 1


def range_around_a_break(x):
    with torch.autograd.profiler.record_function("logged"):
        y = x.sin()
        print("inside the range")
        z = y.cos()
    return z + 1


def test_a_range_open_at_a_graph_break_is_in_the_trace_after_it():
    cc = CompileCounter()
    compiled = kiln.compile(range_around_a_break, backend=cc)
    x = torch.randn(3)
    with torch.profiler.profile() as prof:
        got = compiled(x)
    assert_same(got, range_around_a_break(x))
    # before the break; after it, up to the range's end, whose real __exit__ (a torch op
    # behind DisableTorchFunctionSubclass) runs natively; after the range
    assert cc.frame_count == 3
    assert "logged" in {e.name for e in prof.events()}      # re-entered for the code after the break


def test_a_compiled_optimizer_step_gives_eagers_parameters():
    def train(opt_cls, compile_step):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        opt = opt_cls(model.parameters(), lr=0.01)
        step = kiln.compile(opt.step) if compile_step else opt.step
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward()
            step()
            opt.zero_grad()
        return [p.detach() for p in model.parameters()]

    for opt_cls in (torch.optim.AdamW, torch.optim.SGD):
        kiln.reset()
        for a, b in zip(train(opt_cls, True), train(opt_cls, False)):
            torch.testing.assert_close(a, b)
