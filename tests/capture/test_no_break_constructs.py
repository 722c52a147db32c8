"""Constructs captured as one graph, without a break (issue 15): environment reads,
itertools/functools, builtins, objects created inside the compiled function.

Each case compiles under ``fullgraph=True`` with a counting backend, runs twice on fresh
random inputs, compares with eager (outputs and input state), and asserts the graph count.
"""
from __future__ import annotations

import copy
import os

import pytest
import torch

import kiln
from kiln.testing import CompileCounter, assert_same


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def check(fn, make_args, graphs=1, calls=2):
    """Compile ``fn`` (fullgraph), call it ``calls`` times on fresh args, compare with eager."""
    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc, fullgraph=True)
    for _ in range(calls):
        args = make_args()
        e_args = copy.deepcopy(args)
        expected = fn(*e_args)
        actual = compiled(*args)
        assert_same(actual, expected)
        assert_same(args, e_args, path="inputs")
    assert cc.frame_count == graphs, f"{cc.frame_count} graphs, expected {graphs}"
    return cc, compiled


def r(*shape):
    return lambda: (torch.randn(*shape),)


# ------------------------------------------------------------------------ os.environ
ENV = "KILN_TEST_NO_BREAK_FLAG"


def env_get(x):
    if os.environ.get(ENV, "0") == "1":
        return x * 2
    return x + 1


def env_getitem(x):
    return x * len(os.environ[ENV])


def env_contains(x):
    return x + 1 if ENV in os.environ else x - 1


def env_not_contains(x):
    return x + 1 if ENV not in os.environ else x - 1


def env_getenv(x):
    v = os.getenv(ENV)
    return x + 1 if v is None else x * int(v)


def env_getenv_default(x):
    return x * int(os.getenv(ENV, default="3"))


def env_get_none_default(x):
    return x + (os.environ.get(ENV) is None)


@pytest.mark.parametrize("fn", [env_get, env_contains, env_not_contains, env_getenv,
                                env_getenv_default, env_get_none_default])
def test_environ_read_guards_on_value(fn, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    cc, compiled = check(fn, r(3))
    monkeypatch.setenv(ENV, "1")          # the guard on the variable fails: one new graph
    x = torch.randn(3)
    assert_same(compiled(x), fn(x))
    assert cc.frame_count == 2
    monkeypatch.setenv(ENV, "2")          # another value: another graph
    assert_same(compiled(x), fn(x))
    assert cc.frame_count == 3
    monkeypatch.delenv(ENV)               # absent again: the first entry still serves
    assert_same(compiled(x), fn(x))
    assert cc.frame_count == 3


def test_environ_getitem_and_missing_key(monkeypatch):
    monkeypatch.setenv(ENV, "abc")
    check(env_getitem, r(3))
    monkeypatch.delenv(ENV)
    compiled = kiln.compile(env_getitem, backend=CompileCounter())
    with pytest.raises(KeyError):         # the same error as eager
        compiled(torch.randn(3))


def test_environ_bound_to_a_global_name(monkeypatch):
    from os import environ

    def fn(x):
        return x * 2 if environ.get(ENV) == "on" else x + 1

    monkeypatch.setenv(ENV, "on")
    cc, compiled = check(fn, r(3))
    monkeypatch.setenv(ENV, "off")
    x = torch.randn(3)
    assert_same(compiled(x), fn(x))
    assert cc.frame_count == 2


def test_environ_write_breaks_and_stays_correct(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)

    def fn(x):
        y = x + 1
        os.environ[ENV] = "7"
        return y * int(os.environ[ENV])

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc)
    x = torch.randn(3)
    assert_same(compiled(x), x.add(1).mul(7))
    assert os.environ[ENV] == "7"
    assert cc.frame_count == 2              # the write runs natively, between two graphs
    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend=CompileCounter(), fullgraph=True)(torch.randn(3))


# ------------------------------------------------------------------ itertools / functools
import functools  # noqa: E402
import itertools  # noqa: E402
import operator  # noqa: E402


def it_chain(x, y):
    return [t * 2 for t in itertools.chain([x], (y, x + y), [])]


def it_chain_from_iterable(x, y):
    out = x
    for t in itertools.chain.from_iterable([[x, y], [y * 3]]):
        out = out + t
    return out


def it_product(x, y):
    return [a * b for a, b in itertools.product([x, y], [1.5, x])]


def it_product_repeat(x, y):
    return sum(a - b for a, b in itertools.product([x, y], repeat=2))


def it_combinations(x, y):
    return [a @ b.T for a, b in itertools.combinations([x, y, x + 1], 2)]


