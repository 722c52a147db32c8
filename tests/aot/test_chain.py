"""A differentiable output that feeds another is on the other's autograd path, as in eager
(kiln/aot/chain.py): grad() with respect to it, retain_grad() and its hooks see the gradient
that flows from the later output (fuzz seed 3418)."""
import pytest
import torch

import kiln
from kiln.aot.chain import cut_position

BACKENDS = ["aot_eager", "inductor"]


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    """The chain itself must compile: a graph run as captured would hide a failure here."""
    import kiln.aot.dynamic as D

    def refuse(gm, error):
        raise AssertionError(f"the graph ran as captured: {type(error).__name__}: {error}")
    monkeypatch.setattr(D, "as_captured", refuse)


def _grad_wrt_output(x, w):
    y = torch.log_softmax(x @ w, -1)
    loss = (y * y).sum()
    g, = torch.autograd.grad(loss, [y], retain_graph=True)    # a graph break
    return g * 2, loss


def _two_outputs(x, w):
    logits = torch.tanh(x @ w)
    loss = (logits ** 2).mean()
    return logits, loss


def _three_levels(x, w, buf):
    a = (x @ w).sigmoid()
    b = a * 3 + 1
    buf.add_(1)                          # an input mutation after the first cut
    c = (b * b).sum() + buf.sum()
    return a, b, c


def _inputs():
    return torch.randn(4, 6), torch.randn(6, 5, requires_grad=True)


def _clone(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) for a in args]


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_with_respect_to_an_output_that_feeds_another(backend):
    args = _inputs()
    ref = _clone(args)
    got = kiln.compile(_grad_wrt_output, backend=backend)(*args)
    want = _grad_wrt_output(*ref)
    torch.testing.assert_close(got[0], want[0])
    got[1].backward()
    want[1].backward()
    torch.testing.assert_close(args[1].grad, ref[1].grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_retain_grad_and_hooks_on_an_output_see_the_later_outputs_gradient(backend):
    args = _inputs()
    ref = _clone(args)
    cf = kiln.compile(_two_outputs, backend=backend)
    for _ in range(2):                   # the compile, then the entry
        logits, loss = cf(*args)
        r_logits, r_loss = _two_outputs(*ref)
        seen = []
        logits.register_hook(lambda g: seen.append(g))
        logits.retain_grad()
        r_logits.retain_grad()
        loss.backward()
        r_loss.backward()
        assert logits.grad is not None and len(seen) == 1
        torch.testing.assert_close(logits.grad, r_logits.grad)
        torch.testing.assert_close(seen[0], r_logits.grad)
        torch.testing.assert_close(args[1].grad, ref[1].grad)


def test_chain_of_three_with_a_mutation_between_matches_eager():
    x, w = _inputs()
    buf = torch.zeros(3)
    rx, rw, rbuf = x.clone(), w.detach().clone().requires_grad_(), buf.clone()
    cf = kiln.compile(_three_levels, backend="aot_eager")
    a, b, c = cf(x, w, buf)
    ra, rb, rc = _three_levels(rx, rw, rbuf)
    torch.testing.assert_close(buf, rbuf)
    for t, r in ((a, ra), (b, rb), (c, rc)):
        torch.testing.assert_close(t, r)
    ga, gb = torch.autograd.grad(c, [a, b], retain_graph=True)
    rga, rgb = torch.autograd.grad(rc, [ra, rb], retain_graph=True)
    torch.testing.assert_close(ga, rga)
    torch.testing.assert_close(gb, rgb)
    c.backward()
    rc.backward()
    torch.testing.assert_close(w.grad, rw.grad)


def test_graph_count_is_unchanged_and_inference_is_not_split():
    from kiln.testing import CompileCounter

    seen = []

    def spy(gm, example_inputs):
        seen.append(cut_position(gm, list(example_inputs)))
        return gm.forward
    counter = CompileCounter()
    kiln.compile(_two_outputs, backend=counter)(*_inputs())
    assert counter.frame_count == 1
    kiln.compile(_two_outputs, backend=spy)(*_inputs())
    with torch.no_grad():
        kiln.compile(_two_outputs, backend=spy)(*_inputs())
    assert seen[0] is not None and seen[1] is None      # nothing to split without gradients


def test_each_part_has_its_own_cache_entry():
    kiln.cache.reset_stats()
    kiln.compile(_two_outputs, backend="aot_eager")(*_inputs())
    assert kiln.cache.stats()["misses"] == 2
    kiln.reset()
    args = _inputs()
    ref = _clone(args)
    logits, loss = kiln.compile(_two_outputs, backend="aot_eager")(*args)
    assert kiln.cache.stats()["hits"] == 2
    r_logits, r_loss = _two_outputs(*ref)
    logits.retain_grad()
    r_logits.retain_grad()
    loss.backward()
    r_loss.backward()
    torch.testing.assert_close(logits.grad, r_logits.grad)


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_dynamic_graph_chain_matches_eager_for_each_size(backend):
    cf = kiln.compile(_two_outputs, backend=backend, dynamic=True)
    for n in (4, 7, 4, 9):
        args = (torch.randn(n, 6), torch.randn(6, 5, requires_grad=True))
        ref = _clone(args)
        logits, loss = cf(*args)
        r_logits, r_loss = _two_outputs(*ref)
        logits.retain_grad()
        r_logits.retain_grad()
        loss.backward()
        r_loss.backward()
        torch.testing.assert_close(logits.grad, r_logits.grad)
        torch.testing.assert_close(args[1].grad, ref[1].grad)
