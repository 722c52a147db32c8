"""backend="inductor": kiln's AOT stages, Inductor's per-graph compiler, kiln's runtime wrappers.

Inductor on CPU compiles C++ with the system compiler, a few seconds per graph: graphs are
small, and tests that check one compiled function share it (module-scoped fixtures; kiln's
entries are reset between tests, and the recompiles hit Inductor's FX graph cache). Every
result is compared with eager on fresh inputs; graph counts with the eager backend's. Dropout:
kiln keeps ``fallback_random=True`` by default, so a seed gives eager's
exact mask (the zeros must be the same elements; the kept values are compared within float32
tolerance, as Inductor's arithmetic may differ from eager's in the last bit);
``fallback_random=False`` is Inductor's own RNG (checked for being a valid dropout, not for
eager's numbers).
"""
from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

import kiln
from kiln import _torch
from kiln.aot import AOTCompiled
from kiln.backends import lookup_backend
from kiln.backends.inductor.progress import Progress
from kiln.testing import CompileCounter

RTOL = ATOL = 1e-5


class CountingInductor:
    """The inductor backend, counting the graphs it compiles."""

    __name__ = "counting_inductor"

    def __init__(self, mode=None, options=None):
        self.inner = lookup_backend("inductor", mode=mode, options=options)[0]
        self.frame_count = 0
        self.compiled: list = []

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        out = self.inner(gm, example_inputs)
        self.compiled.append(out)
        return out


def close(actual, expected, rtol=RTOL, atol=ATOL):
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def assert_inductor_compiled(counter: CountingInductor) -> None:
    """Every graph went through Inductor: none fell back to FX."""
    assert counter.compiled
    for c in counter.compiled:
        assert c.kiln_inductor_fallbacks == [], c.kiln_inductor_fallbacks
        # (a graph loaded from the compile cache reports its load instead)
        assert set(c.kiln_compile_seconds) in ({"aot", "partition", "inductor"}, {"load"})


# ------------------------------------------------------------------------------------------------
# Inference and training of one small model (shared compiled module)
# ------------------------------------------------------------------------------------------------

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x)))).softmax(-1)


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    model = Net()
    eager = copy.deepcopy(model)
    counter = CountingInductor()
    return model, eager, kiln.compile(model, backend=counter), counter


def test_inference_matches_eager(net):
    model, eager, compiled, counter = net
    for _ in range(2):
        x = torch.randn(6, 12)
        with torch.no_grad():
            close(compiled(x), eager(x))
    inference = [c for c in counter.compiled if c.kind == "inference"]
    assert len(inference) == 1             # the second call reused it
    assert isinstance(inference[0], AOTCompiled)
    assert_inductor_compiled(counter)


def test_training_matches_eager(net):
    model, eager, compiled, counter = net
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(2):                     # two steps: the second sees updated weights
        x = torch.randn(6, 12)
        for o in (opt, opt_e):
            o.zero_grad(set_to_none=True)
        loss, loss_e = compiled(x).pow(2).sum(), eager(x).pow(2).sum()
        close(loss, loss_e)
        loss.backward()
        loss_e.backward()
        for (name, p), pe in zip(model.named_parameters(), eager.parameters()):
            close(p.grad, pe.grad)
        opt.step()
        opt_e.step()
    training = [c for c in counter.compiled if c.kind == "training"]
    assert len(training) == 1
    assert training[0].parts.partitioner.startswith("min_cut")     # kiln's, after Inductor's passes
    assert_inductor_compiled(counter)


# ------------------------------------------------------------------------------------------------
# Semantics the runtime wrappers keep: input mutations, output aliases, RNG, autocast
# ------------------------------------------------------------------------------------------------

def test_batchnorm_running_stats_and_grads():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="inductor")
    for _ in range(2):
        x = torch.randn(2, 3, 6, 6)
        out, out_e = compiled(x), eager(x)
        close(out, out_e)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            close(getattr(model[1], name), getattr(eager[1], name))
        out.sum().backward()
        out_e.sum().backward()
    for p, pe in zip(model.parameters(), eager.parameters()):
        close(p.grad, pe.grad, rtol=1e-4, atol=1e-4)


