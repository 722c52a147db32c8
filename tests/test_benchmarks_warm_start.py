"""Smoke test of benchmarks/warm_start.py's package column: the child that compiles saves a
package, and the child that loads it answers the first call (eager backend, small MLP, in
this process). Timings are never asserted."""
import importlib.util
import json
import pathlib
import sys

import kiln

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "warm_start.py"


def _load():
    spec = importlib.util.spec_from_file_location("kiln_bench_warm_start", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # (a package finds WithLoss by its module's name)
    spec.loader.exec_module(mod)
    return mod


def test_package_children(tmp_path, capsys):
    bench = _load()
    path = str(tmp_path / "mlp.kiln")
    for model in ("mlp", "mlp-train"):
        kiln.reset()
        bench._child(model, "kiln", "cpu", "eager", path)
        kiln.reset()
        bench._child(model, "package", "cpu", "eager", path)
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("RESULT ")]
        assert len(lines) == 2 and all(json.loads(ln[7:])["first"] > 0 for ln in lines)
    kiln.reset()
