"""The staged API: create_aot_state -> stage1_graph_capture -> (edit) -> stage2_compile."""
import pytest
import torch

import kiln
import kiln.aot as aot
from kiln.aot import create_aot_state, stage1_graph_capture, stage2_compile
from kiln.testing import assert_same

from _aot_helpers import DT, Recorder, rg, rn

aten = torch.ops.aten


def _fake_mode_active():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())


def test_no_mode_stays_active_between_stages():
    x = rg(3)
    state = create_aot_state(lambda x: x.sin(), [x])       # used without ``with``
    assert not _fake_mode_active() and not state.closed
    assert type(torch.randn(2)) is torch.Tensor
    capture = stage1_graph_capture(state)
    assert not _fake_mode_active()
    compiled = stage2_compile(state, capture)
    assert not _fake_mode_active()
    out = compiled(x)
    assert type(out) is torch.Tensor
    assert_same(out, x.sin())
    state.close()
    state.close()          # idempotent
    with create_aot_state(lambda x: x.sin(), [x]) as st:
        assert not _fake_mode_active()
        compiled = stage2_compile(st, stage1_graph_capture(st))
    assert st.closed and not _fake_mode_active()
    assert_same(compiled(x), x.sin())


def test_state_closes_when_creation_fails():
    def bad(x):
        return x.nonzero()          # data-dependent output shape
    with pytest.raises(kiln.Unsupported, match="data-dependent"):
        create_aot_state(bad, [rn(3)])
    assert not _fake_mode_active()


def test_forward_metadata():
    def f(x, buf, w):
        buf.add_(1)
        x.t_()
        return x, w.view(-1), (w * 2), w * 2
    x, buf, w = rn(2, 3), rn(3), rg(3)
    with create_aot_state(f, [x, buf, w], static_input_indices=[1]) as st:
        ins, outs = st.input_info, st.output_info
        assert [i.mutates_data for i in ins] == [False, True, False]
        assert [i.mutates_metadata for i in ins] == [True, False, False]
        assert [i.is_static for i in ins] == [False, True, False]
        assert [i.requires_grad for i in ins] == [False, False, True]
        assert [o.kind for o in outs] == ["is_input", "alias_of_input", "graph", "graph"]
        assert outs[1].base == 2 and outs[0].base == 0
        assert [o.requires_grad for o in outs] == [False, True, True, True]
        assert st.needs_autograd
        text = st.as_text()
        assert "data mutated" in text and "metadata mutated" in text and "alias_of_input 2" in text


def test_static_inputs_come_from_kiln_meta():
    states = []

    def backend(gm, example_inputs):
        with create_aot_state(gm, example_inputs) as st:
            states.append([(i.is_static, i.source) for i in st.input_info])
            return stage2_compile(st, stage1_graph_capture(st))
    m = torch.nn.Linear(3, 2).to(DT)
    kiln.compile(m, backend=backend)(rn(4, 3))
    info = states[0]
    assert [s for s, _ in info] == [False, True, True]
    assert "weight" in str(info[1][1]) and "bias" in str(info[2][1])


def test_inference_vs_joint():
    x, w = rn(3), rg(3)
    with create_aot_state(lambda x, w: x * w, [x, w]) as st:
        assert st.needs_autograd and stage1_graph_capture(st).kind == "joint"
    with create_aot_state(lambda x, w: x * w, [x, w.detach()]) as st:
        assert stage1_graph_capture(st).kind == "inference"
    with torch.no_grad():
        with create_aot_state(lambda x, w: x * w, [x, w]) as st:
            assert stage1_graph_capture(st).kind == "inference"
    with create_aot_state(lambda x, w: (x * w).detach(), [x, w]) as st:   # nothing differentiable
        assert stage1_graph_capture(st).kind == "inference"


def test_graph_is_functional_aten_and_mutations_are_outputs():
    def f(x, buf):
        buf.mul_(2)
        y = x * 2
        y.add_(1)
        return y
    x, buf = rg(4), rn(4)
    with create_aot_state(f, [x, buf]) as st:
        cap = stage1_graph_capture(st)
        targets = [n.target for n in cap.graph.nodes if n.op == "call_function"]
        assert all(isinstance(t, torch._ops.OpOverload) for t in targets)
        assert not any(t._schema.is_mutable for t in targets)
        assert cap.num_fw_outputs == 2        # new value of buf, then y
        phs = [n for n in cap.graph.nodes if n.op == "placeholder"]
        assert [p.name for p in phs] == ["primals_1", "primals_2", "tangents_1"]
        assert phs[1].meta["kiln_mutated"]
        assert cap.tangent_positions == [1]
        compiled = stage2_compile(st, cap)
    b2 = buf.clone()
    out = compiled(x, buf)
    assert_same(buf, b2 * 2)
    assert_same(out, x.detach() * 2 + 1)


