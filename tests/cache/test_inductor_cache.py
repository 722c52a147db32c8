"""The compile cache with the ``"inductor"`` backend: a load runs no AOT trace and no
Inductor compile, and returns exactly what the compile returned.

Inductor compiles C++ on CPU (seconds per graph): the graphs are tiny and few."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
import kiln.aot.dynamic as aot_dynamic
from kiln import _torch


@pytest.fixture
def work(monkeypatch):
    """Counts kiln's AOT traces and Inductor's graph compiles."""
    counts = {"traces": 0, "inductor": 0}
    real_stages, real_inductor = aot_dynamic._run_stages, _torch.inductor_compile_graph

    def stages(*a, **kw):
        counts["traces"] += 1
        return real_stages(*a, **kw)

    def inductor(*a, **kw):
        counts["inductor"] += 1
        return real_inductor(*a, **kw)
    monkeypatch.setattr(aot_dynamic, "_run_stages", stages)
    monkeypatch.setattr(_torch, "inductor_compile_graph", inductor)
    return counts


def step(x, w, buf):
    buf.add_(1)                                  # an input mutation: a runtime wrapper
    h = torch.nn.functional.gelu(x @ w)
    return h.sum(1), h.tanh(), x.view(-1)        # two differentiable outputs and an alias


def _inputs():
    return (torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True), torch.zeros(2))


def _clone(args):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in args]


def test_inductor_entry_loads_without_tracing_or_lowering(monkeypatch, work):
    from kiln.aot.compile import AOTCompiled
    from kiln.aot.runtime import wrapper_to_dict

    results = []
    real_cached = kiln.cache.cached

    def keep(*a, **kw):
        out = real_cached(*a, **kw)
        results.append(out)
        return out
    monkeypatch.setattr(kiln.cache, "cached", keep)

    first = _inputs()
    kiln.compile(step)(*first)
    assert kiln.cache.stats()["misses"] == 1 and kiln.cache.stats()["bytes_written"] > 0
    assert work == {"traces": 1, "inductor": 2}          # forward and backward
    kiln.reset()                                         # in-memory entries go: capture again
    args = _inputs()
    ref_args = _clone(args)
    out = kiln.compile(step)(*args)
    assert kiln.cache.stats()["hits"] == 1
    assert work == {"traces": 1, "inductor": 2}          # loaded: nothing traced or lowered

    compiled, loaded = results
    assert isinstance(compiled, AOTCompiled) and isinstance(loaded, AOTCompiled)
    p, q = compiled.parts, loaded.parts
    for field in ("kind", "num_fw_outputs", "tangent_positions", "fw_output_requires_grad",
                  "primal_requires_grad", "grad_enabled", "saved", "saved_bytes", "saved_input_bytes",
                  "symbolic", "grad_dependencies", "check_inputs", "check_outputs",
                  "copy_saved", "watch", "late_demand", "saved_demand"):
        assert getattr(p, field) == getattr(q, field), field
    assert [wrapper_to_dict(w) for w in p.wrappers] == [wrapper_to_dict(w) for w in q.wrappers]
    assert p.forward.code == q.forward.code and p.backward.code == q.backward.code
    for k in ("kiln_num_saved", "kiln_donated"):
        assert p.backward.meta.get(k) == q.backward.meta.get(k), k

    ref = step(*ref_args)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r)
    torch.testing.assert_close(args[2], ref_args[2])     # the mutation
    assert out[2].data_ptr() == args[0].data_ptr()       # the alias
    # a backward through one output only: its partial backward is compiled on demand
    out[0].sum().backward()
    ref[0].sum().backward()
    torch.testing.assert_close(args[0].grad, ref_args[0].grad)
    torch.testing.assert_close(args[1].grad, ref_args[1].grad)
    assert work == {"traces": 1, "inductor": 3}          # (the partial backward)

    # the entry was written again with that backward: the next load compiles it no more
    kiln.reset()
    args = _inputs()
    ref_args = _clone(args)
    out = kiln.compile(step)(*args)
    ref = step(*ref_args)
    out[0].sum().backward()
    ref[0].sum().backward()
    torch.testing.assert_close(args[1].grad, ref_args[1].grad)
    assert kiln.cache.stats()["hits"] == 2
    assert work == {"traces": 1, "inductor": 3}


def feeds_another(x, w):
    """An output that another output is computed from: the graph runs in segments, and its
    backward is made at run time (one fused graph, or a piece per segment)."""
    h = torch.tanh(x @ w)
    return (h * h).sum(), h


def test_a_segmented_graphs_backward_is_stored_once_it_ran(work):
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_()
    feeds_another(x, w_eager)[0].backward()
    grad = w_eager.grad                                  # eager's
    loss, h = kiln.compile(feeds_another)(x, w)
    assert work == {"traces": 1, "inductor": 1}          # the forward: the backward waits
    loss.backward()
    assert work == {"traces": 1, "inductor": 2}          # one fused backward
    torch.testing.assert_close(w.grad, grad)
    for backward in ("fused", "node by node"):
        kiln.reset()
        w.grad = None
        loss, h = kiln.compile(feeds_another)(x, w)
        if backward == "fused":
            loss.backward()
        else:                           # (a hook on the handed output: node by node)
            h.register_hook(lambda g: g)
            loss.backward()
        torch.testing.assert_close(w.grad, grad)
    # loaded both times; the fused backward came from the entry, the pieces compiled once each
    assert kiln.cache.stats()["hits"] == 2
    assert work["traces"] == 1 and work["inductor"] == 2 + 2
    kiln.reset()
    w.grad = None
    loss, h = kiln.compile(feeds_another)(x, w)
    h.register_hook(lambda g: g)
    loss.backward()
    torch.testing.assert_close(w.grad, grad)
    assert work["inductor"] == 4                         # every piece is in the entry now


def test_inductor_config_is_part_of_the_key():
    from kiln.backends.inductor import InductorBackend

    backend = InductorBackend()
    base = backend.cache_options()
    cfg = _torch.inductor_config()
    with cfg.patch(max_autotune_pointwise=not cfg.max_autotune_pointwise):
        assert backend.cache_options() != base
    assert backend.cache_options() == base
    assert InductorBackend(mode="max-autotune-no-cudagraphs").cache_options() != base


def _drop_frame_records():
    from kiln.cache import store
    for _, path in store.records():
        os.unlink(path)


_CHILD = textwrap.dedent("""
    import sys, torch, kiln
    import kiln.aot.dynamic as D
    from kiln import _torch
    work = []
    real, real_ind = D._run_stages, _torch.inductor_compile_graph
    D._run_stages = lambda *a, **k: (work.append("trace"), real(*a, **k))[1]
    _torch.inductor_compile_graph = lambda *a, **k: (work.append("inductor"), real_ind(*a, **k))[1]
    def f(x, w):
        return torch.nn.functional.silu(x @ w).sum(1)
    torch.manual_seed(int(sys.argv[1]))
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    out = kiln.compile(f)(x, w)
    w2 = w.detach().clone().requires_grad_()
    ref = f(x, w2)
    torch.testing.assert_close(out, ref)
    out.sum().backward(); ref.sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)
    s = kiln.cache.stats()
    print("RESULT", work.count("trace"), work.count("inductor"), s["hits"], s["misses"], s["frame_hits"])
