"""flex_attention forward and backward: eager, torch.compile and kiln.compile over four score
and mask modifications, beside ``F.scaled_dot_product_attention`` (causal) as a reference.

    python benchmarks/flex_attention.py [--mods none,causal,alibi,sliding] [--columns eager,torch,kiln,sdpa]
                                        [--iters 20] [--json PATH]
    python benchmarks/flex_attention.py --cpu [--iters 2]       # a tiny variant, to check the script

Inputs: query, key and value of shape (B, H, S, D) = (4, 16, 2048, 64) in bf16 on CUDA, all
three requiring grad (``--cpu``: (2, 2, 256, 16) in float32, forward only: torch has no
flex_attention backward on a CPU). The function compiled is ``flex_attention(q, k, v, ...)``
with, per ``--mods``:

* ``none``: no score_mod, no block mask;
* ``causal``: a causal ``BlockMask`` (``create_block_mask``, built outside the compiled
  function and passed to it as an argument);
* ``alibi``: a score_mod adding ALiBi's per-head linear bias ``slope[h] * (kv - q)`` (the
  slopes a tensor the score_mod closes over), no mask;
* ``sliding``: a causal sliding-window ``BlockMask`` (window 256; ``--cpu``: 64), built outside.

Columns: ``eager`` (flex_attention uncompiled: its unfused reference path, slow and large;
skip it with ``--columns``), ``torch`` (``torch.compile``), ``kiln`` (``kiln.compile``; a kiln
that does not capture flex_attention yet breaks the graph and runs it eagerly: its ``graphs``
then reads 0), and ``sdpa``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` eager,
measured once, in a row of its own compared with torch.compile's causal flex_attention.

Each (mod, column) cell runs in its own process with empty kiln, Inductor and Triton caches.
``first call`` is the wall time of the first forward and backward (the compile), the time
column the median of ``--iters`` more after ``--warmup`` (CUDA events), ``peak`` the largest
``torch.cuda.max_memory_allocated`` over them (inputs included; not measured on a CPU),
``graphs`` the graphs compiled (kiln: its compile cache's misses and bypasses, the cache empty
at the start; torch.compile: dynamo's ``unique_graphs``), ``max err`` the largest difference
of the output and of q's gradient from eager flex_attention's. A cell that fails records its
error and the others still run.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback

import torch
import torch.nn.functional as F

from cells import crash_text, emit, ratio, run_cell, sync, timed_first, timed_steps, write_json

MODS = ("none", "causal", "alibi", "sliding")
COLUMNS = ("eager", "torch", "kiln", "sdpa")
# (torch has no flex_attention backward on a CPU: the CPU variant times the forward only)
CUDA_SIZE = dict(batch=4, heads=16, seq=2048, dim=64, window=256, dtype="bfloat16", backward=True)
CPU_SIZE = dict(batch=2, heads=2, seq=256, dim=16, window=64, dtype="float32", backward=False)


def attention(mod: str, size: dict, device: str):
    """The function to compile for ``mod`` and the extra arguments it takes (a block mask)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if mod == "none":
        def plain(q, k, v):
            return flex_attention(q, k, v)
        return plain, ()
    if mod == "alibi":
        heads = size["heads"]
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device)

        def alibi(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx)

        def with_alibi(q, k, v):
            return flex_attention(q, k, v, score_mod=alibi)
        return with_alibi, ()
    window = size["window"]

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)

    mask_mod = {"causal": causal, "sliding": sliding}[mod]
    block_mask = create_block_mask(mask_mod, None, None, size["seq"], size["seq"], device=device)

    def masked(q, k, v, block_mask):
        return flex_attention(q, k, v, block_mask=block_mask)
    return masked, (block_mask,)


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def run_one(cell: dict, device: str, size: dict, iters: int, warmup: int) -> dict:
    import kiln

    mod, column = cell["mod"], cell["column"]
    torch.manual_seed(0)
    shape = (size["batch"], size["heads"], size["seq"], size["dim"])
    dtype = getattr(torch, size["dtype"])
    backward = size["backward"]
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=backward) for _ in range(3))
    grad_out = torch.randn(shape, device=device, dtype=dtype)
    if column == "sdpa":
        fn, extra = sdpa_causal, ()
    else:
        fn, extra = attention(mod, size, device)
        if column == "torch":
            fn = torch.compile(fn)
        elif column == "kiln":
            fn = kiln.compile(fn)
    outs: list = []

    def step(_i: int) -> None:
        q.grad = k.grad = v.grad = None
        out = fn(q, k, v, *extra)
        if backward:
            out.backward(grad_out)
        if not outs:
            outs.extend([out.detach(), q.grad.detach() if backward else None])

    first = timed_first(lambda: step(0), device)
    row = {"first_s": first}
    if column in ("torch", "kiln"):
        # eager flex_attention's answer, before the timed steps reset the peak
        reference, extra_ref = attention(mod, size, device)
        q.grad = None
        want = reference(q, k, v, *extra_ref)
        row["max_err"] = float((outs[0] - want.detach()).abs().max())
        if backward:
            want.backward(grad_out)
            row["max_err"] = max(row["max_err"], float((outs[1] - q.grad).abs().max()))
        del want
        sync(device)
    step_ms, peak = timed_steps(step, device, iters, warmup, first=1)
    row.update(step_ms=step_ms, peak_mib=peak / 2**20)
    if column == "kiln":
        stats = kiln.cache.stats()
        row["graphs"] = stats["misses"] + stats["bypasses"]
    elif column == "torch":
        row["graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return row


def print_table(rows: list, device: str, size: dict, backward: bool) -> None:
    by = {(r["mod"], r["column"]): r for r in rows}
    what = "forward+backward" if backward else "forward"
    print(f"\nflex_attention {what}, B={size['batch']} H={size['heads']} S={size['seq']} D={size['dim']} "
          f"{size['dtype']} ({device}); ratios to torch.compile of the same mod\n")
    print(f"| mod | column | {what} (ms) | vs torch.compile | peak (MiB) | vs torch.compile | first call (s) "
          "| graphs | max err vs eager flex |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (mod, column), r in by.items():
        label = "causal (sdpa)" if column == "sdpa" else mod
        if "crash" in r:
            print(f"| {label} | {column} | {crash_text(r)} | | | | | | |")
            continue
        t = by.get(("causal" if column == "sdpa" else mod, "torch"), {})
        t = t if "crash" not in t else {}
        peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] else "-"
        err = f"{r['max_err']:.2e}" if "max_err" in r else ""
        print(f"| {label} | {column} | {r['step_ms']:.2f} | {ratio(r['step_ms'], t.get('step_ms'))} | {peak} "
              f"| {ratio(r['peak_mib'], t.get('peak_mib'))} | {r['first_s']:.1f} | {r.get('graphs', '')} | {err} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mods", default=",".join(MODS))
    p.add_argument("--columns", default=",".join(COLUMNS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--cpu", action="store_true", help="the tiny CPU variant")
    p.add_argument("--json", default=None)
    p.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    size = CPU_SIZE if device == "cpu" else CUDA_SIZE
    if args.cell:
        try:
            emit(run_one(json.loads(args.cell), device, size, args.iters, args.warmup))
        except Exception as e:  # the parent records the error as this cell's result
            traceback.print_exc()
            emit({"crash": f"{type(e).__name__}: {e}"[:800]})
        return 0
    mods, columns = args.mods.split(","), args.columns.split(",")
    if set(mods) - set(MODS) or set(columns) - set(COLUMNS):
        p.error(f"mods: {', '.join(MODS)}; columns: {', '.join(COLUMNS)}")
    cells = [{"mod": m, "column": c} for m in mods for c in columns if c != "sdpa"]
    if "sdpa" in columns:
        cells.append({"mod": "-", "column": "sdpa"})
    rows = []
    child_args = ["--iters", str(args.iters), "--warmup", str(args.warmup), *(["--cpu"] if args.cpu else [])]
    for cell in cells:
        r = run_cell(__file__, cell, child_args, timeout=args.timeout)
        rows.append(r)
        print(json.dumps(r), flush=True)
        write_json(args.json, {"device": device, "size": size, "rows": rows})
    print_table(rows, device, size, backward=size["backward"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