def test_input_mutation_and_outputs_aliasing_inputs():
    def f(x, buf):
        buf.mul_(2).add_(x)            # a mutated input
        return x.view(-1), x.t(), (x * buf).sum(0)

    compiled = kiln.compile(f, backend="inductor")
    x, buf = torch.randn(3, 4), torch.randn(3, 4)
    buf_e = buf.clone()
    flat, t, s = compiled(x, buf)
    flat_e, t_e, s_e = f(x, buf_e)
    close(buf, buf_e)
    close(s, s_e)
    assert flat.data_ptr() == x.data_ptr() and t.data_ptr() == x.data_ptr()   # views, as in eager
    assert t.stride() == t_e.stride()
    x.add_(1)                          # seen through the views
    close(flat, x.view(-1))
    close(t, x.t())


def test_dropout_same_seed_same_mask_as_eager():
    def f(x):
        return torch.nn.functional.dropout(x.sin(), 0.5, training=True) * 3

    compiled = kiln.compile(f, backend="inductor")
    x = torch.randn(32, 32, requires_grad=True)
    for seed in (1, 2):                # the first call compiles: compiling draws nothing
        torch.manual_seed(seed)
        expected = f(x)
        (g_e,) = torch.autograd.grad(expected.sum(), x)
        torch.manual_seed(seed)
        got = compiled(x)
        (g,) = torch.autograd.grad(got.sum(), x)
        assert torch.equal(got == 0, expected == 0) and torch.equal(g == 0, g_e == 0)   # eager's mask
        close(got, expected)           # (sin itself may differ in the last bit)
        close(g, g_e)


def test_dropout_with_inductor_rng_is_a_dropout():
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, training=True)

    compiled = kiln.compile(f, backend="inductor", options={"fallback_random": False})
    x = torch.rand(64, 64) + 1
    out = compiled(x)
    kept = out != 0
    close(out[kept], x[kept] * 2)
    assert 0.3 < kept.float().mean().item() < 0.7