""")


def test_fresh_process_with_warm_cache_lowers_nothing(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kiln.__file__))}

    def child(seed):
        p = subprocess.run([sys.executable, str(script), str(seed)], capture_output=True, text=True,
                           env=env, timeout=600)
        assert p.returncode == 0, p.stderr
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")][0]
        return tuple(int(v) for v in line.split()[1:])
    assert child(0) == (1, 2, 0, 1, 0)
    assert child(1) == (0, 0, 0, 0, 1)       # the frame record: not even a capture
    _drop_frame_records()
    assert child(1) == (0, 0, 1, 0, 0)       # captured, and the graph loaded


def test_dynamic_inductor_entry_loads_without_tracing_or_lowering(monkeypatch, work):
    """A graph with symbolic sizes: the entry holds the generated code (sizes read from the
    arguments), the symbolic metadata and the guards the trace added."""
    from kiln.aot.runtime import wrapper_to_dict

    results = []
    real_cached = kiln.cache.cached

    def keep(gm, example_inputs, **kw):
        out = real_cached(gm, example_inputs, **kw)
        from kiln.aot.export import fake_mode_of_graph

        results.append((out, [str(g.expr) for g in fake_mode_of_graph(gm).shape_env.guards]))
        return out
    monkeypatch.setattr(kiln.cache, "cached", keep)

    def dyn(x, w, buf):
        buf.add_(1)
        h = torch.nn.functional.gelu(x @ w)
        return h.sum(1)[: x.shape[0] - 1], h.tanh(), x.view(-1)

    def inputs(m):
        return (torch.randn(m, 4, requires_grad=True), torch.randn(4, m + 3, requires_grad=True), torch.zeros(m))
    kiln.compile(dyn, dynamic=True)(*inputs(3))
    assert work == {"traces": 1, "inductor": 2}
    kiln.reset()
    f = kiln.compile(dyn, dynamic=True)
    for m in (5, 6):
        args = inputs(m)
        ref_args = _clone(args)
        out = f(*args)
        ref = dyn(*ref_args)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r)
        torch.testing.assert_close(args[2], ref_args[2])
        out[0].sum().backward()                       # one output: a partial backward, on demand
        ref[0].sum().backward()
        torch.testing.assert_close(args[0].grad, ref_args[0].grad)
        torch.testing.assert_close(args[1].grad, ref_args[1].grad)
    assert kiln.cache.stats()["hits"] == 1
    assert work == {"traces": 1, "inductor": 3}       # nothing traced or lowered but the partial backward
    (compiled, g1), (loaded, g2) = results
    p, q = compiled.parts, loaded.parts
    for field in ("kind", "num_fw_outputs", "tangent_positions", "saved", "symbolic", "grad_dependencies",
                  "trace_guards", "input_guards", "input_ranges"):
        assert getattr(p, field) == getattr(q, field), field
    assert [wrapper_to_dict(w) for w in p.wrappers] == [wrapper_to_dict(w) for w in q.wrappers]
    assert p.forward.code == q.forward.code and p.backward.code == q.backward.code
    assert compiled.input_check.conditions == loaded.input_check.conditions and g1 == g2


_DYNAMIC_CHILD = textwrap.dedent("""
    import sys, torch, kiln
    import kiln.aot.dynamic as D
    from kiln import _torch
    work = []
    real, real_ind = D._run_stages, _torch.inductor_compile_graph
    D._run_stages = lambda *a, **k: (work.append("trace"), real(*a, **k))[1]
    _torch.inductor_compile_graph = lambda *a, **k: (work.append("inductor"), real_ind(*a, **k))[1]
    def f(x, w):
        return torch.nn.functional.silu(x @ w).sum(1) * x.shape[0]
    g = kiln.compile(f)                                   # automatic dynamic
    w = torch.randn(4, 3)
    for n in map(int, sys.argv[1:]):
        x = torch.randn(n, 4)
        torch.testing.assert_close(g(x, w), f(x, w))
    s = kiln.cache.stats()
    print("RESULT", work.count("trace"), work.count("inductor"), s["hits"], s["misses"], s["frame_hits"])
