"""``@contextlib.contextmanager`` inside compiled code: the generator runs lazily, its code
before the ``yield`` at ``__enter__`` and the rest at ``__exit__``, after the with body, so
effects interleave as in eager and the with body is in the graph. A graph break inside the
with body puts the break at the context manager instead (the suspended generator cannot be
handed to the code after a break)."""
import contextlib

import torch

import kiln
from kiln.testing import CompileCounter

LOG: list = []
STATE = {"depth": 0}


@contextlib.contextmanager
def scaled(k):
    STATE["depth"] += 1
    LOG.append("enter")
    try:
        yield k * 2
    finally:
        STATE["depth"] -= 1
        LOG.append("exit")


@contextlib.contextmanager
def nothing():
    yield


@contextlib.contextmanager
def yields_twice():
    yield 1
    yield 2


def _eager_and_compiled(fn, x, **compile_kwargs):
    cnt = CompileCounter()
    LOG.clear()
    expected = fn(x)
    eager_log = list(LOG)
    LOG.clear()
    got = kiln.compile(fn, backend=cnt, **compile_kwargs)(x)
    torch.testing.assert_close(got, expected)
    assert LOG == eager_log
    return cnt


def test_the_with_body_runs_between_enter_and_exit_in_one_graph():
    def f(x):
        with scaled(3) as s:
            y = x * s + STATE["depth"]
            LOG.append("body")
        return y + STATE["depth"]

    cnt = _eager_and_compiled(f, torch.randn(3), fullgraph=True)
    assert cnt.frame_count == 1 and STATE["depth"] == 0


def test_a_context_manager_as_a_decorator_and_beside_another():
    @nothing()
    def triple(x):
        return x * 3

    def f(x):
        with torch.no_grad(), nothing():
            z = x * 2
        return triple(x) + z

    assert _eager_and_compiled(f, torch.randn(3), fullgraph=True).frame_count == 1


def test_a_generator_that_does_not_stop_raises_eagers_error():
    def f(x):
        with yields_twice():
            x = x + 1
        return x

    for run in (f, kiln.compile(f, backend="eager")):
        try:
            run(torch.randn(2))
        except RuntimeError as e:
            assert "generator didn't stop" in str(e)
        else:
            raise AssertionError("no RuntimeError")


def test_a_break_inside_the_with_body_breaks_at_the_context_manager():
    def f(x):
        x = x.sin()
        with scaled(2) as k:
            x = x * k
            print("a break")
            x = x + 1
        return x.cos() + len(LOG)

    cnt = _eager_and_compiled(f, torch.randn(3))
    assert cnt.frame_count >= 1
