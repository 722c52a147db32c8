"""Smoke test of benchmarks/compile_time.py's --interleave mode: the columns are compiled in one
process and timed in turns; each column is its own compile (repeated blocks on for one, off
for the other) and both start from the same weights and batches: their first losses are eager's. Timings are never asserted."""

import pytest
import torch

import kiln
from benchmark_modules import load_benchmark

pytest.importorskip("transformers")


def test_interleaved_columns_are_their_own_compiles():
    bench = load_benchmark("compile_time")
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
