"""Dynamic (symbolic-shape) graphs in the compile cache: keyed with their symbolic
sizes, stored with the guards their trace added, loaded without tracing into the capture's
ShapeEnv; a fresh process hits them once the automatic-dynamic profile made dims symbolic.

aot_eager here (fast); the inductor case is in test_inductor_cache.py."""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import sympy

import torch

import kiln
import kiln.aot.dynamic as aot_dynamic
from kiln.aot import symbolic_codec as C


@pytest.fixture
def traces(monkeypatch):
    calls = []
    real = aot_dynamic._run_stages

    def counted(*a, **kw):
        calls.append(kw.get("dynamic"))
        return real(*a, **kw)
    monkeypatch.setattr(aot_dynamic, "_run_stages", counted)
    return calls


@pytest.fixture
def results(monkeypatch):
    """Each cached() result, with the capture's ShapeEnv guards right after it."""
    out = []
    real = kiln.cache.cached

    def keep(gm, example_inputs, **kw):
        res = real(gm, example_inputs, **kw)
        from kiln.aot.export import fake_mode_of_graph

        mode = fake_mode_of_graph(gm)
        guards = [str(g.expr) for g in mode.shape_env.guards] if mode is not None else None
        out.append((res, guards, gm, list(example_inputs)))
        return res
    monkeypatch.setattr(kiln.cache, "cached", keep)
    return out


def sliced(x, w, buf, k):
    buf.add_(1)                                        # an input mutation
    h = torch.relu(x @ w) * k
    # an output whose size is an expression of the symbols, an output view of an input, a
    # symbolic int output
    return h.sum(0)[: x.shape[0] - 1], x.view(-1), x.shape[0] * 2


def args_for(m):
    return [torch.randn(m, 4, requires_grad=True), torch.randn(4, m + 3, requires_grad=True), torch.zeros(m), m]


