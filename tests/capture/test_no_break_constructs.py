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
