"""Python semantics inside compiled code, compared with plain Python: imports and
name resolution, the attribute protocol (``__setattr__``, ``__getattribute__``, descriptors,
slots), ``locals()``, augmented assignment, constants in graph code, exceptions across graph
breaks, zero-argument ``super()`` in resumed frames, and the resume-code crashes a fuzzer
found."""
from __future__ import annotations

import abc
import builtins
import collections
import copy
import io
import math
import operator
import os
import sys
import typing

import pytest
import torch

import kiln
from kiln.testing import CompileCounter

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from _conformance import assert_same  # noqa: E402

BACKENDS = ["eager", "aot_eager"]


def counted(name: str):
    """A backend that counts graphs, then compiles them with kiln's backend ``name``."""
    from kiln.backends.registry import lookup_backend

    inner, _ = lookup_backend(name)
    counter = CompileCounter()

    def backend(gm, example_inputs):
        counter(gm, example_inputs)
        return inner(gm, example_inputs)
    backend.counter = counter
    return backend


def _call(fn, args):
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - compared with eager
        return None, e


def compare(fn, make_args, backend="eager", graphs=None, calls=2, fullgraph=False, dynamic=None,
            capsys=None, warm=True):
    """``fn`` compiled against ``fn`` run eagerly, on fresh arguments each call: results (or
    exception type and message), arguments after the call, grad mode and ``sys.exc_info()``
    after the call, stdout. ``graphs``: graphs compiled by the first call (and with ``warm``,
    none by later ones)."""
    kiln.reset()
    be = counted(backend)
    cf = kiln.compile(fn, backend=be, fullgraph=fullgraph, dynamic=dynamic)
    first = None
    for i in range(calls):
        args = make_args()
        eargs = copy.deepcopy(args)
        expected, e_exc = _call(fn, eargs)
        e_out = capsys.readouterr().out if capsys is not None else None
        got, g_exc = _call(cf, args)
        if capsys is not None:
            assert capsys.readouterr().out == e_out, f"call{i}: stdout differs"
        if e_exc is not None:
            assert type(g_exc) is type(e_exc) and str(g_exc) == str(e_exc), (
                f"call{i}: compiled {g_exc!r}, eager {e_exc!r}")
        else:
            if g_exc is not None:
                raise AssertionError(f"call{i}: compiled raised, eager returned {expected!r}") from g_exc
            assert_same(got, expected, path=f"call{i}:out")
        assert_same(args, eargs, path=f"call{i}:args")
        assert torch.is_grad_enabled()
        assert sys.exc_info()[1] is None
        if i == 0:
            first = be.counter.frame_count
            if graphs is not None:
                assert first == graphs, f"expected {graphs} graph(s), got {first}"
        elif warm:
            assert be.counter.frame_count == first, "a warm call compiled again"
    return cf, be.counter


def T(*shape):
    return lambda: (torch.randn(*shape),)


def dd(t):
    return float(t.sum())   # a graph break (needs the data)


# -- 1. imports and name resolution -----------------------------------------------------------

def from_submodule_import(x):
    from torch.nn import functional
    return functional.relu(x), functional is torch.nn.functional


def import_as_and_dotted(x):
    import torch.nn.functional as F
    import os.path
    import torch.nn
    return F.gelu(x), F is torch.nn.functional, torch.nn is sys.modules["torch.nn"], os.path.sep


def from_package_import_submodule(x):
    from collections import abc
    from json import decoder
    import json.decoder
    return x + 1, isinstance([], abc.Sequence), decoder is json.decoder


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [from_submodule_import, import_as_and_dotted, from_package_import_submodule])
def test_imports_bind_what_python_binds(fn, backend):
    compare(fn, T(4), backend, graphs=1, fullgraph=True)


def test_relative_imports_inside_a_package():
    import _import_pkg.sub.mod as mod

    compare(mod.relative_imports, T(3), "eager", graphs=1, fullgraph=True)
    compare(mod.missing_relative_name, T(3), "eager")   # ImportError, as in eager


def test_import_of_a_missing_name_raises_import_error():
    def f(x):
        from torch.nn import no_such_name_zz  # noqa: F401
        return x

    def caught(x):
        try:
            from torch.nn import no_such_name_zz  # noqa: F401
        except ImportError:
            return x + 100
        return x

    compare(f, T(2))
    compare(caught, T(2))


def test_import_of_a_module_not_yet_loaded_runs_natively():
    import _import_pkg.sub as sub
    import _import_pkg.sub.mod as mod

    sys.modules.pop("_import_pkg.sub.lazy", None)
    sub.__dict__.pop("lazy", None)
    kiln.reset()
    be = counted("eager")
    cf = kiln.compile(mod.lazy_import, backend=be)
    assert torch.equal(cf(torch.ones(2)), torch.full((2,), 9.0))
    assert "_import_pkg.sub.lazy" in sys.modules     # imported natively, at the break
    assert be.counter.frame_count == 2
    assert torch.equal(cf(torch.ones(2)), torch.full((2,), 9.0))


def test_replaced_import_hook_is_honoured():
    seen = []
    namespace = {"__builtins__": dict(vars(builtins))}

    def hook(name, *args, **kwargs):
        seen.append(name)
        return builtins.__import__(name, *args, **kwargs)
    namespace["__builtins__"]["__import__"] = hook
    exec("def f(x):\n    import math\n    return x * math.pi\n", namespace)
    kiln.reset()
    out = kiln.compile(namespace["f"], backend="eager")(torch.ones(2))
    assert torch.equal(out, torch.ones(2) * math.pi) and seen == ["math"]


def test_builtins_shadowed_deleted_and_given_as_dict_or_module():
    for builtins_obj in (builtins, dict(vars(builtins))):
        namespace = {"__builtins__": builtins_obj, "torch": torch}
        exec("def f(x):\n    return x * len([1, 2])\n", namespace)
        f = namespace["f"]
        kiln.reset()
        cf = kiln.compile(f, backend="eager")
        assert torch.equal(cf(torch.ones(2)), f(torch.ones(2)))
        namespace["len"] = lambda v: 10          # a module global shadows the builtin
        assert torch.equal(cf(torch.ones(2)), torch.full((2,), 10.0))
        del namespace["len"]
        assert torch.equal(cf(torch.ones(2)), torch.full((2,), 2.0))
    namespace = {"torch": torch, "scale": 3}
    exec("def g(x):\n    return x * scale\n", namespace)
    kiln.reset()
    cg = kiln.compile(namespace["g"], backend="eager")
    assert torch.equal(cg(torch.ones(2)), torch.full((2,), 3.0))
    del namespace["scale"]                       # a deleted global: NameError, as in eager
    with pytest.raises(NameError):
        cg(torch.ones(2))


