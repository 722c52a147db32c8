"""Smoke test of benchmarks/dynamic.py: a tiny run (the plain function model, eager backend, 3
lengths) goes through and writes the expected JSON. Timings are never asserted."""
import json

import torch

from benchmark_modules import load_benchmark


def test_dynamic_benchmark_quick(tmp_path, capsys):
    bench = load_benchmark("dynamic")
    out = tmp_path / "dynamic.json"
    threads = torch.get_num_threads()
    assert bench.main(["--quick", "--lengths", "3", "--models", "fn", "--backends", "eager",
                       "--json", str(out)]) == 0
    assert torch.get_num_threads() == threads          # the benchmark leaves the process as it was
    assert "kiln/torch" in capsys.readouterr().out

    data = json.loads(out.read_text())
    for key in ("device", "torch", "python", "grad", "lengths", "seed", "steady_len", "steady_calls",
                "repeats", "skipped", "wall_s", "rows"):
        assert key in data, key
    assert len(data["lengths"]) == len(set(data["lengths"])) == 3
    assert all(16 <= t <= 200 for t in data["lengths"])
    assert data["steady_len"] in data["lengths"]
    rows = data["rows"]
    assert [(r["model"], r["backend"], r["compiler"]) for r in rows] == [
        ("fn", "eager", "kiln"), ("fn", "eager", "torch.compile")]
    for r in rows:
        assert "error" not in r, r.get("error")
        for key in ("graphs", "compile_s", "first_calls_s", "second_pass_s", "second_pass_new_graphs",
                    "steady_new_graphs", "steady_ms", "eager_ms", "steady_over_eager", "compiling_calls",
                    "calls", "info"):
            assert key in r, key
        assert [c["T"] for c in r["calls"]] == data["lengths"]
        assert r["graphs"] == sum(c["new_graphs"] for c in r["calls"]) >= 1
        assert r["second_pass_new_graphs"] == r["steady_new_graphs"] == 0   # seen lengths: no compile
    kiln_row, torch_row = rows
    assert kiln_row["info"]["entries"] >= 1 and kiln_row["info"]["eager_entries"] == 0
    assert torch_row["info"]["unique_graphs"] == torch_row["info"]["wrapper_count"] == torch_row["graphs"]
    assert set(kiln_row["ratios_kiln_over_torch"]) == {"graphs", "compile_s", "first_calls_s", "steady_ms"}