""")


def test_fresh_process_loads_the_dynamic_graph_automatic_dynamic_made(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_DYNAMIC_CHILD)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kiln.__file__))}

    def child(*sizes):
        p = subprocess.run([sys.executable, str(script), *map(str, sizes)], capture_output=True, text=True,
                           env=env, timeout=600)
        assert p.returncode == 0, p.stderr
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")][0]
        return tuple(int(v) for v in line.split()[1:])
    assert child(3, 5, 6) == (2, 2, 0, 2, 0)  # static, then dim 0 symbolic: two inference graphs
    assert child(7, 9) == (0, 0, 0, 0, 1)     # the frame record's dynamic entry: no capture
    _drop_frame_records()
    assert child(7, 9) == (0, 0, 1, 0, 0)     # symbolic at once (the profile), and loaded


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_an_entry_compiled_for_one_gpu_is_served_to_another_rebound(work):
    """Inductor's code names the device it was compiled for: the ranks of one machine (cuda:0,
    cuda:1) sharing a cache directory share one compile, rebound to each GPU, and both run."""
    def f(x, w):
        return torch.relu(x @ w).sum(1) * 2

    outs = []
    for dev in ("cuda:0", "cuda:1"):
        kiln.reset()
        x, w = torch.randn(8, 16, device=dev), torch.randn(16, 4, device=dev)
        before = kiln.cache.stats()["misses"]
        out = kiln.compile(f, backend="inductor")(x, w)
        torch.testing.assert_close(out, f(x, w))
        assert out.device == x.device
        outs.append(kiln.cache.stats()["misses"] - before)
    assert outs == [1, 0]
    assert work["inductor"] == 1