# -- 2. the attribute protocol -------------------------------------------------------------------

class Doubling:
    def __init__(self):
        self.calls = 0

    def __setattr__(self, name, value):
        if name != "calls":
            object.__setattr__(self, "calls", self.calls + 1)
            value = value * 2
        object.__setattr__(self, name, value)


class Hundred:
    def __getattribute__(self, name):
        if name == "a":
            return 100
        return object.__getattribute__(self, name)


class ViaSuper:
    def __setattr__(self, name, value):
        super().__setattr__(name, value + 1)


class WithProperty:
    def __init__(self):
        self._v = 1

    @property
    def v(self):
        return self._v

    @v.setter
    def v(self, value):
        self._v = value * 10

    @property
    def frozen(self):
        return 5


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self):
        self.a = 1
        self.b = 2

    def __eq__(self, other):
        return (self.a, self.b) == (other.a, other.b)


class Fallback:
    @property
    def broken(self):
        raise AttributeError("inside the property")

    def __getattr__(self, name):
        if name == "broken":
            return f"fallback {name}"
        raise AttributeError(name)


class ScaledModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 1.0

    def __setattr__(self, name, value):
        if name == "scale":
            value = value * 3
        super().__setattr__(name, value)

    def forward(self, x):
        self.scale = 2.0
        return x * self.scale


def store_through_setattr(x, obj):
    obj.a = 3
    return x + obj.a, obj.calls


def store_then_read_through_getattribute(x, obj):
    obj.a = 5
    return x + obj.a


def new_object_with_hooks(x):
    d = Doubling()
    d.a = 4
    v = ViaSuper()
    v.b = 1
    return x * d.a + v.b + Hundred().a, d.calls


def property_setter(x, obj):
    obj.v = 2
    return x * obj.v


def property_without_setter(x, obj):
    obj.frozen = 3
    return x


def slots_store(x, obj):
    obj.a = 7
    return x + obj.a + obj.b


def getattr_after_property_error(x, obj):
    return x, obj.broken


