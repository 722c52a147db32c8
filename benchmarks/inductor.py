"""Does kiln's Inductor backend make programs faster? Eager, torch.compile (default mode) and
kiln.compile(backend="inductor"), side by side, in one run.

    python benchmarks/inductor.py [--device cuda] [--json PATH] [--models gpt2-16,gpt2-512,bert,resnet]
                                  [--quick] [--iters 20]

Models (pure PyTorch, no downloads; every one is captured as one graph by both compilers):

* ``gpt2-16`` / ``gpt2-512``: a GPT-2-style decoder, 6 layers, d=512, 8 heads, vocabulary
  50257, batch 8, at sequence length 16 and 512;
* ``bert``: a BERT-base-sized encoder, 12 layers, d=768, 12 heads, FFN 3072, vocabulary 30522,
  batch 8, sequence 128, with an MLM head;
* ``resnet``: ``timm``'s resnet50 when timm is installed, else a ResNet-18-style net written
  here, batch 32 at 224x224 (CPU: smaller).

Rows, per model:

* inference step: ``model(x)`` under ``torch.no_grad()`` in eval mode (ms, median);
* training step: forward, loss, backward and an AdamW step (ms, median; the optimizer runs
  eagerly for all three);
* cold compile, inference / training: the wall time of the first call of a compiled model, with
  empty Inductor/Triton caches (a fresh cache directory for each) and after every library is
  imported (so it is compile time plus one run); on CUDA the median of ``--compile-repeats``
  (default 3) cold compiles per compiler, the compilers taking turns;
* peak memory of a training step (CUDA: ``torch.cuda.max_memory_allocated`` during the step,
  parameters and optimizer state included; CPU: not measured);
* peak memory requested: the same peak in the bytes the tensors asked for
  (``requested_bytes`` of ``torch.cuda.memory_stats``). The caching allocator hands out a whole
  cached block when what is left of it would be small, so the row above also counts that slack,
  which depends on the order of earlier frees (on GPT-2 seq 16, the optimizer state that the
  first step creates lands in blocks a few MiB larger or smaller from one compiler to another).

Times are medians over ``--iters`` steps after warm-up, measured with CUDA events on GPU. The
steps are timed in ``--rounds`` rounds that visit every column in turn, so that a drift of the
machine touches all columns alike. A column's peak memory counts from what the other columns
hold (all stay alive for the interleaved timing). The first compiled step's loss is compared
with eager's (same weights, same batch; dropout is 0).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kiln  # noqa: E402


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------

class Attention(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(a.transpose(1, 2).reshape(b, t, d))


class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, causal=True)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2 style: token + position embeddings, pre-LN blocks, final LN, LM head."""

    def __init__(self, vocab=50257, d=512, layers=6, heads=8, max_seq=1024):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_seq, d)
        self.blocks = nn.ModuleList(GPTBlock(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets=None):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class BertLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        self.attn = Attention(d, heads, causal=False)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))                        # post-LN, as BERT
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class Bert(nn.Module):
    """BERT-base sized encoder with an MLM head (transform + decoder to the vocabulary)."""

    def __init__(self, vocab=30522, d=768, layers=12, heads=12, ffn=3072, max_seq=512):
        super().__init__()
        self.tok, self.pos, self.typ = nn.Embedding(vocab, d), nn.Embedding(max_seq, d), nn.Embedding(2, d)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(BertLayer(d, heads, ffn) for _ in range(layers))
        self.transform, self.ln_head = nn.Linear(d, d), nn.LayerNorm(d)
        self.decoder = nn.Linear(d, vocab)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.ln(self.tok(idx) + self.pos(pos) + self.typ(torch.zeros_like(idx)))
        for layer in self.layers:
            x = layer(x)
        logits = self.decoder(self.ln_head(F.gelu(self.transform(x))))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        chans, blocks, cin = [64, 128, 256, 512], [], 64
        for i, c in enumerate(chans):
            blocks += [BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)]
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class Classifier(nn.Module):
    """A vision model with a cross-entropy loss when targets are given."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x, targets=None):
        logits = self.net(x)
        return logits if targets is None else F.cross_entropy(logits, targets)


def make(name: str, device: torch.device, quick: bool):
    """(model, inputs, targets, description) for a model name."""
    g = torch.Generator().manual_seed(0)
    if name.startswith("gpt2"):
        seq = int(name.split("-")[1])
        batch, kw = 8, {}
        if quick:
            batch, seq, kw = 2, min(seq, 32), dict(vocab=512, d=64, layers=2, heads=4, max_seq=64)
        model = GPT(**kw)
        vocab = model.head.out_features
        idx = torch.randint(0, vocab, (batch, seq), generator=g)
        tgt = torch.randint(0, vocab, (batch, seq), generator=g)
        desc = f"GPT-2 style, {len(model.blocks)} layers, d={model.ln.normalized_shape[0]}, batch {batch}, seq {seq}"
    elif name == "bert":
        batch, seq, kw = 8, 128, {}
        if quick:
            batch, seq, kw = 2, 16, dict(vocab=512, d=64, layers=2, heads=4, ffn=128, max_seq=64)
        model = Bert(**kw)
        vocab = model.decoder.out_features
        idx = torch.randint(0, vocab, (batch, seq), generator=g)
        tgt = torch.randint(0, vocab, (batch, seq), generator=g)
        desc = f"BERT-base sized, {len(model.layers)} layers, d={model.ln.normalized_shape[0]}, batch {batch}, seq {seq}"
    elif name == "resnet":
        batch, size = (4, 64) if quick else (32, 224)
        try:
            import timm

            net, which = timm.create_model("resnet50", num_classes=1000), "timm resnet50"
        except ImportError:
            net, which = ResNet18(), "ResNet-18 style"
        model = Classifier(net)
        idx = torch.randn(batch, 3, size, size, generator=g)
        tgt = torch.randint(0, 1000, (batch,), generator=g)
        desc = f"{which}, batch {batch}, {size}x{size}"
    else:
        raise SystemExit(f"unknown model {name!r}")
    return model.to(device), idx.to(device), tgt.to(device), desc


# ------------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------------

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_times_ms(fn, device, iters: int, warmup: int = 3) -> list[float]:
    """Wall times of ``iters`` calls of ``fn`` after ``warmup`` (CUDA events on GPU)."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


