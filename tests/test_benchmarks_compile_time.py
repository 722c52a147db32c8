"""Smoke test of benchmarks/compile_time.py's --interleave mode: the columns are compiled in one
process and timed in turns; each column is its own compile (repeated blocks on for one, off
for the other) and both start from the same weights and batches: their first losses are eager's. Timings are never asserted."""
import importlib.util
import pathlib
import sys

import pytest
import torch

import kiln

pytest.importorskip("transformers")
BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _load():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("kiln_bench_compile_time", BENCH / "compile_time.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_interleaved_columns_are_their_own_compiles():
    bench = _load()
    cell = {"layers": 2, "columns": ["kiln_regions", "kiln_noregions"], "rounds": 2, "kiln_backend": "aot_eager"}
    rows = bench.run_interleaved(cell, "cpu", bench.CPU_SIZE, iters=1, warmup=0, rounds=2)
    assert [r["column"] for r in rows] == ["kiln_regions", "kiln_noregions"]
    assert all(len(r["rounds_ms"]) == 2 and r["step_ms"] > 0 for r in rows)
    torch.manual_seed(0)
    eager = bench.build(2, bench.CPU_SIZE).train()     # (the weights every column starts from)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = float(eager(**bench.batch(bench.CPU_SIZE, 0, "cpu")).loss)
    assert [r["loss"] for r in rows] == pytest.approx([want, want], rel=1e-3)
    # one graph per column: the second is not served the first one's (blocks) graph
    assert kiln.cache.stats()["misses"] + kiln.cache.stats()["bypasses"] >= 2
