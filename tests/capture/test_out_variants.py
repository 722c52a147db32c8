"""``out=`` variants of torch functions in compiled code.

An ``out=`` tensor of the right size is written in place like any mutation. One of the wrong
size (or layout) is resized by eager; kiln does not model that metadata change on an input or a
view, so the call runs eagerly (a graph break) and the answer is eager's.
"""
import copy

import pytest
import torch

import kiln
from kiln.testing import CompileCounter, assert_same

SETTINGS = [("eager", None), ("eager", True), ("aot_eager", None), ("aot_eager", True)]


def check(fn, make_args, backend, dynamic, graphs=None):
    counter = CompileCounter() if backend == "eager" else None
    compiled = kiln.compile(fn, backend=counter or backend, dynamic=dynamic)
    for call in range(2):
        torch.manual_seed(call)
        args = make_args()
        e_args = copy.deepcopy(args)
        out = compiled(*args)
        assert_same(out, fn(*e_args))
        assert_same(list(args), list(e_args), path="args after the call")
    if counter is not None and graphs is not None:
        assert counter.frame_count == graphs


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_out_of_the_right_size_stays_in_the_graph(backend, dynamic):
    def f(x, out):
        torch.add(x, 1, out=out)
        return out * 2

    check(f, lambda: (torch.randn(3, 4), torch.empty(3, 4)), backend, dynamic, graphs=1)


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_out_input_resized(backend, dynamic):
    def f(x, out):
        torch.sin(x, out=out)
        return out + 1

    check(f, lambda: (torch.randn(3, 4), torch.empty(0)), backend, dynamic)


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_out_view_of_input_resized(backend, dynamic):
    def f(x, out):
        torch.add(x, 1, out=out)
        torch.mul(x, 2, out=out[0])    # out[0] (3,) is resized to (3, 3): it covers all of out
        return out

    check(f, lambda: (torch.randn(3, 3), torch.empty(3, 3)), backend, dynamic)


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_out_tuple_resized(backend, dynamic):
    def f(x, values, indices):
        torch.max(x, 0, out=(values, indices))
        return values * 2, indices

    check(f, lambda: (torch.randn(3, 4), torch.empty(0), torch.empty(0, dtype=torch.long)), backend, dynamic)


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_out_intermediate_resized(backend, dynamic):
    def f(x):
        out = torch.empty(0)
        torch.cos(x, out=out)
        return out * 2

    check(f, lambda: (torch.randn(3, 4),), backend, dynamic)


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_resize_of_an_input(backend, dynamic):
    """``resize_``/``resize_as_`` of an input (the AOT epilogue copied the new values into the
    old size: a shape error) run eagerly; of an intermediate they stay in the graph."""
    def f(x, y):
        x.resize_as_(y)
        x.fill_(1)
        z = torch.empty(0)
        z.resize_(3)
        z.fill_(2)
        return x * 2, z

    check(f, lambda: (torch.randn(2), torch.randn(4)), backend, dynamic)


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_resize_of_a_view_of_an_input(backend, dynamic):
    def f(x):
        v = x[1:]
        v.resize_(2)
        return x + 1, v * 2

    check(f, lambda: (torch.randn(4),), backend, dynamic)


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_out_variants_that_return_none_write_their_out_tensors(backend, dynamic):
    # (unbind_copy and split_copy with out= return None: the write is the whole op)
    def f(x, out, out2):
        torch.unbind_copy(x, out=out)
        torch.split_copy(x * 2, 1, out=out2)

    check(f, lambda: (torch.randn(3, 3), tuple(torch.zeros(3) for _ in range(3)),
                      tuple(torch.zeros(1, 3) for _ in range(3))), backend, dynamic, graphs=1)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_result_of_an_out_call_is_the_out_tensor(backend):
    def f(x, out):
        r = torch.zeros(3, out=out)
        same = r is out
        r2 = torch.add(x, 1, out=out)
        r2.mul_(2)
        return same, r2 is out, out * 1

    want_out, got_out = torch.empty(3), torch.empty(3)
    want = f(torch.ones(3), want_out)
    got = kiln.compile(f, backend=backend)(torch.ones(3), got_out)
    assert got[:2] == want[:2] == (True, True)
    torch.testing.assert_close(got[2], want[2])
    torch.testing.assert_close(got_out, want_out)