def clone(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def check(fn, compiled_fn, args):
    ref_args = clone(args)
    out = compiled_fn(*args)
    ref = fn(*ref_args)
    torch.testing.assert_close(out[0], ref[0])
    torch.testing.assert_close(out[1], ref[1])
    assert out[2] == ref[2]
    torch.testing.assert_close(args[2], ref_args[2])
    out[0].sum().backward()
    ref[0].sum().backward()
    torch.testing.assert_close(args[0].grad, ref_args[0].grad)
    torch.testing.assert_close(args[1].grad, ref_args[1].grad)
    return out


def test_dynamic_entry_loads_without_tracing_field_by_field(traces, results):
    from kiln.aot.compile import AOTCompiled
    from kiln.aot.runtime import wrapper_to_dict

    check(sliced, kiln.compile(sliced, backend="aot_eager", dynamic=True), args_for(3))
    assert kiln.cache.stats()["misses"] == 1 and kiln.cache.stats()["bytes_written"] > 0
    assert traces == [True]
    kiln.reset()                                       # a new capture, its own ShapeEnv
    f = kiln.compile(sliced, backend="aot_eager", dynamic=True)
    check(sliced, f, args_for(5))
    check(sliced, f, args_for(6))
    assert kiln.cache.stats()["hits"] == 1 and traces == [True]      # loaded: nothing traced

    (compiled, guards_compiled, _, _), (loaded, guards_loaded, _, _) = results
    assert isinstance(compiled, AOTCompiled) and isinstance(loaded, AOTCompiled)
    p, q = compiled.parts, loaded.parts
    assert p.symbolic and q.symbolic
    for field in ("kind", "num_fw_outputs", "tangent_positions", "fw_output_requires_grad",
                  "primal_requires_grad", "grad_enabled", "saved", "saved_bytes", "saved_input_bytes",
                  "partitioner", "symbolic", "grad_dependencies", "check_inputs", "check_outputs",
                  "copy_saved", "watch", "late_demand", "saved_demand",
                  "trace_guards", "input_guards", "input_ranges"):
        assert getattr(p, field) == getattr(q, field), field
    assert [wrapper_to_dict(w) for w in p.wrappers] == [wrapper_to_dict(w) for w in q.wrappers]
    assert p.forward.code == q.forward.code and p.backward.code == q.backward.code
    for a, b in zip(p.input_fakes, q.input_fakes):
        assert C.encode_value(a) == C.encode_value(b)
    for g, h in ((p.forward, q.forward), (p.backward, q.backward)):
        va = [n.meta.get("val") for n in g.graph.nodes if n.op == "placeholder"]
        vb = [n.meta.get("val") for n in h.graph.nodes if n.op == "placeholder"]
        assert C.encode_value(va) == C.encode_value(vb)
    # the symbolic sizes are checked on every call, as after the compile
    assert compiled.input_check.conditions == loaded.input_check.conditions
    assert loaded.fallback is not None
    # the guards the trace added are the capture's after a load too (the frame's shape guards)
    assert guards_compiled == guards_loaded
    assert p.trace_guards                              # (the slice guarded x.shape[0] - 1 >= 2)


def test_loaded_dynamic_entry_compiles_per_shape_outside_its_trace(traces, results):
    kiln.compile(sliced, backend="aot_eager", dynamic=True)(*args_for(3))
    kiln.reset()
    kiln.compile(sliced, backend="aot_eager", dynamic=True)(*args_for(5))
    assert kiln.cache.stats()["hits"] == 1 and traces == [True]
    loaded, _, gm, example_inputs = results[-1]
    # the graph's own arguments, with w (4, 8) in another layout: outside the symbolic trace
    bad = [a.detach().t().contiguous().t().requires_grad_(a.requires_grad)
           if isinstance(a, torch.Tensor) and a.shape == (4, 8) else
           a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
           for a in example_inputs]
    ref_args = clone(bad)
    assert not loaded.input_check.holds(bad)
    out = loaded(*bad)
    ref = gm(*ref_args)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r)
    assert traces == [True, False]                     # compiled for these shapes
    out[0].sum().backward()
    ref[0].sum().backward()
    for a, r in zip(bad, ref_args):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            torch.testing.assert_close(a.grad, r.grad)


def test_a_dynamic_miss_says_why(capsys):
    kiln.set_logs("cache")
    kiln.compile(sliced, backend="aot_eager", dynamic=True)(*args_for(3))
    kiln.reset()
    args = args_for(3)
    args[0] = args[0].detach().double().requires_grad_()
    args[1] = args[1].detach().double().requires_grad_()
    args[2] = args[2].double()
    kiln.compile(sliced, backend="aot_eager", dynamic=True)(*args)
    err = capsys.readouterr().err
    # (the inputs are numbered after the size symbols that come first)
    assert re.search(r"input \d+ dtype: float32 -> float64", err) and "sizes" not in err.split("miss sliced")[-1]


def test_codec_round_trips_expressions_and_refuses_unknown_functions():
    from torch.utils._sympy.functions import FloorDiv, Mod
    from torch.utils._sympy.numbers import int_oo

    s0, s1 = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True)
    for e in (s0 * 2 + 1, FloorDiv(s0, 8), Mod(s1, 4), sympy.Max(s0, s1 - 3), sympy.Eq(s0, s1),
              sympy.Ge(s0 - 1, 2), sympy.And(sympy.Lt(s0, 9), sympy.Ne(s1, 0)), sympy.Rational(3, 2) * s0,
              int_oo, -int_oo, sympy.true):
        assert C.decode_expr(C.encode_expr(e)) == e, e
    assert C.decode_expr(C.encode_expr(s0)) != sympy.Symbol("s0")       # assumptions are kept
    with pytest.raises(ValueError):
        C.encode_expr(sympy.sin(s0))
    with pytest.raises(ValueError):
        C.decode_expr({"f": "os.system", "args": [{"i": 1}]})


