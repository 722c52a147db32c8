"""``import kiln`` imports no torch, so that the ``kiln`` command's subcommands that need no
compiler (``kiln report``) start at once; the first use of a name imports its own module, and
the package then holds what an eager import binds."""
import json
import subprocess
import sys

import kiln


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_kiln_imports_no_torch():
    r = _run("import json, sys, kiln; import kiln.report; "
             "print(json.dumps({'torch': 'torch' in sys.modules, 'cache': kiln.config.cache}))")
    assert r == {"torch": False, "cache": True}


def test_the_report_command_imports_no_torch(tmp_path):
    import torch

    with kiln.config.patch(trace_dir=str(tmp_path)):
        kiln.compile(lambda x: x.sin() + 1, backend="aot_eager")(torch.randn(3))
    r = _run("import json, sys; from kiln.cli import main; "
             f"rc = main(['report', {str(tmp_path)!r}, '-o', {str(tmp_path / 'r.html')!r}]); "
             "print(json.dumps({'torch': 'torch' in sys.modules, 'rc': rc}))")
    assert r == {"torch": False, "rc": 0}
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_every_public_name_is_bound_at_first_use():
    for name in kiln.__all__:
        assert getattr(kiln, name) is not None, name
    assert callable(kiln.explain) and callable(kiln.compile)
    assert type(kiln.config).__name__ == "Config"


def test_a_submodule_imported_first_does_not_shadow_its_name():
    r = _run("import json, kiln.explain, kiln.config; import kiln; "
             "print(json.dumps({'explain': callable(kiln.explain), "
             "'config': type(kiln.config).__name__}))")
    assert r == {"explain": True, "config": "Config"}


def test_first_use_under_no_grad_loads_the_compiler():
    # the lazy load runs wherever the first name is used: inference code under torch.no_grad()
    r = _run("import json, torch, kiln\n"
             "with torch.no_grad():\n"
             "    f = kiln.compile(lambda x: x * 2 + 1, backend='aot_eager')\n"
             "    y = f(torch.ones(3))\n"
             "print(json.dumps({'y': y.tolist()}))")
    assert r == {"y": [3.0, 3.0, 3.0]}


_WARM_START = """
import json, sys, torch, kiln
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
x = torch.randn(5, 8)
out = kiln.compile(net, backend="aot_eager")(x)
out.sum().backward()
expected = net(x)
print(json.dumps({"frame_hits": kiln.cache.stats()["frame_hits"], "equal": torch.allclose(out, expected),
                  "imported": [m for m in ("sympy", "torch.fx.experimental.symbolic_shapes", "bytecode",
                                           "kiln.capture.interpreter") if m in sys.modules]}))
"""


def test_a_warm_start_imports_no_tracer(tmp_path):
    # a process served by the cache (frame records: nothing traced) imports neither sympy nor
    # torch's symbolic shapes (a third of a second of every warm start), nor kiln's bytecode
    # tracer; the cold one traces
    import os
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path), "KILN_CACHE_FRAMES": "1"}   # (the defaults)

    def run() -> dict:
        out = subprocess.run([sys.executable, "-c", _WARM_START], capture_output=True, text=True, check=True, env=env)
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = run()
    assert cold["frame_hits"] == 0 and cold["equal"]
    warm = run()
    assert warm == {"frame_hits": 1, "equal": True, "imported": []}


def test_the_aot_stages_and_their_modules_are_reachable_from_the_package():
    # kiln.aot binds its names at their first use: its stage modules are reachable as
    # attributes too, as when the package imported them all
    r = _run("import json, kiln\n"
             "print(json.dumps({'module': kiln.aot.dynamic.__name__,\n"
             "                  'same': kiln.aot.compile_graph is kiln.aot.dynamic.compile_graph,\n"
             "                  'stage': kiln.aot.stage2_compile.__module__}))")
    assert r == {"module": "kiln.aot.dynamic", "same": True, "stage": "kiln.aot.compile"}
