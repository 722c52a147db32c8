"""Python semantics the capture models without a break: ``dict(mapping)`` and ``dict.update``
of any mapping (a ``collections.abc.MutableMapping``: its keys, each read with ``m[key]``),
``OrderedDict.fromkeys``' keyword arguments, a property whose getter is C code (a pybind11
class's), and a frozenset's missing mutators (eager's AttributeError)."""
import collections
from collections.abc import MutableMapping

import pytest
import torch

import kiln
from kiln.testing import CompileCounter


class TensorMap(MutableMapping):
    def __init__(self, **items):
        self._d = dict(items)

    def __getitem__(self, k):
        return self._d[k]

    def __setitem__(self, k, v):
        self._d[k] = v

    def __delitem__(self, k):
        del self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


class OwnKeys(TensorMap):
    def keys(self):
        return ["b"]          # dict.update reads only these


def test_dict_of_a_mutable_mapping_is_one_graph():
    tm = TensorMap(a=torch.ones(3), b=torch.full((3,), 3.0))
    own = OwnKeys(a=torch.ones(3), b=torch.full((3,), 5.0))

    def f(x):
        d = dict(tm)
        e = {}
        e.update(own)
        g = dict(own, c=x)
        return x * d["a"] + d["b"] + sum(e.values()) + len(g)

    cnt = CompileCounter()
    compiled = kiln.compile(f, backend=cnt, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), f(x))
    assert cnt.frame_count == 1


def test_ordered_dict_fromkeys_takes_value_by_keyword():
    def f(x, y):
        d = collections.OrderedDict.fromkeys(("a", "b"), value=y)
        e = collections.OrderedDict.fromkeys(iterable=["c"])
        return x + d["a"] + d["b"], list(e.items())

    cnt = CompileCounter()
    x, y = torch.randn(3), torch.randn(3)
    out, items = kiln.compile(f, backend=cnt, fullgraph=True)(x, y)
    torch.testing.assert_close(out, f(x, y)[0])
    assert items == [("c", None)] and cnt.frame_count == 1


def test_dict_fromkeys_refuses_keywords_as_eager():
    def f(x):
        return dict.fromkeys(["a"], value=x)

    with pytest.raises(TypeError, match="keyword"):
        f(torch.randn(2))
    with pytest.raises(TypeError, match="keyword"):
        kiln.compile(f, backend="eager")(torch.randn(2))


def test_a_property_implemented_in_c_is_read_and_guarded():
    make = torch._C._dynamo.guards.GuardDebugInfo      # (a pybind11 class: C getters)

    def f(x, info):
        return torch.cos(x) if info.result else torch.sin(x)

    cnt = CompileCounter()
    compiled = kiln.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x, make(True, ["a"], 0)), torch.cos(x))
    torch.testing.assert_close(compiled(x, make(False, ["a"], 0)), torch.sin(x))
    assert cnt.frame_count == 2


def test_a_frozensets_missing_mutator_raises_eagers_error():
    def f(x):
        s = frozenset((1, 2, 3))
        s.add(4)
        return x

    with pytest.raises(AttributeError, match="'frozenset' object has no attribute 'add'"):
        kiln.compile(f, backend="eager")(torch.randn(2))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_c_getter_read_after_a_store_sees_it(backend):
    """A getter written in C reads the real object: after this function set its attributes
    (not yet written back) the read breaks the graph, so the stores land first."""
    import operator
    import weakref

    class Box:
        doubled = property(operator.attrgetter("foo"))

    def f(o, x):
        p = weakref.proxy(o)
        before = p.foo
        o.foo = x.sum()
        return before, p.foo, o.doubled, x * 2

    x = torch.ones(3)
    want_o, got_o = Box(), Box()
    want_o.foo = got_o.foo = torch.zeros(())
    want = f(want_o, x)
    got = kiln.compile(f, backend=backend)(got_o, x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_o.foo, want_o.foo)
