"""The step counter of CUDA graphs (kiln/cudagraphs/steps.py) on CPU: which calls are steps.
Only functions compiled with CUDA graphs count them; a step is one call from Python with all
it runs (continuations after graph breaks, compiled callees); a backward stays in the step
of its forward's call; each thread has its own."""
from __future__ import annotations

import threading

import torch

import kiln
from kiln.cudagraphs.steps import state


def broken(x):
    y = x.sin() * 2
    print("a graph break")      # a continuation runs the rest
    return y.cos() + 1


def plain(x):
    return x * 3


def test_only_functions_with_cuda_graphs_count_steps():
    default = kiln.compile(plain, backend="aot_eager")
    reduce_overhead = kiln.compile(plain, backend="aot_eager", mode="reduce-overhead")
    x = torch.randn(4)
    before = state.count
    for _ in range(3):
        torch.testing.assert_close(default(x), plain(x))
    assert state.count == before
    for n in range(1, 4):
        torch.testing.assert_close(reduce_overhead(x), plain(x))
        assert state.count == before + n


def test_a_call_with_graph_breaks_is_one_step(capsys):
    cf = kiln.compile(broken, backend="aot_eager", mode="reduce-overhead")
    x = torch.randn(4)
    for n in range(1, 4):
        before = state.count
        torch.testing.assert_close(cf(x), broken(x))
        assert state.count == before + 1, n
    assert len(cf.entries) == 1 and cf.entries[0].graph_break is not None


def test_a_compiled_callee_runs_in_its_callers_step(capsys):
    inner = kiln.compile(broken, backend="aot_eager", mode="reduce-overhead")

    def outer(x):
        print("a graph break before the callee")
        return inner(x) + 1

    cf = kiln.compile(outer, backend="aot_eager", mode="reduce-overhead")
    x = torch.randn(4)
    for _ in range(3):
        before = state.count
        torch.testing.assert_close(cf(x), broken(x) + 1)
        assert state.count == before + 1


def test_two_functions_called_alternately_each_call_a_step():
    f = kiln.compile(plain, backend="aot_eager", mode="reduce-overhead")
    g = kiln.compile(broken, backend="aot_eager", mode="reduce-overhead")
    x = torch.randn(4)
    before = state.count
    for n in range(3):
        f(x)
        g(x)
    assert state.count == before + 6


def test_the_backward_stays_in_its_forwards_step():
    cf = kiln.compile(plain, backend="aot_eager", mode="reduce-overhead")
    x = torch.randn(4, requires_grad=True)
    for _ in range(2):
        y = cf(x)
        step = state.count
        y.sum().backward()
        assert state.count == step
    torch.testing.assert_close(x.grad, torch.full((4,), 6.0))


def test_config_cudagraphs_counts_from_the_first_call_compiled_with_it():
    cf = kiln.compile(plain, backend="aot_eager")       # (cudagraphs off when compiled)
    x = torch.randn(4)
    with kiln.config.patch(cudagraphs=True):
        before = state.count
        torch.testing.assert_close(cf(x), plain(x))      # the capture's call is a step too
        assert state.count == before + 1
        cf(x)
        assert state.count == before + 2


def test_a_step_in_another_thread_does_not_hold_this_threads_steps():
    entered, release = threading.Event(), threading.Event()

    def waits(x):
        y = x + 1
        entered.set()
        release.wait(10)        # (a graph break: runs natively, inside the step)
        return y

    blocked = kiln.compile(waits, backend="aot_eager", mode="reduce-overhead")
    cf = kiln.compile(plain, backend="aot_eager", mode="reduce-overhead")
    x = torch.randn(4)
    t = threading.Thread(target=blocked, args=(x,))
    t.start()
    try:
        assert entered.wait(60)
        before = state.count
        cf(x)
        assert state.count == before + 1
    finally:
        release.set()
        t.join()


def test_reset_starts_the_count_again():
    cf = kiln.compile(plain, backend="aot_eager", mode="reduce-overhead")
    cf(torch.randn(4))
    assert state.count > 0
    kiln.reset()
    assert state.count == 0 and state.warming == -1