def it_combinations_with_replacement(x, y):
    return len(list(itertools.combinations_with_replacement([x, y], 2))) * x


def it_permutations(x, y):
    return [a - b for a, b in itertools.permutations([x, y, 2 * y], 2)]


def it_permutations_full(x, y):
    return [p[0] * p[1] for p in itertools.permutations([x, y])]


def it_islice(x, y):
    return list(itertools.islice([x, y, x * y, x + y, 0.5 * x], 1, None, 2))


def it_islice_stop(x, y):
    return sum(itertools.islice(iter([x, y, x * y]), 2))


def it_accumulate(x, y):
    return list(itertools.accumulate([x, y, x * y]))


def it_accumulate_func(x, y):
    return list(itertools.accumulate([x, y, y], torch.maximum, initial=torch.zeros_like(x)))


def it_accumulate_ints(x, y):
    offsets = list(itertools.accumulate([1, 2, 3], operator.mul))
    return x * offsets[-1] + y * offsets[0]


def it_zip_longest(x, y):
    return [a + (b if b is not None else 0) for a, b in itertools.zip_longest([x, y, x], [y])]


def it_zip_longest_fill(x, y):
    return [a * b for a, b in itertools.zip_longest([x], [y, x], fillvalue=2.0)]


def it_repeat(x, y):
    return list(itertools.repeat(x + y, 3))


def it_repeat_zip(x, y):
    return [a * b for a, b in zip([x, y], itertools.repeat(2.0))]


def it_count(x, y):
    for i, t in zip(itertools.count(1), [x, y, y]):
        x = x + t * i
    return x


def it_count_for_break(x, y):
    for i in itertools.count(2, 3):
        if i > 10:
            break
        x = x * i
    return x


def it_count_next(x, y):
    c = itertools.count(start=5)
    next(c)
    return x * next(c)


def it_cycle(x, y):
    return [a * b for a, b in zip(range(5), itertools.cycle([x, y]))]


def it_cycle_islice(x, y):
    return [t * 2 for t in itertools.islice(itertools.cycle([x, y, 3.0]), 7)]


def it_reduce(x, y):
    return functools.reduce(lambda a, b: a * b + 1, [x, y, x])


def it_reduce_initial(x, y):
    return functools.reduce(torch.add, [y, y], x)


def it_starmap_pairwise(x, y):
    return list(itertools.starmap(torch.mul, itertools.pairwise([x, y, x + y])))


def it_takewhile_compress(x, y):
    small = list(itertools.takewhile(lambda n: n < 3, [1, 2, 5, 1]))
    return list(itertools.compress([x, y, x - y], [1, 0, 1])), x * len(small)


ITERTOOLS_CASES = [it_chain, it_chain_from_iterable, it_product, it_product_repeat,
                   it_combinations, it_combinations_with_replacement, it_permutations,
                   it_permutations_full, it_islice, it_islice_stop, it_accumulate,
                   it_accumulate_func, it_accumulate_ints, it_zip_longest, it_zip_longest_fill,
                   it_repeat, it_repeat_zip, it_count, it_count_for_break, it_count_next,
                   it_cycle, it_cycle_islice, it_reduce, it_reduce_initial,
                   it_starmap_pairwise, it_takewhile_compress]


@pytest.mark.parametrize("fn", ITERTOOLS_CASES, ids=lambda f: f.__name__)
def test_itertools(fn):
    check(fn, lambda: (torch.randn(3, 3), torch.randn(3, 3)))


def test_itertools_over_symbolic_sizes():
    def fn(x):
        dims = list(itertools.accumulate(x.shape, operator.mul))
        pairs = list(itertools.product(range(2), [x.shape[0]]))
        return x.reshape(dims[-1]) * len(pairs), [d for d in itertools.islice(x.shape, 1, None)]

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc, fullgraph=True, dynamic=True)
    for n in (3, 4, 5):
        x = torch.randn(n, 2)
        assert_same(compiled(x), fn(x))
    assert cc.frame_count == 1


def test_infinite_iterator_across_a_graph_break(capsys):
    def fn(x):
        total = x
        for i in itertools.count(1):
            print("step", i)               # a graph break with count's iterator on the stack
            total = total * i
            if i == 3:
                return total

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc)
    x = torch.randn(3)
    assert_same(compiled(x), fn(x))
    assert capsys.readouterr().out == "step 1\nstep 2\nstep 3\n" * 2


def test_infinite_iterator_consumed_to_the_end_is_unsupported():
    with pytest.raises(kiln.Unsupported):
        kiln.compile(lambda x: list(itertools.count()) and x, backend=CompileCounter(),
                     fullgraph=True)(torch.randn(2))
