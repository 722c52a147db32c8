"""Triton kernels recorded after a module's first call and launched by kiln without Triton or
Inductor (``kiln.backends.inductor.triton_kernels``). The launcher code, the module rewrite and every
refusal run on CPU; the record and load of real kernels, and a fresh process that imports
neither Triton nor Inductor, on CUDA."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.backends.inductor import generated_module as G
from kiln.backends.inductor import cache_entry
from kiln.backends.inductor import triton_kernels as T
from kiln.cache import store

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TRITON_MODULE = textwrap.dedent("""\
    import triton
    import triton.language as tl
    from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
    from torch._inductor.async_compile import AsyncCompile
    async_compile = AsyncCompile()
    triton_poi_0 = async_compile.triton('triton_poi_0', '''
    @triton.jit
    def triton_poi_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
        pass
    ''', device_str='cuda')
    async_compile.wait(globals())
    del async_compile
    def call(args):
        return triton_poi_0.run(*args, stream=0)
    """)


def test_describe_keeps_each_triton_kernels_source_digest_and_makes_triton_lazy():
    fast = G.describe(TRITON_MODULE, {})
    assert set(fast["triton"]) == {"triton_poi_0"} and fast["kernels"] == {}
    assert "triton = __kiln_rt__.module('triton')" in fast["source"]
    assert "tl = __kiln_rt__.module('triton.language')" in fast["source"]
    assert "start_graph = __kiln_rt__.get(" in fast["source"]
    # a kernel whose global and kernel names differ is not described (kiln looks kernels up by name)
    assert G.describe(TRITON_MODULE.replace("triton_poi_0 = ", "other = "), {}) is None


def test_a_module_whose_kernels_were_not_recorded_loads_through_inductor(tmp_path):
    fast = G.describe(TRITON_MODULE, {})
    assert G.load(fast, {}, str(tmp_path)) is None


def test_a_corrupt_record_is_not_used_and_is_removed(tmp_path):
    fast = G.describe(TRITON_MODULE, {})
    path = T.record_path(str(tmp_path), G.module_digest(fast))
    blob = store.encode({"format": T.FORMAT, "kernels": {}}, b"cubin", store.KERNELS)
    with open(path, "wb") as f:
        f.write(blob[:-2] + b"xx")
    assert G.load(fast, {}, str(tmp_path)) is None
    assert not os.path.exists(path)


def test_the_launcher_computes_the_grid_and_passes_the_recorded_arguments():
    k = {"def_args": ["in_ptr0", "out_ptr0", "xnumel"], "call_args": ["in_ptr0", "out_ptr0", "xnumel"],
         "grid": {"prefix": [], "x": "-((xnumel) // -(128))", "y": "1", "z": "1"},
         "num_warps": 4, "shared": 16, "arg_tys": "OOi", "scratch": 1, "profile_name": "triton_poi_0"}
    launches = []
    scope = {"_kiln_launch": lambda *a: launches.append(a), "_kiln_function": 1234,
             "_kiln_profiler": torch.autograd.profiler, "_kiln_record": torch._C._profiler._RecordFunctionFast}
    exec(T.launcher_source(k), scope)
    scope["launcher"]("a", "b", 1000, stream=7)
    assert launches == [(1234, 8, 1, 1, 4, 16, "OOiO", ("a", "b", 1000, None), 7)]
    # under the profiler the launch is named, as Inductor's is
    x = torch.zeros(3)
    with torch.profiler.profile() as prof:
        scope["launcher"](x, x, 3, stream=0)
    assert any(e.name == "triton_poi_0" for e in prof.events())


def test_kernels_are_recorded_once_after_the_first_call_which_then_leaves_the_call_path(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "_made", {})
    fast = G.describe(TRITON_MODULE, {})
    recorded = []

    def record(module_globals, sources):
        recorded.append(sources)
        return {"format": T.FORMAT, "kernels": {}, "device": 0, "facts": {}}, b""
    monkeypatch.setattr(T, "record", record)
    calls = []
    module = type("Module", (), {"call": staticmethod(lambda args: calls.append(list(args)) or len(args))})
    code = {"inputs_to_check": [], "mutated_input_idxs": [], "defers_input_alignment": False}
    boxed = cache_entry._entry_point(module, code, G.triton_recorder(fast, {}, str(tmp_path)))
    assert boxed([1, 2]) == 2 and boxed([3]) == 1
    assert recorded == [fast["triton"]] and calls == [[1, 2], [3]]
    assert os.path.exists(T.record_path(str(tmp_path), G.module_digest(fast)))
    assert boxed.__closure__[0].cell_contents is module.call     # (the recorder is gone)
    # once recorded, a later slow load has nothing to record
    assert G.triton_recorder(fast, {}, str(tmp_path)) is None


def test_a_failed_record_never_fails_the_call(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "_made", {})
    fast = G.describe(TRITON_MODULE, {})

    def record(module_globals, sources):
        raise RuntimeError("inductor changed")
    monkeypatch.setattr(T, "record", record)
    module = type("Module", (), {"call": staticmethod(lambda args: 5)})
    code = {"inputs_to_check": [], "mutated_input_idxs": [], "defers_input_alignment": False}
    boxed = cache_entry._entry_point(module, code, G.triton_recorder(fast, {}, str(tmp_path)))
    assert boxed([]) == 5 and boxed([]) == 5
    assert not T.is_recorded(str(tmp_path), G.module_digest(fast))


# ------------------------------------------------------------------------------------------------
# CUDA: real kernels
# ------------------------------------------------------------------------------------------------

_CHILD = textwrap.dedent("""\
    import json, os, sys, torch, kiln
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128)).cuda()
    partial = os.environ.get("PARTIAL") == "1"

    class WithLoss(torch.nn.Module):         # logits and a loss; backward() of the loss only
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            y = self.net(x)
            return y, y.square().mean()
    if partial:
        net = WithLoss(net)
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    package = os.environ.get("PACKAGE")
    if os.environ.get("LOAD") == "1":
        f = kiln.load_package(package, net, on_miss="error")
    else:
        f = kiln.compile(net, backend="inductor")
    out = f(x)
    if partial:
        out, loss = out
        loss.backward()         # (a backward for one output of two: made at run time)
    else:
        out.sum().backward()
    torch.cuda.synchronize()
    if package and os.environ.get("LOAD") != "1":
        f.save_package(package)
    print(json.dumps({"out": out.detach().cpu().tolist(), "grad": x.grad.cpu().tolist(),
                      "stats": kiln.cache.stats(),
                      "imported": [m for m in ("torch._inductor", "triton", "torch._dynamo") if m in sys.modules]}))
    """)


def _child(env) -> dict:
    p = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@requires_cuda
def test_a_warm_process_launches_recorded_kernels_without_triton_or_inductor(tmp_path):
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "kiln"), "KILN_CACHE_FRAMES": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    cold = _child(env)
    kernels = tmp_path / "kiln" / "kernels"
    records = [n for n in os.listdir(kernels) if n.endswith(T.SUFFIX)]
    assert len(records) == 2               # the forward's and the backward's module
    warm = _child(env)
    assert warm["stats"]["frame_hits"] == 1
    assert warm["imported"] == [], warm["imported"]
    torch.testing.assert_close(torch.tensor(warm["out"]), torch.tensor(cold["out"]), rtol=0, atol=0)
    torch.testing.assert_close(torch.tensor(warm["grad"]), torch.tensor(cold["grad"]), rtol=0, atol=0)
    # a record for another GPU or torch is not used: the module loads through Inductor
    for n in records:
        path = kernels / n
        header, payload = store.decode(path.read_bytes(), store.KERNELS)
        header["facts"]["torch"] = "0.0"
        path.write_bytes(store.encode(header, payload, store.KERNELS))
    other = _child(env)
    assert "torch._inductor" in other["imported"]
    torch.testing.assert_close(torch.tensor(other["out"]), torch.tensor(cold["out"]), rtol=0, atol=0)


def _record_loads(monkeypatch) -> list:
    """Each generated-module load from now on: True where kiln loaded it (recorded kernels)."""
    loaded_calls: list = []
    orig = G.load

    def spy(*args):
        module = orig(*args)
        loaded_calls.append(module is not None)
        return module
    monkeypatch.setattr(G, "load", spy)
    return loaded_calls


@requires_cuda
def test_recorded_kernels_match_inductors_in_process(tmp_path, monkeypatch):
    """A reduction Inductor autotunes among several configurations, recorded with the one it
    chose; kiln's loaded module returns what the compiled one returns."""

    monkeypatch.setattr(kiln.config, "cache", True)

    def f(x, w):
        return torch.softmax(x @ w, dim=-1).sum(dim=0) + x.mean()

    x, w = torch.randn(512, 256, device="cuda"), torch.randn(256, 384, device="cuda")
    compiled = kiln.compile(f, backend="inductor")
    expected = compiled(x, w)
    kernels = store.kernels_dir()
    assert any(n.endswith(T.SUFFIX) for n in os.listdir(kernels))
    kiln.reset()
    loaded_calls = _record_loads(monkeypatch)
    again = kiln.compile(f, backend="inductor")(x, w)
    assert loaded_calls == [True]
    torch.testing.assert_close(again, expected, rtol=0, atol=0)
    torch.testing.assert_close(again, f(x, w), rtol=1e-4, atol=1e-4)