def del_attr_hook(x):
    class Tracked:
        def __delattr__(self, name):
            object.__setattr__(self, "deleted", name)
    t = Tracked()
    t.a = 1
    del t.a
    return x + 1, t.deleted


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, make", [
    (store_through_setattr, lambda: (torch.randn(3), Doubling())),
    (store_then_read_through_getattribute, lambda: (torch.randn(3), Hundred())),
    (property_setter, lambda: (torch.randn(3), WithProperty())),
    (property_without_setter, lambda: (torch.randn(3), WithProperty())),
    (slots_store, lambda: (torch.randn(3), Slotted())),
    (getattr_after_property_error, lambda: (torch.randn(3), Fallback())),
], ids=lambda v: getattr(v, "__name__", ""))
def test_attribute_protocol_on_existing_objects(fn, make, backend):
    compare(fn, make, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attribute_hooks_of_objects_created_in_the_frame(backend):
    compare(new_object_with_hooks, T(3), backend, graphs=1, fullgraph=True)
    compare(del_attr_hook, T(3), backend)


def test_user_setattr_runs_once_and_is_not_replayed():
    obj = Doubling()
    kiln.reset()
    cf = kiln.compile(store_through_setattr, backend="eager", fullgraph=True)
    out, calls = cf(torch.zeros(2), obj)
    assert torch.equal(out, torch.full((2,), 6.0)) and calls == 1
    assert obj.a == 6 and obj.calls == 1   # the write back stores; it does not call __setattr__


def test_module_setattr_override():
    def make():
        return (ScaledModule(), torch.randn(3))

    def f(m, x):
        return m(x), m.scale
    compare(f, make, "eager", graphs=1, fullgraph=True)


class Counter:
    total = 1


def class_attribute_store(x):
    Counter.total = Counter.total + 1
    return x + Counter.total, Counter().total


def module_attribute_store(x):
    import _import_pkg

    _import_pkg.VALUE = _import_pkg.VALUE + 1
    return x + _import_pkg.VALUE


@pytest.mark.parametrize("fn, read", [
    (class_attribute_store, lambda: Counter.total),
    (module_attribute_store, lambda: sys.modules["_import_pkg"].VALUE)])
def test_class_and_module_attribute_stores_are_seen_by_later_reads(fn, read):
    import _import_pkg  # noqa: F401

    kiln.reset()
    cf = kiln.compile(fn, backend="eager")
    for _ in range(3):
        before = read()
        expected = fn(torch.zeros(2))
        after = read()
        setattr(Counter, "total", before) if fn is class_attribute_store else setattr(
            sys.modules["_import_pkg"], "VALUE", before)
        assert_same(cf(torch.zeros(2)), expected)
        assert read() == after


class ShiftedBox:
    def __init__(self, k):
        self.k = k

    def __getattribute__(self, name):
        if name == "k":
            return object.__getattribute__(self, "k") + 10
        return object.__getattribute__(self, name)

    def __eq__(self, other):
        return object.__getattribute__(self, "k") == object.__getattribute__(other, "k")


@pytest.mark.parametrize("dynamic", [None, True])
def test_guards_read_past_a_custom_getattribute(dynamic):
    def f(x, box):
        box.k += 1
        return x * box.k
    for k in (2, 3):
        compare(f, lambda: (torch.randn(3), ShiftedBox(k)), "eager", graphs=None, dynamic=dynamic)


# -- 3. locals(), vars(), dir() -------------------------------------------------------------------

def locals_plain(x):
    y = x * 2
    return list(locals()), locals()["y"]


def locals_is_one_dict(x):
    y = x * 2
    d = locals()
    z = y + 1
    return d is locals(), list(d), z


def locals_with_cells_and_break(x):
    k = 3

    def g():
        return k + 1
    y = x * k
    print("break")
    z = y + g()
    return list(locals()), locals()["k"], sorted(vars()), dir(), z


def make_closure():
    w = 5

    def inner(x):
        q = x * w
        return list(locals()), locals()["w"], q
    return inner


@pytest.mark.parametrize("fn, graphs", [(locals_plain, 1), (locals_is_one_dict, 1),
                                        (locals_with_cells_and_break, 2), (make_closure(), 1)],
                         ids=["plain", "one_dict", "cells_break", "free_vars"])
def test_locals_is_what_python_returns(fn, graphs, capsys):
    # (the closure g is a new function on every call: its continuation is guarded on it)
    compare(fn, T(3), "eager", graphs=graphs, capsys=capsys, warm=fn is not locals_with_cells_and_break)


def test_locals_after_a_break_has_no_kiln_names():
    def f(x):
        y = x + 1
        print("break")
        z = y * 2
        return sorted(locals()), dir(), z
    kiln.reset()
    names, d, _ = kiln.compile(f, backend="eager")(torch.ones(2))
    assert names == d == ["x", "y", "z"]


def locals_dict_kept_across_a_break(x):
    """Before Python 3.13 a frame keeps one ``locals()`` dict: a key the function adds to it
    stays, through a graph break too (Thunder's locals lookaside test)."""
    d = locals()
    d["added"] = 5
    print("break")
    y = x + locals()["added"]
    return locals() is d, sorted(locals()), y


def test_the_locals_dict_is_handed_to_the_continuation(capsys):
    compare(locals_dict_kept_across_a_break, T(3), "eager", graphs=1, capsys=capsys, warm=False)   # (before the print: no op)
    same, names, _ = kiln.compile(locals_dict_kept_across_a_break, backend="eager")(torch.ones(2))
    assert same and names == ["added", "d", "x", "y"]



LOG = []


def locals_in_a_handler_that_runs_natively(x, xs):
    """After a break inside an except block the frame goes on natively: its locals(), vars()
    and dir() are the user's frame's, without the break's stack slots or cell holders, and
    a cell not yet set is not there."""
    for e1 in xs:
        try:
            x.view(3, 7)
        except RuntimeError:
            print("bad op")
        LOG.append((sorted(locals()), sorted(vars()), dir(), "x" in locals(), vars(x.__class__) is not None))
    count = 0

    def bump(t):
        nonlocal count
        count += 1
        return t * count
    y = bump(x)
    LOG.append(sorted(locals()))
    return y


def test_locals_vars_dir_in_code_that_runs_natively_after_a_break(capsys):
    LOG.clear()
    eager = locals_in_a_handler_that_runs_natively(torch.ones(2, 2), [1, 2])
    expected = list(LOG)
    LOG.clear()
    kiln.reset()
    got = kiln.compile(locals_in_a_handler_that_runs_natively, backend="eager")(torch.ones(2, 2), [1, 2])
    assert LOG == expected
    assert expected[0][0] == ["e1", "x", "xs"] and expected[-1] == ["bump", "count", "e1", "x", "xs", "y"]
    torch.testing.assert_close(got, eager)


def locals_called_where_the_break_is(x, log):
    """``locals()`` itself breaks the graph in the loop's continuation (the cell ``count``, handed
    over empty, cannot be read there): the break function calls it natively, in a generated
    frame whose own variables are not the user's."""
    i = 0
    while i < 3:
        print("locals", sorted(locals()), vars().get("count"), file=log)
        i += 1
    count = 0

    def bump(t):
        nonlocal count
        count += 1
        return t * count
    y = bump(x)
    print("locals", sorted(locals()), file=log)
    return y


def test_locals_called_at_a_graph_break_are_the_users():
    import io

    logs = [io.StringIO(), io.StringIO()]
    eager = locals_called_where_the_break_is(torch.ones(2), logs[0])
    kiln.reset()
    got = kiln.compile(locals_called_where_the_break_is, backend="eager")(torch.ones(2), logs[1])
    assert logs[1].getvalue() == logs[0].getvalue()
    assert "'i', 'log', 'x'] None" in logs[0].getvalue()
    torch.testing.assert_close(got, eager)


def shadowed_locals(x):
    try:
        x.view(3, 7)
    except RuntimeError:
        print("bad op")
    return locals(), x + 1


def test_a_module_that_shadows_locals_keeps_its_own():
    g = dict(shadowed_locals.__globals__)
    g["locals"] = lambda: "the module's own"
    fn = type(shadowed_locals)(shadowed_locals.__code__, g, "shadowed_locals")
    kiln.reset()
    assert kiln.compile(fn, backend="eager")(torch.ones(2, 2))[0] == "the module's own"


# -- 4. augmented assignment ---------------------------------------------------------------------

INPLACE = ["+=", "-=", "*=", "/=", "//=", "%=", "**=", "@=", "&=", "|=", "^=", "<<=", ">>="]
_BITWISE = {"&=", "|=", "^=", "<<=", ">>="}


def _augmented(op: str, left: str, right: str):
    namespace = {"torch": torch}
    exec(f"def f(x, y):\n    a = {left}\n    a {op} {right}\n    return a, x, y\n", namespace)
    return namespace["f"]


def _operands(op):
    if op == "@=":
        return lambda: (torch.randn(3, 3), torch.randn(3, 3))
    if op in _BITWISE:
        return lambda: (torch.randint(1, 4, (3, 3)), torch.randint(1, 3, (3, 3)))
    return lambda: (torch.rand(3, 3) + 1, torch.rand(3, 3) + 1)


# every operator captured, a few of them also through the AOT stage
_OP_BACKENDS = [(op, "eager") for op in INPLACE] + [(op, "aot_eager") for op in ("+=", "/=", "@=", "|=")]


@pytest.mark.parametrize("op, backend", _OP_BACKENDS)
def test_augmented_assignment_to_a_python_number(op, backend):
    lefts = ["0", "True", "x.shape[0]"] + ([] if op in _BITWISE else ["1.5"])
    for left in lefts:   # (a number @ a tensor is a TypeError, raised as eager raises it)
        compare(_augmented(op, left, "x"), _operands(op), backend, graphs=0 if op == "@=" else 1)


@pytest.mark.parametrize("op, backend", _OP_BACKENDS)
def test_augmented_assignment_to_a_tensor(op, backend):
    # a tensor's own in-place method mutates it (x and a are one object); Tensor has no
    # __imatmul__, so ``a @= y`` rebinds a and leaves x alone
    compare(_augmented(op, "x", "y"), _operands(op), backend, graphs=1)
    compare(_augmented(op, "x", "2"), _operands(op), backend, graphs=0 if op == "@=" else 1)


def test_accumulating_into_a_number_under_dynamic_shapes():
    def f(x, n):
        acc = 0
        for i in range(3):
            acc += x * i
        acc += n
        return acc
    for n in (3, 4, 5):
        kiln.reset()
        out = kiln.compile(f, backend="eager", dynamic=True, fullgraph=True)(torch.ones(2), n)
        assert torch.equal(out, f(torch.ones(2), n))


# -- 5. constants in graph code ------------------------------------------------------------------

CONSTANT_CASES = {
    "legacy_tensor_type": lambda x: x.type(torch.HalfTensor),
    "type_name": lambda x: x.type("torch.DoubleTensor"),
    "nan": lambda x: x.masked_fill(x > 0, float("nan")),
    "minus_inf": lambda x: x.masked_fill(x > 0, float("-inf")),
    "minus_zero": lambda x: torch.full_like(x, -0.0),
    "complex": lambda x: x + complex(1.5, -2.0),
    "ellipsis": lambda x: x[..., None],
    "device": lambda x: x.to(torch.device("cpu")),
    "memory_format": lambda x: x.reshape(1, 1, 2, 3).contiguous(memory_format=torch.channels_last),
    "layout_dtype": lambda x: torch.zeros(2, 3, layout=torch.strided, dtype=torch.float64) + x,
    "size": lambda x: x.view(torch.Size([3, 2])),
    "nested_tuple": lambda x: x.sum(dim=(0, 1)),
    "pad_minus_zero": lambda x: torch.nn.functional.pad(x, (1, 1), value=-0.0),
    "dtype_class_kwarg": lambda x: x.new_zeros((2,), dtype=torch.int32) + 1,
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CONSTANT_CASES))
def test_constants_reach_graph_code(name, backend):
    fn = CONSTANT_CASES[name]
    x = torch.randn(2, 3)
    expected = fn(x)
    kiln.reset()
    got = kiln.compile(fn, backend=backend, fullgraph=True)(x)
    assert_same(got, expected)
    assert got.stride() == expected.stride()
    if not got.is_complex() and got.is_floating_point():
        assert torch.equal(torch.signbit(got), torch.signbit(expected))   # -0.0 stays -0.0


