"""Peak memory and step time of training a model whose every block is checkpointed: eager,
torch.compile and kiln.compile over the same checkpointing, side by side.

    python benchmarks/checkpointed_training.py [--models llama,gpt] [--columns eager,torch,kiln]
        [--iters 20] [--json PATH]
    python benchmarks/checkpointed_training.py --cpu [--iters 2]       # a tiny variant, to check the script

Models (random weights, nothing downloaded):

* ``llama``: a Hugging Face Llama (``transformers.LlamaConfig``: 8 layers, d=1024, 16 heads
  over 4 key/value heads, intermediate 2816, vocabulary 32000; batch 8, sequence 1024, labels
  given) with ``model.gradient_checkpointing_enable()`` (``use_reentrant=False``: every
  decoder layer recomputed in the backward);
* ``gpt``: a GPT-2-style stack (benchmarks/inductor.py's ``GPT``: 12 layers, d=768, 12 heads,
  vocabulary 50257; batch 8, sequence 1024) whose forward runs each block through
  ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)``.

``--cpu``: 2 layers, d=64, 4 heads (2 key/value heads), vocabulary 512, batch 2, sequence 32.
A step is the forward under bf16 autocast, the loss, the backward and an AdamW step (fused on
CUDA); only the model is compiled. The extra column ``eager_nockpt`` (not run by default)
trains the same model without checkpointing: the memory the checkpointing saves.

Each (model, column) cell runs in its own process with empty kiln, Inductor and Triton caches:
``first step`` is the wall time of the first step (the cold compile for the compilers),
``step`` the median of ``--iters`` steps after ``--warmup`` more (CUDA events), ``peak`` the
largest ``torch.cuda.max_memory_allocated`` over the timed steps (weights and optimizer state
included; not measured on a CPU), ``losses`` the first 4 steps' losses, which must follow
eager's.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
from torch.utils.checkpoint import checkpoint

from cells import crash_text, emit, ratio, run_cell, sync, timed_first, timed_steps, write_json
from inductor import GPT

MODELS = ("llama", "gpt")
COLUMNS = ("eager", "torch", "kiln", "eager_nockpt")
CUDA_SIZE = {
    "llama": dict(layers=8, hidden=1024, heads=16, kv_heads=4, intermediate=2816, vocab=32000, batch=8, seq=1024),
    "gpt": dict(layers=12, hidden=768, heads=12, vocab=50257, batch=8, seq=1024),
}
CPU_SIZE = {
    "llama": dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=176, vocab=512, batch=2, seq=32),
    "gpt": dict(layers=2, hidden=64, heads=4, vocab=512, batch=2, seq=32),
}


class CheckpointedGPT(GPT):
    """The GPT-2-style stack with every block recomputed in the backward (when ``checkpointed``)."""

    def __init__(self, *args, checkpointed: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.checkpointed = checkpointed

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        logits = self.head(self.ln(x))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build(name: str, size: dict, checkpointed: bool):
    if name == "gpt":
        return CheckpointedGPT(vocab=size["vocab"], d=size["hidden"], layers=size["layers"], heads=size["heads"],
                               max_seq=max(1024, size["seq"]), checkpointed=checkpointed)
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(hidden_size=size["hidden"], intermediate_size=size["intermediate"],
                                   num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                                   num_key_value_heads=size["kv_heads"], vocab_size=size["vocab"],
                                   max_position_embeddings=max(1024, size["seq"]))
    model = transformers.LlamaForCausalLM(cfg)
    if checkpointed:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def loss_of(name: str, fwd, size: dict, step: int, device: str):
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(1, size["vocab"], (size["batch"], size["seq"] + 1), generator=g).to(device)
    if name == "gpt":
        return fwd(ids[:, :-1], ids[:, 1:])
    return fwd(input_ids=ids[:, :-1], labels=ids[:, :-1]).loss


def run_one(cell: dict, device: str, sizes: dict, iters: int, warmup: int) -> dict:
    import kiln

    name, column = cell["model"], cell["column"]
    size = sizes[name]
    torch.manual_seed(0)
    model = build(name, size, checkpointed=column != "eager_nockpt").to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    fwd = torch.compile(model) if column == "torch" else kiln.compile(model) if column == "kiln" else model
    losses: list = []

    def step(i: int) -> None:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_of(name, fwd, size, i, device)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if len(losses) < 4:
            losses.append(loss.detach())

    sync(device)
    first = timed_first(lambda: step(0), device)
    step_ms, peak = timed_steps(step, device, iters, warmup, first=1)
    return {"first_step_s": first, "step_ms": step_ms, "peak_mib": peak / 2**20, "losses": [float(x) for x in losses]}


def print_table(rows: list, device: str) -> None:
    by = {(r["model"], r["column"]): r for r in rows}
    print(f"\nevery block checkpointed ({device}); ratios to torch.compile\n")
    print("| model | column | first step (s) | step (ms) | vs torch.compile | peak (MiB) | vs torch.compile "
          "| losses | max diff from eager |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, column), r in by.items():
        if "crash" in r:
            print(f"| {name} | {column} | {crash_text(r)} | | | | | | |")
            continue
        t, e = by.get((name, "torch")), by.get((name, "eager"))
        t = t if t and "crash" not in t else None
        diff = (f"{max(abs(a - b) for a, b in zip(r['losses'], e['losses'])):.2e}"
                if e and "crash" not in e else "")
        peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] else "-"
        print(f"| {name} | {column} | {r['first_step_s']:.1f} | {r['step_ms']:.2f} "
              f"| {ratio(r['step_ms'], t and t['step_ms'])} | {peak} | {ratio(r['peak_mib'], t and t['peak_mib'])} "
              f"| {', '.join(f'{x:.4f}' for x in r['losses'])} | {diff} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--columns", default="eager,torch,kiln", help=f"of {', '.join(COLUMNS)}")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--cpu", action="store_true", help="the tiny CPU variant")
    p.add_argument("--json", default=None)
    p.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    sizes = CPU_SIZE if device == "cpu" else CUDA_SIZE
    if args.cell:
        emit(run_one(json.loads(args.cell), device, sizes, args.iters, args.warmup))
        return 0
    columns, models = args.columns.split(","), args.models.split(",")
    if set(columns) - set(COLUMNS) or set(models) - set(MODELS):
        p.error(f"columns: {', '.join(COLUMNS)}; models: {', '.join(MODELS)}")
    rows = []
    child_args = ["--iters", str(args.iters), "--warmup", str(args.warmup), *(["--cpu"] if args.cpu else [])]
    for name in models:
        for column in columns:
            r = run_cell(__file__, {"model": name, "column": column}, child_args, timeout=args.timeout)
            rows.append(r)
            print(json.dumps(r), flush=True)
            write_json(args.json, {"device": device, "sizes": sizes, "rows": rows})
    print_table(rows, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
