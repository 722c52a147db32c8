"""A graph break inside a loop: every iteration that breaks resumes in a continuation of the
last one. The loop's iterator is handed over in constant size (a range as the range of what is
left), and after ``resume.LOOP_LEVELS`` nested continuations the rest of the loop runs
natively: a long loop neither captures once per iteration nor nests the stack without bound,
and returns what eager returns."""
from __future__ import annotations

import sys

import torch

import kiln
from kiln.capture import resume
from kiln.testing import CompileCounter, assert_same


def _untraceable():
    sys.intern("kiln")          # (not traceable: a graph break)


def _stack_depth():
    f, n = sys._getframe(), 0
    while f is not None:
        f, n = f.f_back, n + 1
    return n


class _Box:
    pass


def _tagged(b, i):
    b.fn = lambda: i
    b.fn.tag = i                # (an attribute set on a function: a graph break)
    b.depth = _stack_depth()


def _loop_with_a_break(x, n):
    b = _Box()
    total = 0
    deepest = 0
    for i in range(n):
        x = x * 1.0001 + 1
        _tagged(b, i)
        total += b.fn.tag
        deepest = max(deepest, b.depth)
    return x, total, deepest


def test_a_long_loop_with_a_break_per_iteration_stops_nesting():
    n = 400
    cnt = CompileCounter()
    cf = kiln.compile(_loop_with_a_break, backend=cnt)
    x = torch.randn(3)
    got, expected = cf(x, n), _loop_with_a_break(x, n)
    assert_same(got[:2], expected[:2])
    # one continuation per iteration up to the cap, then the rest of the loop natively
    assert resume.LOOP_LEVELS <= cnt.frame_count <= resume.LOOP_LEVELS + 4
    assert got[2] < expected[2] + 8 * resume.LOOP_LEVELS


def test_a_short_loop_with_a_break_is_compiled_every_iteration():
    cnt = CompileCounter()
    cf = kiln.compile(_loop_with_a_break, backend=cnt)
    x = torch.randn(3)
    assert_same(cf(x, 5)[:2], _loop_with_a_break(x, 5)[:2])
    assert cnt.frame_count == 5         # (the frame, then a continuation per later iteration)


def _range_left(x, n):
    it = iter(range(3, n, 2))
    first = next(it)
    x = x + first
    _untraceable()
    return x, type(it).__name__, list(it)


def test_a_range_iterator_is_handed_over_as_a_range():
    """The continuation gets ``range(5, n, 2)``, not a tuple of every number left: what the
    entry hands over and guards does not grow with the loop."""
    cf = kiln.compile(_range_left)
    x = torch.randn(2)
    for n in (10, 100_000):
        assert_same(cf(x, n), _range_left(x, n))


def _loop_over_a_long_range(x, n):
    for i in range(n):
        if i == 1:
            _untraceable()
        x = x + 1 if i < 3 else x
    return x


def test_a_break_in_a_loop_over_a_long_range_costs_no_more_than_a_short_one():
    cnt = CompileCounter()
    cf = kiln.compile(_loop_over_a_long_range, backend=cnt)
    x = torch.randn(2)
    assert_same(cf(x, 2000), _loop_over_a_long_range(x, 2000))
    assert cnt.frame_count == 2


def _loop_over_long_items(x, items):
    total = 0
    for a, b in items:
        x = x * 1.0001 + b
        _untraceable()
        total += a
    return x, total


def test_a_break_in_every_iteration_of_a_long_list_runs_the_rest_natively():
    """Over a list (not a range) the continuation is handed the items left, guarded one by
    one: with more than ``resume.LONG_LOOP_ITEMS`` of them, the loop's second iteration goes
    on natively instead of nesting a continuation per iteration (O(n) each)."""
    items = [(i, i % 2) for i in range(2 * resume.LONG_LOOP_ITEMS)]
    cnt = CompileCounter()
    cf = kiln.compile(_loop_over_long_items, backend=cnt)
    x = torch.randn(3)
    assert_same(cf(x, items), _loop_over_long_items(x, items))
    assert cnt.frame_count <= 3
    short = items[:8]
    cnt2 = CompileCounter()
    assert_same(kiln.compile(_loop_over_long_items, backend=cnt2)(x, short), _loop_over_long_items(x, short))
    assert cnt2.frame_count >= len(short)      # a short loop: compiled iteration by iteration


def test_a_break_with_too_many_items_left_runs_the_frame_natively():
    """More than ``resume.HANDED_ITEMS_LIMIT`` items left at the first break: handing them over
    would generate and guard an expression per item, so the frame runs natively."""
    items = [(i, 1) for i in range(resume.HANDED_ITEMS_LIMIT + 10)]
    cnt = CompileCounter()
    cf = kiln.compile(_loop_over_long_items, backend=cnt)
    x = torch.randn(3)
    assert_same(cf(x, items), _loop_over_long_items(x, items))
    assert cnt.frame_count == 0 and all(e.is_eager for e in cf.entries)
