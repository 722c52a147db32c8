"""Binary, comparison, unary and ``in`` operators on user objects, as Python dispatches them:
``!=`` derived from ``__eq__``, a subclass's reflected operator first, no reflected operator
between objects of one type, and the class's dunder guarded (replacing it recompiles)."""
from __future__ import annotations

import dataclasses
import operator

import pytest
import torch

import kiln
from kiln.testing import CompileCounter


class Box:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return self.v == other.v


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Base:
    def __add__(self, other):
        return "Base.__add__"

    def __radd__(self, other):
        return "Base.__radd__"

    def __sub__(self, other):
        return "Base.__sub__"

    def __eq__(self, other):
        return "Base.__eq__"

    def __lt__(self, other):
        return "Base.__lt__"


class Derived(Base):
    def __radd__(self, other):
        return "Derived.__radd__"

    def __eq__(self, other):
        return "Derived.__eq__"

    def __gt__(self, other):
        return "Derived.__gt__"


class Plain(Base):
    pass


class OnlyReflected:
    def __add__(self, other):
        return NotImplemented

    def __radd__(self, other):
        return "OnlyReflected.__radd__"


def _compare(fn, *args):
    counter = CompileCounter()
    expected = fn(*args)
    got = kiln.compile(fn, backend=counter)(*args)
    assert got == expected
    assert counter.frame_count == 1
    return got


def test_not_equal_is_derived_from_eq():
    def f(x):
        return x + 1, [Box(0) != Box(0), Box(0) != Box(1), Point(1, 2) != Point(1, 2),
                       Point(1, 2) != Point(1, 3), operator.ne(Box(2), Box(2)), Box(3).__ne__(Box(3)),
                       Box(4) != Box(4) and "same"]
    expected = f(torch.ones(1))[1]
    assert expected == [False, True, False, True, False, False, False]
    counter = CompileCounter()
    out = kiln.compile(f, backend=counter)(torch.ones(1))
    assert out[1] == expected and counter.frame_count == 1


def test_not_equal_of_arguments_reads_their_eq():
    def f(x, a, b):
        return x * 2 if a != b else x * 3
    counter = CompileCounter()
    g = kiln.compile(f, backend=counter)
    x = torch.randn(3)
    for a, b in [(Point(1, 2), Point(1, 2)), (Point(1, 2), Point(2, 2))]:
        torch.testing.assert_close(g(x, a, b), f(x, a, b))


def test_not_equal_raises_what_eq_raises():
    def f(x):
        try:
            return x, 0 != Box(0)      # int.__ne__ declines, Box.__ne__ calls Box.__eq__(box, 0)
        except AttributeError:
            return x, "AttributeError"
    assert f(torch.ones(1))[1] == "AttributeError"
    assert kiln.compile(f, backend="eager")(torch.ones(1))[1] == "AttributeError"


def test_subclass_reflected_operator_goes_first():
    def f(x):
        return x + 1, [Base() + Derived(), Base() == Derived(), Derived() == Base(), Base() < Derived(),
                       Base() + Plain(), Plain() + Base(), Base() - Derived(), Base() == Base()]
    expected = f(torch.ones(1))[1]
    assert expected[:4] == ["Derived.__radd__", "Derived.__eq__", "Derived.__eq__", "Derived.__gt__"]
    counter = CompileCounter()
    assert kiln.compile(f, backend=counter)(torch.ones(1))[1] == expected
    assert counter.frame_count == 1


def test_no_reflected_operator_between_objects_of_one_type():
    def f(x):
        try:
            return x, OnlyReflected() + OnlyReflected()
        except TypeError:
            return x, "TypeError"
    assert f(torch.ones(1))[1] == "TypeError"
    assert kiln.compile(f, backend="eager")(torch.ones(1))[1] == "TypeError"
    # another type on the left: its __add__ declines, then the reflected one answers
    def g(x):
        return x, 1 + OnlyReflected()
    assert kiln.compile(g, backend="eager")(torch.ones(1))[1] == "OnlyReflected.__radd__"


@pytest.mark.parametrize("dunder, replacement", [
    ("__add__", lambda self, other: self.v + 100),
    ("__radd__", lambda self, other: self.v - 100),
    ("__iadd__", lambda self, other: 0.5),
    ("__neg__", lambda self: 7.0),
    ("__contains__", lambda self, item: False),
    ("__eq__", lambda self, other: False),
    ("__ne__", lambda self, other: False),
])
def test_replacing_an_operator_dunder_recompiles(dunder, replacement):
    class Num:
        def __init__(self, v):
            self.v = v

        def __add__(self, other):
            return self.v + 1

        def __radd__(self, other):
            return self.v + 2

        def __iadd__(self, other):
            return self.v * 10

        def __neg__(self):
            return -self.v

        def __contains__(self, item):
            return item == 1

        def __eq__(self, other):
            return True

    def f(x, p, q):
        y = p
        y += 3
        return x + (p + 1) + (1 + p) + (-p) + (1 in p) + y + (p == q) + (p != q)

    counter = CompileCounter()
    g = kiln.compile(f, backend=counter)
    x, p, q = torch.zeros(1), Num(2.0), Num(3.0)
    torch.testing.assert_close(g(x, p, q), f(x, p, q))
    setattr(Num, dunder, replacement)
    torch.testing.assert_close(g(x, p, q), f(x, p, q))
    assert counter.frame_count == 2


import enum  # noqa: E402


class Layout(str, enum.Enum):
    NCHW = "NCHW"
    NHWC = "NHWC"


class Mode(enum.Enum):
    TRAIN = 1
    EVAL = 2


class _Marker:
    pass


class _Configured(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layout, self.mode, self.a, self.b = Layout.NHWC, Mode.TRAIN, _Marker(), _Marker()

    def forward(self, x):
        if self.layout != Layout.NCHW:      # (timm's output_fmt test: str.__ne__ of a str Enum)
            x = x.flip(0)
        return x * 2, self.layout == "NHWC", self.mode is Mode.EVAL, self.mode == Mode.EVAL, self.a is self.b


def test_enum_comparisons_and_identity_follow_the_objects():
    """A str-mixin Enum compares with str's operator, in the graph's capture, without a
    break; identity and equality of objects read from a module are guarded: changing them
    recompiles instead of reusing a stale answer."""
    m = _Configured()
    counter = CompileCounter()
    g = kiln.compile(m, backend=counter)
    x = torch.randn(3)
    for change in (None, "layout", "mode", "alias"):
        if change == "layout":
            m.layout = Layout.NCHW
        elif change == "mode":
            m.mode = Mode.EVAL
        elif change == "alias":
            m.b = m.a
        want, got = m(x), g(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:]
    assert counter.frame_count == 4
