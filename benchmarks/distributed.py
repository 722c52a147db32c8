"""Data-parallel training under torch.distributed: eager, torch.compile and kiln.compile under the
same wrapper (DDP, FSDP2), side by side. Launched by torchrun, one process per rank:

    torchrun --nproc_per_node 2 benchmarks/distributed.py [--model gpt|llama] [--wrappers ddp,fsdp2,tp]
        [--columns eager,torch,kiln] [--iters 20] [--warmup 3] [--precision bf16|fp32]
        [--json PATH] [--trace DIR]
    torchrun --nproc_per_node 2 benchmarks/distributed.py --cpu --iters 3     # a tiny check, gloo

CUDA with NCCL when the GPUs are there (rank r on cuda:r), gloo on the CPU otherwise.

Models (``--model``):

* ``gpt`` (the default): benchmarks/inductor.py's GPT-2-style stack: 12 layers, d=1024, 16
  heads, vocabulary 50257, batch 8 per rank, sequence 256 (``--cpu``: 2 layers, d=64, 4 heads,
  vocabulary 512, batch 2, sequence 32);
* ``llama``: transformers' ``LlamaForCausalLM`` at its default config (KV cache on) but 12
  layers, d=1024, 16 heads over 4 key/value heads, intermediate 2816, vocabulary 32000, batch 8
  per rank, sequence 256, its loss from ``labels`` (``--cpu``: 2 layers, d=64, 4 heads over 2).
  Under FSDP2 its decoder layers are the blocks sharded (and compiled) one by one.

A step is the forward under bf16 autocast (CUDA only; ``--precision fp32``: no autocast and TF32
off, where the losses follow eager's to float32 rounding), the loss, the backward (with the
wrapper's gradient communication) and an AdamW step (fused on CUDA; one tensor at a time under
tensor parallelism).

Wrappers:

* ``ddp``: ``DistributedDataParallel(model)`` (default 25 MiB buckets, ``--bucket-cap-mb`` to
  change them: on the tiny ``--cpu`` model, 0.05 gives several buckets, though torch.compile's
  DDPOptimizer refuses a cap under its 1 MiB first bucket); the compiled column is
  ``torch.compile(ddp)`` / ``kiln.compile(ddp)``. Both cut the graph at DDP's buckets, so a
  bucket's all-reduce overlaps the backward of the layers before it.
* ``fsdp2``: ``fully_shard`` on every block and on the root; the compiled column compiles each
  block (``--fsdp-compile blocks``, as TorchTitan does) or the whole model (``whole``).
* ``tp``: tensor parallelism over all ranks (``parallelize_module`` on a 1-D mesh): each block's
  MLP split Megatron-style, ``fc1`` colwise and ``fc2`` rowwise (Llama: ``gate_proj`` and
  ``up_proj`` colwise, ``down_proj`` rowwise; the stack's attention reads a
  fused qkv projection that a colwise split does not cut per head, so it stays replicated);
  every rank reads the same batch, and tokens/s counts it once. The compiled column compiles
  the whole model: kiln runs the DTensor modules outside its graphs and compiles the rest.

Per (wrapper, column), printed by rank 0 as a table and written with ``--json``: ``first step``
(wall seconds of step 1: the cold compile), ``step`` (the median of ``--iters`` steps after
``--warmup`` more: CUDA events on a GPU, the wall clock on a CPU), ``tokens/s`` over all ranks,
``peak`` (``torch.cuda.max_memory_allocated`` on rank 0 over the timed steps; not measured on a
CPU), and ``max loss diff``: the largest relative difference of the column's losses from eager's
over every step, on rank 0 (the same batches, the same initial weights).

``--interleave``: every column is compiled first, then the columns take turns (``--rounds``
turns of ``--iters`` steps each) and each one's step is the median over its turns, so that all
see the same state of a noisy host. No peak memory then: every column's model is resident.

``--mode reduce-overhead`` compiles both compilers' columns with CUDA graphs. kiln's cut of DDP
graphs into pieces is set by ``KILN_DDP_PIECES`` (``kiln.config.ddp_pieces``, 4 by default) in
the environment of the run.

``--cprofile``: rank 0 prints a cProfile of 10 more steps of each column (where the host's time
goes).

``--trace DIR``: a profiler trace (Chrome JSON) of 3 steps of each column on rank 0, where the
all-reduce (DDP) or reduce-scatter (FSDP2) kernels can be seen overlapping the backward. Rank 0
prints each trace's summary (``trace_overlap.py``): the collectives' time, how much of it ran
beside computation, how much was exposed, and the heaviest kernels.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cells import step_times, timed_steps  # noqa: E402
from inductor import GPT  # noqa: E402
from trace_overlap import render, summary  # noqa: E402

CUDA_SIZE = dict(layers=12, d=1024, heads=16, vocab=50257, batch=8, seq=256)
CPU_SIZE = dict(layers=2, d=64, heads=4, vocab=512, batch=2, seq=32)
# ``--model llama``: transformers' LlamaForCausalLM at its default config but these sizes
# (grouped-query attention, KV cache on as by default, labels for the loss)
LLAMA_CUDA_SIZE = dict(layers=12, d=1024, heads=16, kv_heads=4, intermediate=2816, vocab=32000, batch=8, seq=256)
LLAMA_CPU_SIZE = dict(layers=2, d=64, heads=4, kv_heads=2, intermediate=176, vocab=512, batch=2, seq=32)
MODELS = ("gpt", "llama")
WRAPPERS = ("ddp", "fsdp2", "tp")
COLUMNS = ("eager", "torch", "kiln")


class LlamaLM(nn.Module):
    """transformers' LlamaForCausalLM called as the GPT stack is: ``(idx, targets) -> loss``
    (labels shifted inside the model, as Hugging Face training does), its decoder layers as
    ``blocks`` for FSDP2's per-block sharding."""

    def __init__(self, size: dict):
        super().__init__()
        import transformers

        transformers.logging.set_verbosity_error()
        cfg = transformers.LlamaConfig(
            hidden_size=size["d"], intermediate_size=size["intermediate"], num_hidden_layers=size["layers"],
            num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"], vocab_size=size["vocab"],
            max_position_embeddings=max(1024, size["seq"]))
        self.lm = transformers.LlamaForCausalLM(cfg)
        self.blocks = self.lm.model.layers

    def forward(self, idx, targets=None):
        return self.lm(input_ids=idx, labels=idx).loss


