"""Repeated blocks outlive the process: a package and the compile cache hold the shared block
once, and a fresh process runs it with nothing captured or compiled, with eager's values and
gradients."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

MODEL = textwrap.dedent("""
    import sys, torch, kiln
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self, d=8):
            super().__init__()
            self.norm = torch.nn.Parameter(torch.ones(d))
            self.up = torch.nn.Linear(d, 2 * d)
            self.down = torch.nn.Linear(2 * d, d)

        def forward(self, x):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm
            return x + self.down(F.silu(self.up(h)))

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Block() for _ in range(4)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    def check(model, compiled):
        x = torch.randn(3, 8)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        ref = model(x1)
        ref.pow(2).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        out = compiled(x2)
        out.pow(2).sum().backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(x2.grad, x1.grad)
        for p, g in zip(model.parameters(), grads):
            torch.testing.assert_close(p.grad, g)

    torch.manual_seed(0)
    model = Stack()
    what, path, backend = sys.argv[1:4]
""")

SAVE = MODEL + textwrap.dedent("""
    compiled = kiln.compile(model, backend=backend)
    check(model, compiled)
    report = compiled.save_package(path)
    assert report.entries == 1 and not report.left_out, report
    print("SAVED")
""")

LOAD = MODEL + textwrap.dedent("""
    import kiln.aot.dynamic as aot_dynamic
    def refuse(*a, **k):
        raise AssertionError("a loaded package traced a graph")
    aot_dynamic._run_stages = refuse
    compiled = kiln.load_package(path, model, on_miss="error")
    check(model, compiled)
    print("LOADED")
""")

CACHED = MODEL + textwrap.dedent("""
    compiled = kiln.compile(model, backend=backend)
    check(model, compiled)
    print("STATS", kiln.cache.stats())
""")


def _run(tmp_path, script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KILN_CACHE_DIR": str(tmp_path / "cache"),
           "KILN_REPEATED_BLOCKS": "1", "KILN_CACHE_FRAMES": "1"}
    env.pop("KILN_LOGS", None)
    out = subprocess.run([sys.executable, "-c", script, *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_a_package_holds_the_block_once_and_loads_elsewhere(tmp_path):
    path = tmp_path / "stack.kiln"
    assert "SAVED" in _run(tmp_path, SAVE, "save", str(path), "aot_eager")
    manifest = json.loads(zipfile.ZipFile(path).read("manifest.json"))
    (entry,) = manifest["entries"]
    graph = entry["graph"]["graph"]
    assert len(graph["subgraphs"]) == 1
    assert sum(1 for n in graph["nodes"] if n["op"] == "get_attr") == 1      # (one node, read 4 times)
    (tmp_path / "cache").rename(tmp_path / "cache-of-the-saver")
    assert "LOADED" in _run(tmp_path, LOAD, "load", str(path), "aot_eager")


@pytest.mark.parametrize("backend", ["inductor"])
def test_a_fresh_process_runs_the_cached_blocks_without_compiling(tmp_path, backend):
    first = _run(tmp_path, CACHED, "cache", "-", backend)
    assert "'misses': 1" in first
    second = _run(tmp_path, CACHED, "cache", "-", backend)
    assert "'frame_hits': 1" in second and "'misses': 0" in second