def test_unprintable_constants_are_held_by_the_graph_module():
    from kiln.capture.graph_constants import fx_argument

    marker = object()
    bind = lambda obj: marker  # noqa: E731
    for printable in (1, -0.0, math.nan, math.inf, "s", b"b", None, Ellipsis, torch.float16,
                      torch.device("cpu"), torch.strided, torch.channels_last, torch.Size([2]),
                      slice(1, None), (1, (2.0, None)), complex(1, 2)):
        assert repr(fx_argument(printable, bind)) == repr(printable)   # printed as it is
    for unprintable in (torch.HalfTensor, operator.add, math, complex(0.0, -0.0), frozenset({1}),
                        object()):
        assert fx_argument(unprintable, bind) is marker
    assert fx_argument((1, torch.HalfTensor), bind) == (1, marker)


# -- 6. exceptions across graph breaks ---------------------------------------------------------

def bare_raise_after_break(x):
    try:
        raise ValueError("boom")
    except ValueError:
        print("handling")
        raise


def raise_from_after_break(x):
    try:
        raise ValueError("boom")
    except ValueError as e:
        y = x + 1
        print("handling")
        raise KeyError(f"{y.shape}") from e


def chained_after_break(x):
    try:
        raise ValueError("boom")
    except ValueError:
        print("handling")
        raise KeyError("k")


def exc_info_after_break(x):
    try:
        raise ValueError("boom")
    except ValueError:
        y = x * 2
        print("handling")
        info = sys.exc_info()
        return y, type(info[1]).__name__, str(info[1])


def exc_info_after_the_handler(x):
    try:
        raise ValueError("boom")
    except ValueError:
        print("handling")
        y = x * 2
    return y, sys.exc_info()


def nested_handlers(x):
    try:
        try:
            raise ValueError("outer")
        except ValueError:
            try:
                raise KeyError("inner")
            except KeyError:
                print("nested")
                y = x + 1
                inner = str(sys.exc_info()[1])
            outer = str(sys.exc_info()[1])
            raise
    except ValueError as e:
        return y, inner, outer, str(e)


def finally_around_a_break(x):
    try:
        y = x + 1
        print("body")
        return y
    finally:
        print("finally")


def finally_with_an_exception(x):
    try:
        raise ValueError("boom")
    finally:
        print("finally")


def handler_in_a_loop(x):
    for i in range(3):
        try:
            if i == 1:
                raise ValueError(i)
            x = x + 1
        except ValueError:
            print("except", i)
            x = x * 2
    return x


@pytest.mark.parametrize("fn", [bare_raise_after_break, raise_from_after_break, chained_after_break,
                                exc_info_after_break, exc_info_after_the_handler, nested_handlers,
                                finally_around_a_break, finally_with_an_exception, handler_in_a_loop])
def test_exceptions_across_graph_breaks(fn, capsys):
    compare(fn, T(3), "eager", capsys=capsys)


def test_exception_chaining_after_a_break():
    for fn in (raise_from_after_break, chained_after_break):
        kiln.reset()
        cf = kiln.compile(fn, backend="eager")
        with pytest.raises(KeyError) as got:
            cf(torch.ones(2))
        with pytest.raises(KeyError) as expected:
            fn(torch.ones(2))
        for a, b in ((got.value, expected.value),):
            assert type(a.__context__) is type(b.__context__) and str(a.__context__) == str(b.__context__)
            assert type(a.__cause__) is type(b.__cause__)
            assert a.__suppress_context__ == b.__suppress_context__
        assert sys.exc_info()[1] is None


def _last_frame(exc):
    import traceback

    last = traceback.extract_tb(exc.__traceback__)[-1]
    return last.lineno, last.line


@pytest.mark.parametrize("fn", [bare_raise_after_break, nested_handlers, chained_after_break])
def test_a_reraised_exception_is_the_original(fn):
    # the frame goes on natively from the raise: the exception the handler re-raises is the
    # one raised (its traceback ends at the user's raise statement, as in eager)
    kiln.reset()
    cf = kiln.compile(fn, backend="eager")
    for run in (fn, cf):
        try:
            run(torch.ones(2))
        except Exception as e:  # noqa: BLE001
            seen = (type(e), _last_frame(e), type(e.__context__))
        else:
            seen = None
        if run is fn:
            expected = seen
    assert seen == expected


def test_an_unhandled_raise_after_captured_work():
    def f(x):
        y = x * 2
        if y.shape[0] == 2:
            raise ValueError(f"bad {y.shape[0]}")
        return y
    _, counter = compare(f, T(2), "eager", graphs=1)


# -- 7. zero-argument super() in resumed frames --------------------------------------------------

class PrintingLinear(torch.nn.Linear):
    def forward(self, x):
        print("forward")
        return super().forward(x) * 2


class SuperAfterDel(torch.nn.Linear):
    def forward(self, x):
        y = x * 2
        print("forward")
        del x
        return super().forward(y)


class SelfInACell(torch.nn.Linear):
    def forward(self, x):
        bias = lambda: self.bias  # noqa: E731
        print("forward")
        return super().forward(x) + bias()