def build(size: dict, device: torch.device, model: str = "gpt") -> nn.Module:
    torch.manual_seed(0)
    if model == "llama":
        return LlamaLM(size).to(device)
    return GPT(vocab=size["vocab"], d=size["d"], layers=size["layers"], heads=size["heads"],
               max_seq=max(1024, size["seq"])).to(device)


def wrap(model: nn.Module, wrapper: str, column: str, device: torch.device, args):
    """(the wrapped model, the callable a step calls)."""
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        kw = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **kw)
        return ddp, compiler(column, args)(ddp) if column != "eager" else ddp
    if wrapper == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in model.blocks:
            plan = ({"fc1": ColwiseParallel(), "fc2": RowwiseParallel()} if hasattr(block, "fc1") else
                    {"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                     "mlp.down_proj": RowwiseParallel()})
            parallelize_module(block, mesh, plan)
        return model, compiler(column, args)(model) if column != "eager" else model
    from torch.distributed.fsdp import fully_shard

    compile_fn = compiler(column, args) if column != "eager" else None
    for i, block in enumerate(model.blocks):
        fully_shard(block)
    fully_shard(model)
    if compile_fn is not None and args.fsdp_compile == "blocks":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = compile_fn(block)
        return model, model
    return model, compile_fn(model) if compile_fn is not None else model


def compiler(column: str, args):
    mode = {"mode": args.mode} if args.mode else {}
    if column == "torch":
        return lambda m: torch.compile(m, backend=args.torch_backend, **mode)
    import kiln

    return lambda m: kiln.compile(m, backend=args.kiln_backend, **mode)


def batches(size: dict, device: torch.device, rank: int, step: int):
    """The step's batch on ``rank`` (tensor parallelism: pass rank 0 on every rank, the same batch)."""
    g = torch.Generator().manual_seed(10_000 * rank + step)
    idx = torch.randint(0, size["vocab"], (size["batch"], size["seq"] + 1), generator=g)
    return idx[:, :-1].to(device), idx[:, 1:].to(device)


def prepare(wrapper: str, column: str, size: dict, device: torch.device, args) -> dict:
    """One column built, wrapped and compiled: its step function (``step(i)`` trains on batch
    ``i``), the wall seconds of its first step (the cold compile), and its losses so far."""
    rank = dist.get_rank()
    model, call = wrap(build(size, device, args.model), wrapper, column, device, args)
    cuda = device.type == "cuda"
    # (the fused and foreach AdamW refuse a mix of DTensor and plain parameters, which this
    # tensor parallelism makes: the attention's stay replicated, plain tensors)
    impl = {"foreach": False} if wrapper == "tp" else {"fused": True} if cuda else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **impl)
    losses = []

    def step(i: int):
        idx, targets = batches(size, device, 0 if wrapper == "tp" else rank, i)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda and args.precision == "bf16"):
            loss = call(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().float().item())

    sync(device)
    t = time.perf_counter()
    step(0)
    sync(device)
    first = time.perf_counter() - t
    for i in range(1, 1 + args.warmup):
        step(i)
    sync(device)
    return {"wrapper": wrapper, "column": column, "step": step, "first_s": first, "losses": losses}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()


