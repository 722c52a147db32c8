"""Does kiln's mode="reduce-overhead" (CUDA graphs) remove launch overhead? Eager,
torch.compile(mode="reduce-overhead") and kiln.compile(mode="reduce-overhead"), side by side.

    python benchmarks/cudagraphs.py --device cuda [--json PATH] [--iters 50]

Cases:

* ``one-op``: ``x + 1`` on 1024 floats: wall time per call (µs), averaged over 2000 calls after
  warm-up, one synchronize at the end (the CPU cost of a call);
* ``gpt2 inference``: GPT-2 style, 6 layers, d=512, 8 heads, batch 8, sequence 16, under
  no_grad (ms, median of CUDA-event times per step after warm-up);
* ``gpt2 training``: forward, cross-entropy loss, backward and an AdamW step (the optimizer runs
  eagerly for all three), same model;
* peak memory (MiB) of one inference step and one training step
  (``torch.cuda.max_memory_allocated``, parameters and optimizer state included).

Each column runs in its own process (torch's CUDA-graph pools outlive ``torch._dynamo.reset``,
so one process would count one column's memory in the next). Each compiled step's output is
compared with eager's (same weights, same batch).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kiln  # noqa: E402
from benchmarks.inductor import GPT  # noqa: E402,F401  (the model of benchmarks/inductor.py)

COLUMNS = ["eager", "torch reduce-overhead", "kiln reduce-overhead"]


def compiler(column: str):
    if column == "eager":
        return lambda m: m
    if column == "torch reduce-overhead":
        return lambda m: torch.compile(m, mode="reduce-overhead")
    return lambda m: kiln.compile(m, mode="reduce-overhead")


def reset():
    kiln.reset()
    torch._dynamo.reset()


def events_ms(fn, iters: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def one_op(column: str) -> dict:
    reset()

    def f(x):
        return x + 1

    cf = compiler(column)(f)
    x = torch.randn(1024, device="cuda")
    for _ in range(20):
        y = cf(x)
    torch.testing.assert_close(y, f(x))
    n = 2000
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            cf(x)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return {"one_op_us": best}


def gpt(column: str, base, idx, tgt, iters: int) -> dict:
    reset()
    model = copy.deepcopy(base)
    compiled = compiler(column)(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    res: dict = {}

    def inference():
        with torch.no_grad():
            return compiled(idx)

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss = compiled(idx, tgt)
        loss.backward()
        opt.step()
        return loss

    model.eval()
    first = inference().float().clone()
    res["logits_err"] = (first - base(idx).float()).abs().max().item() if column != "eager" else 0.0
    res["inference_ms"] = events_ms(inference, iters)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    inference()
    torch.cuda.synchronize()
    res["peak_inference_mib"] = torch.cuda.max_memory_allocated() / 2**20
    model.train()
    res["first_loss"] = train_step().item()
    res["training_ms"] = events_ms(train_step, iters)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    train_step()
    torch.cuda.synchronize()
    res["peak_training_mib"] = torch.cuda.max_memory_allocated() / 2**20
    del compiled, model, opt
    reset()
    torch.cuda.empty_cache()
    return res


def run_column(column: str, iters: int) -> dict:
    torch.manual_seed(0)
    base = GPT(vocab=50257, d=512, layers=6, heads=8).cuda()
    idx = torch.randint(0, 50257, (8, 16), device="cuda")
    tgt = torch.randint(0, 50257, (8, 16), device="cuda")
    r = one_op(column)
    r.update(gpt(column, base, idx, tgt, iters))
    if column.startswith("kiln"):
        from kiln.cudagraphs import skip_reasons, stats

        r["kiln_cudagraph_calls"] = dict(stats)
        r["kiln_skip_reasons"] = dict(skip_reasons)
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", default=None)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--columns", default=",".join(COLUMNS))
    p.add_argument("--one-column", default=None, help=argparse.SUPPRESS)   # (the child process)
    args = p.parse_args(argv)
    if args.device != "cuda" or not torch.cuda.is_available():
        print("benchmarks/cudagraphs.py measures CUDA graphs: it needs --device cuda and a GPU")
        return 0
    if args.one_column:
        with open(args.json, "w") as fh:
            json.dump(run_column(args.one_column, args.iters), fh)
        return 0
    columns = args.columns.split(",")
    results: dict = {}
    for column in columns:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            path = tmp.name
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one-column", column, "--json", path,
                               "--iters", str(args.iters)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{column}: failed\n{proc.stderr[-3000:]}", flush=True)
            continue
        with open(path) as fh:
            results[column] = json.load(fh)
        os.unlink(path)
        print(f"{column}: {results[column]}", flush=True)
    columns = [c for c in columns if c in results]
    rows = [("one-op call (µs wall)", "one_op_us"), ("GPT-2 inference step (ms)", "inference_ms"),
            ("GPT-2 training step (ms)", "training_ms"), ("peak memory, inference (MiB)", "peak_inference_mib"),
            ("peak memory, training (MiB)", "peak_training_mib"), ("first loss", "first_loss")]
    print(f"\ndevice: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| case | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for label, k in rows:
        print(f"| {label} | " + " | ".join(f"{results[c][k]:.3f}" if k in results[c] else "-" for c in columns) + " |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, fh,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