class Triple(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3


class Base:
    def scale(self, t):
        return t * 3


class Derived(Base):
    def scale(self, t):
        print("derived")
        return super().scale(t) + 1


@pytest.mark.parametrize("cls", [PrintingLinear, SuperAfterDel, SelfInACell])
def test_super_in_a_resumed_method(cls, capsys):
    torch.manual_seed(0)
    m = cls(3, 3)
    compare(lambda x: m(x), T(2, 3), "eager", capsys=capsys)


def test_super_in_plain_classes_and_autograd_function_apply(capsys):
    d = Derived()
    compare(lambda x: d.scale(x), T(3), "eager", capsys=capsys)
    compare(lambda x: Triple.apply(x) + 1, T(3), "eager")


# -- 8. resume code the fuzzer broke ----------------------------------------------------------

def assert_in_a_with_block(x):
    with torch.no_grad():
        assert dd(x) < 1e6, "shape"
    return x * 2


def short_circuit_in_nested_with(x, y):
    with torch.no_grad():
        with torch.enable_grad():
            y = ((x.sum() > 0) and y * 0.5 or x) + dd(y)
    return y


def list_display_across_a_break(x, y):
    return [x, dd(y), *[y]][0] + sum([t * dd(t) for t in (x, y)])


def dict_display_across_a_break(x, y):
    d = {"a": x, "b": dd(y), **{"c": y}}
    return d["a"] * d["b"] + d["c"]


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("fn", [assert_in_a_with_block, short_circuit_in_nested_with,
                                list_display_across_a_break, dict_display_across_a_break])
def test_breaks_the_fuzzer_found(fn, dynamic):
    nargs = fn.__code__.co_argcount
    # the same values on every call: the continuations specialize on the floats read
    _, counter = compare(fn, lambda: tuple(torch.arange(3.0) * (k + 1) for k in range(nargs)),
                         "eager", dynamic=dynamic)
    assert counter.frame_count >= 1   # compiled, not run eagerly after an internal error


def test_graph_that_only_hands_back_a_size_under_dynamic_shapes():
    def f(x, n):
        with torch.no_grad():
            m = n + 0
        return m, x.shape[0]
    for n in (3, 4, 5):
        kiln.reset()
        cf = kiln.compile(f, backend="eager", dynamic=True)
        assert cf(torch.ones(n), n) == (n, n)
        assert not any(e.is_eager for e in cf.entries)


def test_iterating_a_tensor_gives_the_rows_of_unbind():
    def f(w):
        w = w * 2
        for row in w:
            row[0] = 0.0
        return w
    compare(f, lambda: (torch.randn(4, 4),), "eager", graphs=1)
    # rows of unbind (one multi-output view op) cannot change in place under autograd
    compare(f, lambda: (torch.randn(4, 4, requires_grad=True),), "eager")


def test_sequence_times_a_float_raises_type_error():
    def f(x):
        return [x] * 2.0
    compare(f, T(2))


def test_dunder_class_of_tensors_containers_and_constants():
    """``x.__class__`` was a method value named "__class__" for tensors and builtin containers
    (``x.__class__.__name__`` gave "__class__"): it is the value's class, as type(x)."""
    import kiln as _kiln
    from torch import nn as _nn

    def f(x, p, xs, n):
        return (x.__class__.__name__, x.__class__ is torch.Tensor, p.__class__ is _nn.Parameter,
                p.__class__.__name__, xs.__class__.__name__, xs.__class__ is list, n.__class__.__name__,
                (x * 2).__class__.__name__)

    args = (torch.randn(3), _nn.Parameter(torch.randn(2)), [torch.randn(2)], 3)
    assert _kiln.compile(f, backend="eager")(*args) == f(*args)


# -- custom __getattribute__ with __getattr__ ---------------------------------------------------

CALLS = []


class Watched:
    """Records every attribute lookup that reaches its own code, in order."""
    kind = 7

    def __init__(self):
        object.__setattr__(self, "inst", 3)

    def __getattribute__(self, name):
        CALLS.append(("__getattribute__", name))
        if name.startswith("missing"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name):
        CALLS.append(("__getattr__", name))
        if name == "missing_for_good":
            raise AttributeError(name)
        return 5

    def method(self):
        return 2


WATCHED = Watched()


def reads_an_argument(t, w):
    return (t + w.inst + w.kind + w.missing_a + w.method() + getattr(w, "missing_for_good", 11)
            + hasattr(w, "missing_for_good") + hasattr(w, "inst"))


def reads_a_global(t):
    return t + WATCHED.inst + WATCHED.missing_b


def reads_a_new_object(t):
    w = Watched()
    w.b = 4
    return t + w.b + w.missing_c


@pytest.mark.parametrize("fn, extra", [(reads_an_argument, True), (reads_a_global, False), (reads_a_new_object, False)],
                         ids=["argument", "global", "made_inside"])
def test_getattribute_and_getattr_run_as_in_python(fn, extra):
    """Only the lookups the program makes reach the object's code, in Python's order (kiln's
    own type checks never do: isinstance would read __class__ through __getattribute__)."""
    args = (torch.ones(2), Watched()) if extra else (torch.ones(2),)
    for _ in range(2):
        CALLS.clear()
        expected = fn(*args)
        eager_calls = list(CALLS)
        CALLS.clear()
        kiln.reset()
        got = kiln.compile(fn, backend="eager")(*args)
        assert CALLS == eager_calls
        torch.testing.assert_close(got, expected)


# -- an error raised inside a compiled graph, at the user's line ---------------------------------

SINK = io.StringIO()


def view_used_after_its_base_changed(x, v):
    parts = list(v.split(2, dim=-1))
    for _ in x:
        with torch.no_grad():
            print("step", file=SINK)          # a break: the loop body is a continuation
            v *= 2
        total = sum(parts)                    # autograd refuses the stale view: raises here
    return total


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_an_error_raised_in_a_graph_ends_at_the_users_line(backend):
    import traceback

    def raised_at(fn):
        v = torch.randn(4, requires_grad=True)
        with pytest.raises(RuntimeError) as info:
            fn(torch.randn(2, 4), v)
        frames = [f for f in traceback.extract_tb(info.value.__traceback__) if f.filename == __file__]
        return frames[-1].name, frames[-1].line.strip()

    expected = raised_at(view_used_after_its_base_changed)
    assert expected == ("view_used_after_its_base_changed", "total = sum(parts)                    # autograd refuses the stale view: raises here")
    kiln.reset()
    assert raised_at(kiln.compile(view_used_after_its_base_changed, backend=backend)) == expected


def test_isinstance_with_a_metaclass_that_checks_the_instance_is_eagers_answer():
    """A runtime-checkable Protocol reads the instance's attributes; torch's legacy storage
    classes (``torch.BoolStorage``) compare its dtype: the answer is the real isinstance's,
    never the one the instance's class alone would give."""
    import typing

    @typing.runtime_checkable
    class HasScale(typing.Protocol):
        scale: float

    class Scaled:
        scale = 2.0

    class Plain:
        pass

    def f(x, o):
        return x * 2 if isinstance(o, HasScale) else x - 1

    compiled = kiln.compile(f, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, Scaled()), x * 2)
    torch.testing.assert_close(compiled(x, Plain()), x - 1)

    def g(x, s):
        return x + 1 if isinstance(s, torch.BoolStorage) else x

    storage = torch.BoolStorage.from_buffer(bytes([1, 0, 1]), "big")
    torch.testing.assert_close(kiln.compile(g, backend="eager")(x, storage), x + 1)


