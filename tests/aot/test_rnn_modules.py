"""Recurrent modules through the AOT stage. torch's ``aten.lstm`` decomposition picks the
inference-only ``mkldnn_rnn_layer`` on CPU when the input does not require grad (the weights
may): its backward failed on the missing workspace. kiln traces with mkldnn off."""
import copy

import pytest
import torch
from torch import nn

import kiln
from kiln.testing import assert_same


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("make", [lambda: nn.LSTM(4, 5, batch_first=True), lambda: nn.GRU(4, 5),
                                  lambda: nn.RNN(4, 5, num_layers=2)], ids=["lstm", "gru", "rnn"])
def test_recurrent_module_outputs_and_grads(make, dynamic):
    torch.manual_seed(0)
    m = make()
    ref = copy.deepcopy(m)
    compiled = kiln.compile(m, backend="aot_eager", dynamic=dynamic)
    for call in range(2):
        x = torch.randn(2, 3, 4)
        out, e_out = compiled(x), ref(x)
        assert_same(out, e_out, rtol=1e-4, atol=1e-5)
        (out[0].sum() + out[1][0].sum() if isinstance(out[1], tuple) else out[0].sum()).backward()
        (e_out[0].sum() + e_out[1][0].sum() if isinstance(e_out[1], tuple) else e_out[0].sum()).backward()
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            assert_same(p.grad, q.grad, rtol=1e-4, atol=1e-5, path=name)


def test_lstm_decomposition_hidden_states_keep_their_shape(monkeypatch):
    # torch 2.11's aten.lstm decomposition (the Python kernel that runs while tracing) returned
    # h_n and c_n with an extra dimension ((layers, 1, batch, hidden)); kiln reshapes them to
    # the hidden states passed in. A kernel with that defect stands in for it, on any torch.
    from kiln.aot import trace_context

    op = torch.ops.aten.lstm.input
    called = []
    for key in (torch._C.DispatchKey.Autograd, torch._C.DispatchKey.CompositeImplicitAutograd):
        correct = op.py_kernels[key]

        def defective(*args, _correct=correct, **kwargs):
            called.append(1)
            out, h, c = _correct(*args, **kwargs)
            return out, h.unsqueeze(1), c.unsqueeze(1)
        monkeypatch.setitem(op.py_kernels, key, defective)
    op._dispatch_cache.clear()
    trace_context.lstm_hidden_defect.cache_clear()
    try:
        assert trace_context.lstm_hidden_defect()
        torch.manual_seed(0)
        m = nn.LSTM(4, 5, num_layers=2, batch_first=True)
        x = torch.randn(2, 3, 4)
        compiled = kiln.compile(copy.deepcopy(m), backend="aot_eager")
        out, expected = compiled(x), m(x)
        assert called
        assert_same(out, expected, rtol=1e-4, atol=1e-5)
    finally:
        monkeypatch.undo()
        op._dispatch_cache.clear()
        trace_context.lstm_hidden_defect.cache_clear()
