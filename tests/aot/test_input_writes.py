"""Inputs the graph writes itself (``keep_input_mutations``): BatchNorm running statistics and
buffers updated under no_grad are written by an ``aten.copy_`` at the end of the forward
instead of being returned for the runtime to copy back. Compared with eager: outputs,
gradients, the inputs' new values and their version counters."""
import copy

import pytest
import torch

import kiln
from kiln.aot import create_aot_state, stage1_graph_capture, stage2_compile
from kiln.aot.partition import min_cut_rematerialization_partition
from kiln.errors import Unsupported
from kiln.testing import assert_same

from _aot_helpers import DT, rg, rn


def stages(fn, args, keep=True, **kw):
    st = create_aot_state(fn, args, keep_input_mutations=keep)
    with st:
        capture = stage1_graph_capture(st)
        return st, capture, stage2_compile(st, capture, **kw)


def writes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.copy_.default]


def test_a_buffer_updated_under_no_grad_is_written_by_the_inference_graph():
    def f(x, buf):
        with torch.no_grad():
            buf.mul_(0.5).add_(x.mean())
        return x * 2

    x, buf = rn(4), rn(4)
    st, _, compiled = stages(f, [x, buf])
    assert st.meta.in_graph_mutated_indices == [1] and st.meta.mutated_data_indices == []
    assert len(writes(compiled.parts.forward)) == 1
    assert len(compiled.parts.forward.graph.find_nodes(op="output")[0].args[0]) == 1   # no new value out
    b1, b2 = buf.clone(), buf.clone()
    v = b2._version
    assert_same(compiled(x, b2), f(x, b1))
    assert_same(b2, b1)
    assert b2._version > v           # as eager's in-place op


def test_without_keep_the_runtime_copies_back():
    def f(x, buf):
        buf.add_(1)
        return x + buf

    st, _, compiled = stages(f, [rn(3), rn(3)], keep=False)
    assert st.meta.mutated_data_indices == [1] and not writes(compiled.parts.forward)


def test_a_write_autograd_records_stays_a_copy_back():
    def f(x, y):
        y.mul_(x)            # y's new value requires grad: the copy_ back is recorded by autograd
        return y.sum()

    st, _, compiled = stages(f, [rg(3), rn(3)])
    assert st.meta.in_graph_mutated_indices == [] and st.meta.mutated_data_indices == [1]


@pytest.mark.parametrize("view", [False, True])
def test_a_saved_input_that_the_graph_writes_reaches_the_backward_unchanged(view):
    """Eager saves a copy of buf; a pass that drops the copy (as Inductor's joint-graph passes
    drop no-op clones) leaves the backward reading buf itself: the forward saves a copy
    taken before its write."""
    def f(w, buf):
        b = buf[1:] if view else buf
        y = w * b.clone()
        with torch.no_grad():
            buf.add_(1)
        return (y * y).sum()

    w, buf = rg(4), rn(5 if view else 4)
    st = create_aot_state(f, [w, buf], keep_input_mutations=True)
    with st:
        capture = stage1_graph_capture(st)
        for n in list(capture.graph.nodes):
            if n.op == "call_function" and n.target is torch.ops.aten.clone.default:
                n.replace_all_uses_with(n.args[0])
                capture.graph.erase_node(n)
        compiled = stage2_compile(st, capture, partition_fn=min_cut_rematerialization_partition)
    assert st.meta.in_graph_mutated_indices == [1]
    fw = compiled.parts.forward
    saved = list(fw.graph.find_nodes(op="output")[0].args[0])[compiled.parts.num_fw_outputs:]
    assert any(s.target is torch.ops.aten.clone.default for s in saved)    # the copy before the write
    w1, w2 = w.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    b1, b2 = buf.clone(), buf.clone()
    ref, out = f(w1, b1), compiled(w2, b2)
    ref.backward()
    out.backward()
    assert_same(out, ref)
    assert_same(w2.grad, w1.grad)
    assert_same(b2, b1)