def test_autocast_region():
    def f(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.mm(x, w)
        return y.float().relu() + 1, y.dtype

    compiled = kiln.compile(f, backend="inductor")
    x, w = torch.randn(8, 16), torch.randn(16, 4, requires_grad=True)
    (out, dt), (out_e, dt_e) = compiled(x, w), f(x, w)
    assert dt == dt_e == torch.bfloat16 and out.dtype == out_e.dtype
    close(out, out_e)
    (g,) = torch.autograd.grad(out.sum(), w)
    (g_e,) = torch.autograd.grad(out_e.sum(), w)
    close(g, g_e)


def _lm_loss(x, w, target):
    return torch.nn.functional.cross_entropy(x @ w, target)


@pytest.fixture(scope="module")
def lm_loss():
    counter = CountingInductor()
    return kiln.compile(_lm_loss, backend=counter), counter


def test_backward_saves_what_torch_compile_saves(lm_loss):
    """Inductor's joint-graph passes rewrite cross-entropy's backward (``iota == target``);
    the new nodes belong to the backward, so nothing logits-sized but the logits is saved."""
    compiled, counter = lm_loss
    x, w = torch.randn(64, 16), torch.randn(16, 300, requires_grad=True)
    target = torch.randint(0, 300, (64,))
    compiled(x, w, target)             # compiles (outside the hooks: only the step is counted)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss = compiled(x, w, target)
    close(loss, _lm_loss(x, w, target))
    big = [t for t in saved if t.numel() >= 64 * 300]
    assert [t.dtype for t in big] == [torch.float32], [(t.dtype, t.shape) for t in big]
    (g,) = torch.autograd.grad(loss, w)
    (g_e,) = torch.autograd.grad(_lm_loss(x, w, target), w)
    close(g, g_e)


def test_donated_saved_tensors_and_retain_graph(lm_loss):
    """The backward may reuse the memory of saved activations (donated buffers); with
    ``retain_graph=True`` it gets copies, so a second backward still sees them intact."""
    compiled, counter = lm_loss
    x, w = torch.randn(64, 16), torch.randn(16, 300, requires_grad=True)
    target = torch.randint(0, 300, (64,))
    loss, loss_e = compiled(x, w, target), _lm_loss(x, w, target)
    training = counter.compiled[-1]
    assert training.kind == "training" and training.parts.backward.meta["kiln_donated"]  # the logits
    for _ in range(2):
        (g,) = torch.autograd.grad(loss, w, retain_graph=True)
        (g_e,) = torch.autograd.grad(loss_e, w, retain_graph=True)
        close(g, g_e)


# ------------------------------------------------------------------------------------------------
# Graph counts, graph breaks, dynamic shapes
# ------------------------------------------------------------------------------------------------

def _breaking(x, w):
    h = torch.tanh(x @ w)
    print("a graph break")
    return (h * 2).sum(-1)


def test_graph_break_same_counts_as_eager(capsys):
    eager_counter, counter = CompileCounter(), CountingInductor()
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    expected = kiln.compile(_breaking, backend=eager_counter)(x, w)
    got = kiln.compile(_breaking, backend=counter)(x, w)
    close(got, expected)
    assert counter.frame_count == eager_counter.frame_count == 2
    (g,) = torch.autograd.grad(got.sum(), w)
    (g_e,) = torch.autograd.grad(_breaking(x, w).sum(), w)
    close(g, g_e)
    assert_inductor_compiled(counter)


def _dynamic(x, w):
    return (x @ w).softmax(-1) * x.shape[0]


def test_dynamic_compiles_once_for_every_size():
    counter = CountingInductor()
    compiled = kiln.compile(_dynamic, backend=counter, dynamic=True)
    w = torch.randn(8, 8)
    for n in (3, 5, 9, 17):
        x = torch.randn(n, 8)
        close(compiled(x, w), _dynamic(x, w))
    assert counter.frame_count == 1 and len(compiled.entries) == 1
    (aot,) = counter.compiled
    assert aot.parts.symbolic and aot.fallback.compiles == 0     # one symbolic graph served all
    assert_inductor_compiled(counter)


def test_shape_facts_inductor_adds_become_guards(monkeypatch):
    """A size fact Inductor records while compiling (in the capture's ShapeEnv) is a guard of
    the entry; a size it specializes is specialized in the entry's guards."""
    real = _torch.inductor_compile_graph
    seen: dict = {}

    def compile_and_assume(gm, example_inputs, **kw):
        out = real(gm, example_inputs, **kw)
        x = next(t for t in example_inputs if isinstance(t, torch.Tensor) and _torch.is_symbolic(t.shape[0]))
        seen["env"] = x.shape[0].node.shape_env
        if bool(x.shape[0] <= 20):      # what Inductor does when it guards on a size
            int(x.shape[1])             # ... and when it specializes one
        return out

    monkeypatch.setattr(_torch, "inductor_compile_graph", compile_and_assume)

    def f(x):
        return x.cos() + 1

    compiled = kiln.compile(f, backend="inductor", dynamic=True)
    x = torch.randn(4, 6)
    close(compiled(x), f(x))
    guards = compiled.entries[0].describe_guards()
    assert "<= 20" in guards
    x2 = torch.randn(7, 6)              # within both facts: no recompile
    close(compiled(x2), f(x2))
    assert len(compiled.entries) == 1
    for shape in ((30, 6), (4, 9)):     # breaks one fact each: a new entry, eager's result
        y = torch.randn(*shape)
        close(compiled(y), f(y))
    assert len(compiled.entries) == 3


# ------------------------------------------------------------------------------------------------
# Modes and options
# ------------------------------------------------------------------------------------------------

def test_modes_map_to_inductor_settings():
    default = lookup_backend("inductor")[0]
    assert default.config_patches["triton.cudagraphs"] is False
    assert default.config_patches["fallback_random"] is True
    assert default.config_patches["combo_kernels"] is True      # (Triton only: one launch for many)
    assert default.config_patches["combo_kernels_pointwise_only"] is True
    off = lookup_backend("inductor", options={"combo_kernels": False})[0]
    assert off.config_patches["combo_kernels"] is False
    auto = lookup_backend("inductor", mode="max-autotune")[0]
    assert auto.config_patches["max_autotune"] is True
    assert auto.config_patches["triton.cudagraphs"] is False      # kiln owns CUDA graphs
    assert lookup_backend("inductor", mode="max-autotune")[0] is auto   # compile keys stay interned
    no_cg = lookup_backend("inductor", mode="max-autotune-no-cudagraphs")[0]
    assert no_cg.config_patches["coordinate_descent_tuning"] is True
    ro = lookup_backend("inductor", mode="reduce-overhead")[0]
    assert ro.config_patches["triton.cudagraphs"] is False       # kiln records them itself
    assert ro.cudagraphs and not default.cudagraphs and not auto.cudagraphs
    opts = lookup_backend("inductor", options={"cpp.threads": 2, "max-autotune": True})[0]
    assert opts.config_patches["cpp.threads"] == 2 and opts.config_patches["max_autotune"] is True


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match=r"unknown Inductor option 'max_autotun'.*did you mean 'max_autotune'"):
        kiln.compile(lambda x: x, backend="inductor", options={"max_autotun": True})
    with pytest.raises(ValueError, match="takes a bool, got int"):
        kiln.compile(lambda x: x, backend="inductor", options={"max_autotune": 3})
    with pytest.raises(ValueError, match="kiln manages CUDA graphs"):
        kiln.compile(lambda x: x, backend="inductor", options={"triton.cudagraphs": True})
    with pytest.raises(ValueError, match="frozen"):
        kiln.compile(lambda x: x, backend="inductor", options={"freezing": True})
    with pytest.raises(TypeError, match="option names are strings"):
        kiln.compile(lambda x: x, backend="inductor", options={1: True})


