"""Inductor entries in a package: the AOT artifact and Inductor's generated code, loaded by
the backend's own loader (no AOT tracing, no lowering). Few, tiny graphs: Inductor compiles
C++ for each."""
import pytest
import torch

import kiln

import _pkg_models as M


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    d = tmp_path_factory.mktemp("inductor-packages")
    kiln.reset()
    torch.manual_seed(0)
    model = M.MLP()
    f = kiln.compile(M.f, backend="inductor", dynamic=False)
    step = kiln.compile(M.train_step, backend="inductor", dynamic=False)
    x = torch.randn(2, 4)
    cached, kiln.config.cache = kiln.config.cache, False     # (compiled here: Inductor probes the ISA)
    try:
        f(x, torch.randn(2, 4))
        step(model, x)
    finally:
        kiln.config.cache = cached
    reports = [f.save_package(d / "f.kiln"), step.save_package(d / "step.kiln")]
    kiln.reset()
    yield d, model, reports
    kiln.reset()


def test_inductor_inference_and_training(packages, monkeypatch):
    import kiln.aot.dynamic
    import kiln.runtime.function
    import kiln.backends.inductor

    d, model, reports = packages
    assert all(not r.left_out for r in reports) and [r.entries for r in reports] == [1, 2]

    called = []

    def refuse(*a, **k):
        called.append(a)
        raise AssertionError("compiled again")
    monkeypatch.setattr(kiln.runtime.function, "capture", refuse)
    monkeypatch.setattr(kiln.aot.dynamic, "compile_graph", refuse)
    monkeypatch.setattr(kiln.backends.inductor.GraphCompile, "run", refuse)
    f = kiln.load_package(d / "f.kiln", M.f, on_miss="error")
    step = kiln.load_package(d / "step.kiln", M.train_step, on_miss="error")
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    torch.testing.assert_close(f(x, y), M.f(x, y))
    model.zero_grad()
    loss = step(model, x)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.testing.assert_close(loss, M.train_step(model, x))
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert not called


def test_dynamic_inductor_package_serves_new_sizes(tmp_path, monkeypatch):
    """A dynamic=True Inductor entry (its generated code takes the sizes as ints) loads with
    no capture ShapeEnv and runs for sizes the guards allow; one they do not is a miss."""
    import kiln.aot.dynamic
    import kiln.runtime.function
    import kiln.backends.inductor

    kiln.reset()
    c = kiln.compile(M.branchy, backend="inductor", dynamic=True)
    c(torch.randn(3, 4, requires_grad=True)).sum().backward()
    c(torch.randn(5, 4, requires_grad=True)).sum().backward()
    report = c.save_package(tmp_path / "b.kiln")
    assert report.entries == 1 and not report.left_out
    kiln.reset()

    def refuse(*a, **k):
        raise AssertionError("compiled again")
    monkeypatch.setattr(kiln.runtime.function, "capture", refuse)
    monkeypatch.setattr(kiln.aot.dynamic, "compile_graph", refuse)
    monkeypatch.setattr(kiln.backends.inductor.GraphCompile, "run", refuse)
    fast = kiln.load_package(tmp_path / "b.kiln", M.branchy, on_miss="error")
    for n in (4, 7):
        x = torch.randn(n, 4, requires_grad=True)
        rx = x.detach().clone().requires_grad_(True)
        out, ref = fast(x), M.branchy(rx)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x.grad, rx.grad)
    with pytest.raises(kiln.PackageMiss, match="<= 8"):
        fast(torch.randn(12, 4, requires_grad=True))
    kiln.reset()


def test_package_carries_the_cpu_simd_answer(packages, tmp_path):
    """Inductor probes the CPU's SIMD sets (seconds per process) before loading C++ kernels;
    a package carries this machine's answer, and a fresh process with the same facts and an
    empty cache dir takes it instead of probing. (Here kiln's own loader of the kernel
    libraries is told the machine differs, so that the kernels load through Inductor: on the
    same machine kiln loads them itself and Inductor's ISA module is never imported.)"""
    import json
    import os
    import subprocess
    import sys

    from kiln.backends.inductor import vec_isa_memo
    from kiln.package import fileformat

    d, _, _ = packages
    m = fileformat.read(str(d / "f.kiln")).manifest
    assert m["vec_isa"] and m["vec_isa"][0]["facts"] == vec_isa_memo._facts()
    here = os.path.dirname(os.path.abspath(__file__))
    code = ("import torch, kiln, _pkg_models as M\n"
            "import kiln.backends.inductor.generated_module as G\n"
            "G.machine_facts = lambda: 'another machine'\n"
            f"f = kiln.load_package({str(d / 'f.kiln')!r}, M.f, on_miss='error')\n"
            "x, y = torch.randn(2, 4), torch.randn(2, 4)\n"
            "torch.testing.assert_close(f(x, y), M.f(x, y))\n"
            "import torch._inductor.cpu_vec_isa as isa\n"
            "print('REMEMBERED', getattr(isa.valid_vec_isa_list, 'kiln_remembered', False))\n")
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path / "empty"),
           "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(here)), here,
                                          os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REMEMBERED True" in out.stdout, out.stdout
    assert not (tmp_path / "empty" / "aot").exists()
    json.dumps(m["vec_isa"])          # (plain data)
