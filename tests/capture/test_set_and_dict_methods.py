"""Sets and dicts made or changed in compiled code behave as eager's: a set iterates and pops
in eager's hash order and keeps the first of equal members; ``set.pop``, ``dict.popitem``
(``OrderedDict``'s ``last=False`` too), ``list.index``/``tuple.index`` with bounds, the type of
``|`` and ``copy()``, and eager's TypeError for methods called with the wrong arguments."""
from __future__ import annotations

import collections
import os
import sys

import pytest
import torch

import kiln
from kiln.testing import CompileCounter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _conformance import same_as_eager_in_one_graph  # noqa: E402


def _raises_as_eager(setup: str, call: str, state: str) -> None:
    """``call`` after ``setup`` raises in eager; compiled, it raises the same exception type in
    the captured code (one graph) and leaves ``state`` as eager leaves it."""
    src = f"""
def f(x):
    {setup}
    try:
        {call}
    except (TypeError, ValueError, IndexError, KeyError) as e:
        return x + 1, type(e).__name__, {state}
    return x, None, {state}
"""
    scope = {}
    exec(compile(src, "<test>", "exec"), scope)
    f = scope["f"]
    expected = f(torch.ones(1))
    assert expected[1] is not None
    counter = CompileCounter()
    got = kiln.compile(f, backend=counter)(torch.ones(1))
    assert repr(got[1:]) == repr(expected[1:])
    assert counter.frame_count == 1


def test_a_set_iterates_in_eagers_hash_order():
    def f(x):
        s = set()
        for v in (3, 1, 2, 9, 17, 33):
            s.add(v)
        s.discard(1)
        s.add(25)
        words = {"delta", "alpha", "echo", "charlie", "bravo"}
        comp = {v * 8 for v in (5, 3, 1)}
        return x + 1, list(s), tuple(s), [w for w in words], list(comp), list(s | {40, 8}), list(s & {17, 33, 3})
    same_as_eager_in_one_graph(f, torch.ones(1))


def test_set_pop_and_copy():
    def f(x):
        s = {x.shape[0] * 10, 1, (1,), "a"}
        popped = [s.pop(), s.pop()]
        t = s.copy()
        t.add(99)
        return x * len(s), popped, sorted(map(repr, s)), sorted(map(repr, t))
    same_as_eager_in_one_graph(f, torch.ones(2))


def test_set_of_tensors_pops_a_member():
    def f(x, y):
        s = {x, y}
        a = s.pop()
        return a + 1, len(s), a is x or a is y
    x, y = torch.randn(2), torch.randn(2)
    got = kiln.compile(f, backend="eager")(x, y)
    assert got[1] == 1 and got[2] is True


