"""Default and min-cut partitioners: same gradients, less saved memory for the min-cut."""
import pytest
import torch
import torch.nn as nn

import kiln

from kiln.aot import create_aot_state, stage1_graph_capture, stage2_compile
from kiln.aot.partition import partition_capture
from kiln.aot import fx_graphs
from kiln.testing import assert_same

from _aot_helpers import DT, rg, rn

aten = torch.ops.aten


def _capture(fn, args, **kw):
    st = create_aot_state(fn, args, **kw)
    return st, stage1_graph_capture(st)


def _grads(compiled, args, grad_of):
    for a in grad_of:
        a.grad = None
    out = compiled(*args)
    out = out if isinstance(out, torch.Tensor) else out[0]
    (out * torch.linspace(0, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
    return [a.grad.clone() for a in grad_of]


def test_min_cut_recomputes_a_pointwise_chain():
    def f(x):
        return ((x.sin() * 2).cos() + 1).exp().tanh()
    x = rg(64, 64)
    st, cap = _capture(f, [x])
    with st:
        d = partition_capture(cap, "default")
        m = partition_capture(cap, "min_cut")
        assert m.saved_bytes < d.saved_bytes
        assert m.saved == ["primals_1"] and m.saved_activation_bytes == 0
        compiled = [stage2_compile(st, cap, partition_fn=p) for p in ("default", "min_cut")]
    results = [_grads(c, [x], [x]) for c in compiled]
    x2 = x.detach().clone().requires_grad_(True)
    ref = _grads(f, [x2], [x2])
    assert_same(results[0], ref)
    assert_same(results[1], ref)


def test_min_cut_never_recomputes_matmul_or_random_ops():
    def f(x, w1, w2):
        h = torch.nn.functional.dropout((x @ w1).relu(), 0.3)
        return (h @ w2).sin()
    x, w1, w2 = rn(16, 32), rg(32, 32), rg(32, 8)
    st, cap = _capture(f, [x, w1, w2])
    with st:
        d = partition_capture(cap, "default")
        m = partition_capture(cap, "min_cut")
    n_mm = lambda gm: sum(1 for n in gm.graph.nodes if n.target in (aten.mm.default, aten.addmm.default))
    assert n_mm(m.backward) == n_mm(d.backward)
    assert "native_dropout" not in m.backward.code
    assert m.saved_bytes <= d.saved_bytes


def test_min_cut_treats_parameters_as_free_and_mutated_inputs_as_unsaveable():
    def f(x, buf, w):
        buf.add_(1)
        return (x * w).sin() * buf
    x, buf, w = rg(8), rn(8), rg(8)
    st, cap = _capture(f, [x, buf, w], static_input_indices=[1, 2])
    with st:
        m = partition_capture(cap, "min_cut")
        assert "primals_2" not in m.saved          # the mutated buffer is copied into after forward
        compiled = stage2_compile(st, cap, partition_fn="min_cut")
    b0 = buf.clone()
    out = compiled(x, buf, w)
    out.sum().backward()
    x2, w2, b2 = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True), b0.clone()
    f(x2, b2, w2).sum().backward()
    assert_same(buf, b2)
    assert_same((x.grad, w.grad), (x2.grad, w2.grad))


@pytest.mark.parametrize("partition", ["default", "min_cut"])
def test_transformer_block_partitions(partition):
    block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).to(DT)
    names = [n for n, _ in block.named_parameters()]
    params = [p for _, p in block.named_parameters()]

    def f(x, *ps):
        return torch.func.functional_call(block, dict(zip(names, ps)), (x,))
    x = rn(2, 8, 32)
    st, cap = _capture(f, [x, *params], static_input_indices=list(range(1, len(params) + 1)))
    with st:
        p = partition_capture(cap, partition)
        compiled = stage2_compile(st, cap, partition_fn=partition)
    assert p.saved_bytes > 0
    got = _grads(compiled, [x, *params], params)
    ref = _grads(block, [x], params)
    assert_same(got, ref)


