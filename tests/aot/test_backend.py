"""The "aot_eager" backend and kiln.backends.aot.aot_backend through kiln.compile."""
import torch
import torch.nn as nn

import kiln
from kiln.aot import AOTCompiled
from kiln.backends import list_backends, lookup_backend
from kiln.backends.aot import aot_backend
from kiln.testing import assert_same

from _aot_helpers import DT, Recorder, check_training, rn


def test_aot_eager_is_registered():
    assert "aot_eager" in list_backends()
    fn, name = lookup_backend("aot_eager")
    assert name == "aot_eager" and callable(fn)


def test_aot_eager_returns_an_aot_callable_with_fw_and_bw_graphs():
    got = []
    inner, _ = lookup_backend("aot_eager")

    def spy(gm, example_inputs):
        c = inner(gm, example_inputs)
        got.append(c)
        return c
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh()).to(DT)
    kiln.compile(m, backend=spy)(rn(2, 4)).sum().backward()
    c = got[0]
    assert isinstance(c, AOTCompiled) and c.kind == "training"
    assert "aten.tanh" in c.forward_graph.code and c.backward_graph is not None
    assert all(p.grad is not None for p in m.parameters())


def test_custom_aot_backend_compilers_are_called():
    fw, bw = Recorder(), Recorder()
    backend = aot_backend(fw_compiler=fw, bw_compiler=bw, partition_fn="min_cut")
    m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2)).to(DT)
    check_training(module=m, make_args=lambda: (rn(3, 4),), backend=backend)
    assert len(fw.graphs) == 1 and len(bw.graphs) == 1
    fw_gm, fw_ex = fw.graphs[0]
    assert len(fw_ex) == 5                  # x + 4 parameters
    assert all(n.op != "call_module" for n in fw_gm.graph.nodes)


def test_inference_under_no_grad_then_training():
    fw = Recorder()
    backend = aot_backend(fw_compiler=fw)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).to(DT)
    cm = kiln.compile(m, backend=backend)
    x = rn(2, 4)
    with torch.no_grad():
        out = cm(x)
    assert not out.requires_grad and len(fw.graphs) == 1
    assert_same(out, m(x).detach())
    cm(x).sum().backward()                  # grad mode differs: a new training graph
    assert len(fw.graphs) == 3              # inference graph, then forward and backward
    assert all(p.grad is not None for p in m.parameters())


def test_backend_in_a_training_loop_matches_eager():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1)).to(DT)
    import copy

    ref = copy.deepcopy(m)
    cm = kiln.compile(m, backend="aot_eager")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(4):
        x = rn(8, 6)
        torch.manual_seed(100 + step)
        loss = cm(x).pow(2).mean()
        torch.manual_seed(100 + step)
        ref_loss = ref(x).pow(2).mean()
        assert_same(loss, ref_loss)
        for mod, o, l in ((m, opt, loss), (ref, ref_opt, ref_loss)):
            o.zero_grad()
            l.backward()
            o.step()
    for (k, a), (_, b) in zip(m.state_dict().items(), ref.state_dict().items()):
        assert_same(a, b, path=k)
