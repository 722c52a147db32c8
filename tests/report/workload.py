"""A real run for the report tests: a training step with a graph break, compiled, then called
with another shape (a recompile, and a compile-cache miss whose nearest entry differs)."""
from __future__ import annotations

import os

import torch

import kiln


def step(x, w):
    y = (x @ w).relu()
    print("logging a step")      # a graph break: the rest runs in a continuation
    return (y * 2).sum()


def run_traced(trace_dir: str) -> list:
    """Run the workload with the trace on; returns (compiled, eager) results."""
    compiled = kiln.compile(step, backend="aot_eager")
    results = []
    with kiln.config.patch(trace_dir=trace_dir, cache_frames=True):
        for shape in ((4, 3), (6, 3)):
            x = torch.randn(*shape)
            w = torch.randn(3, 5, requires_grad=True)
            out = compiled(x, w)
            out.backward()
            w2 = w.detach().clone().requires_grad_(True)
            ref = step(x, w2)
            ref.backward()
            results.append((out.detach(), ref.detach(), w.grad, w2.grad))
    return results


def trace_paths(trace_dir: str) -> list:
    return sorted(os.path.join(trace_dir, n) for n in os.listdir(trace_dir) if n.endswith(".jsonl"))
