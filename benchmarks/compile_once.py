"""One compile per job: the time to the first training step on 2 ranks, kiln against torch.compile.

    python benchmarks/compile_once.py [--models mlp-train,gpt2-train] [--device cpu|cuda]
        [--json PATH] [--redis-server PATH]

A job is 2 ranks (processes) over torch.distributed (gloo on CPU, NCCL on CUDA), each a "host"
with empty kiln, Inductor and Triton caches of its own. Every rank wraps the model, runs one
training step (loss and backward), and reports the seconds from wrapping to the step's end.
Columns:

* ``kiln once``: kiln with ``distributed_compile_once`` (the default): one rank compiles each
  graph, the other receives it through the process group's store;
* ``kiln each``: the same with it off: both ranks compile;
* ``torch``: torch.compile, both ranks compile (its caches are per host);
* ``kiln warm remote``: kiln over a Redis that an earlier job filled (a redis-server the
  benchmark starts, persistence off): no rank compiles.

"first step" is the slower rank's (the job waits for it); "compiles" counts the graphs each
rank compiled (kiln's cache misses less what it received), summed over the ranks.
Models: ``mlp-train`` (a small MLP) and ``gpt2-train`` (benchmarks/inductor.py's GPT-2-style
decoder, 6 layers, d=512; batch 2, sequence 64).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _rank(model: str, compiler: str, rank: int, port: int, device: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    sys.path.insert(0, HERE)
    import kiln

    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2, timeout=datetime.timedelta(seconds=1800))
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.manual_seed(0)
    if model == "gpt2-train":
        from inductor import GPT
        net = GPT(vocab=8192)
        args = (torch.randint(0, 8192, (2, 64)), torch.randint(0, 8192, (2, 64)))
    else:
        from warm_start import WithLoss
        net = WithLoss(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)))
        args = (torch.randn(32, 64), torch.randn(32, 10))
    dev = "cuda" if device == "cuda" else "cpu"
    net = net.to(dev)
    args = tuple(a.to(dev) for a in args)
    dist.barrier()                          # (both ranks start the clock together)
    start = time.perf_counter()
    fn = torch.compile(net) if compiler == "torch" else kiln.compile(net)
    out = fn(*args)
    (out if isinstance(out, torch.Tensor) else out.loss).backward()
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - start
    stats = kiln.cache.stats()
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"first": first, "compiles": stats["misses"] - stats["job_hits"],
                                  "job_hits": stats["job_hits"], "remote_hits": stats["remote_hits"]}), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(model: str, compiler: str, device: str, hosts: str, env: dict) -> list[dict]:
    port = _free_port()
    procs = []
    for rank in range(2):
        host = os.path.join(hosts, f"host{rank}")
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--rank", model, compiler, str(rank), str(port), "--device", device],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**env, "KILN_CACHE_DIR": os.path.join(host, "kiln"),
                 "TORCHINDUCTOR_CACHE_DIR": os.path.join(host, "inductor"),
                 "TRITON_CACHE_DIR": os.path.join(host, "triton")}))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=3600)
        lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"{model}/{compiler} failed:\n{err[-3000:]}")
        results.append(json.loads(lines[0][7:]))
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp-train,gpt2-train")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json")
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--rank", nargs=4)
    a = ap.parse_args()
    if a.rank:
        _rank(a.rank[0], a.rank[1], int(a.rank[2]), int(a.rank[3]), a.device)
        return
    sys.path.insert(0, HERE)
    from warm_start import _start_redis

    base = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    pycache = tempfile.TemporaryDirectory(prefix="kiln-bench-pycache-")
    base.setdefault("PYTHONPYCACHEPREFIX", pycache.name)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-redis-") as rd:
        proc, url = _start_redis(a.redis_server, rd)
        try:
            for model in a.models.split(","):
                with tempfile.TemporaryDirectory() as d:        # (untimed: library bytecode)
                    _job(model, "kiln", a.device, d, base)
                row = {"model": model}
                columns = {"kiln_once": ("kiln", {}), "kiln_each": ("kiln", {"KILN_DISTRIBUTED_COMPILE_ONCE": "0"}),
                           "torch": ("torch", {}), "kiln_warm_remote": ("kiln", {"KILN_REMOTE_CACHE": url})}
                for column, (compiler, extra) in columns.items():
                    if column == "kiln_warm_remote":
                        with tempfile.TemporaryDirectory() as d:    # an earlier job fills Redis
                            _job(model, compiler, a.device, d, {**base, **extra})
                    with tempfile.TemporaryDirectory() as d:
                        ranks = _job(model, compiler, a.device, d, {**base, **extra})
                    row[f"{column}_first_s"] = max(r["first"] for r in ranks)
                    row[f"{column}_ranks_s"] = [round(r["first"], 3) for r in ranks]
                    if compiler == "kiln":
                        row[f"{column}_compiles"] = sum(r["compiles"] for r in ranks)
                rows.append(row)
                print(f"# {model} done: {json.dumps(row)}", file=sys.stderr, flush=True)
                if a.json:
                    with open(a.json, "w") as f:
                        json.dump({"device": a.device, "rows": rows}, f, indent=1)
        finally:
            proc.terminate()
            proc.wait()
    print(f"time to the first training step on 2 ranks (the slower rank), seconds; device {a.device}")
    print(f"{'model':<11} | {'kiln once':>9} {'(compiles)':>10} | {'kiln each':>9} {'(compiles)':>10} | "
          f"{'torch':>7} | {'kiln warm remote':>16} {'(compiles)':>10}")
    for r in rows:
        print(f"{r['model']:<11} | {r['kiln_once_first_s']:>9.2f} {r['kiln_once_compiles']:>10} | "
              f"{r['kiln_each_first_s']:>9.2f} {r['kiln_each_compiles']:>10} | {r['torch_first_s']:>7.2f} | "
              f"{r['kiln_warm_remote_first_s']:>16.2f} {r['kiln_warm_remote_compiles']:>10}")


if __name__ == "__main__":
    main()