def test_the_first_of_equal_members_is_kept():
    def f(x):
        a = {1, 1.0, True}
        b = {1.0, 1}
        c = {2}
        c.update([2.0, 3])
        d = {1.0} | {1}
        return x + 1, [type(v).__name__ for v in a], [type(v).__name__ for v in b], \
            sorted(type(v).__name__ for v in c), [type(v).__name__ for v in d], [7 // v for v in b]
    same_as_eager_in_one_graph(f, torch.ones(1))


def test_set_methods_refuse_wrong_arguments():
    def f(x, which):
        s = {1, 2}
        try:
            if which == 0:
                s.add(1, 2)
            elif which == 1:
                s.pop(1)
            else:
                set().pop()
        except (TypeError, KeyError) as e:
            return x + 1, type(e).__name__
        return x, None
    g = kiln.compile(f, backend="eager")
    for which in range(3):
        assert repr(g(torch.ones(1), which)) == repr(f(torch.ones(1), which))


def test_dict_popitem_returns_the_key_object():
    def f(x):
        d = {x: 1}
        k, v = d.popitem()
        od = collections.OrderedDict(a=1, b=2, c=3)
        first = od.popitem(last=False)
        last = od.popitem()
        return k + v, k is x, first, last, list(od)
    same_as_eager_in_one_graph(f, torch.ones(2))


def test_sequence_index_with_bounds():
    def f(x):
        lst, tup = [1, 2, 1, 3, 1], (1, 2, 1, 3)
        out = [lst.index(1, 1), lst.index(1, -2), tup.index(1, 1, 3), lst.index(3, 0, 10)]
        try:
            lst.index(3, 0, 2)
        except ValueError as e:
            out.append(str(e))
        try:
            tup.index(2, 2)
        except ValueError as e:
            out.append(str(e))
        return x + 1, out
    g = kiln.compile(f, backend="eager")
    assert repr(g(torch.ones(1))) == repr(f(torch.ones(1)))


class PlainDictSubclass(dict):
    pass


def test_dict_union_and_copy_types():
    def f(x):
        od = collections.OrderedDict(a=1)
        dd = collections.defaultdict(list, a=[1])
        sub = PlainDictSubclass(a=1)
        out = [od | {"b": 2}, {"b": 2} | od, dd | {"b": 2}, {"b": 2} | dd, sub | {"b": 2}, sub.copy(),
               od.copy(), dd.copy()]
        return x + 1, [type(v).__name__ for v in out], [list(v.items()) for v in out], \
            [v.default_factory for v in out if isinstance(v, collections.defaultdict)]
    same_as_eager_in_one_graph(f, torch.ones(1))


@pytest.mark.parametrize("call", ["d.update({}, {})", "d.get(1, 2, 3)", "d.popitem(1)", "d.clear(1)", "d.keys(1)",
                                  "d.pop()", "d.setdefault()", "d.get(a=1)", "{}.update([(1, 2, 3)])",
                                  "{[1, 2]: x}"])
def test_dict_methods_raise_eagers_error_for_wrong_arguments(call):
    _raises_as_eager("d = {1: x}", call, "d")


def test_dict_views_attributes_and_items_equality():
    def f(x):
        d = {"a": 1, "b": 2}
        try:
            d.values().bogus
            missing = "no AttributeError"
        except AttributeError:
            missing = "AttributeError"
        return x + 1, missing, hasattr(d.items(), "bogus"), d.items() == {("a", 1), ("b", 2)}, \
            {("a", 1), ("b", 3)} == d.items(), hasattr(d.keys(), "isdisjoint")
    same_as_eager_in_one_graph(f, torch.ones(1))


def test_an_ordered_dict_argument_is_read_in_its_own_order():
    def f(x, od):
        od["z"] = 0
        return x * len(od), list(od), [k for k, _ in od.items()]
    counter = CompileCounter()
    g = kiln.compile(f, backend=counter)

    def make(order):
        od = collections.OrderedDict(a=1, b=2, c=3)
        for k in order:
            od.move_to_end(k)
        return od
    for order in ("a", "b", "a"):
        e, k = make(order), make(order)
        assert repr(g(torch.ones(1), k)) == repr(f(torch.ones(1), e))
        assert list(k) == list(e)
    assert counter.frame_count == 2       # (the order is guarded: b moved last is another entry)


def test_a_partial_made_in_compiled_code_is_one_object_after_a_break():
    import functools

    def f(x):
        p = functools.partial(torch.add, other=1)
        d = {p: 5}
        print("", end="")      # a graph break
        return x + d[p], p in d
    got = kiln.compile(f, backend="eager")(torch.ones(2))
    assert repr(got) == repr(f(torch.ones(2)))


class CountingLRU(collections.OrderedDict):
    """An OrderedDict subclass whose __setitem__ counts and evicts (an LRU cache)."""

    def __init__(self, size):
        super().__init__()
        self.size, self.sets = size, 0

    def __setitem__(self, key, value):
        self.sets += 1
        super().__setitem__(key, value)
        if len(self) > self.size:
            self.popitem(last=False)


def test_writing_back_an_ordered_dict_subclass_runs_none_of_its_code_again():
    def f(x, cache):
        for k in ("t1", "t2", "t3"):
            cache[k] = x + len(k)
        print("", end="")       # a graph break: the cache is written back before it
        return x + 1
    e, k = CountingLRU(2), CountingLRU(2)
    f(torch.ones(1), e)
    kiln.compile(f, backend="eager")(torch.ones(1), k)
    assert (k.sets, list(k)) == (e.sets, list(e)) == (3, ["t2", "t3"])


def test_set_predicates_stop_at_the_deciding_item_and_frozensets_stay_frozen():
    def f(x):
        taken = []

        def gen(items):
            for v in items:
                taken.append(v)
                yield v
        s = {1, 2}
        it = iter([5, 2, 7])
        out = [s.isdisjoint(gen([9, 1, 3])), s.issuperset(gen([1, 9, 2])), s.isdisjoint(it), list(it)]
        fs = frozenset([x.shape[0], 3])
        kinds = [type(fs | {4}).__name__, type(fs - {3}).__name__, type(fs & {3}).__name__, type(fs ^ {5}).__name__]
        keyed = {frozenset({1, 2})}
        return x + 1, out, list(taken), kinds, {1, 2} in keyed
    same_as_eager_in_one_graph(f, torch.ones(2))


@pytest.mark.parametrize("call", ["a.copy(1)", "a.pop(0, 1)", "a.clear(1)", "a.reverse(1)", "a.count()",
                                  "a.sort(1)", "a.append(1, 2)", "a.insert(0)", "a[5] = 0", "del a[5]",
                                  "a['x'] = 0", "a[::2] = [1]", "[1, 'a'].sort()", "a.insert('x', 0)",
                                  "a.pop('x')", "[].pop()", "list(x=1)", "list([], [])", "tuple(a, a)",
                                  "set([1], [2])", "set(x=[])", "frozenset(a, a)"])
def test_list_methods_and_constructors_raise_eagers_error(call):
    _raises_as_eager("a = [3, 1, 2]", call, "a")
