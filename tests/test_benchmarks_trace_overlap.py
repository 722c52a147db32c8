"""benchmarks/trace_overlap.py on a Chrome trace of known kernels: collectives and computation
told apart, intervals merged across streams, overlap and idle time measured."""
import gzip
import json

import pytest

from benchmark_modules import load_benchmark


def _kernel(name, ts, dur, stream):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream}


@pytest.mark.parametrize("compressed", [False, True])
def test_overlap_of_collectives_with_computation(tmp_path, compressed):
    events = [
        _kernel("triton_poi_fused_0", 0, 100, 7),          # compute 0-100 and 50-150 (another stream)
        _kernel("gemm", 50, 100, 8),
        _kernel("ncclDevKernel_AllReduce_Sum_f32", 120, 80, 20),   # 120-200: 30 beside compute
        _kernel("triton_poi_fused_0", 300, 100, 7),        # idle 200-300
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000},   # not a kernel
    ]
    path = tmp_path / ("t.json.gz" if compressed else "t.json")
    text = json.dumps({"traceEvents": events})
    if compressed:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    bench = load_benchmark("trace_overlap")
    s = bench.summary(str(path))
    assert s["kernels"] == 4
    assert s["span_ms"] == pytest.approx(0.4)
    assert s["compute_ms"] == pytest.approx(0.25)       # 0-150 and 300-400
    assert s["comm_ms"] == pytest.approx(0.08)
    assert s["overlapped_ms"] == pytest.approx(0.03)
    assert s["exposed_ms"] == pytest.approx(0.05)
    assert s["idle_ms"] == pytest.approx(0.1)
    assert s["heaviest"][0] == {"name": "triton_poi_fused_0", "count": 2, "ms": pytest.approx(0.2)}
    assert "exposed 0.05" in bench.render(s)


def test_a_trace_without_gpu_kernels(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add",
                                                 "ts": 0, "dur": 5}]}))
    bench = load_benchmark("trace_overlap")
    assert bench.render(bench.summary(str(path))).endswith("no GPU kernels")