_THREAD_STATE = __import__("threading").local()


def test_a_threading_local_attribute_is_read_as_the_type_reads_it():
    """``threading.local`` keeps one dict per thread, behind its own C attribute lookup."""
    _THREAD_STATE.bias = torch.ones(2)

    def f(x):
        return torch.cat([x, _THREAD_STATE.bias])

    cnt = CompileCounter()
    compiled = kiln.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(2)
    torch.testing.assert_close(compiled(x), f(x))
    _THREAD_STATE.bias = torch.zeros(2)          # another tensor: read again, as an input
    torch.testing.assert_close(compiled(x), f(x))
    assert cnt.frame_count == 1


class _Countdown:
    """An iterator class: ``__iter__`` returns the object, ``__next__`` advances it."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n <= 0:
            raise StopIteration
        self.n -= 1
        return self.n


_LIVE_COUNTDOWN = _Countdown(5)


def test_an_iterator_class_is_advanced_by_its_own_next():
    def f(x):
        for i in _Countdown(3):
            x = x + i
        a, b = _Countdown(2)
        return x, list(_Countdown(4)), a - b

    cnt = CompileCounter()
    x = torch.randn(2)
    torch.testing.assert_close(kiln.compile(f, backend=cnt, fullgraph=True)(x), f(x))
    assert cnt.frame_count == 1

    def g(x):                       # an iterator from outside, left part-way: its state is eager's
        for i in _LIVE_COUNTDOWN:
            if i == 3:
                break
        return x + i

    torch.testing.assert_close(kiln.compile(g, backend="eager")(x), x + 3)
    assert _LIVE_COUNTDOWN.n == 3


# -- callable(), super() of a class, ordering of sequences, keyword-named parameters ----------

class _CallableObject:
    def __call__(self, x):
        return x


class _Plain:
    pass


def callable_of_new_objects(x):
    # (objects made in the compiled code: callable() asks their type)
    return x + 1, [callable(v) for v in (_CallableObject(), _Plain(), x, [1], {}, (1,), lambda: 1, iter([1]))]


def test_callable_of_objects_made_in_the_compiled_code():
    compare(callable_of_new_objects, T(2), graphs=1, fullgraph=True)


class _Base:
    @classmethod
    def make(cls, x):
        return x * 5 + len(cls.__name__)

    @staticmethod
    def shift(x):
        return x - 1

    def triple(self, x):
        return x * 3


class _Derived(_Base):
    @classmethod
    def make(cls, x):
        return super().make(x) + super(_Derived, cls).shift(x)

    @staticmethod
    def shift(x):
        return super(_Derived, _Derived).shift(x) + super(_Derived, _Derived).triple(None, x)


class _MoreDerived(_Derived):
    pass


def super_of_a_class(x):
    return _Derived.make(x), _MoreDerived.make(x), _Derived.shift(x), _MoreDerived().make(x)


def test_super_with_a_class_as_second_argument():
    # super() in a classmethod, and super(C, C): the class's own MRO, bound to the class
    compare(super_of_a_class, T(3), graphs=1, fullgraph=True)


def ordered_sequences(x, t):
    return x + 1, [(1, 2) < (1, 3), (1, 2) <= (1, 2), [1, 2, 3] > [1, 2], (2,) >= (1, 9), t < (1, 2),
                   sys.version_info >= (3, 8), tuple(x.shape) >= (2, 3), tuple(x.shape) < (2, 4)]


@pytest.mark.parametrize("dynamic", [None, True])
def test_lists_and_tuples_order_lexicographically(dynamic):
    compare(ordered_sequences, lambda: (torch.randn(2, 3), (1, 1)), graphs=1, fullgraph=True, dynamic=dynamic)


def version_check_after_a_break(x):
    print("a break")
    if sys.version_info >= (3, 99):
        return x
    return x + 1, sys.version_info


def test_a_structseq_read_from_a_module_crosses_a_break(capsys):
    # (sys.version_info cannot be made again: the code after the break reads it again)
    compare(version_check_after_a_break, T(2), capsys=capsys)


def uniform_with_keyword_named_bounds(t):
    t.uniform_(**{"from": -10, "to": 10})
    return t * 2


def test_parameters_named_by_python_keywords():
    # t.uniform_(from=..., to=...) cannot be written as a keyword call in the graph's code
    kiln.reset()
    be = counted("eager")
    compiled = kiln.compile(uniform_with_keyword_named_bounds, backend=be, fullgraph=True)
    for seed in (0, 1):
        torch.manual_seed(seed)
        expected = uniform_with_keyword_named_bounds(torch.empty(5))
        torch.manual_seed(seed)
        assert_same(compiled(torch.empty(5)), expected)
    assert be.counter.frame_count == 1


# -- instance dicts beside attribute stores, tuple identity at breaks, builtins' arguments -----

class _Plain2:
    pass


class _DictDescriptor:
    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return obj.__dict__.get("v", "default")

    def __set__(self, obj, value):
        obj.__dict__["v"] = value


class _WithDescriptor:
    d = _DictDescriptor()


def attribute_then_instance_dict(obj, x):
    obj.a = 1
    before = "a" in obj.__dict__
    obj.__dict__["a"] = 2
    return x + 1, before, obj.a


def instance_dict_then_attribute(obj, x):
    obj.__dict__["a"] = 2
    obj.a = 1
    return x + 1, obj.__dict__["a"]


def instance_dict_then_descriptor(obj, x):
    obj.__dict__["v"] = "direct"
    return x + 1, obj.d


@pytest.mark.parametrize("fn,cls", [(attribute_then_instance_dict, _Plain2), (instance_dict_then_attribute, _Plain2),
                                    (instance_dict_then_descriptor, _WithDescriptor)],
                         ids=["attribute_then_dict", "dict_then_attribute", "dict_then_descriptor"])
def test_attribute_stores_and_the_instance_dict_see_each_other(fn, cls):
    kiln.reset()
    compiled = kiln.compile(fn, backend="aot_eager")
    for _ in range(2):
        e, k = cls(), cls()
        x = torch.randn(2)
        assert_same(compiled(k, x), fn(e, x))
        assert vars(k) == vars(e)


class _Pair(typing.NamedTuple):
    a: torch.Tensor


class _PairWithDict(_Pair):      # (a subclass: its instances have a __dict__)
    pass


def tuples_across_a_break(x):
    t = (x + 1, 2)
    u = t
    p = _PairWithDict(a=x * 2)
    p.c = 3                      # (a break: setting an attribute of a namedtuple)
    print("a break")
    return t is u, p, p.c


def test_tuples_keep_their_identity_across_a_break(capsys):
    kiln.reset()
    compiled = kiln.compile(tuples_across_a_break, backend="aot_eager")
    x = torch.randn(2)
    expected = tuples_across_a_break(x)
    got = compiled(x)
    assert_same(got, expected)
    assert got[1].c == 3


def builtins_with_wrong_arguments(x, case):
    if case == 0:
        return isinstance(x, torch.Tensor, invalid=True)
    if case == 1:
        return len([x], foo=1)
    if case == 2:
        return getattr(x, "shape", default=1)
    if case == 3:
        return isinstance(x)
    return callable(x, k=1)


@pytest.mark.parametrize("case", range(5))
def test_builtins_reject_arguments_as_eager(case):
    compare(builtins_with_wrong_arguments, lambda: (torch.randn(2), case))


# -- truth and len through user classes, container subclasses' operators, abstract classes -----

class _BoolReturns:
    def __init__(self, r):
        self.r = r

    def __bool__(self):
        return self.r


class _LenReturns:
    def __init__(self, r):
        self.r = r

    def __len__(self):
        return self.r


def truth_of(x, obj):
    return x + 1, bool(obj), "yes" if obj else "no"


def len_of(x, obj):
    return x + 1, len(obj)


@pytest.mark.parametrize("r", [True, 1.2, 1, 0])
def test_bool_takes_only_a_bool_from_dunder_bool(r):
    compare(truth_of, lambda: (torch.randn(2), _BoolReturns(r)))


@pytest.mark.parametrize("r", [3, True, -1, 1.5, 2 ** 70])
def test_len_checks_what_dunder_len_returns(r):
    compare(len_of, lambda: (torch.randn(2), _LenReturns(r)))


class _FalseList(list):
    def __bool__(self):
        return False


class _EmptyDict(dict):
    def __len__(self):
        return 0


class _FalseMeta(type):
    def __bool__(cls):
        return False


class _FalseClass(metaclass=_FalseMeta):
    pass


def truth_of_overriding_containers(x):
    lst, d = _FalseList([1]), _EmptyDict(a=1)
    return x + 1, bool(lst), not d, "yes" if _FalseClass else "no", bool(_FalseClass)


def test_truth_of_container_subclasses_and_classes_uses_their_overrides():
    compare(truth_of_overriding_containers, T(2), graphs=1, fullgraph=True)


class _AddList(list):
    def __add__(self, o):
        return "added"

    def __eq__(self, o):
        return True

    def __reversed__(self):
        return iter(["r"])


class _MissingDefault(collections.defaultdict):
    def __missing__(self, k):
        return "missing"


class _OwnIter(dict):
    def __iter__(self):
        return iter(["z"])

    def keys(self):
        return ["z"]

    def __getitem__(self, k):
        return "item"


def container_subclass_operators(x, d):
    lst = _AddList([1, 2])
    dd = _MissingDefault(int)
    e = {}
    e.update(d)
    return x + 1, lst + [3], lst == [9], list(reversed(lst)), dd["q"], len(dd), dict(d), e


def test_operators_of_container_subclasses_are_their_own():
    # (not through compare(): a dict whose __iter__ lies cannot be deep-copied)
    kiln.reset()
    compiled = kiln.compile(container_subclass_operators, backend="aot_eager")
    for _ in range(2):
        x = torch.randn(2)
        assert_same(compiled(x, _OwnIter(a=1)), container_subclass_operators(x, _OwnIter(a=1)))


class _Abstract(abc.ABC):
    @abc.abstractmethod
    def m(self):
        ...


def make_abstract(x):
    try:
        _Abstract()
    except TypeError as e:
        return x + 1, str(e)
    return x - 1, "made"


def test_an_abstract_class_cannot_be_instantiated():
    compare(make_abstract, T(2))


SHARED_GLOBAL = 1


def _store_through_globals_dict(x):
    globals()["SHARED_GLOBAL"] = 9
    return x + SHARED_GLOBAL


def _store_through_module_dict(x):
    sys.modules[__name__].__dict__["SHARED_GLOBAL"] = 9
    return x + SHARED_GLOBAL


def _store_both_ways(x):
    global SHARED_GLOBAL
    globals()["SHARED_GLOBAL"] = 9
    SHARED_GLOBAL += 1
    return x + SHARED_GLOBAL


def _store_then_read_dict(x):
    global SHARED_GLOBAL
    SHARED_GLOBAL = 5
    return x + globals()["SHARED_GLOBAL"]


@pytest.mark.parametrize("fn", [_store_through_globals_dict, _store_through_module_dict, _store_both_ways,
                                _store_then_read_dict])
@pytest.mark.parametrize("backend", BACKENDS)
def test_globals_written_through_their_dict_are_read_as_globals(fn, backend):
    """The frame's globals dict reached as a dict (``globals()``, ``module.__dict__``) and its
    globals read or written by name are one state, in the capture and written back after it."""
    global SHARED_GLOBAL
    x = torch.ones(2)
    SHARED_GLOBAL = 1
    expected, expected_after = fn(x), SHARED_GLOBAL
    SHARED_GLOBAL = 1
    got = kiln.compile(fn, backend=backend)(x)
    torch.testing.assert_close(got, expected)
    assert SHARED_GLOBAL == expected_after
    SHARED_GLOBAL = 1


def _delete_then_read(x):
    global SHARED_GLOBAL
    y = x + SHARED_GLOBAL
    del SHARED_GLOBAL
    try:
        return y + SHARED_GLOBAL
    except NameError:
        return y * 10


def _assign_then_delete(x):
    global SHARED_GLOBAL
    SHARED_GLOBAL = 5
    del SHARED_GLOBAL
    return x + 1


@pytest.mark.parametrize("fn", [_delete_then_read, _assign_then_delete])
def test_a_deleted_global_is_gone_in_the_capture_and_after_it(fn):
    global SHARED_GLOBAL
    x = torch.ones(2)
    SHARED_GLOBAL = 1
    expected = fn(x)
    assert "SHARED_GLOBAL" not in globals()
    SHARED_GLOBAL = 1
    counter = CompileCounter()
    torch.testing.assert_close(kiln.compile(fn, backend=counter)(x), expected)
    assert "SHARED_GLOBAL" not in globals()
    assert counter.frame_count == 1
    SHARED_GLOBAL = 1


def _delete_global_or_count(x):
    global MAYBE_GLOBAL
    y = x + 1
    try:
        del MAYBE_GLOBAL
    except NameError:
        y = y + 1
    return y


@pytest.mark.parametrize("present_first", [True, False])
def test_whether_a_deleted_global_is_there_is_guarded(present_first):
    """``del g`` deletes the global or raises NameError: which one is decided by the global's
    presence, guarded for the next call."""
    cf = kiln.compile(_delete_global_or_count, backend="eager")
    g = _delete_global_or_count.__globals__
    for present in (present_first, not present_first, present_first):
        outs = []
        for fn in (_delete_global_or_count, cf):
            if present:
                g["MAYBE_GLOBAL"] = 1
            else:
                g.pop("MAYBE_GLOBAL", None)
            outs.append((fn(torch.zeros(1)).item(), "MAYBE_GLOBAL" in g))
        assert outs[0] == outs[1]


class _Slotted:
    __slots__ = ("x", "__dict__")


class _SlottedBase:
    __slots__ = ("x",)


class _SubOfSlotted(_SlottedBase):       # a subclass without __slots__: the slot and a __dict__
    pass


def _slot_value(o):
    try:
        return _SlottedBase.x.__get__(o) if isinstance(o, _SlottedBase) else _Slotted.x.__get__(o)
    except AttributeError:
        return "<unset>"


def _read_dict_then_store_the_slot(o, t):
    d = vars(o)
    o.x = 1
    o.y = 2
    return t + 1, dict(d), _slot_value(o)


def _store_the_slot_then_read_dict(o, t):
    o.x = 3
    o.y = 4
    return t + 1, dict(o.__dict__), o.x


def _copy_of_a_slotted_object(t):
    a = _SubOfSlotted()
    a.x = 10
    a.z = 5
    b = copy.copy(a)
    return t + 1, _slot_value(b), dict(b.__dict__)


@pytest.mark.parametrize("fn, make", [
    (_read_dict_then_store_the_slot, _Slotted), (_read_dict_then_store_the_slot, _SubOfSlotted),
    (_store_the_slot_then_read_dict, _Slotted), (_store_the_slot_then_read_dict, _SubOfSlotted),
    (lambda o, t: _copy_of_a_slotted_object(t), _Slotted),
], ids=["dict then slot", "dict then inherited slot", "slot then dict", "inherited slot then dict", "copy"])
def test_a_slot_beside_an_instance_dict_stays_a_slot(fn, make):
    """An object with ``__slots__`` and a ``__dict__`` (a subclass of a slotted class): storing
    a slot member goes to the slot, never into ``__dict__``, also after ``__dict__`` was read
    (``copy.copy`` restores the slots that way)."""
    t = torch.ones(2)
    want_obj, got_obj = make(), make()
    want = fn(want_obj, t)
    got = kiln.compile(fn, backend="eager")(got_obj, t)
    assert_same(got, want)
    assert vars(got_obj) == vars(want_obj) and _slot_value(got_obj) == _slot_value(want_obj)


def _dict_display_unpacking(x, other):
    out = [{**{"a": 1}, **collections.OrderedDict(b=2)}]
    try:
        out.append({**other})
    except TypeError as e:
        out.append(str(e))
    return x + 1, out


@pytest.mark.parametrize("other", [[("a", 1)], (), "", {"k": 1}], ids=["pairs", "tuple", "str", "dict"])
def test_dict_display_unpacking_takes_mappings_only(other):
    """``{**x}`` takes a mapping, not the key/value pairs ``dict.update`` also takes."""
    x = torch.ones(2)
    assert_same(kiln.compile(_dict_display_unpacking, backend="eager")(x, other), _dict_display_unpacking(x, other))


# -- unbound names, sorting, sequence errors ------------------------------------------------------

def _read_unbound_local(x):
    try:
        print(y)      # noqa: F821 - assigned below: a local, unbound here
    except UnboundLocalError as e:
        msg = str(e)
    y = 1
    return x + y, msg


def _read_unbound_cell(x):
    try:
        v = y          # noqa: F821 - a cell of this frame, read before it is bound
    except UnboundLocalError as e:
        v = str(e)

    def inner():
        return y
    y = 2
    return x + inner(), v


def _delete_unbound_local(x):
    if x.sum() > 1e9:
        z = 1
    try:
        del z
        out = "deleted"
    except UnboundLocalError as e:
        out = str(e)
    return x * 2, out


def _cell_deleted_after_a_break(x):
    """The frame's own cell variable, deleted after a graph break and read or deleted again:
    the continuation holds the cell in a local, and an empty one still raises
    UnboundLocalError, which ``except NameError`` catches."""
    y = x * 2

    def inner():
        return y
    print(end="")           # a graph break: the rest runs in a continuation
    first = inner() + y
    del y
    out = []
    try:
        out.append(y)
    except NameError as e:
        out.append(f"{type(e).__name__}: {e}")
    try:
        del y
    except NameError as e:
        out.append(f"{type(e).__name__}: {e}")
    y = 5
    return first, out, inner()


def _tuple_index_error(x):
    t = (x, x)
    try:
        return t[5]
    except IndexError as e:
        return x, str(e)


def _sort_sees_an_empty_list(x):
    p = [3, 1, 2]
    seen = []
    p.sort(key=lambda v: (seen.append(len(p)), v)[1])
    return x + p[0], seen, p


def _sort_modified_during_sort(x):
    p = [3, 1, 2]
    try:
        p.sort(key=lambda v: (p.append(0), v)[1])
    except ValueError as e:
        return x, str(e), p
    return x, "", p


class _Bare:
    pass


def _error_messages(x):
    """CPython's messages for errors a program may catch and show."""
    out = []
    o, lst = _Bare(), [1]
    for attempt in (lambda: delattr(o, "zz"), lambda: lst.__delitem__(5), lambda: lst.__setitem__(3, 1),
                    lambda: lst.pop(3)):
        try:
            attempt()
        except (AttributeError, IndexError) as e:
            out.append(str(e))
    try:
        del o.zz
    except AttributeError as e:
        out.append(str(e))
    try:
        del lst[5]
    except IndexError as e:
        out.append(str(e))
    try:
        lst[3] = 1
    except IndexError as e:
        out.append(str(e))
    for items in ([1, 2, 3], [1]):
        try:
            a, b = items
        except ValueError as e:
            out.append(str(e))
    try:
        a, *b, c = lst
    except ValueError as e:
        out.append(str(e))
    return x, out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_read_unbound_local, _read_unbound_cell, _delete_unbound_local,
                                _cell_deleted_after_a_break, _tuple_index_error, _sort_sees_an_empty_list, _sort_modified_during_sort,
                                _error_messages])
def test_unbound_names_sorting_and_index_errors_as_cpython(fn, backend):
    x = torch.ones(3)
    assert_same(kiln.compile(fn, backend=backend)(x), fn(x))