def test_guards_that_do_not_hold_for_the_capture_are_not_added():
    from kiln import _torch

    mode = _torch.new_fake_mode()
    n = _torch.symbolic_int(mode, 3, "L['n']")
    env = mode.shape_env
    e = n.node.expr
    before = len(env.guards)
    with pytest.raises(C.EntryDoesNotFit):
        C.replay_guards(env, [sympy.Ge(e, 2), sympy.Gt(e, 10)])
    assert len(env.guards) == before
    C.replay_guards(env, [sympy.Ge(e, 2)])
    assert [str(g.expr) for g in env.guards[before:]] == [str(sympy.Ge(e, 2))]


def test_a_chained_dynamic_graph_stays_correct_when_loaded(traces):
    def chained(x, w):
        y = torch.log_softmax(x @ w, -1)                  # an output that feeds another
        return y, (y * y).sum()

    def run(m):
        x, w = torch.randn(m, 4, requires_grad=True), torch.randn(4, 6, requires_grad=True)
        rx, rw = clone([x, w])
        y, loss = kiln.compile(chained, backend="aot_eager", dynamic=True)(x, w)
        ry, rloss = chained(rx, rw)
        torch.testing.assert_close(y, ry)
        torch.testing.assert_close(loss, rloss)
        g, = torch.autograd.grad(loss, [y], retain_graph=True)
        rg, = torch.autograd.grad(rloss, [ry], retain_graph=True)
        torch.testing.assert_close(g, rg)
        (loss + y.sum()).backward()
        (rloss + ry.sum()).backward()
        torch.testing.assert_close(x.grad, rx.grad)
        torch.testing.assert_close(w.grad, rw.grad)
    run(3)
    run(5)
    kiln.reset()
    run(7)
    run(9)
    assert kiln.cache.stats()["hits"] >= 1


_CHILD = textwrap.dedent("""
    import sys, torch, kiln
    import kiln.aot.dynamic as D
    traces = []
    real = D._run_stages
    D._run_stages = lambda *a, **k: (traces.append(k.get("dynamic")), real(*a, **k))[1]
    def f(x, w):
        return torch.tanh(x @ w).sum(1) * x.shape[0]
    g = kiln.compile(f, backend="aot_eager")          # automatic dynamic
    for n in map(int, sys.argv[1:]):
        x, w = torch.randn(n, 4), torch.randn(4, 3, requires_grad=True)
        w2 = w.detach().clone().requires_grad_()
        out, ref = g(x, w), f(x, w2)
        torch.testing.assert_close(out, ref)
        out.sum().backward(); ref.sum().backward()
        torch.testing.assert_close(w.grad, w2.grad)
    s = kiln.cache.stats()
    print("RESULT", traces.count(True), traces.count(False), s["hits"], s["misses"], s["frame_hits"])
""")


def test_fresh_process_hits_after_automatic_dynamic_made_dims_symbolic(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kiln.__file__))}

    def child(*sizes):
        p = subprocess.run([sys.executable, str(script), *map(str, sizes)], capture_output=True, text=True,
                           env=env, timeout=300)
        assert p.returncode == 0, p.stderr
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")][0]
        return tuple(int(v) for v in line.split()[1:])
    # first process: static, then the size changes and dim 0 becomes symbolic (one dynamic trace)
    assert child(3, 5, 6) == (1, 1, 0, 2, 0)
    # next process: the frame record's dynamic entry serves the new sizes (no capture at all)
    assert child(7, 8) == (0, 0, 0, 0, 1)
    # without frame records: the profile makes dim 0 symbolic at once, and that entry is loaded
    from kiln.cache import store
    for _, path in store.records():
        os.unlink(path)
    assert child(7, 8) == (0, 0, 1, 0, 0)


def test_an_entry_whose_trace_guards_fail_for_the_new_sizes_is_a_miss(traces, capsys):
    kiln.set_logs("cache")
    check(sliced, kiln.compile(sliced, backend="aot_eager", dynamic=True), args_for(3))
    kiln.reset()
    # the same graph and shape facts (same key), but the stored trace guarded x.shape[0] - 1 >= 2
    check(sliced, kiln.compile(sliced, backend="aot_eager", dynamic=True), args_for(2))
    err = capsys.readouterr().err
    assert "does not hold for these sizes" in err
    s = kiln.cache.stats()
    assert s["hits"] == 0 and s["misses"] == 2 and traces == [True, True]