def test_min_cut_saves_no_more_than_default_on_a_transformer_block():
    block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, activation="gelu").to(DT)
    names = [n for n, _ in block.named_parameters()]
    params = [p for _, p in block.named_parameters()]

    def f(x, *ps):
        return torch.func.functional_call(block, dict(zip(names, ps)), (x,))
    st, cap = _capture(f, [rn(2, 8, 32), *params], static_input_indices=list(range(1, len(params) + 1)))
    with st:
        d = partition_capture(cap, "default")
        m = partition_capture(cap, "min_cut")
    assert m.saved_activation_bytes <= d.saved_activation_bytes


def test_min_cut_recomputes_a_pointwise_chain_from_its_input():
    def f(x, w):
        return ((x @ w).sin() * 2).cos().exp()
    x, w = rg(8, 16), rg(16, 16)
    st, cap = _capture(f, [x, w])
    with st:
        d = partition_capture(cap, "default")
        m = partition_capture(cap, "min_cut")
    # the matmul's output alone: sin, cos and exp are recomputed from it in the backward's kernel
    assert m.saved_activation_bytes == 8 * 16 * x.element_size() < d.saved_activation_bytes


def test_min_cut_saves_what_the_backward_matmul_reads():
    # the gelu's output feeds a matmul whose weight gradient reads it: the backward would write
    # it out whole again, so it is saved, not recomputed (a kernel saved, no memory lost)
    def f(x, w1, w2):
        return torch.nn.functional.gelu(x @ w1) @ w2
    x, w1, w2 = rg(8, 16), rg(16, 32), rg(32, 4)
    st, cap = _capture(f, [x, w1, w2])
    with st:
        m = partition_capture(cap, "min_cut")
    kinds = {n.target for n in m.backward.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.erf.default in kinds            # gelu's backward (recomputes erf: fuses)
    assert m.saved_activation_bytes == 2 * 8 * 32 * x.element_size()    # x @ w1, gelu(x @ w1)


def test_partition_fn_returning_the_wrong_graphs_is_an_error():
    def bad(joint, joint_inputs, *, num_fwd_outputs):
        from kiln.aot import default_partition

        fw, bw = default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)
        return fw, fw
    st, cap = _capture(lambda x: x.sin(), [rg(3)])
    with st, pytest.raises(ValueError, match="backward takes"):
        stage2_compile(st, cap, partition_fn=bad)


def _clamp_then_shift(t):
    t.clamp_(-1.0, 1.0)        # the backward reads the input as it was (its clamp mask)
    t.add_(0.5)
    return t


def _exp_then_transpose(t):
    y = (t * 2).exp()          # the min-cut saves t and recomputes exp in the backward
    t.t_()                     # a metadata mutation: the copy-back restrides the input
    return y


def _min_cut_without_input_clones(joint, joint_inputs, *, num_fwd_outputs):
    """Inductor's joint-graph passes drop the functional graph's clones of inputs (no-ops in a
    functional graph); the min-cut then saves the mutated input itself."""
    from kiln.aot.partition import min_cut_rematerialization_partition

    for n in list(joint.graph.nodes):
        if n.op == "call_function" and n.target is aten.clone.default and n.args[0].op == "placeholder":
            n.replace_all_uses_with(n.args[0])
            joint.graph.erase_node(n)
    joint.recompile()
    return min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)