def result(c: dict, ms: float, peak: int, size: dict) -> dict:
    tokens = size["batch"] * size["seq"] * (1 if c["wrapper"] == "tp" else dist.get_world_size())
    return {"wrapper": c["wrapper"], "column": c["column"], "first_s": c["first_s"], "step_ms": ms,
            "tokens_per_s": tokens / (ms / 1e3), "peak_mib": peak / 2**20, "losses": c["losses"]}


def run_column(wrapper: str, column: str, size: dict, device: torch.device, args) -> dict:
    rank = dist.get_rank()
    c = prepare(wrapper, column, size, device, args)
    step = c["step"]
    ms, peak = timed_steps(step, device.type, args.iters, 0, first=1 + args.warmup)
    if args.trace and rank == 0:
        path = os.path.join(args.trace, f"{wrapper}_{column}.json")
        trace(step, 1 + args.warmup + args.iters, path)
        print(render(summary(path)), flush=True)
    elif args.trace:
        for i in range(3):
            step(1 + args.warmup + args.iters + i)
    if args.cprofile:
        python_profile(step, 1 + args.warmup + args.iters + 3, print_it=rank == 0)
    sync(device)
    return result(c, ms, peak, size)


def run_interleaved(wrapper: str, columns: list[str], size: dict, device: torch.device, args) -> list[dict]:
    """Every column compiled first, then timed in turns (``--rounds`` turns of ``--iters`` steps
    each), so that each sees the same state of the host and GPUs; the step is the median over all
    turns. Each column trains on the same batches in the same order. No peak memory: the
    columns' models are all resident."""
    prepared = []
    for column in columns:
        try:
            prepared.append(prepare(wrapper, column, size, device, args))
        except Exception as e:  # noqa: BLE001 - one broken cell does not stop the others
            prepared.append({"wrapper": wrapper, "column": column, "crash": f"{type(e).__name__}: {e}"})
    times: dict[str, list] = {c["column"]: [] for c in prepared if "crash" not in c}
    first = 1 + args.warmup
    for r in range(args.rounds):
        for c in prepared:
            if "crash" not in c:
                t, _ = step_times(c["step"], device.type, args.iters, 0, first=first + r * args.iters)
                times[c["column"]] += t
    return [c if "crash" in c else result(c, statistics.median(times[c["column"]]), 0, size)
            for c in prepared]


