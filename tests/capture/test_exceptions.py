"""Exceptions raised and handled inside captured code: the except block is captured too (no
graph break), exactly as eager runs it. kiln's own limitations are never caught by user code."""
import pytest
import torch

import kiln
from kiln.testing import CompileCounter, assert_same


class Lookup(dict):
    def get(self, key, default=None):  # the Mapping.get pattern transformers relies on
        try:
            return self[key]
        except KeyError:
            return default


def missing_key(x, d):
    try:
        v = d["missing"]
    except KeyError:
        v = x + 1
    return v * 2


def raise_and_catch(x):
    try:
        raise ValueError("boom", 3)
    except (TypeError, ValueError) as e:
        return x * len(e.args)


def mapping_get(x, m):
    return x * m.get("q", 3) + m.get("a", 0)


def nested_handlers(x):
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            y = x + 1
            raise IndexError("outer")
    except IndexError:
        y = y * 10
    return y


def exception_inside_with(x):
    try:
        with torch.no_grad():
            y = x * 2
            raise RuntimeError("in block")
    except RuntimeError:
        z = y + 1
    return z, torch.is_grad_enabled()


def helper_raises(v):
    if v > 1:
        raise ValueError("too big")
    return v


def caught_from_inlined_call(x):
    try:
        n = helper_raises(2)
    except ValueError:
        n = 5
    return x * n


CASES = [
    (missing_key, lambda: (torch.randn(3), {"a": 1})),
    (raise_and_catch, lambda: (torch.randn(3),)),
    (mapping_get, lambda: (torch.randn(3), Lookup(a=2))),
    (nested_handlers, lambda: (torch.randn(3),)),
    (exception_inside_with, lambda: (torch.randn(3, requires_grad=True),)),
    (caught_from_inlined_call, lambda: (torch.randn(3),)),
]


@pytest.mark.parametrize("fn, make", CASES, ids=[c[0].__name__ for c in CASES])
def test_handled_exception_is_captured_in_one_graph(fn, make):
    cnt = CompileCounter()
    cf = kiln.compile(fn, backend=cnt, fullgraph=True)  # no graph break, no eager fallback
    for _ in range(2):
        args = make()
        assert_same(cf(*args), fn(*args))
    assert cnt.frame_count == 1


def uncaught(x):
    try:
        y = x + 1
        raise KeyError("k")
    except ValueError:
        y = None
    return y


def test_uncaught_exception_reaches_the_caller():
    with pytest.raises(KeyError, match="k"):
        kiln.compile(uncaught, backend="eager")(torch.randn(2))


def _finally(x, log):
    try:
        return x + 1
    finally:
        log.append("finally")


def test_finally_runs():
    log, elog = [], []
    x = torch.randn(2)
    assert_same(kiln.compile(_finally, fullgraph=True, backend="eager")(x, log), _finally(x, elog))
    assert log == elog == ["finally"]


def _kiln_limit_not_caught(x):
    try:
        return x * x.sum().item()   # kiln cannot capture .item(): not an exception to catch
    except Exception:
        return x * 0


def test_kiln_limitations_are_not_caught_by_user_handlers():
    x = torch.randn(3)
    assert_same(kiln.compile(_kiln_limit_not_caught, backend="eager")(x), _kiln_limit_not_caught(x))
    with pytest.raises(kiln.Unsupported, match="item"):
        kiln.compile(_kiln_limit_not_caught, fullgraph=True, backend="eager")(x)


def _raises_natively():
    return list(1)          # a graph break inside, then eager's TypeError


def _answers():
    return "second"


def _loop_over_callees(x):
    out = []
    for c in (_raises_natively, _answers, _raises_natively, _answers):
        try:
            out.append(c())
        except TypeError:
            out.append("TE")
    return x + 1, out


def test_a_loop_goes_on_after_a_caught_exception_from_code_run_natively():
    """The call breaks the graph and raises; the frame's handler takes it and the loop comes
    back to the same call, which must run with the stack as CPython lays it out (the rest of
    the frame goes on natively)."""
    x = torch.ones(1)
    expected = _loop_over_callees(x)
    got = kiln.compile(_loop_over_callees, backend="eager")(x)
    assert repr(got) == repr(expected)
    got = kiln.compile(_loop_over_callees, backend="aot_eager")(x)
    assert repr(got) == repr(expected)


def test_an_exception_that_is_anothers_context_stays_one_object():
    def fn():
        context = Exception("context")
        try:
            raise context
        except Exception:
            try:
                raise Exception("caught")
            except Exception:
                pass
            try:
                raise Exception("new")
            except Exception as exc:
                raised = exc
        return raised.__context__ is context, repr(raised.__context__), raised.__context__.__context__

    got = kiln.compile(fn, backend="eager")()
    assert repr(got) == repr(fn())
