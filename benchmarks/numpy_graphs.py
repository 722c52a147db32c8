"""NumPy code under kiln and under torch.compile: graphs, and whether the result is eager's.

For every case of ``tests/capture/test_numpy.py`` (NumPy on ndarrays and tensors), it runs
the function eagerly, under ``kiln.compile`` and under ``torch.compile`` (both with a
graph-counting backend that runs the graph as is), three times on fresh inputs, and prints per
case the graph count and whether each returned exactly what eager returned (Python type,
dtype, shape, values; the arguments' final state). Then it times one call of a small NumPy
function (median of many, after warm-up): eager NumPy, kiln (eager and aot_eager backends),
torch.compile (eager backend).

    python benchmarks/numpy_graphs.py [--json out.json]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import warnings

import numpy as np
import torch

import kiln

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "capture"))
import test_numpy as cases  # noqa: E402


class Count:
    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def run(compile_fn, fn, make_args, calls=3):
    counter = Count()
    compiled = compile_fn(fn, counter)
    same = True
    for _ in range(calls):
        args = make_args()
        eager_args = copy.deepcopy(args)
        expected = fn(*eager_args)
        try:
            actual = compiled(*args)
            cases.assert_same_numpy(actual, expected)
            cases.assert_same_numpy(list(args), list(eager_args), "args")
        except Exception:
            same = False
    return counter.graphs, same


def kiln_compile(fn, backend):
    return kiln.compile(fn, backend=backend)


def dynamo_compile(fn, backend):
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend)


def median_us(f, *args, n=2000):
    for _ in range(50):
        f(*args)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    opts = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    print(f"{'case':38} {'kiln graphs':>11} {'kiln = eager':>12} {'t.c graphs':>10} {'t.c = eager':>11}")
    for fn, make_args in cases.CASES:
        kg, ks = run(kiln_compile, fn, make_args)
        dg, ds = run(dynamo_compile, fn, make_args)
        rows.append({"case": fn.__name__, "kiln_graphs": kg, "kiln_same": ks,
                     "torch_compile_graphs": dg, "torch_compile_same": ds})
        print(f"{fn.__name__:38} {kg:>11} {str(ks):>12} {dg:>10} {str(ds):>11}")

    def small(a, b):
        return np.sin(a) @ b.T + a.mean(axis=0)

    a, b = np.random.randn(16, 16), np.random.randn(16, 16)
    timings = {"eager": median_us(small, a, b),
               "kiln eager": median_us(kiln.compile(small, backend="eager"), a, b),
               "kiln aot_eager": median_us(kiln.compile(small, backend="aot_eager"), a, b),
               "torch.compile eager": median_us(torch.compile(small, backend="eager"), a, b)}
    print("\none call of np.sin(a) @ b.T + a.mean(axis=0), 16x16 float64 (median, us)")
    for k, v in timings.items():
        print(f"  {k:22} {v:8.1f}  ({v / timings['eager']:.2f}x eager)")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"cases": rows, "timings_us": timings}, f, indent=1)


if __name__ == "__main__":
    main()