def trace(step, start: int, path: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    os.makedirs(os.path.dirname(path), exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for i in range(3):
            step(start + i)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    prof.export_chrome_trace(path)


def python_profile(step, start: int, print_it: bool, steps: int = 10) -> None:
    """cProfile of ``steps`` steps (every rank runs them; rank 0 prints where the host's time went)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for i in range(steps):
        step(start + i)
    prof.disable()
    if print_it:
        for order in ("tottime", "cumulative"):
            pstats.Stats(prof).sort_stats(order).print_stats(30)


def max_rel_diff(a: list, b: list) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def table(rows: list[dict]) -> str:
    lines = ["| wrapper | column | first step (s) | step (ms) | vs eager | tokens/s | peak (MiB) | max loss diff |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "crash" in r:
            lines.append(f"| {r['wrapper']} | {r['column']} | crash: {r['crash'][-100:]!r} | | | | | |")
            continue
        eager = next((e for e in rows if e["wrapper"] == r["wrapper"] and e["column"] == "eager"
                      and "crash" not in e), None)
        vs = f"{r['step_ms'] / eager['step_ms']:.2f}x" if eager else ""
        diff = f"{max_rel_diff(r['losses'], eager['losses']):.1e}" if eager else ""
        peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] else "n/a"
        lines.append(f"| {r['wrapper']} | {r['column']} | {r['first_s']:.2f} | {r['step_ms']:.2f} | {vs} | "
                     f"{r['tokens_per_s']:.0f} | {peak} | {diff} |")
    return "\n".join(lines)


def report(rows: list[dict], args) -> None:
    """Rank 0 prints the newest rows and rewrites the JSON (a run stopped early keeps them)."""
    if dist.get_rank() != 0:
        return
    for r in rows:
        if not r.get("reported"):
            print(f"{r['wrapper']} {r['column']}: " + (r.get("crash") or f"{r['step_ms']:.2f} ms"), flush=True)
            r["reported"] = True
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "precision": args.precision, "size": args.size, "device": args.device, "rows": rows}, fh, indent=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--wrappers", default=",".join(WRAPPERS))
    p.add_argument("--columns", default=",".join(COLUMNS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--interleave", action="store_true",
                   help="compile every column first, then time them in turns (fair step times on a noisy host)")
    p.add_argument("--rounds", type=int, default=5, help="turns per column with --interleave")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="the tiny sizes, on the CPU over gloo")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                   help="bf16: the forward under bf16 autocast on CUDA; fp32: no autocast, TF32 off "
                        "(the losses then compare with eager's to float32 rounding)")
    p.add_argument("--model", choices=MODELS, default="gpt",
                   help="gpt: the GPT-2-style stack; llama: transformers' LlamaForCausalLM")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP's bucket_cap_mb (default: DDP's 25 MiB, the first bucket 1 MiB)")
    p.add_argument("--fsdp-compile", choices=("blocks", "whole"), default="blocks")
    p.add_argument("--mode", default=None, help="both compilers' mode (reduce-overhead: CUDA graphs)")
    p.add_argument("--kiln-backend", default="inductor")
    p.add_argument("--torch-backend", default="inductor")
    p.add_argument("--json", default=None)
    p.add_argument("--trace", default=None, help="a directory for rank 0's profiler traces")
    p.add_argument("--cprofile", action="store_true", help="rank 0 prints a cProfile of 10 steps per column")
    args = p.parse_args(argv)

    cuda = torch.cuda.is_available() and not args.cpu
    if args.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    size = {"gpt": CUDA_SIZE if cuda else CPU_SIZE, "llama": LLAMA_CUDA_SIZE if cuda else LLAMA_CPU_SIZE}[args.model]
    args.size, args.device = size, str(device)
    rows = []
    try:
        for wrapper in args.wrappers.split(","):
            columns = args.columns.split(",")
            if args.interleave:
                rows += run_interleaved(wrapper, columns, size, device, args)
                report(rows, args)
                continue
            for column in columns:
                try:
                    rows.append(run_column(wrapper, column, size, device, args))
                except Exception as e:  # noqa: BLE001 - one broken cell does not stop the others
                    rows.append({"wrapper": wrapper, "column": column, "crash": f"{type(e).__name__}: {e}"})
                report(rows, args)
        if dist.get_rank() == 0:
            where = torch.cuda.get_device_name(device) + " + NCCL" if cuda else "CPU + gloo"
            print(f"\n{dist.get_world_size()} ranks, {where}, {args.model}, {args.precision}, size {size}\n")
            print(table(rows))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
