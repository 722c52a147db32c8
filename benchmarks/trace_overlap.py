"""How much of a step's communication a profiler trace shows hidden behind computation.

    python benchmarks/trace_overlap.py TRACE.json [TRACE.json ...] [--top 12]

Reads Chrome traces written by ``torch.profiler`` (``prof.export_chrome_trace``) and splits the
GPU kernels into collectives (NCCL's kernels: all-reduce, reduce-scatter, all-gather) and the
rest. For each trace it prints, in milliseconds over the traced steps:

* ``span``: first kernel start to last kernel end;
* ``compute``: time some non-collective kernel runs (intervals merged over streams);
* ``comm``: time some collective kernel runs;
* ``overlapped``: time a collective runs while a computation runs too;
* ``exposed``: collective time with no computation beside it (what overlap would still save);
* ``idle``: time no kernel runs at all (the host launching, or waiting);

and the kernels that took the most time. A collective kernel's duration includes its wait for
the other ranks, so ``exposed`` is an upper bound of the wire time that is not hidden.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict

COLLECTIVE_PREFIXES = ("nccl", "ncclDevKernel", "ncclKernel")


def kernels(path: str) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every GPU kernel in the trace."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        events = json.load(fh)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    return [(e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


def merged(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def intersection(a, b) -> float:
    """Total length of the overlap of two merged, sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_collective(name: str) -> bool:
    return name.startswith(COLLECTIVE_PREFIXES)


def summary(path: str, top: int = 12) -> dict:
    ks = kernels(path)
    if not ks:
        return {"trace": path, "kernels": 0}
    comm = merged((s, e) for n, s, e in ks if is_collective(n))
    compute = merged((s, e) for n, s, e in ks if not is_collective(n))
    busy = merged((s, e) for _, s, e in ks)
    span = max(e for _, _, e in ks) - min(s for _, s, _ in ks)
    overlapped = intersection(comm, compute)
    per_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for n, s, e in ks:
        per_name[n][0] += 1
        per_name[n][1] += e - s
    heaviest = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:top]
    ms = 1e-3
    return {"trace": path, "kernels": len(ks), "span_ms": span * ms, "compute_ms": length(compute) * ms,
            "comm_ms": length(comm) * ms, "overlapped_ms": overlapped * ms,
            "exposed_ms": (length(comm) - overlapped) * ms, "idle_ms": (span - length(busy)) * ms,
            "heaviest": [{"name": n[:90], "count": c, "ms": t * ms} for n, (c, t) in heaviest]}


def render(s: dict) -> str:
    if not s["kernels"]:
        return f"{s['trace']}: no GPU kernels"
    lines = [f"{s['trace']}: {s['kernels']} kernels, span {s['span_ms']:.2f} ms, compute {s['compute_ms']:.2f}, "
             f"comm {s['comm_ms']:.2f} (overlapped {s['overlapped_ms']:.2f}, exposed {s['exposed_ms']:.2f}), "
             f"idle {s['idle_ms']:.2f}"]
    lines += [f"  {h['ms']:9.2f} ms  {h['count']:5d}x  {h['name']}" for h in s["heaviest"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    for path in args.traces:
        print(render(summary(path, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
