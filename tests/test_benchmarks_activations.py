"""Smoke test of benchmarks/activations.py: a tiny CPU run (1 layer, eager and kiln, the cast
policy) goes through, writes its JSON, and kiln's inlined cast halves the saved activations.
Timings are never asserted."""
import json

import torch

from benchmark_modules import load_benchmark


def test_activations_benchmark_quick(tmp_path, capsys):
    bench = load_benchmark("activations")
    out = tmp_path / "act.json"
    threads = torch.get_num_threads()
    assert bench.main(["--device", "cpu", "--steps", "3", "--layers", "1", "--dim", "32", "--seq", "16",
                       "--batch", "2", "--backend", "aot_eager", "--compilers", "eager,kiln",
                       "--policies", "cast", "--json", str(out)]) == 0
    assert torch.get_num_threads() == threads
    text = capsys.readouterr().out
    assert "max dev" in text and "kiln saved MiB" in text
    data = json.loads(out.read_text())
    rows = {(r["policy"], r["compiler"]): r for r in data["results"]}
    assert set(rows) == {("none", "eager"), ("none", "kiln"), ("cast", "eager"), ("cast", "kiln")}
    assert all("error" not in r and len(r["losses"]) == 3 for r in rows.values())
    rep = rows[("cast", "kiln")]["kiln_report"]
    assert rep["graphs"] == 1 and rep["bytes_after"] < rep["bytes_before"]
    # the forward is exact under a cast policy: the first loss equals the no-hook run's
    assert rows[("cast", "kiln")]["losses"][0] == rows[("none", "eager")]["losses"][0]
    assert rows[("cast", "kiln")]["max_loss_deviation"] < 0.01
