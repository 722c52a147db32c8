"""Which objects a compiled function hands out: ``is`` between values after a graph break, the
constructors that return their argument, and the attributes of objects created in the frame
(a partial's ``args``/``keywords``, a nested function's annotations). Each case is compared with
eager."""
from __future__ import annotations

import collections
import functools

import pytest
import torch

import kiln
from kiln.testing import CompileCounter


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _break():
    print(end="")


def _same(fn, *args):
    got, want = kiln.compile(fn, backend="eager")(*args), fn(*args)
    assert repr(got) == repr(want)
    return got


def test_equal_values_made_apart_stay_apart_across_a_break():
    def f(x):
        a = "xyzpdq"
        c = a[:3] + a[3:]            # equal to a, another object
        n = 10 ** 6
        m = n + 0 * int(x.shape[0])  # (folded at capture: still another int object in eager)
        t = (1, "q" * 3)
        u = tuple([1, "qqq"])
        _break()
        return a is c, a == c, n is m, n == m, t is u, x + 1

    _same(f, torch.ones(2))


def test_one_object_reached_twice_is_one_object_after_a_break():
    def f(x):
        v = 1.5 * x.shape[0]
        pair = [v, v]
        _break()
        return pair[0] is pair[1], sorted(pair) == pair, x * 2

    _same(f, torch.ones(2))


def test_tuple_and_frozenset_of_their_own_type_return_the_argument():
    def f(t, fs, x):
        a = (x, 1)
        return tuple(t) is t, frozenset(fs) is fs, tuple(a) is a, tuple([x, 1]) is a, \
            tuple.__new__(tuple, t) is t, x + 1

    counter = CompileCounter()
    args = ((["a"], 1), frozenset({1, 2}), torch.ones(2))
    got = kiln.compile(f, backend=counter)(*args)
    assert repr(got) == repr(f(*args))
    assert counter.frame_count == 1


def _capture(*args, **kwargs):
    return args, kwargs


def test_a_partials_args_and_keywords_are_its_own_objects():
    def f(x):
        p = functools.partial(_capture, 1)
        p.keywords["a"] = 2                 # seen by the call
        kw = p.keywords
        _break()
        kw["b"] = 3                         # after the break: still the partial's dict
        return p(), p.args is p.args, p.keywords is kw, x + 1

    _same(f, torch.ones(2))


def test_a_change_to_an_argument_partials_keywords_is_written_back():
    def f(x, p):
        p.keywords["scale"] = 2
        return p(x)

    def scaled(x, scale=1, shift=0):
        return x * scale + shift

    x = torch.ones(3)
    eager, compiled = functools.partial(scaled, shift=1), functools.partial(scaled, shift=1)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x, compiled), f(x, eager))
    assert compiled.keywords == eager.keywords == {"shift": 1, "scale": 2}


def test_a_nested_function_keeps_its_annotations_at_a_break():
    def f(x):
        def g(arg: int, *, k: "torch.Tensor" = None) -> str:
            return str(arg)
        y = x + 1
        _break()
        return y, g.__annotations__, g.__kwdefaults__, g(3)

    _same(f, torch.ones(2))


def test_a_dict_or_set_changed_in_size_while_iterated_raises_as_eager():
    def grows(x):
        d = {"a": 1, "b": 2}
        for k in d:
            d[k + "x"] = 3
        return x

    def shrinks(x, d):
        for k in d:
            del d[k]
        return x

    def set_grows(x):
        s = {1, 2}
        for k in s:
            s.add(k + 10)
        return x

    for fn, args in ((grows, ()), (set_grows, ()), (shrinks, ({"a": 1, "b": 2},))):
        for run in (fn, kiln.compile(fn, backend="eager")):
            with pytest.raises(RuntimeError, match="changed size during iteration"):
                run(torch.ones(1), *[dict(a) for a in args])


def test_iterating_a_dict_reads_each_value_as_it_is_then():
    def f(x):
        d = {"a": 1, "b": 2, "c": x}
        seen = []
        for k, v in d.items():
            if k == "a":
                d["b"] = 100            # (same size: no error, the new value is seen)
            seen.append(v)
        for v in d.values():
            d["c"] = 7
            seen.append(v)
        od = collections.OrderedDict(a=1)
        for k in od:
            od["q"] = 2                 # (after its last key OrderedDict's iterator just stops)
        it = iter(d)
        next(it)
        d["z"] = 1
        for _ in range(2):              # (and stays failed)
            try:
                next(it)
            except RuntimeError as e:
                seen.append(str(e))
        return seen, list(od), type(iter(d.items())).__name__, type(iter({1})).__name__

    _same(f, torch.ones(1))


def _is_same_object(a, b):
    _break()
    return a is b


def test_a_frozenset_made_in_the_frame_is_one_object_across_a_break():
    def f(x):
        s = frozenset({1, 2, 3})
        t = s
        return _is_same_object(s, t), s is t, x + 1

    assert _same(f, torch.ones(2))[:2] == (True, True)


def test_a_slice_of_lists_keeps_its_objects():
    def f(x):
        a = [1, 2]
        s = slice(a, [3, 4], [5, 6])
        s.start.append(9)
        return s.start is s.start, s.start is a, s.start, a, x + 1

    assert _same(f, torch.ones(2))[:2] == (True, True)
