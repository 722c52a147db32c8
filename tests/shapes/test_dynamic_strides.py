"""Automatic dynamic strides: an input whose stride changes while its sizes stay (the last
token of a growing sequence, ``ids[:, -1:]``, as a decoding loop passes it) is compiled with a
symbolic stride after the first change, instead of once per step until the recompile limit.
Writes through such an input, and outputs that are views of it, land where eager's do."""
import pytest
import torch

import kiln
from kiln.shapes.profile import FrameProfile


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _counted(fn, backend="aot_eager"):
    from kiln.backends.registry import lookup_backend

    inner = lookup_backend(backend)[0]
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inner(gm, example_inputs)

    return kiln.compile(fn, backend=counting), graphs


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_last_token_of_a_growing_sequence_compiles_twice(backend):
    emb = torch.nn.Embedding(50, 8)

    def step(tok):
        return emb(tok).sum(-1) * 2

    compiled, graphs = _counted(step, backend)
    ids = torch.randint(0, 50, (3, 4))
    for _ in range(8):
        last = ids[:, -1:]                              # sizes (3, 1), stride (length, 1)
        torch.testing.assert_close(compiled(last), step(last))
        ids = torch.cat([ids, torch.randint(0, 50, (3, 1))], 1)
    assert len(graphs) == 2, compiled.recompile_reasons
    assert "stride mismatch at index 0" in compiled.recompile_reasons[0]


def test_writes_and_views_through_a_dynamic_stride_land_where_eagers_do():
    def f(col, w):
        col.mul_(2)                          # written in place: into the caller's buffer
        return col[1:], (col * w).sum(), col.t()

    compiled, graphs = _counted(f)
    for width in range(3, 8):
        buf, ref = torch.randn(4, width), None
        ref = buf.clone()
        w = torch.randn(4, 1)
        got = compiled(buf[:, -2:-1], w)
        want = f(ref[:, -2:-1], w)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(buf, ref)
        # the views share the caller's storage as eager's do
        assert got[0].data_ptr() == buf[1:, -2:-1].data_ptr() and got[0].stride() == want[0].stride()
        assert got[2].stride() == want[2].stride()
    assert len(graphs) == 2


def test_mark_static_keeps_a_stride_static():
    def f(x):
        return x * 2

    compiled, graphs = _counted(f)
    for width in range(3, 6):
        x = torch.randn(4, width)[:, :1]
        kiln.mark_static(x, 0)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(graphs) == 3


def test_strides_that_follow_the_sizes_stay_with_them():
    prof = FrameProfile({"qualname": "f"}, None)
    assert prof.observe_strides("x", (2, 5), (5, 1)) == set()
    assert prof.observe_strides("x", (2, 6), (6, 1)) == set()       # contiguous: the sizes changed
    assert prof.observe_strides("x", (2, 1), (6, 1)) == set()
    assert prof.observe_strides("x", (2, 1), (7, 1)) == {0}         # the same sizes, another stride
    assert prof.observe_strides("y", (1, 3), (9, 1)) == set()
    assert prof.observe_strides("y", (1, 3), (12, 1)) == set()      # a size-1 dim's stride is never read
    prof.observe_tensor("x", (2, 1))
    saved = prof.to_json()
    assert saved["tensors"]["x"]["dynamic_strides"] == [0]
    again = FrameProfile({"qualname": "f"}, None)
    again.load_json(saved)
    assert again.dynamic_strides["x"] == {0}
