"""Smoke test of benchmarks/warm_start.py's package column: the child that compiles saves a
package, and the child that loads it answers the first call (eager backend, small MLP, in
this process). Timings are never asserted."""
import json

import kiln
from benchmark_modules import load_benchmark


def test_package_children(tmp_path, capsys):
    bench = load_benchmark("warm_start")
    path = str(tmp_path / "mlp.kiln")
    for model in ("mlp", "mlp-train"):
        kiln.reset()
        bench._child(model, "kiln", "cpu", "eager", path)
        kiln.reset()
        bench._child(model, "package", "cpu", "eager", path)
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("RESULT ")]
        assert len(lines) == 2 and all(json.loads(ln[7:])["first"] > 0 for ln in lines)
    kiln.reset()