def test_every_stage_prints_and_reports_saved_bytes():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(DT)
    w1, b1, w2, b2 = m.parameters()

    def f(x, w1, b1, w2, b2):
        return torch.nn.functional.linear(torch.tanh(torch.nn.functional.linear(x, w1, b1)), w2, b2)
    with create_aot_state(f, [rn(4, 8), w1, b1, w2, b2], static_input_indices=[1, 2, 3, 4]) as st:
        assert "parameter/buffer" in st.as_text()
        cap = stage1_graph_capture(st)
        text = cap.as_text()
        assert "def forward(self, primals_1" in text and "tangents_1" in text
        assert "saved for backward: default partitioner" in text
        assert cap.saved_tensor_bytes("default") > 0
        compiled = stage2_compile(st, cap)
    text = compiled.as_text()
    assert "forward graph" in text and "backward graph" in text and "saved for backward" in text
    assert compiled.saved_tensor_bytes == cap.saved_tensor_bytes("default")
    assert compiled.saved_tensors and compiled.forward_graph is not None and compiled.backward_graph is not None
    # the activations saved: tanh's output (4x8 float64) at least
    assert compiled.saved_tensor_bytes >= 4 * 8 * 8


def test_edit_the_joint_graph_between_stages():
    """sin -> cos in the joint graph: the forward output and the weight's gradient (which the
    backward computes from the saved sin/cos value) both follow the edit."""
    def f(x, w):
        return torch.sin(x) * w

    x, w = rg(5), rg(5)
    with create_aot_state(f, [x, w]) as st:
        cap = stage1_graph_capture(st)
        sins = [n for n in cap.graph.nodes if n.target == aten.sin.default]
        assert len(sins) == 1
        sins[0].target = aten.cos.default
        compiled = stage2_compile(st, cap)
    assert "aten.cos" in compiled.forward_graph.code and "aten.sin" not in compiled.forward_graph.code
    out = compiled(x, w)
    assert_same(out, torch.cos(x) * w)
    g = torch.randn(5, dtype=DT)
    gw, = torch.autograd.grad(out, [w], g)
    assert_same(gw, g * torch.cos(x).detach())          # backward reflects the edit


def test_edit_the_backward_part():
    """Replace the gradient formula: x.grad becomes 3 * tangent instead of cos(x) * tangent."""
    def f(x):
        return torch.sin(x)
    x = rg(4)
    with create_aot_state(f, [x]) as st:
        cap = stage1_graph_capture(st)
        g = cap.graph
        tangent = [n for n in g.nodes if n.name == "tangents_1"][0]
        out = [n for n in g.nodes if n.op == "output"][0]
        with g.inserting_before(out):
            new_grad = g.call_function(aten.mul.Tensor, (tangent, 3.0))
        fw_outs = out.args[0][:cap.num_fw_outputs]
        out.args = ([*fw_outs, new_grad],)
        g.eliminate_dead_code()
        compiled = stage2_compile(st, cap)
    y = compiled(x)
    assert_same(y, torch.sin(x))
    y.sum().backward()
    assert_same(x.grad, torch.full_like(x, 3.0))


def test_custom_compilers_and_partition_fn():
    fw, bw = Recorder(), Recorder()
    calls = []

    def my_partition(joint, joint_inputs, *, num_fwd_outputs):
        calls.append(num_fwd_outputs)
        return aot.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)

    x, w = rn(3, 4), rg(4, 2)
    with create_aot_state(lambda x, w: (x @ w).relu(), [x, w]) as st:
        compiled = stage2_compile(st, stage1_graph_capture(st), fw_compiler=fw, bw_compiler=bw,
                                  partition_fn=my_partition)
    assert calls == [1] and len(fw.graphs) == 1 and len(bw.graphs) == 1
    fw_gm, fw_ex = fw.graphs[0]
    assert len(fw_ex) == 2 and all(isinstance(t, torch.Tensor) for t in fw_ex)
    out = compiled(x, w)
    out.sum().backward()
    w2 = w.detach().clone().requires_grad_(True)
    (x @ w2).relu().sum().backward()
    assert_same(w.grad, w2.grad)


def test_bad_partition_fn_name():
    with create_aot_state(lambda x: x.sin(), [rg(3)]) as st:
        cap = stage1_graph_capture(st)
        with pytest.raises(ValueError, match="unknown partition_fn"):
            stage2_compile(st, cap, partition_fn="nope")


def test_config_partition_fn(monkeypatch):
    monkeypatch.setattr(kiln.config, "aot_partition_fn", "min_cut")
    with create_aot_state(lambda x: x.sin().sin(), [rg(3)]) as st:
        compiled = stage2_compile(st, stage1_graph_capture(st))
    assert compiled.parts.partitioner == "min_cut"


def test_compiled_callable_works_inside_the_open_state():
    x = rg(3)
    with create_aot_state(lambda x: x.sin(), [x]) as st:
        compiled = stage2_compile(st, stage1_graph_capture(st))
        out = compiled(x)           # the fake mode is still entered here
        assert type(out) is torch.Tensor
    assert_same(out, x.sin())


def test_stage_on_closed_state_raises():
    st = create_aot_state(lambda x: x.sin(), [rg(3)])
    cap = stage1_graph_capture(st)
    st.close()
    with pytest.raises(RuntimeError, match="closed"):
        stage1_graph_capture(st)
    with pytest.raises(RuntimeError, match="closed"):
        stage2_compile(st, cap)


def test_public_names():
    import kiln.backends.aot as b

    for name in ("create_aot_state", "stage1_graph_capture", "stage2_compile", "stage2_export"):
        assert callable(getattr(aot, name))
    assert callable(b.aot_backend)