@pytest.mark.parametrize("dynamic", [True, None])
def test_generated_programs_loaded_from_the_cache_match_eager(tmp_path, dynamic):
    """The fuzzer's programs, each run twice over one cache directory: the second run loads
    (static and dynamic graphs, the automatic-dynamic profile of the first run), and must
    still match eager everywhere the fuzzer looks."""
    from tests.fuzz.generator import generate
    from tests.fuzz.runner import run_program

    hits = 0
    for seed in (2, 5, 11, 17):
        prog = generate(seed)
        cache = str(tmp_path / f"seed{seed}")
        first = run_program(prog, "aot_eager", dynamic, cache_dir=cache)
        kiln.cache.reset_stats()
        second = run_program(prog, "aot_eager", dynamic, cache_dir=cache)
        hits += kiln.cache.stats()["hits"]
        assert second.status == first.status, f"seed {seed}: {second.describe()}"
        assert second.status in ("ok", "invalid"), f"seed {seed}: {second.describe()}"
    assert hits > 0


def transposed_in_place(x):
    x.t_()                      # the capture's fake changes layout: the AOT trace is per shape
    return x * 2


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_graph_compiled_per_shape_stores_its_shapes(backend, traces, tmp_path):
    """A dynamic graph the AOT stages compile per shape (its symbolic trace is not possible):
    the entry keeps each shape compiled, a new process loads them instead of tracing, and a
    package carries them."""
    def run(compiled, sizes):
        for n in sizes:
            x = torch.randn(n, 3)
            ref = x.clone()
            torch.testing.assert_close(compiled(x), transposed_in_place(ref))
            assert x.shape == ref.shape and x.stride() == ref.stride()

    compiled = kiln.compile(transposed_in_place, backend=backend, dynamic=True)
    run(compiled, (8, 5, 8))
    assert traces == [True, False, False]             # one symbolic try, then the two shapes
    path = str(tmp_path / "shapes.kiln")
    report = compiled.save_package(path)
    assert report.entries == 1 and not report.left_out, report
    kiln.reset()
    del traces[:]
    run(kiln.compile(transposed_in_place, backend=backend, dynamic=True), (5, 8, 6))
    assert traces == [False], traces                  # 5 and 8 loaded; 6 compiled
    kiln.reset()
    del traces[:]
    with kiln.config.patch(cache=False):
        run(kiln.load_package(path, transposed_in_place, on_miss="error"), (8, 5))
    assert traces == [], traces


def exp_changed_in_place(x):
    y = x.exp()
    y.add_(1)                   # exp saved y: eager's backward raises; kiln's AOT stages refuse
    return y


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_graph_the_aot_stages_failed_on_is_stored_as_such(backend, traces, tmp_path):
    """A graph kiln's AOT stages fail on runs as captured; its entry says so, and a new process
    (or a package) runs it as captured without tracing it again."""
    def run(compiled):
        x = torch.randn(4, requires_grad=True)
        out = compiled(x)
        torch.testing.assert_close(out, x.detach().exp() + 1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()

    compiled = kiln.compile(exp_changed_in_place, backend=backend)
    run(compiled)
    assert traces == [False]
    path = str(tmp_path / "captured.kiln")
    report = compiled.save_package(path)
    assert report.entries == 1 and not report.left_out, report
    kiln.reset()
    del traces[:]
    run(kiln.compile(exp_changed_in_place, backend=backend))
    assert traces == [] and kiln.cache.stats()["hits"] == 1, (traces, kiln.cache.stats())
    kiln.reset()
    with kiln.config.patch(cache=False):
        run(kiln.load_package(path, exp_changed_in_place, on_miss="error"))
    assert traces == []