def test_options_reach_inductor(monkeypatch):
    real = _torch.inductor_compile_graph
    seen = []

    def spy(gm, example_inputs, **kw):
        seen.append(_torch.inductor_config().cpp.threads)
        return real(gm, example_inputs, **kw)

    monkeypatch.setattr(_torch, "inductor_compile_graph", spy)

    def f(x):
        return x.exp() - 1

    compiled = kiln.compile(f, backend="inductor", options={"cpp.threads": 1})
    x = torch.randn(5)
    close(compiled(x), f(x))
    assert seen == [1]


# ------------------------------------------------------------------------------------------------
# Failures, logs, progress
# ------------------------------------------------------------------------------------------------

def test_inductor_failure_runs_the_graph_as_aten_with_a_warning(monkeypatch):
    def broken(gm, example_inputs, **kw):
        raise RuntimeError("simulated Inductor failure")

    monkeypatch.setattr(_torch, "inductor_compile_graph", broken)

    def f(x, w):
        return (x @ w).relu().sum()

    x, w = torch.randn(3, 4), torch.randn(4, 2, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = kiln.compile(f, backend="inductor")(x, w)
    messages = [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
    for kind in ("forward", "backward"):
        assert any(f"Inductor failed on the {kind} graph" in m and "simulated Inductor failure" in m
                   for m in messages), messages
    close(out, f(x, w))
    (g,) = torch.autograd.grad(out, w)
    (g_e,) = torch.autograd.grad(f(x, w), w)
    close(g, g_e)


def test_a_failed_compile_keeps_no_inputs_alive(monkeypatch):
    """Inductor's errors keep a frame (``first_useful_frame``) whose locals are the compile's
    tensors: the noted failure must not keep the caller's inputs alive through it."""
    import gc
    import sys
    import weakref

    from torch._inductor.exc import InductorError

    def broken(gm, example_inputs, **kw):
        try:
            raise RuntimeError("simulated")
        except RuntimeError as inner:
            raise InductorError(inner, sys._getframe()) from inner

    monkeypatch.setattr(_torch, "inductor_compile_graph", broken)

    def f(x, w):
        return (x @ w).relu().sum()

    compiled = kiln.compile(f, backend="inductor")
    x, w = torch.randn(3, 4), torch.randn(4, 2, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(x, w).backward()
    refs = [weakref.ref(x), weakref.ref(w)]
    del x, w
    for _ in range(10):
        if not gc.collect():
            break
    assert [r() for r in refs] == [None, None]


def _sqrt_beside(x):
    h = x * 3
    return h * 2, h.sqrt()          # sqrt's derivative is infinite at 0


@pytest.mark.parametrize("dynamic", [False, True])
def test_backward_through_one_output_compiles_with_inductor(dynamic):
    """The backward for a call whose other outputs get no gradient is made after the AOT trace;
    its zeros must still be ops Inductor lowers (it fell back to FX on ``zeros_like``)."""
    counter = CountingInductor()
    compiled = kiln.compile(_sqrt_beside, backend=counter, dynamic=dynamic)
    for n in (3, 5) if dynamic else (3,):
        x = torch.rand(n, dtype=torch.float64)
        x[1] = 0.0
        x_c, x_e = x.clone().requires_grad_(), x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)    # no fallback warning
            compiled(x_c)[0].sum().backward()
        _sqrt_beside(x_e)[0].sum().backward()
        close(x_c.grad, x_e.grad)
        assert torch.isfinite(x_c.grad).all()
    assert_inductor_compiled(counter)


def test_perf_log(capsys):
    def f(x):
        return x.tanh() * 3

    kiln.set_logs("perf")
    try:
        kiln.compile(f, backend="inductor")(torch.randn(4))
    finally:
        kiln.set_logs(None)
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("[kiln:perf] graph of"))
    assert "capture" in line and "aot" in line and "inductor" in line


def test_progress_after_delay(capsys, monkeypatch):
    import time

    monkeypatch.setattr(Progress, "DELAY", 0.05)
    p = Progress("graph #9 (demo)")
    with p, p.phase("Inductor, graph 1/2 (forward)"):
        time.sleep(0.3)
        with p.phase("Inductor, graph 2/2 (backward)"):
            pass
    err = capsys.readouterr().err
    assert "[kiln] compiling graph #9 (demo): Inductor, graph 1/2 (forward)…" in err
    assert "graph 2/2 (backward)" in err and "compiled graph #9 (demo) in" in err
    with kiln.config.patch(progress=False), p, p.phase("quiet"):
        time.sleep(0.2)
    assert capsys.readouterr().err == ""
    with p, p.phase("fast"):          # under the delay: nothing
        pass
    assert capsys.readouterr().err == ""


def test_max_pool_compiles_in_a_process_that_never_ran_torch_compile(tmp_path):
    """Inductor's max-pool decomposition reads ``torch._inductor.lowering`` when it runs; a
    process that never imported it made the whole graph run as captured (no Inductor). The
    pool's int64 indices are recomputed in the backward from the int8 offsets it saves.
    (Inductor's decompositions with kiln's AOT stages and FX compilers: no C++ build.)"""
    import subprocess
    import sys

    code = """
import torch, kiln
from kiln.backends.aot import aot_backend
from kiln.backends.inductor import decomposition_table
m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.MaxPool2d(3, 2, 1), torch.nn.ReLU())
x = torch.randn(2, 3, 10, 10)
f = kiln.compile(m, backend=aot_backend(partition_fn="min_cut", decompositions=decomposition_table()))
out = f(x)
out.sum().backward()
torch.testing.assert_close(out, m(x))
(e,) = f.entries
parts = e.compiled_graph.parts
assert parts.kind == "training", parts.kind
outs = list(parts.forward.graph.find_nodes(op="output")[0].args[0])[parts.num_fw_outputs:]
dtypes = [o.meta["val"].dtype for o in outs if isinstance(o.meta.get("val"), torch.Tensor)]
assert torch.int8 in dtypes and torch.int64 not in dtypes, dtypes
print("OK")
"""
    env = {**os.environ, "KILN_CACHE": "0", "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
