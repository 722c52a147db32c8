"""A training step of Hugging Face decoders at their defaults (KV cache on, grouped-query
attention, labels, a padded attention mask) with bf16 autocast and fused AdamW: eager,
torch.compile and kiln.compile (both with their default backend, Inductor), side by side.

    python benchmarks/hf_training.py [--models gpt2,llama,qwen2,t5,mistral] [--iters 20] [--json PATH]
    python benchmarks/hf_training.py --interleave [--models ...]    # step times, alternating in one process

Models, built from configs at these sizes (random weights, nothing downloaded):

* ``gpt2``: 6 layers, d=512, 8 heads, sequence 256, batch 8;
* ``llama``: 8 layers, d=1024, 16 heads over 4 key/value heads, sequence 512, batch 4;
* ``qwen2``: 8 layers, d=1024, 16 heads over 2 key/value heads, sequence 512, batch 4;
* ``mistral``: 8 layers, d=1024, 16 heads over 4 key/value heads, sequence 512, batch 4;
* ``t5``: 6+6 layers, d=512, 8 heads, source 256 / target 128, batch 8.

Each column runs in its own process with empty compiler caches: ``first step`` is the wall
time of the first step (the cold compile for the compilers), ``step`` the median of
``--iters`` steps after 6 warm-up steps (CUDA events), ``peak`` the largest
``torch.cuda.max_memory_allocated`` over the timed steps (weights and optimizer state
included), and ``losses`` the first 6 steps' losses, which must follow eager's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

SIZES = {
    "gpt2": dict(batch=8, seq=256),
    "llama": dict(batch=4, seq=512),
    "qwen2": dict(batch=4, seq=512),
    "mistral": dict(batch=4, seq=512),
    "t5": dict(batch=8, seq=256, target=128),
}


def build(name: str):
    import transformers

    transformers.logging.set_verbosity_error()
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=50257, n_positions=1024)
        return transformers.GPT2LMHeadModel(cfg)
    if name == "t5":
        cfg = transformers.T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
                                    vocab_size=32128, decoder_start_token_id=0)
        return transformers.T5ForConditionalGeneration(cfg)
    kv = {"llama": 4, "qwen2": 2, "mistral": 4}[name]
    cls = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}[name]
    cfg = getattr(transformers, cls)(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                     num_attention_heads=16, num_key_value_heads=kv, vocab_size=32000,
                                     max_position_embeddings=1024)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def token_batch(size: int, seq: int, step: int, device: str, vocab: int = 30000, target: int | None = None) -> dict:
    """Random token ids (the same for a given ``step``), an attention mask whose first row is
    padded on the left, and labels: the ids themselves, or ``target`` random tokens (an
    encoder-decoder's)."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(1, vocab, (size, seq), generator=g).to(device)
    mask = torch.ones_like(ids)
    mask[0, : seq // 8] = 0                        # one padded row
    if target:
        labels = torch.randint(1, vocab, (size, target), generator=g).to(device)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


def batch(name: str, step: int, device: str) -> dict:
    s = SIZES[name]
    return token_batch(s["batch"], s["seq"], step, device, target=s.get("target"))


def training_step(loss_of, opt, device: str):
    """``step(i)``: the loss of batch ``i`` (``loss_of(i)``) under bf16 autocast, its backward and
    an optimizer step; returns the loss, detached."""
    def step(i: int):
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_of(i)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def run_column(name: str, column: str, iters: int, device: str) -> dict:
    torch.manual_seed(0)
    model = build(name).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    if column == "torch":
        fwd = torch.compile(model)
    elif column == "kiln":
        import kiln

        fwd = kiln.compile(model)
    else:
        fwd = model

    step = training_step(lambda i: fwd(**batch(name, i, device)).loss, opt, device)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    start = time.perf_counter()
    losses = [step(0)]
    sync()
    first = time.perf_counter() - start
    losses += [step(i) for i in range(1, 6)]
    losses = [float(x) for x in losses]
    times, peak = [], 0
    for i in range(iters):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step(6 + i)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
            peak = max(peak, torch.cuda.max_memory_allocated())
        else:
            t = time.perf_counter()
            step(6 + i)
            times.append((time.perf_counter() - t) * 1e3)
    return {"model": name, "column": column, "first_step_s": first, "step_ms": statistics.median(times),
            "peak_mib": peak / 2**20, "losses": losses}


def run_interleaved(name: str, _column: str, iters: int, device: str) -> dict:
    """torch.compile and kiln on two copies of one model in one process: after each one's
    warm-up, their steps alternate, so a drift in the host's speed reaches both alike."""
    import kiln

    steps, times = {}, {"torch": [], "kiln": []}
    for column, compiler in (("torch", torch.compile), ("kiln", kiln.compile)):
        torch.manual_seed(0)
        model = build(name).to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
        fwd = compiler(model)

        step = training_step(lambda i, fwd=fwd: fwd(**batch(name, i, device)).loss, opt, device)
        for i in range(6):
            step(i)
        steps[column] = step
    for i in range(iters):
        for column in (("torch", "kiln") if i % 2 == 0 else ("kiln", "torch")):
            if device == "cuda":
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                steps[column](6 + i)
                b.record()
                b.synchronize()
                times[column].append(a.elapsed_time(b))
            else:
                t = time.perf_counter()
                steps[column](6 + i)
                times[column].append((time.perf_counter() - t) * 1e3)
    t, k = statistics.median(times["torch"]), statistics.median(times["kiln"])
    return {"model": name, "column": "interleave", "torch_step_ms": t, "kiln_step_ms": k, "ratio": k / t}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(SIZES))
    p.add_argument("--columns", default="eager,torch,kiln")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--interleave", action="store_true",
                   help="time torch.compile and kiln in one process, alternating steps (fair where the "
                        "host's speed drifts between processes; peak memory and first step: run without it)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--column", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        run = run_interleaved if args.column == "interleave" else run_column
        print("RESULT " + json.dumps(run(args.one, args.column, args.iters, args.device)), flush=True)
        return 0
    if args.interleave:
        args.columns = "interleave"
    rows = []
    for name in args.models.split(","):
        for column in args.columns.split(","):
            env = dict(os.environ)
            tmp = tempfile.mkdtemp(prefix="hf_training_")
            env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"), KILN_CACHE_DIR=os.path.join(tmp, "kiln"),
                       TRITON_CACHE_DIR=os.path.join(tmp, "triton"))
            try:
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name, "--column", column,
                                       "--iters", str(args.iters), "--device", args.device],
                                      capture_output=True, text=True, timeout=args.timeout, env=env)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                r = json.loads(lines[-1][7:]) if lines else {"model": name, "column": column,
                                                             "crash": proc.stderr[-800:]}
            except subprocess.TimeoutExpired:
                r = {"model": name, "column": column, "crash": f"timeout ({args.timeout} s)"}
            rows.append(r)
            print(json.dumps(r), flush=True)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