@pytest.mark.parametrize("partition", ["default", "min_cut", _min_cut_without_input_clones])
@pytest.mark.parametrize("fn", [_clamp_then_shift, _exp_then_transpose])
def test_a_saved_mutated_input_keeps_the_value_the_forward_read(fn, partition):
    """The runtime copies a mutated input's new value (or strides) into it after the forward;
    a partition that saves the input itself must keep the value the forward read (fuzz seed
    3826: after Inductor's joint-graph passes the min-cut saved it, and backward raised a
    version error)."""
    import kiln
    from kiln._torch import inductor_decompositions
    from kiln.backends import aot_backend

    w = rg(4, 4)
    x_e, x_k = w * 1.0, w * 1.0
    out_e = fn(x_e)
    (out_e * torch.linspace(0, 1, 16, dtype=out_e.dtype).view(4, 4)).sum().backward()
    g_e = w.grad.clone()
    w.grad = None
    compiled = kiln.compile(fn, backend=aot_backend(partition_fn=partition, decompositions=inductor_decompositions()))
    out_k = compiled(x_k)
    assert_same(out_k, out_e)
    assert_same(x_k, x_e)
    (out_k * torch.linspace(0, 1, 16, dtype=out_k.dtype).view(4, 4)).sum().backward()
    assert_same(w.grad, g_e)


def _joint_of(f, args):
    from kiln.aot.partition import _Joint
    from kiln.backends.inductor import decomposition_table

    st = create_aot_state(f, args, decompositions=decomposition_table())
    with st:
        cap = stage1_graph_capture(st)
    return _Joint(cap.graph_module, cap.num_fw_outputs)


def test_a_residual_add_after_a_matmul_is_not_recomputed():
    """``x`` is read by a LayerNorm whose fusible chain ends at a matmul, and by the residual
    add after it: the add is banned from recomputation (torch's ban_if_used_far_apart), so the
    backward never rebuilds the residual stream from far back."""
    from kiln.aot.partition import _banned_by_fusion_structure

    def f(inp, w):
        x = inp * 2                   # (a computed stream: an input is never fused with)
        return (x + torch.nn.functional.layer_norm(x, (16,)) @ w).sin().sum()
    j = _joint_of(f, [rg(4, 16), rg(16, 16)])
    banned = _banned_by_fusion_structure(j)
    (x,) = [u for u in j.primals[0].users if u.target is torch.ops.aten.mul.Tensor and u in j.fw]
    residual = [u for u in x.users if u.target is torch.ops.aten.add.Tensor]
    assert residual and set(residual) <= banned, (residual, banned)
    assert not [u for u in x.users if u.target is torch.ops.aten.var_mean.correction and u in banned]


def test_a_long_fusible_chain_is_cut():
    from kiln.aot.partition import _banned_by_fusion_structure

    def f(x):
        for _ in range(60):           # 120 fusible nodes in one chain
            x = x * 1.01 + 0.01
        return x.sin().sum()
    j = _joint_of(f, [rg(4, 16)])
    banned = _banned_by_fusion_structure(j)
    order = {n: i for i, n in enumerate(j.graph.nodes)}
    first = min(order[n] for n in j.fw if n.op == "call_function")
    assert banned and all(order[n] > first + 100 for n in banned), sorted(n.name for n in banned)


def test_min_cut_saves_a_relu_mask_not_the_activation():
    """ReLU's backward reads only ``out <= 0``, which no tangent feeds: the min-cut runs it at
    the end of the forward and saves the 1-byte mask instead of the activation (as torch's
    partitioner does with such "unclaimed" backward ops)."""
    def f(x, w):
        return (x @ w).relu().mean(dim=1)
    x, w = rg(16, 32), rg(32, 64)
    st, cap = _capture(f, [x, w])
    with st:
        d = partition_capture(cap, "default")
        m = partition_capture(cap, "min_cut")
        compiled = stage2_compile(st, cap, partition_fn="min_cut")
    masks = [n for n in fx_graphs.flat_outputs(m.forward.graph)[m.num_fw_outputs:]
             if n.meta["val"].dtype == torch.bool]
    assert len(masks) == 1 and m.saved_activation_bytes == 16 * 64, m.saved
    assert d.saved_activation_bytes == 16 * 64 * 8                  # (the float64 activation)
    assert not [n for n in m.backward.graph.nodes if n.target is aten.le.Scalar]
    x2, w2 = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    assert_same(_grads(compiled, [x, w], [x, w]), _grads(f, [x2, w2], [x2, w2]))