@contextlib.contextmanager
def fresh_caches():
    """Empty Inductor, Triton and kiln caches (new directories), so a compile is cold."""
    from torch._inductor.utils import fresh_cache

    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as d, fresh_cache(dir=d), \
            kiln.config.patch(cache_dir=os.path.join(d, "kiln")):
        yield


def reset_compilers():
    kiln.reset()
    torch._dynamo.reset()


COMPILERS = {
    "eager": lambda m: m,
    "torch.compile": lambda m: torch.compile(m),
    "kiln inductor": lambda m: kiln.compile(m, backend="inductor"),
}


def _requested(device, which: str) -> int | None:
    """Bytes the live tensors asked for (``current``) or their peak since the last reset."""
    if device.type != "cuda":
        return None
    return torch.cuda.memory_stats(device).get(f"requested_bytes.all.{which}")


def step_functions(compiled, opt, idx, tgt):
    """(inference step, training step) of a compiled model: ``compiled(idx)`` under no_grad, and
    ``compiled(idx, tgt)`` -> loss, backward, optimizer step (also used by benchmarks/cudagraphs.py)."""
    def inference():
        with torch.no_grad():
            return compiled(idx)

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss = compiled(idx, tgt)
        loss.backward()
        opt.step()
        return loss
    return inference, train_step


def cold_compile(compiled, model: nn.Module, idx, tgt, device) -> tuple[float, float, torch.Tensor, torch.Tensor]:
    """(inference s, training s, logits, loss) of a compiled model's first calls: an inference
    call in eval mode, then a training forward and backward (the caller empties the caches)."""
    model.eval()
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        first = compiled(idx)
    sync(device)
    inference_s = time.perf_counter() - t0
    model.train()
    t0 = time.perf_counter()
    loss = compiled(idx, tgt)
    loss.backward()
    sync(device)
    return inference_s, time.perf_counter() - t0, first, loss