@requires_cuda
@pytest.mark.parametrize("cache", ["1", "0"])
def test_a_package_carries_the_recorded_kernels(tmp_path, cache):
    """Saved after the first call (with the cache on or off), a package loads in a fresh
    process with an empty cache and imports neither Triton nor Inductor."""
    package = str(tmp_path / "model.kiln")
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "kiln"), "KILN_CACHE": cache, "PACKAGE": package,
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    saved = _child(env)
    loaded = _child({**env, "LOAD": "1", "KILN_CACHE": "1", "KILN_CACHE_DIR": str(tmp_path / "empty")})
    assert loaded["imported"] == [], loaded["imported"]
    torch.testing.assert_close(torch.tensor(loaded["out"]), torch.tensor(saved["out"]), rtol=0, atol=0)
    torch.testing.assert_close(torch.tensor(loaded["grad"]), torch.tensor(saved["grad"]), rtol=0, atol=0)


@requires_cuda
def test_a_kernel_whose_name_triton_cuts_is_recorded(monkeypatch):
    """A fused kernel of many operators has a name over 150 characters; Triton writes its cubin
    under the name cut to 150, where Inductor's own static launcher does not look. kiln finds
    it, records the kernel, and the loaded module returns what the compiled one returns."""
    monkeypatch.setattr(kiln.config, "cache", True)

    def f(x):
        y = torch.sin(x) + torch.cos(x) * torch.tanh(x) - torch.sigmoid(x) + torch.erf(x) * torch.atan(x)
        y = y + torch.exp(-x.abs()) * torch.log1p(x.abs()) + torch.sqrt(x.abs() + 1) - torch.rsqrt(x.abs() + 1)
        y = y + torch.floor(x) * torch.ceil(x) + torch.trunc(x) + torch.sign(x) * torch.expm1(x.clamp(max=1))
        y = y + torch.asinh(x) + torch.reciprocal(x.abs() + 2) + torch.sinh(x.clamp(-1, 1)) + torch.cosh(x.clamp(-1, 1))
        return y + torch.acos(x.clamp(-0.5, 0.5)) * torch.asin(x.clamp(-0.5, 0.5)) + torch.round(x) + torch.frac(x)

    x = torch.randn(4096, device="cuda")
    compiled = kiln.compile(f, backend="inductor")
    expected = compiled(x)
    kernels = store.kernels_dir()
    names = []
    for n in os.listdir(kernels):
        if n.endswith(T.SUFFIX):
            with open(os.path.join(kernels, n), "rb") as fh:
                header, _ = store.decode(fh.read(), store.KERNELS)
            names += list(header["kernels"])
    assert any(len(name) > 150 for name in names), names
    kiln.reset()
    loaded_calls = _record_loads(monkeypatch)
    again = kiln.compile(f, backend="inductor")(x)
    assert loaded_calls == [True]
    torch.testing.assert_close(again, expected, rtol=0, atol=0)
    torch.testing.assert_close(again, f(x), rtol=1e-4, atol=1e-4)


@requires_cuda
def test_a_package_carries_the_kernels_of_a_backward_made_at_run_time(tmp_path):
    """A training step that calls backward() on the loss only (the model also returns its
    logits) compiles that backward at its first run; the package saved after it carries its
    kernels too, so a fresh process with empty caches imports neither Triton nor Inductor."""
    package = str(tmp_path / "model.kiln")
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "kiln"), "PACKAGE": package, "PARTIAL": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    saved = _child(env)
    loaded = _child({**env, "LOAD": "1", "KILN_CACHE_DIR": str(tmp_path / "empty"),
                     "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-empty"),
                     "TRITON_CACHE_DIR": str(tmp_path / "triton-empty")})
    assert loaded["imported"] == [], loaded["imported"]
    torch.testing.assert_close(torch.tensor(loaded["out"]), torch.tensor(saved["out"]), rtol=0, atol=0)
    torch.testing.assert_close(torch.tensor(loaded["grad"]), torch.tensor(saved["grad"]), rtol=0, atol=0)
