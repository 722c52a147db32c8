"""zip, enumerate and the itertools adaptors take the items of an iterator as eager does, one
at a time when asked (``zip(it, it)``, ``tee(it)`` then ``next(it)``, a loop that breaks out),
and call the user's functions (``starmap``, ``accumulate``, the predicates) only as their items
are taken."""
from __future__ import annotations

import itertools
import os
import sys

import pytest
import torch

import kiln
from kiln.testing import CompileCounter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _conformance import same_as_eager_in_one_graph  # noqa: E402


def test_zip_of_one_iterator_pairs_its_items():
    def f(x):
        it = iter([1, 2, 3, 4, 5])
        pairs = list(zip(it, it))
        grouped = list(zip(*[iter(range(6))] * 2))
        return x + 1, pairs, grouped
    same_as_eager_in_one_graph(f, torch.ones(1))


def test_enumerate_and_zip_leave_the_rest_of_an_iterator():
    def f(x):
        it = iter([x, x + 1, x + 2, x + 3])
        for i, v in enumerate(it):
            if i == 1:
                break
        rest = list(it)
        it2 = iter([1, 2, 3])
        first = next(zip(it2, "ab"))
        return rest, first, list(it2)
    same_as_eager_in_one_graph(f, torch.ones(2))


def test_an_argument_iterator_is_consumed_as_far_as_eager_does():
    def f(x, it):
        return x + next(zip(it, "a"))[0]
    counter = CompileCounter()
    g = kiln.compile(f, backend=counter)
    it_e, it_k = iter([1, 2, 3]), iter([1, 2, 3])
    torch.testing.assert_close(g(torch.ones(1), it_k), f(torch.ones(1), it_e))
    assert list(it_k) == list(it_e) == [2, 3]


@pytest.mark.parametrize("adaptor", ["tee", "islice", "chain", "accumulate", "pairwise", "compress",
                                     "zip_longest", "filterfalse", "takewhile", "dropwhile"])
def test_itertools_over_an_iterator_take_only_what_is_asked(adaptor):
    def f(x):
        it = iter([1, 2, 3, 4, 5])
        if adaptor == "tee":
            a, b = itertools.tee(it)
            got = [next(a), next(a), next(b)]
        elif adaptor == "islice":
            got = list(itertools.islice(it, 1, 4, 2))
        elif adaptor == "chain":
            got = [next(itertools.chain(it, [9]))]
        elif adaptor == "accumulate":
            got = [next(itertools.accumulate(it))]
        elif adaptor == "pairwise":
            got = [next(itertools.pairwise(it))]
        elif adaptor == "compress":
            got = [next(itertools.compress(it, [0, 1, 1]))]
        elif adaptor == "zip_longest":
            got = list(itertools.zip_longest(it, [1, 2]))[:1]
        elif adaptor == "filterfalse":
            got = [next(itertools.filterfalse(lambda t: t < 3, it))]
        elif adaptor == "takewhile":
            got = list(itertools.takewhile(lambda t: t < 3, it))
        else:
            got = [next(itertools.dropwhile(lambda t: t < 3, it))]
        return x + len(got), got, list(it)
    if adaptor == "pairwise" and not hasattr(itertools, "pairwise"):
        pytest.skip("itertools.pairwise is Python 3.10+")
    same_as_eager_in_one_graph(f, torch.ones(2))


@pytest.mark.parametrize("adaptor", ["islice", "filterfalse", "takewhile", "dropwhile", "starmap", "compress"])
def test_itertools_over_an_iterator_continue_after_a_graph_break(adaptor):
    def f(x):
        it = iter([1, 2, 3, 4, 5, 6])
        if adaptor == "islice":
            lazy = itertools.islice(it, 1, 5, 2)
        elif adaptor == "filterfalse":
            lazy = itertools.filterfalse(lambda t: t % 2, it)
        elif adaptor == "takewhile":
            lazy = itertools.takewhile(lambda t: t < 4, it)
        elif adaptor == "dropwhile":
            lazy = itertools.dropwhile(lambda t: t < 3, it)
        elif adaptor == "starmap":
            lazy = itertools.starmap(lambda a, b: a * b, zip(it, it))
        else:
            lazy = itertools.compress(it, iter([1, 0, 1, 1, 0, 1]))
        first = next(lazy)
        print("", end="")     # a graph break with the iterator half read
        return x + first, list(lazy), list(it)
    expected = f(torch.ones(1))
    counter = CompileCounter()
    got = kiln.compile(f, backend=counter)(torch.ones(1))
    assert repr(got) == repr(expected)
    assert counter.frame_count == 1     # (the graph before the break; none after it)


