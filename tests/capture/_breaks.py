"""Shared helpers for the graph-break / side-effect / comptime tests.

``check(fn, make_args, frames)`` compiles ``fn`` with a ``CompileCounter`` backend (graph
breaks allowed) and calls it ``calls`` times on FRESH inputs from ``make_args`` (see
``_conformance.A``/``R``). On every call it requires:

* the compiled result equals eager (run on deep copies of the inputs); when eager raises,
  the compiled call raises the same exception type with the same message;
* every argument ends in the state eager leaves its copy in (input-mutation parity: lists,
  dicts, modules, user objects);
* what was printed to stdout (and, with ``compare_err``, stderr) is identical;
* ``frames`` graphs were compiled by the first call (graph before the break + graphs of the
  continuations), and the warm calls compile nothing new.

``make`` is for closures and globals: a zero-argument factory returning ``(fn, get_state)`` or
``(fn, get_state, reset)``; two instances are made (one eager, one compiled) and their
``get_state()`` compared after every call; ``reset()`` (if given) puts an instance back in its
initial state before every call, so that guarded Python values (a counter in a cell) repeat.
"""
from __future__ import annotations

import copy
import os
import sys

import pytest
import torch

import kiln
from kiln.testing import CompileCounter

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from _conformance import A, R, RI, Fresh, assert_same  # noqa: E402,F401


def fixed(value, label=None):
    """A fresh tensor with always the same value (a data-dependent Python value that is the
    same on every call, so the continuation does not respecialize)."""
    return Fresh(lambda: torch.tensor(value), label or f"tensor({value!r})")


def pos(*shape):
    """A fresh positive tensor (so a `> 0` branch always goes the same way)."""
    return Fresh(lambda: torch.rand(*shape) + 0.5, f"pos{shape}")


def neg(*shape):
    return Fresh(lambda: -torch.rand(*shape) - 0.5, f"neg{shape}")


def _call(fn, args, kwargs):
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001 - compared with eager
        return None, e


def check(fn=None, make_args=None, frames=None, *, calls=3, capsys=None, make=None,
          compare_err=False, rtol=1e-5, atol=1e-6, expect_raise=None):
    """See the module docstring. Returns (compiled function, counter)."""
    make_args = make_args or A()
    resets = []
    if make is not None:
        eager_fn, eager_state, *r1 = make()
        comp_fn, comp_state, *r2 = make()
        resets = r1 + r2
    else:
        eager_fn, comp_fn = fn, fn
        eager_state = comp_state = None
    torch.manual_seed(0)
    kiln.reset()
    cnt = CompileCounter()
    cf = kiln.compile(comp_fn, backend=cnt)
    after_first = None
    for i in range(calls):
        for reset in resets:
            reset()
        args, kwargs = make_args()
        eargs, ekwargs = copy.deepcopy((args, kwargs))
        if capsys is not None:
            capsys.readouterr()
        expected, e_exc = _call(eager_fn, eargs, ekwargs)
        if capsys is not None:
            e_out = capsys.readouterr()
        got, g_exc = _call(cf, args, kwargs)
        if capsys is not None:
            g_out = capsys.readouterr()
            assert g_out.out == e_out.out, f"call{i}: stdout differs:\n{g_out.out!r}\n!=\n{e_out.out!r}"
            if compare_err:
                assert g_out.err == e_out.err, f"call{i}: stderr differs:\n{g_out.err!r}\n!=\n{e_out.err!r}"
        if expect_raise is not None:
            assert isinstance(e_exc, expect_raise), f"the case should raise {expect_raise} in eager: {e_exc!r}"
        if e_exc is not None:
            assert g_exc is not None, f"call{i}: eager raised {e_exc!r}, compiled returned {got!r}"
            assert type(g_exc) is type(e_exc) and str(g_exc) == str(e_exc), (
                f"call{i}: compiled raised {g_exc!r}, eager {e_exc!r}")
        else:
            if g_exc is not None:
                raise AssertionError(f"call{i}: compiled raised, eager returned {expected!r}") from g_exc
            assert_same(got, expected, rtol, atol, path=f"call{i}:out")
        assert_same(args, eargs, rtol, atol, path=f"call{i}:args")
        assert_same(kwargs, ekwargs, rtol, atol, path=f"call{i}:kwargs")
        if make is not None:
            assert_same(comp_state(), eager_state(), rtol, atol, path=f"call{i}:state")
        if i == 0:
            after_first = cnt.frame_count
            if frames is not None:   # None: only check that warm calls compile nothing
                assert after_first == frames, f"expected {frames} graph(s) on the first call, got {after_first}"
        else:
            assert cnt.frame_count == after_first, (
                f"call{i} (warm, same shapes) compiled {cnt.frame_count - after_first} new graph(s)")
    return cf, cnt


def case(fn, make_args, frames, id=None, marks=(), **opts):
    return pytest.param(fn, make_args, frames, opts, id=id or fn.__name__, marks=marks)


def ids_unique(cases):
    seen = {}
    for p in cases:
        seen[p.id] = seen.get(p.id, 0) + 1
    dup = [k for k, v in seen.items() if v > 1]
    assert not dup, f"duplicate case ids: {dup}"
    return cases


def all_breaks(cf):
    """Every Unsupported a graph break of ``cf`` or of its continuations recorded (depth first)."""
    out = []
    seen = set()

    def walk(c):
        for e in c.entries:
            if id(e) in seen:
                continue
            seen.add(id(e))
            if e.graph_break is not None:
                out.append(e.graph_break)
            for r in e.resumes:
                walk(r)

    walk(cf)
    return out


# Cases with `assert` statements live here: pytest rewrites the asserts of test modules into
# locals named "@py_assert<N>", which would change the code under test.
def assert_on_tensor(x):
    y = x * 2
    assert (y > 0).all(), "must be positive"
    return y + 1


def assert_fails_on_tensor(x):
    y = x * 2
    assert (y > 100).all(), "must be large"
    return y + 1
