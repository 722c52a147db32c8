"""bytecode_utils: the one place where CPython 3.11 and 3.12 differ. These tests run on both
(CI: 3.11; the GPU machine: 3.12) and check that the normalized stream is the same shape."""
import sys

import pytest
import torch

import kiln
from kiln.capture import bytecode_utils as bu
from kiln.testing import CompileCounter, assert_same


def _ops(fn):
    return [i.opname for i in bu.decode(fn.__code__)]


def test_jumps_are_normalized():
    def f(a, b):
        if a is None:
            return b
        while a > 0:
            a -= 1
        return a if a else b

    ops = set(_ops(f))
    assert not any(o.startswith(("POP_JUMP_FORWARD", "POP_JUMP_BACKWARD", "JUMP_FORWARD",
                                 "JUMP_BACKWARD")) for o in ops)
    assert "JUMP" in ops and ("POP_JUMP_IF_NONE" in ops or "POP_JUMP_IF_NOT_NONE" in ops)
    for ins in bu.decode(f.__code__):
        if ins.opname.startswith(("POP_JUMP", "JUMP")):
            assert ins.target is not None and 0 <= ins.target <= len(bu.decode(f.__code__))


def test_method_loads_are_normalized():
    def f(x):
        return x.sum(), x.shape

    loads = [i for i in bu.decode(f.__code__) if i.opname == "LOAD_ATTR"]
    assert [l.arg for l in loads] == [(True, "sum"), (False, "shape")]
    assert "LOAD_METHOD" not in _ops(f) and "PRECALL" not in _ops(f)


def test_for_iter_exit_skips_end_for_on_312():
    def f(xs):
        for x in xs:
            pass
        return 1

    instrs = bu.decode(f.__code__)
    (fi,) = [i for i in instrs if i.opname == "FOR_ITER"]
    assert instrs[fi.target].opname != "END_FOR"


def test_line_numbers_are_known_for_every_instruction():
    def f(x):
        y = x + 1
        return y

    assert all(i.lineno is not None for i in bu.decode(f.__code__))


def test_decode_is_cached():
    def f(x):
        return x

    assert bu.decode(f.__code__) is bu.decode(f.__code__)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="3.12 inlines comprehensions (PEP 709)")
def test_312_inlined_comprehension_keeps_outer_binding():
    def f(x):
        i = 10
        ys = [x * i for i in range(3)]
        return ys, i

    cnt = CompileCounter()
    out = kiln.compile(f, backend=cnt, fullgraph=True)(t := torch.randn(2))
    assert_same(out, f(t))
    assert "LOAD_FAST_AND_CLEAR" in _ops(f)


def test_comprehension_does_not_leak_or_clobber():
    def f(x):
        i = 10
        ys = [x * i for i in range(3)]
        d = {k: x + k for k in range(2)}
        return ys, d, i

    t = torch.randn(2)
    assert_same(kiln.compile(f, fullgraph=True, backend="eager")(t), f(t))


def test_yield_from_inside_inlined_generator():
    def gen(xs):
        yield from xs
        yield xs[0] * 2

    def f(a, b):
        return list(gen([a, b]))

    a, b = torch.randn(2), torch.randn(2)
    assert_same(kiln.compile(f, fullgraph=True, backend="eager")(a, b), f(a, b))


def test_binary_and_compare_names():
    assert bu.binary_op_name(0) == "ADD" and bu.binary_op_name(13) == "INPLACE_ADD"
    def f(a, b):
        return a < b, a == b, a >= b

    names = [bu.compare_op_name(i.arg) for i in bu.decode(f.__code__) if i.opname == "COMPARE_OP"]
    assert names == ["LT", "EQ", "GE"]