def print_table(rows: list) -> None:
    if any(r.get("column") == "interleave" for r in rows):
        print("\n| model | torch.compile step (ms) | kiln step (ms) | kiln / torch |")
        print("|---|---|---|---|")
        for r in rows:
            if "crash" in r:
                print(f"| {r['model']} | crash: {r['crash'][-120:]!r} | | |")
            else:
                print(f"| {r['model']} | {r['torch_step_ms']:.2f} | {r['kiln_step_ms']:.2f} | {r['ratio']:.2f}x |")
        return
    by = {(r["model"], r["column"]): r for r in rows}
    print("\n| model | column | first step (s) | step (ms) | vs torch.compile | peak (MiB) | vs torch.compile "
          "| losses, 6 steps | max diff from eager |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, column), r in by.items():
        if "crash" in r:
            print(f"| {name} | {column} | crash: {r['crash'][-120:]!r} | | | | | | |")
            continue
        t, e = by.get((name, "torch")), by.get((name, "eager"))
        ratio = (lambda k: f"{r[k] / t[k]:.2f}x" if t and "crash" not in t and t[k] else "")
        diff = max(abs(a - b) for a, b in zip(r["losses"], e["losses"])) if e and "crash" not in e else float("nan")
        print(f"| {name} | {column} | {r['first_step_s']:.1f} | {r['step_ms']:.2f} | {ratio('step_ms')} "
              f"| {r['peak_mib']:.0f} | {ratio('peak_mib')} | {', '.join(f'{x:.4f}' for x in r['losses'])} "
              f"| {diff:.2e} |")


if __name__ == "__main__":
    sys.exit(main())