def test_a_random_or_writing_backward_op_stays_in_the_backward():
    from kiln.aot.partition import _Joint, _pure

    def f(x):
        return x.relu().sum()
    st, cap = _capture(f, [rg(8)])
    j = _Joint(cap.graph_module, cap.num_fw_outputs)
    assert j.unclaimed and all(_pure(n) for n in j.unclaimed)
    assert all(n in j.bw for n in j.unclaimed)          # (the default partition keeps them there)
    g = torch.fx.Graph()
    p = g.placeholder("x")
    p.meta["val"] = torch.empty(4)
    assert not _pure(g.call_function(aten.rand_like.default, (p,)))
    assert not _pure(g.call_function(aten.add_.Tensor, (p, 1)))


def _bn_relu(x, weight, bias):
    y = torch.nn.functional.batch_norm(x, None, None, weight, bias, training=True)
    return y.relu().mean()


@pytest.mark.parametrize("copy_parameters", [False, True])
def test_min_cut_recomputes_a_batchnorm_relu_from_the_bias(copy_parameters):
    """Eager's BatchNorm backward does not read its bias; kiln's min-cut saves the bias and
    recomputes the ReLU after it from the input, not saving the mask. The bias is saved as it
    is: changing it in place before backward() raises autograd's error (never a wrong
    gradient). With ``copy_saved_parameters`` it is saved as a copy, and the gradients are
    eager's, which allows the change."""
    from kiln.backends.inductor import decomposition_table

    with kiln.config.patch(copy_saved_parameters=copy_parameters):
        _batchnorm_relu_case(decomposition_table, copy_parameters)


def _batchnorm_relu_case(decomposition_table, copy_parameters):
    x, weight, bias = rg(64, 16), rg(16), rg(16)
    st, cap = _capture(_bn_relu, [x, weight, bias], static_input_indices=[1, 2],
                       decompositions=decomposition_table())      # (BatchNorm as pointwise ops)
    with st:
        m = partition_capture(cap, "min_cut")
        compiled = stage2_compile(st, cap, partition_fn="min_cut")
    assert "primals_3" in m.saved and m.saved_activation_bytes < 64 * 16, (m.saved, m.saved_activation_bytes)
    x2, w2, b2 = (t.detach().clone().requires_grad_(True) for t in (x, weight, bias))
    out_k, out_e = compiled(x, weight, bias), _bn_relu(x2, w2, b2)
    assert_same(out_k, out_e)
    with torch.no_grad():
        bias.add_(5.0)                      # (every normalized value > 0 now: a different mask)
        b2.add_(5.0)
    out_e.backward()
    if not copy_parameters:
        with pytest.raises(RuntimeError, match="copy_saved_parameters"):
            out_k.backward()
        return
    out_k.backward()
    assert_same((x.grad, weight.grad, bias.grad), (x2.grad, w2.grad, b2.grad))


def test_several_saved_copies_are_one_multi_tensor_copy(monkeypatch):
    from kiln.aot.function import _copies

    calls = []
    real = torch._foreach_copy_

    def counting(dst, src):
        calls.append(len(src))
        return real(dst, src)
    monkeypatch.setattr(torch, "_foreach_copy_", counting)
    ts = [torch.randn(3), torch.randn(2, 2), torch.randn(4, 3).t(), torch.randn(5, dtype=torch.float64)]
    out = _copies(ts)
    assert sorted(calls) == [1, 2]          # one per dtype; the transposed one is cloned
    for a, b in zip(out, ts):
        assert torch.equal(a, b) and a.stride() == b.stride() and a.dtype == b.dtype
        assert a.data_ptr() != b.data_ptr()