def more_cold_compiles(base: nn.Module, idx, tgt, device, repeats: int) -> dict:
    """``repeats`` more cold compiles per compiler column, the columns taking turns (and turns
    at going first; ``measure`` then compiles torch.compile before kiln): a single
    compile of 10-60 s moves by 10-30% with the load of a shared machine, and the reported cold
    compile is the median of these and the one ``measure`` times."""
    samples: dict = {c: {"compile_inference_s": [], "compile_training_s": []} for c in COMPILERS if c != "eager"}
    for r in range(repeats):
        # (each goes first in turn: the first after another's compile may meet its leftovers)
        for column in (list(samples) if r % 2 else list(samples)[::-1]):
            free_memory(device)
            model = copy.deepcopy(base)
            compiled = COMPILERS[column](model)
            reset_compilers()
            with fresh_caches():
                inf, train, first, loss = cold_compile(compiled, model, idx, tgt, device)
            samples[column]["compile_inference_s"].append(inf)
            samples[column]["compile_training_s"].append(train)
            del model, compiled, first, loss
            reset_compilers()
    free_memory(device)
    return samples


def measure(name: str, column: str, base: nn.Module, idx, tgt, device) -> tuple[dict, dict]:
    """Cold compile times, the first results and the peak memory of a training step, for one
    column; and its step functions (timed later, interleaved with the other columns')."""
    free_memory(device)
    # what is allocated now belongs to other columns (kept alive for the interleaved timing):
    # this column's peak is counted from here, its own parameters and optimizer state included
    baseline = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    requested_baseline = _requested(device, "current")
    model = copy.deepcopy(base)
    compiled = COMPILERS[column](model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    reset_compilers()
    res: dict = {}

    inference, train_step = step_functions(compiled, opt, idx, tgt)

    with fresh_caches():
        res["compile_inference_s"], res["compile_training_s"], first, loss = cold_compile(
            compiled, model, idx, tgt, device)
        opt.zero_grad(set_to_none=True)
        res["first_loss"] = loss.item()
        res["first_logits"] = first.float().cpu()    # (not on the device: later columns' peaks)
        del first, loss
        for _ in range(3):          # the optimizer's state exists from the first step on
            train_step()
        if device.type == "cuda":
            sync(device)
            opt.zero_grad(set_to_none=True)
            torch.cuda.reset_peak_memory_stats(device)
            train_step()
            sync(device)
            res["peak_training_mib"] = (torch.cuda.max_memory_allocated(device) - baseline) / 2**20
            if requested_baseline is not None:
                res["peak_requested_training_mib"] = (_requested(device, "peak") - requested_baseline) / 2**20
    if column == "kiln inductor":
        res["kiln_fallbacks"] = sum(len(getattr(e.compiled_graph, "kiln_inductor_fallbacks", []) or [])
                                    for e in compiled.entries)
        res["kiln_graphs"] = sum(1 for e in compiled.entries if e.compiled_graph is not None)

    def timed_inference():
        model.eval()
        return inference()

    def timed_training():
        model.train()
        return train_step()
    return res, {"inference_ms": timed_inference, "training_ms": timed_training}


def interleaved_medians(steps: dict, device, iters: int, rounds: int) -> dict:
    """Median step time per column and step kind, from ``rounds`` rounds per kind that time
    every column in turn (``iters`` steps per column split evenly over the rounds): a drift of
    the machine (clocks, a neighbour's load) touches every column alike."""
    per_round = max(1, iters // rounds)
    warmup = 2 if per_round > 1 else 1
    times = {(c, k): [] for c in steps for k in steps[c]}
    kinds = list(next(iter(steps.values())))
    # one kind at a time (a program that trains does not switch to inference every few steps)
    for kind in kinds:
        for _ in range(rounds):
            for column, fns in steps.items():
                times[column, kind] += step_times_ms(fns[kind], device, per_round, warmup=warmup)
    return {key: statistics.median(v) for key, v in times.items()}


def free_memory(device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def fmt(v, unit):
    if v is None:
        return "-"
    return f"{v:.2f} {unit}" if unit != "s" else f"{v:.1f} s"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None)
    p.add_argument("--models", default="gpt2-16,gpt2-512,bert,resnet")
    p.add_argument("--iters", type=int, default=40, help="timed steps per column and step kind")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds over the columns the steps are split into (default: one step per column per "
                        "round, the fairest on a machine whose load drifts)")
    p.add_argument("--quick", action="store_true", help="tiny models (a smoke run on CPU)")
    p.add_argument("--compile-repeats", type=int, default=None,
                   help="cold compiles per compiler column, the median reported (default: 3 on CUDA, 1 on CPU)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False      # the same math in all three columns
    # Pay the libraries' import and set-up before any cold compile is timed.
    warm = nn.Linear(4, 4).to(device)
    with fresh_caches():
        for column in COMPILERS:
            COMPILERS[column](copy.deepcopy(warm))(torch.randn(2, 4, device=device)).sum().backward()
    reset_compilers()

    report = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "iters": args.iters, "models": []}
    for name in args.models.split(","):
        torch.manual_seed(0)
        base, idx, tgt, desc = make(name, device, args.quick)
        print(f"\n== {name}: {desc}", flush=True)
        repeats = args.compile_repeats or (3 if device.type == "cuda" and not args.quick else 1)
        extra = more_cold_compiles(base, idx, tgt, device, repeats - 1) if repeats > 1 else {}
        cols, steps = {}, {}
        for column in COMPILERS:
            cols[column], steps[column] = measure(name, column, base, idx, tgt, device)
            for key, more in extra.get(column, {}).items():
                cols[column][key + "_samples"] = all_ = [*more, cols[column][key]]
                cols[column][key] = statistics.median(all_)
            print(f"   {column}: compiled", flush=True)
        for (column, kind), ms in interleaved_medians(steps, device, args.iters, args.rounds or args.iters).items():
            cols[column][kind] = ms
        del steps
        reset_compilers()
        free_memory(device)
        ref = cols["eager"]
        for column in ("torch.compile", "kiln inductor"):
            c = cols[column]
            c["loss_diff_vs_eager"] = abs(c["first_loss"] - ref["first_loss"])
            c["logits_max_diff_vs_eager"] = (c.pop("first_logits") - ref["first_logits"]).abs().max().item()
        ref.pop("first_logits")
        rows = [("inference step", "inference_ms", "ms"), ("training step", "training_ms", "ms"),
                (f"cold compile, inference{' *' if repeats > 1 else ''}", "compile_inference_s", "s"),
                (f"cold compile, training{' *' if repeats > 1 else ''}", "compile_training_s", "s"),
                ("peak memory, training", "peak_training_mib", "MiB"),
                ("peak requested, training", "peak_requested_training_mib", "MiB")]
        print(f"   {'':26}{'eager':>14}{'torch.compile':>16}{'kiln inductor':>16}{'kiln/torch.compile':>20}")
        for label, key, unit in rows:
            vals = [cols[c].get(key) for c in COMPILERS]
            k, t = vals[2], vals[1]
            ratio = f"{k / t:.2f}x" if k is not None and t else "-"
            print(f"   {label:26}" + "".join(f"{fmt(v, unit):>{w}}" for v, w in zip(vals, (14, 16, 16)))
                  + f"{ratio:>20}")
        if repeats > 1:
            print(f"   * median of {repeats} cold compiles per compiler, the compilers taking turns")
        k = cols["kiln inductor"]
        print(f"   loss vs eager: torch.compile {cols['torch.compile']['loss_diff_vs_eager']:.2e}, "
              f"kiln {k['loss_diff_vs_eager']:.2e}; kiln graphs {k['kiln_graphs']}, Inductor fallbacks "
              f"{k['kiln_fallbacks']}", flush=True)
        report["models"].append({"name": name, "description": desc, "results": cols})
        if args.json:                  # written after every model: a partial run keeps its rows
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))
        del base, idx, tgt
    return 0


if __name__ == "__main__":
    sys.exit(main())
