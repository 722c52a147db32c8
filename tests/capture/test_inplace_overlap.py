"""An in-place write that reads a partly overlapping view of its own memory: eager refuses it
(ATen's overlap check), fake tensors do not. kiln leaves it to eager (a graph break), so the
error is eager's, raised at the user's line (fuzz seed 7133); writes eager allows (the same
view, disjoint views, views ATen cannot check) stay in the graph."""
from __future__ import annotations

import traceback

import pytest
import torch

import kiln
from kiln.testing import CompileCounter


def copy_from_row(x):
    for _ in range(2):
        t = x.select(0, 0)
        x.copy_(t)                 # raises: row 0 overlaps the first row of x
    return x.sum()


def shifted_add(x):
    y = x * 1
    y[1:].add_(y[:-1])             # raises
    return y


def transposed_mul(x):
    y = x * 1
    y.mul_(y.t())                  # raises: same memory, other strides
    return y


def setitem_shift(x):
    y = x + 1
    y[1:] = y[:-1]                 # raises
    return y


def _line_in_this_file(e: BaseException):
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == __file__]
    return frames[-1].lineno, frames[-1].line


def assert_raises_like_eager(fn, x, backend="aot_eager", dynamic=None):
    """Eager's overlap error, raised by the compiled function at the same user line."""
    with pytest.raises(RuntimeError, match="single memory location") as eager:
        fn(x.clone())
    kiln.reset()
    with pytest.raises(RuntimeError, match="single memory location") as compiled:
        kiln.compile(fn, backend=backend, dynamic=dynamic)(x.clone())
    assert _line_in_this_file(compiled.value) == _line_in_this_file(eager.value)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("fn", [copy_from_row, shifted_add, transposed_mul, setitem_shift])
def test_refused_overlap_raises_eagers_error_at_the_users_line(fn, backend, dynamic):
    assert_raises_like_eager(fn, torch.randn(3, 3), backend, dynamic)


def allowed_overlaps(x):
    y = x * 1
    y.add_(y)                      # the same view: allowed
    y[:, 0].copy_(y[:, 1])         # strided views: ATen does not check them
    y[:2].mul_(y[2:4])              # disjoint rows
    y.view(-1)[:3].sub_(y[2])      # disjoint (row 2 starts at element 6)
    return y


def test_allowed_overlaps_stay_in_one_graph():
    counter = CompileCounter()
    compiled = kiln.compile(allowed_overlaps, backend=counter, fullgraph=True)
    for _ in range(2):
        x = torch.randn(4, 3)
        torch.testing.assert_close(compiled(x.clone()), allowed_overlaps(x.clone()))
    assert counter.frame_count == 1


@pytest.mark.parametrize("dynamic", [None, True])
def test_allowed_overlaps_aot(dynamic):
    compiled = kiln.compile(allowed_overlaps, backend="aot_eager", dynamic=dynamic)
    for n in (4, 5):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x.clone()), allowed_overlaps(x.clone()))


def setitem_advanced_overlap(x):
    y = x + 1
    y[torch.tensor([0, 1])] = y[1:3]   # raises: index_put_ checks the whole tensor
    return y


@pytest.mark.parametrize("dynamic", [None, True])
def test_setitem_with_tensor_index_from_an_overlapping_view(dynamic):
    assert_raises_like_eager(setitem_advanced_overlap, torch.randn(5, 3), dynamic=dynamic)


def augmented_setitem(x):
    n = x.shape[0]
    y = x * 1
    y[:, 1] += 3                       # writes back the view it read: allowed
    y[n - 1] *= 2                      # (n symbolic under dynamic=True)
    y[1:3] = y[1:3].flip(0)            # a copy: no overlap
    return y


@pytest.mark.parametrize("dynamic", [None, True])
def test_augmented_setitem_stays_in_one_graph(dynamic):
    counter = CompileCounter()
    compiled = kiln.compile(augmented_setitem, backend=counter, dynamic=dynamic, fullgraph=True)
    for n in (4, 5):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x.clone()), augmented_setitem(x.clone()))
    # (fullgraph=True: a break would raise; how many shapes compile is dynamic's business)
    assert counter.frame_count in (1, 2)


def expanded_write(x):
    e = x[:1].expand(3, 4)
    e.add_(1)                          # raises: the written-to elements share memory
    return x


@pytest.mark.parametrize("dynamic", [None, True])
def test_write_into_an_expanded_tensor_raises_at_the_users_line(dynamic):
    assert_raises_like_eager(expanded_write, torch.randn(3, 4), dynamic=dynamic)
