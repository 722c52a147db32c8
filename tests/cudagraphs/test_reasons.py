"""The compile-time decisions of kiln.cudagraphs (which graphs cannot be recorded, and why),
the or-error switch and the logs: CPU-testable."""
from __future__ import annotations

import json
import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.cudagraphs import graph_facts


def traced(fn, *shapes, device="cuda"):
    """The ATen graph of ``fn`` on fake tensors of ``device`` (no GPU needed)."""
    from torch._subclasses import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=False)
    with mode:
        args = [torch.empty(*s, device=device) for s in shapes]
    with mode:
        gm = make_fx(fn)(*args)
    return graph_facts(gm, "forward")


def one_op_graph(op, value):
    """A graph calling ``op`` on one fake CUDA input (ops make_fx cannot trace on fakes)."""
    from torch._subclasses import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, device="cuda")
    g = torch.fx.Graph()
    p = g.placeholder("x")
    p.meta["val"] = x
    n = g.call_function(op, (p,))
    n.meta["val"] = value
    g.output((n,))
    return graph_facts(torch.fx.GraphModule(torch.nn.Module(), g), "inference")


def test_cuda_graph_is_recordable():
    f = traced(lambda x, y: torch.relu(x) @ y, (4, 4), (4, 4))
    assert f.skip is None and f.written_inputs == []


def test_cpu_op_item_and_dynamic_shape_ops_are_skip_reasons():
    cpu_op = traced(lambda x: x + torch.ones(4, device="cpu").sum(), (4,))
    assert "cpu device" in cpu_op.skip and cpu_op.op_level         # (may be split around)
    assert "device sync" in one_op_graph(torch.ops.aten._local_scalar_dense.default, 1).skip
    assert "data-dependent output shape" in one_op_graph(torch.ops.aten.nonzero.default, None).skip
    cpu_input = traced(lambda x: x + 1, (4,), device="cpu")
    assert "cpu device" in cpu_input.skip and not cpu_input.op_level


def region_graph(block_fn):
    """A forward graph calling a repeated block (``invoke_region``) whose ATen graph is
    ``block_fn`` traced on a fake CUDA tensor."""
    from torch._subclasses import FakeTensorMode

    from kiln.aot.regions import invoke_region

    mode = FakeTensorMode(allow_non_fake_inputs=False)
    with mode:
        x = torch.empty(4, device="cuda")
        block = make_fx(block_fn)(x)
        out = tuple(block_fn(x))
    root = torch.nn.Module()
    root.block = block
    g = torch.fx.Graph()
    p = g.placeholder("x")
    p.meta["val"] = x
    n = g.call_function(invoke_region, (g.get_attr("block"), p))
    n.meta["val"] = out
    g.output((g.call_function(operator.getitem, (n, 0)),))
    return graph_facts(torch.fx.GraphModule(root, g), "forward")


def test_ops_inside_a_repeated_block_are_checked():
    """A replay runs a block's ops as recorded: the check looks inside the block."""
    assert region_graph(lambda x: (torch.relu(x) * 2,)).skip is None
    facts = region_graph(lambda x: (x + torch.ones(4, device="cpu").sum(),))
    assert "cpu device" in facts.skip and "inside kiln_invoke_region" in facts.skip and facts.op_level


def test_meta_tensors_do_not_skip():
    f = traced(lambda x, m: (x * 2, m * 3), (4,), (4,))   # both cuda
    assert f.skip is None

    from torch._subclasses import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        x, m = torch.empty(4, device="cuda"), torch.empty(16, device="meta")
        gm = make_fx(lambda x, m: (x * 2, m * 3))(x, m)
    assert graph_facts(gm, "inference").skip is None


def test_written_inputs_are_found():
    def f(x, y):
        x.add_(1)
        return y * 2
    from torch._subclasses import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        a, b = torch.empty(4, device="cuda"), torch.empty(4, device="cuda")
        gm = make_fx(f)(a, b)
    assert graph_facts(gm, "inference").written_inputs == [0]