def test_user_functions_run_as_items_are_taken():
    def f(x):
        log = []

        def add(a, b):
            log.append(("add", b))
            return a + b

        def pair(a, b):
            log.append(("pair", a))
            return a * b

        acc = itertools.accumulate([1, 2, 3], add)
        star = itertools.starmap(pair, [(1, 2), (3, 4)])
        log.append("made")
        first = next(acc), next(star)
        return x + 1, first, log
    same_as_eager_in_one_graph(f, torch.ones(1))


def test_tee_of_a_generator_runs_it_only_as_far_as_read():
    def f(x):
        log = []

        def gen():
            for i in range(3):
                log.append(i)
                yield x + i

        a, b = itertools.tee(gen())
        seen = list(log)
        y = next(a)
        return y, seen, list(log), next(b)
    same_as_eager_in_one_graph(f, torch.ones(1))


def test_zip_strict_over_iterators_raises_eagers_error():
    def f(x, n):
        try:
            return x + 1, list(zip(iter([1, 2]), iter(range(n)), strict=True))
        except ValueError as e:
            return x + 1, str(e)
    g = kiln.compile(f, backend="eager")
    for n in (1, 2, 3):
        assert repr(g(torch.ones(1), n)) == repr(f(torch.ones(1), n))


def test_chain_over_an_iterator_continues_after_a_graph_break():
    def f(x):
        c = itertools.chain(iter([x, x + 1]), [x + 2])
        y = next(c)
        print("", end="")     # a graph break while the chain is half read
        return y, list(c)
    expected = f(torch.ones(1))
    got = kiln.compile(f, backend="eager")(torch.ones(1))
    torch.testing.assert_close(got, expected)


def test_adaptors_over_a_list_see_what_is_appended_after_they_are_made():
    # (eager's enumerate, zip and chain over a list read it as they go: an item appended
    # before they are consumed is theirs; CPython's test_itertools)
    def f(x):
        a = [x, x + 1]
        e, z, c = enumerate(a), zip(a, "xyz"), itertools.chain(a)
        s = itertools.islice(a, 1, None)
        a.append(x + 2)
        return list(e), list(z), list(c), list(s)
    same_as_eager_in_one_graph(f, torch.ones(2))


def test_groupby_calls_its_key_as_the_groups_are_asked_for():
    def f(x):
        log = []
        g = itertools.groupby([1, 1, 2, 3], key=lambda v: log.append(v) or v % 2)
        log.append("made")
        k1, first = next(g)
        head = next(first)
        log.append("read one")
        k2, second = next(g)          # empties ``first``
        return x + 1, log, k1, head, list(first), k2, list(second), [k for k, _ in g]
    same_as_eager_in_one_graph(f, torch.ones(2))


def test_a_list_iterator_that_ended_stays_ended():
    def f(x):
        a = [x, x + 1]
        it = iter(a)
        taken = [next(it), next(it), next(it, None)]
        a.append(x + 2)
        return taken, next(it, "ended"), list(it)
    same_as_eager_in_one_graph(f, torch.ones(2))


def test_a_loop_over_a_list_sees_what_the_code_after_a_graph_break_appends(capsys):
    def f(x, it_in):
        a = [x, x + 1]
        out = []
        for t in a:
            out.append(t * 2)
            print("a break")
            if len(a) < 4:
                a.append(t + 10)
        # an argument's list iterator, advanced as far as the function took it
        got = [next(it_in)]
        print("a break")
        got.append(next(it_in))
        return out, a, got

    x = torch.ones(2)
    src_eager, src_kiln = [x, x * 2, x * 3], [x, x * 2, x * 3]
    it_eager, it_kiln = iter(src_eager), iter(src_kiln)
    expected = f(x, it_eager)
    kiln.reset()
    got = kiln.compile(f, backend="aot_eager")(x, it_kiln)
    kiln.testing.assert_same(got, expected)
    kiln.testing.assert_same(list(it_kiln), list(it_eager))


def test_itertools_objects_keep_their_class_across_a_graph_break(capsys):
    def f(x):
        r = itertools.repeat("a", 3)
        next(r)
        shown = repr(r)                 # (a graph break: repr runs natively)
        t = iter((x, x + 1))
        return x + 1, shown, type(r).__name__, list(r), type(t).__name__

    same = f(torch.ones(2))
    kiln.reset()
    kiln.testing.assert_same(kiln.compile(f, backend="aot_eager")(torch.ones(2)), same)


