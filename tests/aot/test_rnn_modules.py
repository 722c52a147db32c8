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
