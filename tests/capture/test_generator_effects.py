"""Generators are materialized where they are created (run to their end, their items
listed). That is only what eager does when nothing can tell the difference:

* ``@contextlib.contextmanager``: the with body runs between the enter and exit parts of the
  generator; the context manager is a graph break (it ran both parts before the body, and a
  break inside the body rebuilt it around an empty iterator, raising AttributeError);
* a generator with side effects (they would all happen before the consumer reads the first
  item, and past the last item it reads): a graph break;
* a consumer with an effect the generator can see before it has read every item (the items
  were computed before it): a graph break at the next read.
"""
import contextlib
import copy

import pytest
import torch

import kiln
from kiln.testing import assert_same

SETTINGS = [("eager", None), ("aot_eager", None), ("aot_eager", True)]


def check(make_fn, make_args, backend, dynamic, calls=3):
    """``make_fn()`` returns a function with state of its own: eager and kiln get one each."""
    fe, fk = make_fn(), make_fn()
    compiled = kiln.compile(fk, backend=backend, dynamic=dynamic)
    for call in range(calls):
        torch.manual_seed(call)
        args = make_args()
        e_args = copy.deepcopy(args)
        assert_same(compiled(*args), fe(*e_args))
        assert_same(list(args), list(e_args), path="args after the call")


def cm_reading_its_state():
    stack = []

    @contextlib.contextmanager
    def pushed(v):
        stack.append(v)
        try:
            yield v * 2
        finally:
            stack.pop()

    def f(x):
        with pushed(x) as z:
            y = stack[-1] * 2 + z
        return y, len(stack)
    return f


def cm_with_a_break_inside():
    state = {"scale": 1.0}

    @contextlib.contextmanager
    def scaled(k):
        old, state["scale"] = state["scale"], k
        try:
            yield
        finally:
            state["scale"] = old

    def f(x):
        with scaled(3.0):
            print("inside")               # a graph break inside the with body
            y = x * state["scale"]
        return y, state["scale"]
    return f


def cm_setting_grad_mode():
    @contextlib.contextmanager
    def no_grad():
        prev = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            yield
        finally:
            torch.set_grad_enabled(prev)

    def f(x):
        with no_grad():
            y = x * 2
        return y, x * 3
    return f


def generator_with_effects():
    state = {"n": 0}

    def gen(x):
        for _ in range(3):
            state["n"] += 1
            yield x * state["n"]

    def f(x):
        out = [v + state["n"] for v in gen(x)]
        return out, state["n"]
    return f


def generator_partly_consumed():
    log = []

    def gen(x):
        log.append("first")
        yield x
        log.append("second")
        yield x * 2

    def f(x):
        return next(gen(x)), list(log)
    return f


def generator_reading_what_the_consumer_changes():
    state = {"k": 1}

    def gen(x):
        for _ in range(3):
            yield x * state["k"]

    def f(x):
        out = []
        for v in gen(x):
            state["k"] += 1
            out.append(v)
        return out
    return f


def generator_reading_a_tensor_the_consumer_mutates():
    def gen(x):
        for i in range(3):
            yield x * i

    def f(x):
        out = []
        for v in gen(x):
            x.add_(1)
            out.append(v)
        return out
    return f


def pure_generator():
    def pairs(xs):
        for a, b in zip(xs, xs[1:]):
            yield a * b

    def f(x):
        return sum(pairs([x, x + 1, x + 2]))
    return f


CASES = [cm_reading_its_state, cm_with_a_break_inside, cm_setting_grad_mode, generator_with_effects,
         generator_partly_consumed, generator_reading_what_the_consumer_changes,
         generator_reading_a_tensor_the_consumer_mutates, pure_generator]


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_generator_effects_match_eager(case, backend, dynamic):
    check(case, lambda: (torch.randn(3, requires_grad=case is cm_setting_grad_mode),), backend, dynamic)


def test_pure_generator_stays_in_one_graph():
    counter = kiln.testing.CompileCounter()
    f = kiln.compile(pure_generator(), backend=counter, fullgraph=True)
    x = torch.randn(3)
    assert_same(f(x), pure_generator()(x))
    assert counter.frame_count == 1
