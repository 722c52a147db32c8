"""What the benchmarks that measure each cell (a model, a column) in a fresh process share.

A parent process spawns the script itself once per cell with ``--cell JSON``; the child builds
its model, measures, and prints one ``RESULT {json}`` line (``emit``). ``run_cell`` gives every
child empty kiln, Inductor and Triton caches in a temporary directory of its own, so a first
step is a cold compile, and turns a crash or a timeout into a row with ``crash`` set: one
broken cell never stops the others.

Step timing (``timed_steps``): the median after warm-up, with CUDA events on a GPU and the wall
clock on a CPU; peak memory is the largest ``torch.cuda.max_memory_allocated`` over the timed
steps (0 on a CPU, where nothing measures it).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

import torch


def empty_cache_env(directory: str, extra: dict | None = None) -> dict:
    """The environment with kiln's, Inductor's and Triton's caches in ``directory`` (and
    ``extra`` on top: a column's own settings)."""
    env = {**os.environ, "KILN_CACHE_DIR": os.path.join(directory, "kiln"),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(directory, "inductor"),
           "TRITON_CACHE_DIR": os.path.join(directory, "triton")}
    env.update(extra or {})
    return env


def run_cell(script: str, cell: dict, args: list, *, extra_env: dict | None = None, timeout: int = 1800) -> dict:
    """Run ``script --cell JSON args...`` in a fresh process with empty caches; its RESULT row
    (the cell's keys first), or the cell with ``crash`` (stderr's tail, or the timeout)."""
    tmp = tempfile.mkdtemp(prefix="kiln_bench_cell_")
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(script), "--cell", json.dumps(cell), *args],
                              capture_output=True, text=True, timeout=timeout,
                              env=empty_cache_env(tmp, extra_env))
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if lines:
            return {**cell, **json.loads(lines[-1][7:])}
        return {**cell, "crash": (proc.stderr or proc.stdout)[-800:] or f"exit status {proc.returncode}"}
    except subprocess.TimeoutExpired:
        return {**cell, "crash": f"timeout ({timeout} s)"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def emit(result: dict) -> None:
    """The child's answer to ``run_cell``."""
    print("RESULT " + json.dumps(result), flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_first(step: Callable[[], object], device: str) -> float:
    """Seconds of wall time for one call of ``step`` (the cold compile when it is the first)."""
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - start


def step_times(step: Callable[[int], object], device: str, iters: int, warmup: int, first: int = 0) -> tuple:
    """``warmup`` untimed calls ``step(first + i)``, then ``iters`` timed ones: their times in ms
    (in call order) and the peak bytes allocated over them (0 on a CPU)."""
    for i in range(warmup):
        step(first + i)
    sync(device)
    times, peak = [], 0
    for i in range(first + warmup, first + warmup + iters):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step(i)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
            peak = max(peak, torch.cuda.max_memory_allocated())
        else:
            t = time.perf_counter()
            step(i)
            times.append((time.perf_counter() - t) * 1e3)
    return times, peak


def timed_steps(step: Callable[[int], object], device: str, iters: int, warmup: int, first: int = 0) -> tuple:
    """``warmup`` untimed calls ``step(first + i)``, then the median of ``iters`` timed ones in ms
    and the peak bytes allocated over the timed ones (0 on a CPU)."""
    times, peak = step_times(step, device, iters, warmup, first)
    return statistics.median(times), peak


def ratio(value, base) -> str:
    """``value / base`` as ``0.87x``; empty where either is missing or zero."""
    if not value or not base:
        return ""
    return f"{value / base:.2f}x"


def crash_text(row: dict, width: int = 120) -> str:
    """A crash cell, short and on one line (for a markdown table)."""
    return "crash: " + repr(row["crash"][-width:]).replace("|", "/")


def write_json(path: str | None, payload) -> None:
    """Write the rows so far (called after each cell: a run stopped early keeps them)."""
    if path:
        with open(path, "w") as fh:
            json.dump(payload, fh, indent=1)