def test_a_partitioner_that_drops_the_write_is_refused():
    def drop_writes(joint, inputs, *, num_fwd_outputs):
        fw, bw = min_cut_rematerialization_partition(joint, inputs, num_fwd_outputs=num_fwd_outputs)
        for n in writes(fw):
            fw.graph.erase_node(n)
        fw.recompile()
        return fw, bw

    def f(w, buf):
        with torch.no_grad():
            buf.add_(1)
        return (w * 2).sum()

    with pytest.raises(Unsupported, match="writes inputs"):
        stages(f, [rg(3), rn(3)], partition_fn=drop_writes)


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_batchnorm_training_and_eval_match_eager(backend):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5)).to(DT)
    m2 = copy.deepcopy(m)
    f = kiln.compile(m2, backend=backend)
    for _ in range(3):
        x = torch.randn(2, 3, 8, 8, dtype=DT)
        ref, out = m(x), f(x)
        ref.sum().backward()
        out.sum().backward()
        assert_same(out, ref)
        for (name, a), b in zip(m.named_parameters(), m2.parameters()):
            assert_same(b.grad, a.grad)
        for (name, a), b in zip(m.named_buffers(), m2.buffers()):
            assert_same(b, a)
    m.eval(), m2.eval()
    x = torch.randn(2, 3, 8, 8, dtype=DT)
    with torch.no_grad():
        assert_same(f(x), m(x))
    assert len(f._kiln_compiled.entries) == 2
    texts = [e.compiled_graph.as_text() for e in f._kiln_compiled.entries]
    assert sum("written by the graph" in t for t in texts) == 1        # the training graph's


def test_the_write_bumps_the_version_that_an_earlier_saved_tensor_checks():
    """A tensor eager saved before the compiled call writes it: backward() raises eager's error."""
    def f(x, buf):
        with torch.no_grad():
            buf.add_(x.sum())
        return x * 2

    compiled = kiln.compile(f, backend="aot_eager")
    w = rg(3)
    buf = rn(3)
    y = (w * buf).sum()           # saves buf
    compiled(rn(3), buf)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_batchnorm_running_stats_are_written_by_the_graph_and_checked_like_eager():
    """BatchNorm saves its running stats for backward: changing them before backward() raises
    eager's error, also when the graph wrote them."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(3).to(DT)
    bn2 = copy.deepcopy(bn)
    f = kiln.compile(bn2, backend="aot_eager")
    x = rg(4, 3)
    out = f(x)
    text = f._kiln_compiled.entries[0].compiled_graph.as_text()
    assert "written by the graph" in text and "copy_ back" not in text
    ref = bn(x)
    with torch.no_grad():
        bn.running_mean.add_(1)
        bn2.running_mean.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ref.sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def _scale_and_view_column(col, w):
    col.mul_(2)
    return col[1:], (col * w).sum(), col.t()


def _view_through_a_detached_alias(col, w):
    col.detach().add_(w)
    return col.detach()[1:], col.t()


@pytest.mark.parametrize("fn", [_scale_and_view_column, _view_through_a_detached_alias])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_views_of_an_input_written_in_place_read_eagers_elements(backend, dynamic, fn):
    # the input is a strided column of a wider buffer; the write's value is laid out
    # contiguously, so views read off the written value have other strides than eager's
    kiln.reset()
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic)
    for width in (3, 5):
        buf = torch.randn(4, width)
        ref = buf.clone()
        w = torch.randn(4, 1)
        got, want = compiled(buf[:, -2:-1], w), fn(ref[:, -2:-1], w)
        assert_same(got, want)
        assert_same(buf, ref)
        for g, e in zip(got, want):
            if isinstance(e, torch.Tensor) and e.dim():
                assert (g.stride(), g.storage_offset()) == (e.stride(), e.storage_offset())
                assert g.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
