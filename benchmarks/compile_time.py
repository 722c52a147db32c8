"""Cold compile time and step time of a Hugging Face Llama training step as its layer count
grows: torch.compile and kiln.compile, each with and without compiling the repeated decoder
layer once.

    python benchmarks/compile_time.py [--layers 4,16,32] [--iters 20] [--json PATH]
        [--columns torch,torch_regions,kiln,kiln_regions,kiln_noregions]
    python benchmarks/compile_time.py --cpu [--layers 2,4] [--iters 2]      # a tiny variant, to check the script
    python benchmarks/compile_time.py --interleave 8 [--layers 16] [--columns kiln_regions,kiln,torch]

Model: ``transformers.LlamaConfig`` at a small width but its real structure (random weights,
nothing downloaded): d=1024, 16 heads over 4 key/value heads, intermediate 2816, vocabulary
32000; batch 4, sequence 512, labels given (the loss is the model's), KV cache at its default.
``--cpu``: d=64, 4 heads over 2, intermediate 176, vocabulary 512, batch 2, sequence 32. A step
is the forward under bf16 autocast, the backward and an AdamW step (fused on CUDA); only the
model is compiled.

Columns:

* ``torch``: ``torch.compile(model)``;
* ``torch_regions``: the same, with the decoder layer's ``forward`` wrapped in
  ``torch.compiler.nested_compile_region`` (compiled once, reused by every layer; skipped where
  the installed torch lacks it);
* ``kiln``: ``kiln.compile(model)`` at its defaults;
* ``kiln_regions`` / ``kiln_noregions``: the same with ``KILN_REPEATED_BLOCKS=1`` / ``=0``
  (a kiln without that setting ignores the variable: both then equal ``kiln``);
* ``torch_layers`` / ``kiln_layers``: each decoder layer compiled on its own (torch's regional
  compilation recipe, and FSDP2's per-block compile); the rest of the model runs eagerly.

Every (column, layer count) cell runs in its own process with empty kiln, Inductor and Triton
caches. ``first step`` is the wall time from wrapping the model to the end of its first step
(the cold compile; library imports come before the clock), ``step`` the median of ``--iters``
steps after ``--warmup`` more (CUDA events), ``peak`` the largest
``torch.cuda.max_memory_allocated`` over the timed steps, ``graphs`` the graphs compiled: for
kiln its compile cache's misses and bypasses (empty at the start, so every compiled graph is
one; hits are graphs served again within the process), for torch.compile dynamo's
``unique_graphs``. ``growth`` is a column's first step at each layer count over its first
step at the smallest. Targets: kiln's cold compile of 16 layers <= 0.35x torch.compile's, its
growth from 4 to 16 layers <= 1.2x, its step <= 1.0x torch.compile's.

``--interleave ROUNDS``: the step times again, with every column in one process per layer count
(each compiled, then ``ROUNDS`` rounds of ``--iters`` steps per column in turn; a column's step
is the median over the rounds of each round's mean step). The host's state moves a step from one
process to the next by more than the difference between columns; here every column sees the same
host. The first steps in this mode are not cold compiles (the columns share the process).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from cells import crash_text, emit, ratio, run_cell, sync, timed_first, timed_steps, write_json

COLUMNS = ("torch", "torch_regions", "kiln", "kiln_regions", "kiln_noregions", "torch_layers", "kiln_layers")
KILN_ENV = {"kiln_regions": {"KILN_REPEATED_BLOCKS": "1"}, "kiln_noregions": {"KILN_REPEATED_BLOCKS": "0"}}
CUDA_SIZE = dict(hidden=1024, heads=16, kv_heads=4, intermediate=2816, vocab=32000, batch=4, seq=512)
CPU_SIZE = dict(hidden=64, heads=4, kv_heads=2, intermediate=176, vocab=512, batch=2, seq=32)


def build(layers: int, size: dict):
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(hidden_size=size["hidden"], intermediate_size=size["intermediate"],
                                   num_hidden_layers=layers, num_attention_heads=size["heads"],
                                   num_key_value_heads=size["kv_heads"], vocab_size=size["vocab"],
                                   max_position_embeddings=max(1024, size["seq"]))
    return transformers.LlamaForCausalLM(cfg)


def batch(size: dict, step: int, device: str) -> dict:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(1, size["vocab"], (size["batch"], size["seq"]), generator=g).to(device)
    return {"input_ids": ids, "labels": ids}


def wrap_layers_in_regions(model) -> None:
    """Every decoder layer's forward as one nested compile region (the class's forward: one
    function for all layers, which is what lets torch.compile reuse the region)."""
    cls = type(model.model.layers[0])
    cls.forward = torch.compiler.nested_compile_region(cls.forward)


def compile_for(column: str, model, kiln_backend: str = "inductor"):
    """The callable a step calls for ``column``: the model compiled whole, or (``*_layers``)
    the model with each decoder layer compiled on its own, torch's regional compilation
    recipe (the layers differ in their ``layer_idx``, which picks their KV cache)."""
    import kiln

    def compile_(m):
        return torch.compile(m) if column.startswith("torch") else kiln.compile(m, backend=kiln_backend)

    if column.endswith("_layers"):
        layers = model.model.layers
        for i, layer in enumerate(layers):
            layers[i] = compile_(layer)
        return model
    return compile_(model)


def run_one(cell: dict, device: str, size: dict, iters: int, warmup: int) -> dict:
    import torch._dynamo  # noqa: F401  (imported before the clock by every column alike)

    import kiln

    column = cell["column"]
    torch.manual_seed(0)
    model = build(cell["layers"], size).to(device).train()
    if column == "torch_regions":
        wrap_layers_in_regions(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    fwd = None
    losses: list = []

    def step(i: int) -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = fwd(**batch(size, i, device)).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if len(losses) < 3:
            losses.append(loss.detach())

    def first_step() -> None:
        nonlocal fwd
        fwd = compile_for(column, model)
        step(0)

    sync(device)
    first = timed_first(first_step, device)
    step_ms, peak = timed_steps(step, device, iters, warmup, first=1)
    row = {"first_step_s": first, "step_ms": step_ms, "peak_mib": peak / 2**20,
           "losses": [float(x) for x in losses]}
    if column.startswith("kiln"):
        stats = kiln.cache.stats()
        row["graphs"] = stats["misses"] + stats["bypasses"]
        row["graph_hits"] = stats["hits"]
        row["repeated_blocks"] = os.environ.get("KILN_REPEATED_BLOCKS", "")
    else:
        row["graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return row


def run_interleaved(cell: dict, device: str, size: dict, iters: int, warmup: int, rounds: int) -> list:
    """Every column of ``cell`` in this process: compiled one after another, then timed in
    turns, ``rounds`` times ``iters`` steps each (CUDA events on a GPU). One row per column."""
    import torch._dynamo  # noqa: F401

    import kiln

    torch.manual_seed(0)
    base = build(cell["layers"], size)
    state = {k: v.clone() for k, v in base.state_dict().items()}
    steps, rows = {}, []
    for column in cell["columns"]:
        model = build(cell["layers"], size)
        model.load_state_dict(state)
        model = model.to(device).train()
        if column == "torch_regions":
            wrap_layers_in_regions(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
        blocks = {"kiln_regions": True, "kiln_noregions": False}.get(column, kiln.config.repeated_blocks)
        with kiln.config.patch(repeated_blocks=blocks):
            fwd = compile_for(column, model, cell.get("kiln_backend", "inductor"))

        def step(i: int, fwd=fwd, opt=opt, blocks=blocks) -> float:
            with kiln.config.patch(repeated_blocks=blocks), torch.autocast(device, dtype=torch.bfloat16):
                loss = fwd(**batch(size, i, device)).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        row = {**cell, "column": column, "columns": None}
        row["first_step_s"] = timed_first(lambda step=step, row=row: row.setdefault("loss", float(step(0))), device)
        for i in range(warmup):
            step(1 + i)
        sync(device)
        steps[column] = step
        row["rounds_ms"] = []
        rows.append(row)
    for _ in range(rounds):
        for row in rows:
            step = steps[row["column"]]
            sync(device)
            if device == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
            start = time.perf_counter()
            for i in range(iters):
                step(i)
            if device == "cuda":
                b.record()
                sync(device)
                row["rounds_ms"].append(a.elapsed_time(b) / iters)
            else:
                row["rounds_ms"].append((time.perf_counter() - start) * 1e3 / iters)
    for row in rows:
        row["step_ms"] = statistics.median(row["rounds_ms"])
        del row["columns"]
    return rows


def print_interleaved(rows: list) -> None:
    print("\nstep time, every column in one process, timed in turns (median of the rounds)\n")
    print("| layers | column | step (ms) | vs torch | rounds (ms) | first step's loss |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "crash" in r:
            print(f"| {r.get('layers', '')} | {r.get('column', '')} | {crash_text(r)} | | | |")
            continue
        t = next((x for x in rows if x.get("layers") == r["layers"] and x.get("column") == "torch"
                  and "step_ms" in x), None)
        rounds = ", ".join(f"{v:.1f}" for v in r["rounds_ms"])
        print(f"| {r['layers']} | {r['column']} | {r['step_ms']:.2f} | {ratio(r['step_ms'], t and t['step_ms'])} "
              f"| {rounds} | {r['loss']:.6f} |")


def print_tables(rows: list, layer_counts: list, columns: list, device: str) -> None:
    by = {(r["layers"], r["column"]): r for r in rows}
    for layers in layer_counts:
        t = by.get((layers, "torch"))
        t = t if t and "crash" not in t and "skipped" not in t else None
        print(f"\n{layers} layers ({device})\n")
        print("| column | first step (s) | vs torch | step (ms) | vs torch | peak (MiB) | vs torch | graphs "
              "| max loss diff from torch |")
        print("|---|---|---|---|---|---|---|---|---|")
        for column in columns:
            r = by.get((layers, column))
            if r is None:
                continue
            if "skipped" in r:
                print(f"| {column} | skipped: {r['skipped']} | | | | | | | |")
                continue
            if "crash" in r:
                print(f"| {column} | {crash_text(r)} | | | | | | | |")
                continue
            diff = (f"{max(abs(a - b) for a, b in zip(r['losses'], t['losses'])):.2e}" if t else "")
            peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] else "-"
            hits = f" ({r['graph_hits']} hits)" if r.get("graph_hits") else ""
            print(f"| {column} | {r['first_step_s']:.1f} | {ratio(r['first_step_s'], t and t['first_step_s'])} "
                  f"| {r['step_ms']:.2f} | {ratio(r['step_ms'], t and t['step_ms'])} "
                  f"| {peak} | {ratio(r['peak_mib'], t and t['peak_mib'])} | {r['graphs']}{hits} | {diff} |")
    if len(layer_counts) < 2:
        return
    low = layer_counts[0]
    print(f"\nfirst step (s) by layer count, and its growth over {low} layers\n")
    print("| column | " + " | ".join(f"{n} layers" for n in layer_counts) + " | "
          + " | ".join(f"growth {n}/{low}" for n in layer_counts[1:]) + " |")
    print("|---|" + "---|" * (2 * len(layer_counts) - 1))
    for column in columns:
        firsts = [by.get((n, column), {}).get("first_step_s") for n in layer_counts]
        if not any(firsts):
            continue
        print(f"| {column} | " + " | ".join(f"{f:.1f}" if f else "-" for f in firsts) + " | "
              + " | ".join(ratio(f, firsts[0]) for f in firsts[1:]) + " |")
    if 4 in layer_counts and 16 in layer_counts:
        print("\ntargets (16 layers): cold <= 0.35x torch, growth 16/4 <= 1.2x, step <= 1.0x torch")
        t16 = by.get((16, "torch"), {})
        for column in columns:
            r4, r16 = by.get((4, column), {}), by.get((16, column), {})
            if not column.startswith("kiln") or "first_step_s" not in r4 or "first_step_s" not in r16:
                continue
            print(f"- {column}: cold {ratio(r16['first_step_s'], t16.get('first_step_s')) or '?'}, "
                  f"growth {ratio(r16['first_step_s'], r4['first_step_s'])}, "
                  f"step {ratio(r16['step_ms'], t16.get('step_ms')) or '?'}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", default=None, help="layer counts (default 4,16,32; with --cpu 2,4)")
    p.add_argument("--columns", default=",".join(COLUMNS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--cpu", action="store_true", help="the tiny CPU variant")
    p.add_argument("--json", default=None)
    p.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    p.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                   help="time every column in one process, in turns, ROUNDS rounds of --iters steps")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    size = CPU_SIZE if device == "cpu" else CUDA_SIZE
    if args.cell:
        cell = json.loads(args.cell)
        if "columns" in cell:
            emit({"rows": run_interleaved(cell, device, size, args.iters, args.warmup, cell["rounds"])})
        else:
            emit(run_one(cell, device, size, args.iters, args.warmup))
        return 0
    layer_counts = [int(n) for n in (args.layers or ("2,4" if device == "cpu" else "4,16,32")).split(",")]
    columns = args.columns.split(",")
    unknown = set(columns) - set(COLUMNS)
    if unknown:
        p.error(f"unknown columns {sorted(unknown)}; known: {', '.join(COLUMNS)}")
    rows = []
    child_args = ["--iters", str(args.iters), "--warmup", str(args.warmup), *(["--cpu"] if args.cpu else [])]
    if args.interleave:
        if "torch_regions" in columns and not hasattr(torch.compiler, "nested_compile_region"):
            columns.remove("torch_regions")
        for layers in layer_counts:
            cell = {"layers": layers, "columns": columns, "rounds": args.interleave}
            r = run_cell(__file__, cell, child_args, timeout=args.timeout)
            got = r.get("rows") or [{"layers": layers, "column": ",".join(columns), "crash": r.get("crash", "?")}]
            rows += got
            for row in got:
                print(json.dumps(row), flush=True)
            write_json(args.json, {"device": device, "size": size, "interleaved": True, "rows": rows})
        print_interleaved(rows)
        return 0
    for layers in layer_counts:
        for column in columns:
            cell = {"layers": layers, "column": column}
            if column == "torch_regions" and not hasattr(torch.compiler, "nested_compile_region"):
                r = {**cell, "skipped": f"torch {torch.__version__} has no torch.compiler.nested_compile_region"}
            else:
                r = run_cell(__file__, cell, child_args, extra_env=KILN_ENV.get(column), timeout=args.timeout)
            rows.append(r)
            print(json.dumps(r), flush=True)
            write_json(args.json, {"device": device, "size": size, "rows": rows})
    print_tables(rows, layer_counts, columns, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