def test_an_itertools_object_with_no_code_for_its_state_runs_the_frame_natively():
    # (``product`` held across a break: eager's object, with its own ``__setstate__``)
    def f(x):
        p = itertools.product((1, 2), (3,))
        p.__setstate__((0, 0x1000))
        return next(p), x + 1

    def g(x):
        try:
            itertools.chain().__setstate__(0)
        except TypeError:
            return x - 1
        return x + 1

    for fn in (f, g):
        kiln.reset()
        kiln.testing.assert_same(kiln.compile(fn, backend="aot_eager")(torch.ones(2)), fn(torch.ones(2)))


class _Layers(__import__("collections").abc.Sequence):
    """A sequence whose ``__iter__`` is collections.abc.Sequence's generator (Hugging Face's
    layer configs)."""

    def __init__(self, items):
        self.items = items

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self):
        return len(self.items)


def test_zip_of_a_list_and_a_user_sequence_leaves_no_generator_at_a_break(capsys):
    # (the list is read as zip goes; the sequence's generator is finished at once, as before,
    # not left suspended in its try block for the break below to make natively)
    def f(x):
        kinds = ["full", "sliding"]
        out = [x * (2 if k == "full" else 3) + c for k, c in zip(kinds, _Layers([1, 2]))]
        print("a break")
        return torch.stack(out).sum()

    counter = CompileCounter()
    kiln.reset()
    x = torch.ones(2)
    kiln.testing.assert_same(kiln.compile(f, backend=counter)(x), f(x))
    assert counter.frame_count == 2


def test_reversed_of_a_list_reads_it_as_it_goes(capsys):
    def f(x):
        a = [1, 2, 3]
        r = reversed(a)
        a[0] = 100
        b = [1, 2, 3]
        s = reversed(b)
        next(s)
        b.clear()
        return x + 1, list(r), list(s), type(r).__name__

    same_as_eager_in_one_graph(f, torch.ones(2))

    def g(x, r):
        out = []
        for t in r:
            out.append(x * t)
            print("a break")
        return out

    kiln.reset()
    a, b = [1, 2, 3], [1, 2, 3]
    expected = g(torch.ones(2), reversed(a))
    kiln.testing.assert_same(kiln.compile(g, backend="aot_eager")(torch.ones(2), reversed(b)), expected)


def test_a_set_built_by_adds_iterates_as_eagers_after_it_leaves_the_graph(capsys):
    # (colliding int hashes: the order depends on how the set was built, not only on its
    # members; CPython's test_set)
    def f(x):
        return set(x)

    def g(x):
        s = set(x)
        print("a break")
        return list(s)

    x = [0, 8, 16, 32, 1]
    for fn in (f, g):
        kiln.reset()
        assert list(kiln.compile(fn, backend="eager")(x)) == list(fn(x))


def test_zip_of_no_iterables_is_empty():
    """zip() of nothing (``zip(*rows)`` of an empty ``rows``) has no rows; it is not one
    endless empty row."""
    def f(x, rows):
        return (x + 1, list(zip()), list(zip(*rows)), next(zip(), "end"), list(zip(strict=True)),
                list(itertools.zip_longest()), [r for r in zip(*rows)])
    same_as_eager_in_one_graph(f, torch.ones(1), [])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_builtin_iterators_keep_their_type(backend):
    """``enumerate``, ``zip``, ``reversed`` and ``iter`` of a string, over items read at once,
    are their own types inside the function (``type()``, ``isinstance``) and when returned,
    with the items they have left."""
    def f(x):
        e, z, r = enumerate("ab", 3), zip("ab", (1, 2)), reversed((1, 2, 3))
        s, rr = iter("abc"), reversed(range(4))
        first = next(e), next(z), next(r), next(s), next(rr)
        types = tuple(type(v).__name__ for v in (e, z, r, s, rr))
        return x + 1, first, types, isinstance(e, enumerate), e, z, r, s, rr

    want = f(torch.ones(1))
    got = kiln.compile(f, backend=backend)(torch.ones(1))
    torch.testing.assert_close(got[0], want[0])
    assert got[1:4] == want[1:4]
    assert [type(v) for v in got[4:]] == [type(v) for v in want[4:]]
    assert [list(v) for v in got[4:]] == [list(v) for v in want[4:]]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_an_iterator_handed_to_a_call_that_breaks_is_itself(backend):
    """An iterator among the arguments of a call that breaks the graph (``length_hint`` runs
    natively) reaches the call as itself: its type and length hint are eager's."""
    import operator

    def f(x, xs):
        hints = (operator.length_hint(enumerate(xs), -1), operator.length_hint(zip(xs, xs), -1),
                 operator.length_hint(iter(xs), -1), operator.length_hint(reversed((1, 2)), -1))
        return x + 1, hints

    want = f(torch.ones(1), [1, 2, 3])
    got = kiln.compile(f, backend=backend)(torch.ones(1), [1, 2, 3])
    assert got[1] == want[1] == (-1, -1, 3, 2)