def test_or_error_raises_and_skips_are_logged(capfd, monkeypatch):
    def f(x):
        return torch.sin(x) + 1

    x = torch.randn(8)
    kiln.set_logs("cudagraphs")
    with kiln.config.patch(cudagraphs=True):
        cf = kiln.compile(f, backend="aot_eager")
        torch.testing.assert_close(cf(x), f(x))
        err = capfd.readouterr().err
        assert "skipping CUDA graphs" in err and "cpu device" in err and "test_reasons.py" in err
        kiln.reset()
        with kiln.config.patch(cudagraph_or_error=True):
            cf = kiln.compile(f, backend="aot_eager")
            with pytest.raises(kiln.CudagraphError, match=r"(?s)cpu device.*test_reasons\.py"):
                cf(x)


def test_or_error_from_the_environment(monkeypatch):
    from kiln.config import Config, _from_env

    monkeypatch.setenv("KILN_CUDAGRAPH_OR_ERROR", "1")
    monkeypatch.setenv("KILN_CUDAGRAPHS", "1")
    cfg = _from_env(Config())
    assert cfg.cudagraph_or_error is True and cfg.cudagraphs is True and cfg.cudagraph_max_recording == 5


def test_reduce_overhead_turns_kiln_cudagraphs_on_for_inductor():
    from kiln.backends import lookup_backend

    assert lookup_backend("inductor", mode="reduce-overhead")[0].cudagraphs
    assert not lookup_backend("inductor")[0].cudagraphs
    with kiln.config.patch(cudagraphs=True):
        assert lookup_backend("inductor")[0].cudagraphs


def test_index_with_integer_indices_is_recordable():
    # aten.index is tagged dynamic_output_shape (boolean masks), but integer indices give a
    # static shape: no reason to skip
    from torch._subclasses import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(8, 4, device="cuda")
        i = torch.empty(3, dtype=torch.long, device="cuda")
        out = torch.empty(3, 4, device="cuda")
    g = torch.fx.Graph()
    px, pi = g.placeholder("x"), g.placeholder("i")
    px.meta["val"], pi.meta["val"] = x, i
    n = g.call_function(torch.ops.aten.index.Tensor, (px, [pi]))
    n.meta["val"] = out
    g.output((n,))
    assert torch.Tag.dynamic_output_shape in torch.ops.aten.index.Tensor.tags
    assert graph_facts(torch.fx.GraphModule(torch.nn.Module(), g), "inference").skip is None


def test_facts_are_plain_data_and_rebuild_the_function_without_the_graph():
    from kiln.cudagraphs import GraphFacts, cudagraphify

    from torch._subclasses import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(4, device="cuda"), torch.empty(4, device="cuda")
        gm = make_fx(lambda w, x: (w * x, x + 1))(a, b)
    next(n for n in gm.graph.nodes if n.op == "placeholder").meta["kiln_static"] = True
    gm.meta["kiln_num_fw_outputs"] = 1
    facts = graph_facts(gm, "forward")
    assert facts.static_inputs == [0] and facts.saved_from == 1 and facts.skip is None
    loaded = GraphFacts.from_dict(json.loads(json.dumps(facts.to_dict())))
    assert loaded == facts
    fn = cudagraphify(lambda w, x: (w * x, x + 1), None, "forward", facts=loaded)
    assert fn.static_idxs == {0} and fn.protected_from == 1 and fn.kind == "forward"
    # on a CPU-only graph, the rebuilt function runs as compiled, with the stored reason
    cpu = graph_facts(make_fx(lambda x: x + 1)(torch.ones(3)), "inference")
    run = cudagraphify(lambda x: x + 1, None, "inference", facts=GraphFacts.from_dict(cpu.to_dict()))
    assert run.disabled and torch.equal(run([torch.ones(3)]), torch.full((3,), 2.0))


def test_cudagraphs_apply_to_a_compile_cache_load(capfd):
    # The recording is a post-compile step: an aot_eager entry stored without CUDA graphs is
    # loaded with them, and makes the same decision (here: CPU inputs, run as compiled)
    from kiln.cudagraphs import skip_reasons

    def f(x):
        return torch.tanh(x) * 3

    x = torch.randn(8)
    kiln.compile(f, backend="aot_eager")(x)
    assert kiln.cache.stats()["misses"] >= 1
    kiln.reset()
    skip_reasons.clear()
    hits = kiln.cache.stats()["hits"]
    with kiln.config.patch(cudagraphs=True):
        torch.testing.assert_close(kiln.compile(f, backend="aot_eager")(x), f(x))
    assert kiln.cache.stats()["hits"] == hits + 1
    assert any("cpu device" in r for r in skip_reasons), skip_reasons
