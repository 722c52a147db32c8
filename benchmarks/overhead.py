"""Per-call overhead that kiln adds over eager (guards + dispatch), beside torch.compile.

Both compilers use their plain "eager" backend, so the captured graph runs the same ops as
eager and the difference is the cost of the call path itself. Medians over many batches of
calls, after warm-up; on CUDA each batch is timed with CUDA events.

    python benchmarks/overhead.py [--device cuda] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import kiln


def one_tensor(x):
    return x + 1


def many_tensors(*xs):
    acc = xs[0]
    for x in xs[1:]:
        acc = acc + x
    return acc


def small_module():
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))


def _batch_us(fn, args, device: str, calls: int) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn(*args)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls
    t = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t) * 1e6 / calls


def time_interleaved(fns: dict, args, device: str, calls: int, repeats: int) -> dict:
    """Median microseconds per call of each variant. Batches of the variants alternate, so a
    slow phase of the machine (clock, other load) touches all of them alike."""
    for fn in fns.values():
        for _ in range(max(50, calls // 10)):
            fn(*args)
    samples: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            samples[k].append(_batch_us(fn, args, device, calls))
    return {k: statistics.median(v) for k, v in samples.items()}


def cases(device: str):
    t = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    xs = [t(8) for _ in range(100)]
    yield "1 tensor", one_tensor, (t(8),)
    yield "10 tensors", many_tensors, tuple(xs[:10])
    yield "100 tensors", many_tensors, tuple(xs)
    yield "small nn.Module", small_module().to(device), (t(4, 16),)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=25)
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args(argv)
    rows = []
    for name, fn, args in cases(a.device):
        peer = torch.compile(fn, backend="eager")
        mine = kiln.compile(fn, backend="eager")
        t = time_interleaved({"eager": fn, "torch": peer, "kiln": mine}, args, a.device, a.calls, a.repeats)
        eager_us, torch_us, kiln_us = t["eager"], t["torch"], t["kiln"]
        rows.append({"case": name, "eager_us": eager_us, "torch_compile_us": torch_us, "kiln_us": kiln_us,
                     "torch_added_us": torch_us - eager_us, "kiln_added_us": kiln_us - eager_us})
    print(f"per-call overhead on {a.device} (torch {torch.__version__}, Python {sys.version.split()[0]}); "
          f"medians of {a.repeats} x {a.calls} calls")
    hdr = f"{'case':18} {'eager us':>9} {'torch.compile us':>17} {'kiln us':>8} {'torch adds':>11} {'kiln adds':>10} {'kiln/torch added':>17}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        ratio = r["kiln_added_us"] / r["torch_added_us"] if r["torch_added_us"] > 0 else float("nan")
        r["added_ratio"] = ratio
        print(f"{r['case']:18} {r['eager_us']:9.2f} {r['torch_compile_us']:17.2f} {r['kiln_us']:8.2f} "
              f"{r['torch_added_us']:11.2f} {r['kiln_added_us']:10.2f} {ratio:17.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "torch": torch.__version__, "python": sys.version.split()[0],
                       "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
