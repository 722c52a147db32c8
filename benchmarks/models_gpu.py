"""The models users bring, on a GPU: eager, torch.compile and kiln.compile, with the fraction
of the hardware's limit each one reaches.

    python benchmarks/models_gpu.py [--models llama,qwen2,...] [--columns eager,torch,kiln]
        [--timing both|turns|alone] [--rounds 5]
        [--iters 20] [--warmup 5] [--timeout 570] [--json PATH] [--peak-tflops F --peak-tbps B]
    python benchmarks/models_gpu.py --merge A.json B.json ...   # one table from earlier runs
    python benchmarks/models_gpu.py --device cpu --tiny [--models ...]   # every case shrunk, to check the script

A run of every case takes longer than one 10-minute command: split it by ``--models`` (and
``--columns``), each with its own ``--json``, and print the whole table with ``--merge``, e.g.
``--models llama``, ``mistral``, ``qwen2,decode``, ``t5``, ``bert``, ``vit_s,resnet50`` (a
family, ``llama``, names both its cases). The eager cell of a case must be in one of the merged
files: the cold compile and the hardware fraction of the compiled cells are computed from it.
A file given later replaces an earlier one's cell of the same case and column.

Cases (random weights from configs, nothing downloaded; every model at its library's defaults:
KV cache on, grouped-query attention, labels, an attention mask with one padded row). Unless
said otherwise a step is a training step: the forward under bf16 autocast, the backward and a
fused AdamW step (``hf_training.training_step``); only the model is compiled.

* ``llama_cache`` / ``llama_nocache``: HF Llama, 8 layers, hidden 2048, 16 heads over 4
  key/value heads, intermediate 5632, vocabulary 32000, batch 4, sequence 1024; the model's
  default ``use_cache`` (on: the forward also builds and returns its KV cache) / ``use_cache=False``
  in the call;
* ``mistral_cache`` / ``mistral_nocache``: the same with HF Mistral and 8 key/value heads;
* ``qwen2``: inference at dynamic lengths. HF Qwen2, 6 layers, hidden 1024, 16 heads over 2
  key/value heads, intermediate 2816, vocabulary 32000, bf16 weights, ``torch.no_grad()``,
  batch 4, labels given; the lengths 128, 192, 256, 320, 384, 512 are called in turn. The step
  is the SUM over the six lengths of each length's median forward (one pass over all lengths),
  the first step the first call at the first length, and ``compile pass`` the wall time of the
  first pass over all six lengths (the note under the table gives it minus eager's: the compile
  time across all lengths);
* ``t5``: HF T5 at t5-base's shape (d_model 768, 12+12 layers, 12 heads, d_ff 3072),
  vocabulary 32128, batch 8, source 512 / target 128;
* ``vit_s``: timm ``vit_small_patch16_224``, batch 64, 224x224 images, cross-entropy on random
  labels of 1000 classes;
* ``resnet50``: timm ``resnet50``, the same batch, images and loss;
* ``bert``: HF ``BertForMaskedLM`` at ``BertConfig()``'s defaults (12 layers, hidden 768),
  batch 16, sequence 512, MLM labels (-100 except at 15% of the positions);
* ``decode``: batch-1 greedy decoding of an HF Llama (8 layers, hidden 2048, 16 heads over 4,
  intermediate 5632) in bf16 under ``torch.no_grad()``: a 128-token prompt, then 64 tokens one
  at a time, passing ``past_key_values`` and ``use_cache=True`` as users do. The cache is
  ``transformers.StaticCache`` (in every column): a cache that grows each token changes the
  shapes each call, which CUDA graphs cannot replay; a static cache is what transformers
  itself uses to compile decoding. Its tensors are allocated by one eager prefill before the
  clock (a compiler tracing the allocation would see them as ordinary inputs). The compiled
  model runs the prefill too, as in a user's own loop (transformers' ``generate`` compiles
  only the decoding steps). The step is the median time of one decoded token (the prefill
  calls are not among them); the first step is the first generation, prefill and 64 tokens.

The timm cases are reported as skipped where timm is not installed.

Columns: ``eager``; ``torch``: ``torch.compile(model)`` (default backend, Inductor);
``kiln``: ``kiln.compile(model)``. For ``decode`` both compilers use
``mode="reduce-overhead"`` (CUDA graphs). Each (case, column) cell runs in its own process with
empty kiln, Inductor and Triton caches (``cells.run_cell``); ``--timeout`` bounds each cell.

Timing (``--timing``). A host-bound step moves by 20-50% from one process to the next (which
cores it gets, their clock, what else runs), more than the compilers differ; so by default
(``both``) each case also runs one more process in which every column is compiled and the
columns are then timed in turns (``--rounds`` rounds, each column ``--iters / --rounds`` steps
in a row, after ``--warmup`` each): the step comes from the turns, the first step, cold
compile and peak from the fresh processes (a process holding every column's weights measures
no column's peak, and its later columns compile after the earlier ones warmed CUDA and the
compile workers). ``turns`` runs only the turns (steps, no first step or peak), ``alone``
only the fresh processes. ``--merge`` gives the steps of a turns-only file to the rows of the
other files.

Reported per cell:

* ``step``: the median of ``--iters`` steps after ``--warmup`` more (CUDA events; the wall
  clock on a CPU) and its ratio to torch.compile's;
* ``first step``: the wall time from wrapping the model to the end of its first step, and
  ``cold compile``: that minus eager's first step (the ratio is kiln's cold compile over
  torch.compile's);
* ``peak``: the largest ``torch.cuda.max_memory_allocated`` over the timed steps (weights,
  gradients and optimizer state included; not measured on a CPU);
* the fraction of the hardware's limit. Matmul-bound steps (training, ``qwen2``): model FLOPs
  utilisation, the FLOPs of one step counted by ``torch.utils.flop_counter.FlopCounterMode``
  in the eager cell (in one more, untimed, step; the compiled cells use eager's count, so a
  compiler that recomputes does not get credit for it) over the step time and the GPU's peak
  dense bf16 FLOP/s. The memory-bound ``decode``: achieved bandwidth, the bytes a token must at
  least read (every parameter but the input embedding table, of which a token reads one row,
  plus the KV cache up to the middle decoded position) over the token's time, as a fraction of
  the peak bandwidth. Peaks by device name: H100 SXM (HBM3) 989.4 TFLOP/s and 3.35 TB/s, H200
  989.4 TFLOP/s and 4.8 TB/s; any other device needs ``--peak-tflops`` / ``--peak-tbps``
  (the peaks used are printed);
* ``losses``: the first 6 steps' losses (``qwen2``: the loss at each length of the first pass;
  ``decode``: the negative log-likelihood of each of the first 6 greedy tokens) and their
  largest relative difference from eager's, which must stay within 1e-3; ``decode`` also
  counts the generated tokens that equal eager's;
* ``graphs``: graphs compiled (kiln: its compile cache's misses and bypasses; torch.compile:
  dynamo's ``unique_graphs``).

The summary gives, over the cases where both compilers ran, kiln's step, peak memory and cold
compile over torch.compile's (geometric mean and the largest), against the targets kiln is held to:
geomean step <= 0.9x and none above 1.0x, peak <= 1.0x and cold compile <= 1.0x on every case.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
from typing import Callable

import torch

# the benchmarks' helpers, and the kiln of this checkout (not another one installed)
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
from cells import crash_text, emit, ratio, run_cell, step_times, timed_first, write_json  # noqa: E402
from hf_training import token_batch, training_step  # noqa: E402

COLUMNS = ("eager", "torch", "kiln")
TIMM_CASES = ("vit_s", "resnet50")

_LLAMA = dict(layers=8, hidden=2048, heads=16, kv_heads=4, intermediate=5632, vocab=32000)
_LLAMA_TINY = dict(layers=2, hidden=64, heads=4, kv_heads=1, intermediate=176, vocab=512)
SIZES = {
    "llama_cache": dict(_LLAMA, batch=4, seq=1024),
    "llama_nocache": dict(_LLAMA, batch=4, seq=1024),
    "mistral_cache": dict(_LLAMA, kv_heads=8, batch=4, seq=1024),
    "mistral_nocache": dict(_LLAMA, kv_heads=8, batch=4, seq=1024),
    "qwen2": dict(layers=6, hidden=1024, heads=16, kv_heads=2, intermediate=2816, vocab=32000, batch=4,
                  lengths=[128, 192, 256, 320, 384, 512]),
    "t5": dict(layers=12, hidden=768, heads=12, intermediate=3072, vocab=32128, batch=8, seq=512, target=128),
    "vit_s": dict(batch=64, image=224, classes=1000, timm={}),
    "resnet50": dict(batch=64, image=224, classes=1000, timm={}),
    "bert": dict(batch=16, seq=512),                                    # BertConfig()'s own sizes
    "decode": dict(_LLAMA, prompt=128, new_tokens=64),
}
TINY = {
    "llama_cache": dict(_LLAMA_TINY, batch=2, seq=32),
    "llama_nocache": dict(_LLAMA_TINY, batch=2, seq=32),
    "mistral_cache": dict(_LLAMA_TINY, kv_heads=2, batch=2, seq=32),
    "mistral_nocache": dict(_LLAMA_TINY, kv_heads=2, batch=2, seq=32),
    "qwen2": dict(_LLAMA_TINY, kv_heads=2, batch=2, lengths=[8, 12, 16, 20, 24, 32]),
    "t5": dict(layers=2, hidden=64, heads=4, intermediate=256, vocab=512, batch=2, seq=32, target=16),
    "vit_s": dict(batch=2, image=32, classes=10, timm=dict(depth=2, embed_dim=64, num_heads=4)),
    "resnet50": dict(batch=2, image=32, classes=10, timm={}),
    "bert": dict(layers=2, hidden=64, heads=4, intermediate=256, vocab=512, batch=2, seq=32),
    "decode": dict(_LLAMA_TINY, prompt=16, new_tokens=8),
}
CASES = tuple(SIZES)
# dense bf16 FLOP/s (1e12) and bandwidth (TB/s) by a substring of the device's name, first match wins
PEAKS = (("H200", 989.4, 4.8), ("H100 80GB HBM3", 989.4, 3.35), ("H100 SXM", 989.4, 3.35))


def family(case: str) -> str:
    return case.split("_")[0]


# ------------------------------------------------------------------------------------------------
# Models and batches
# ------------------------------------------------------------------------------------------------

def build(case: str, size: dict):
    if case in TIMM_CASES:
        import timm

        name = {"vit_s": "vit_small_patch16_224", "resnet50": "resnet50"}[case]
        extra = dict(size["timm"], img_size=size["image"]) if case == "vit_s" else size["timm"]
        return timm.create_model(name, pretrained=False, num_classes=size["classes"], **extra)
    import transformers

    transformers.logging.set_verbosity_error()
    if case == "bert":
        shape = {} if "hidden" not in size else dict(
            hidden_size=size["hidden"], num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
            intermediate_size=size["intermediate"], vocab_size=size["vocab"])
        return transformers.BertForMaskedLM(transformers.BertConfig(**shape))
    if case == "t5":
        cfg = transformers.T5Config(d_model=size["hidden"], d_kv=size["hidden"] // size["heads"],
                                    d_ff=size["intermediate"], num_layers=size["layers"],
                                    num_decoder_layers=size["layers"], num_heads=size["heads"],
                                    vocab_size=size["vocab"], decoder_start_token_id=0)
        return transformers.T5ForConditionalGeneration(cfg)
    config_class = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
                    "decode": "LlamaConfig"}[family(case)]
    cfg = getattr(transformers, config_class)(
        hidden_size=size["hidden"], intermediate_size=size["intermediate"], num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"], vocab_size=size["vocab"],
        max_position_embeddings=4096)
    return transformers.AutoModelForCausalLM.from_config(cfg)


IMAGE_BATCHES = 8


def image_batch(size: dict, step: int, device: str) -> tuple:
    """Batch ``step`` of ``IMAGE_BATCHES`` made once, on the device: drawing 64 images on the
    CPU (10M normal samples) and copying them takes longer than a ViT-S step, and a user's
    loader prefetches; no compiler's step is timed with it."""
    return _image_batch(size["batch"], size["image"], size["classes"], step % IMAGE_BATCHES, device)


@functools.lru_cache(maxsize=IMAGE_BATCHES)
def _image_batch(batch: int, image: int, classes: int, index: int, device: str) -> tuple:
    g = torch.Generator().manual_seed(1000 + index)
    images = torch.randn(batch, 3, image, image, generator=g).to(device)
    return images, torch.randint(0, classes, (batch,), generator=g).to(device)


def mlm_batch(size: dict, vocab: int, step: int, device: str) -> dict:
    """Token ids with a padded row, and labels that are -100 except at 15% of the positions."""
    b = token_batch(size["batch"], size["seq"], step, device, vocab=vocab)
    g = torch.Generator().manual_seed(2000 + step)
    masked = (torch.rand(size["batch"], size["seq"], generator=g) < 0.15).to(device)
    b["labels"] = torch.where(masked, b["input_ids"], torch.full_like(b["input_ids"], -100))
    return b


def loss_function(case: str, size: dict, model, device: str):
    """``loss_of(fwd, i)``: the loss of batch ``i`` through ``fwd`` (the model, compiled or not)."""
    if case in TIMM_CASES:
        def loss_of(fwd, i):
            images, labels = image_batch(size, i, device)
            return torch.nn.functional.cross_entropy(fwd(images), labels)
        return loss_of
    vocab = model.config.vocab_size
    if case == "bert":
        return lambda fwd, i: fwd(**mlm_batch(size, vocab, i, device)).loss
    call = dict(use_cache=False) if case.endswith("_nocache") else {}
    return lambda fwd, i: fwd(**token_batch(size["batch"], size["seq"], i, device, vocab=min(vocab, 30000),
                                            target=size.get("target")), **call).loss


def compiler(column: str, case: str):
    mode = dict(mode="reduce-overhead") if case == "decode" else {}
    if column == "torch":
        return lambda m: torch.compile(m, **mode)
    if column == "kiln":
        import kiln

        return lambda m: kiln.compile(m, **mode)
    return lambda m: m


def count_flops(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


# ------------------------------------------------------------------------------------------------
# The cells (each in its own process)
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Prepared:
    """A column compiled and ready to time: ``step(i)`` makes call ``i`` of the measured
    sequence (``next_call`` is the next one's index), whose calls come in units of ``unit``
    (qwen2: one per length; decode: one generation) that ``step_ms`` reduces to the step."""
    step: Callable[[int], object]
    unit: int
    next_call: int
    row: dict
    step_ms: Callable[[list], float]
    extra: Callable[[], dict] = lambda: {}       # what the row gets after the timing


def prepare_training(case: str, column: str, size: dict, device: str) -> Prepared:
    torch.manual_seed(0)
    model = build(case, size).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    loss_of = loss_function(case, size, model, device)
    fwd = model
    step = training_step(lambda i: loss_of(fwd, i), opt, device)
    losses = []

    def first_step() -> None:
        nonlocal fwd
        fwd = compiler(column, case)(model)
        losses.append(step(0))

    first = timed_first(first_step, device)
    losses += [step(i) for i in range(1, 6)]
    row = {"first_step_s": first, "losses": [float(x) for x in losses]}
    return Prepared(step, 1, 6, row, statistics.median)


def prepare_dynamic(case: str, column: str, size: dict, device: str) -> Prepared:
    torch.manual_seed(0)
    model = build(case, size).to(device, dtype=torch.bfloat16).eval()
    lengths = size["lengths"]
    batches = [token_batch(size["batch"], n, 0, device, vocab=size["vocab"]) for n in lengths]
    fwd = model
    losses = []

    @torch.no_grad()
    def call(i: int):
        return fwd(**batches[i % len(lengths)]).loss

    def first_call() -> None:
        nonlocal fwd
        fwd = compiler(column, case)(model)
        losses.append(call(0))

    first_pass = [timed_first(first_call, device)]
    for i in range(1, len(lengths)):
        first_pass.append(timed_first(lambda i=i: losses.append(call(i)), device))
    row = {"first_step_s": first_pass[0], "compile_pass_s": sum(first_pass), "losses": [float(x) for x in losses]}

    def step_ms(times: list) -> float:
        # whole passes: call i is at length i % len(lengths), so each length keeps its place
        medians = [statistics.median(times[k::len(lengths)]) for k in range(len(lengths))]
        row["step_ms_by_length"] = dict(zip(map(str, lengths), medians))
        return sum(medians)

    return Prepared(call, len(lengths), len(lengths), row, step_ms)


def prepare_decode(case: str, column: str, size: dict, device: str) -> Prepared:
    import transformers

    torch.manual_seed(0)
    model = build(case, size).to(device, dtype=torch.bfloat16).eval()
    prompt = torch.randint(1, size["vocab"], (1, size["prompt"]), generator=torch.Generator().manual_seed(1)).to(device)
    new = size["new_tokens"]
    cache = transformers.StaticCache(config=model.config, max_cache_len=size["prompt"] + new)
    # transformers versions whose forward still takes the cache's positions get them, as users give them
    with_positions = "cache_position" in inspect.signature(model.forward).parameters
    fwd = model
    state: dict = {}

    def forward(ids, start: int):
        extra = dict(cache_position=torch.arange(start, start + ids.shape[1], device=device)) if with_positions else {}
        logits = fwd(input_ids=ids, past_key_values=cache, use_cache=True, **extra).logits[:, -1].float()
        token = logits.argmax(-1, keepdim=True)
        if "losses" in state:        # the first generation: what is compared with eager's
            # the negative log-likelihood of the greedy token: a loss
            state["losses"].append(float(-torch.log_softmax(logits, -1).gather(-1, token)))
            state["tokens"].append(int(token))
        return token

    @torch.no_grad()
    def step(i: int) -> None:
        """Decoded token ``i % new`` of a generation; token 0 first resets the cache and prefills."""
        t = i % new
        if t == 0:
            cache.reset()
            state["token"] = forward(prompt, 0)
        state["token"] = forward(state["token"], size["prompt"] + t)

    def first_generation() -> None:
        nonlocal fwd
        fwd = compiler(column, case)(model)
        state["tokens"], state["losses"] = [], []
        for t in range(new):
            step(t)

    # the cache allocates its tensors at its first update: done here by one eager prefill, before
    # the clock, so that no compiler traces the allocation (transformers marks the tensors as
    # static addresses only outside a compiled region)
    with torch.no_grad():
        forward(prompt, 0)
    first = timed_first(first_generation, device)
    tokens, losses = state.pop("tokens"), state.pop("losses")
    embedding = model.get_input_embeddings().weight
    if model.get_output_embeddings().weight is embedding:       # tied: the output layer reads all of it
        embedding = None
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embedding)
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    position = size["prompt"] + new // 2
    kv_bytes = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * position * 2
    row = {"first_step_s": first, "losses": losses[:6], "tokens": tokens, "bytes_per_step": param_bytes + kv_bytes}

    def per_token_ms(times: list) -> float:
        return statistics.median([ms for k, ms in enumerate(times) if k % new])     # without the prefilling calls

    return Prepared(step, new, new, row, per_token_ms)


PREPARE = {"qwen2": prepare_dynamic, "decode": prepare_decode}


def prepare(case: str, column: str, size: dict, device: str) -> Prepared:
    prepared = PREPARE.get(case, prepare_training)(case, column, size, device)
    if column == "eager" and case != "decode":
        def flops() -> dict:           # one more, untimed, unit (a step; qwen2: a pass over its lengths)
            return {"flops": count_flops(lambda: [prepared.step(prepared.next_call + i) for i in range(prepared.unit)])}
        prepared.extra = flops
    return prepared


def time_alone(prepared: Prepared, device: str, iters: int, warmup: int) -> dict:
    """The column's row: ``iters`` units timed after ``warmup`` more, with the peak over them."""
    p = prepared
    times, peak = step_times(p.step, device, iters * p.unit, warmup * p.unit, first=p.next_call)
    p.next_call += (iters + warmup) * p.unit
    step_ms = p.step_ms(times)          # (before the row is read: qwen2's adds its lengths' steps to it)
    return {**p.row, "step_ms": step_ms, "peak_mib": peak / 2**20, **p.extra()}


def time_in_turns(columns: dict, device: str, iters: int, warmup: int, rounds: int) -> dict:
    """Every column's row, the columns timed in turns: ``warmup`` units each, then ``rounds``
    rounds in which each column runs ``iters / rounds`` units (at least one) in a row. A host
    whose speed drifts (another process, the CPU's clock) slows all columns alike, so their
    ratios hold where timings from separate processes can differ by 20% or more. The peak is
    not comparable here (every column's weights and optimizer state are resident) and is left
    out; first steps are those of this process, the later columns' after the earlier ones
    warmed up CUDA, Triton and the compile workers."""
    chunk = max(1, iters // rounds)
    times = {name: [] for name in columns}
    for name, p in columns.items():
        step_times(p.step, device, 0, warmup * p.unit, first=p.next_call)
        p.next_call += warmup * p.unit
    for _ in range(rounds):
        for name, p in columns.items():
            got, _ = step_times(p.step, device, chunk * p.unit, 0, first=p.next_call)
            p.next_call += chunk * p.unit
            times[name] += got
    steps = {name: p.step_ms(times[name]) for name, p in columns.items()}
    return {name: {**p.row, "step_ms": steps[name], "peak_mib": 0.0, "timing": "turns", "rounds": rounds,
                   **p.extra()}
            for name, p in columns.items()}


def compile_stats(case: str, column: str) -> dict:
    """What a compiled column's row says about its compiler: graphs, and CUDA graph replays."""
    import kiln

    row = {}
    if column == "kiln":
        stats = kiln.cache.stats()
        row["graphs"] = stats["misses"] + stats["bypasses"]
        if case == "decode":
            from kiln.cudagraphs import skip_reasons, stats as graph_calls

            row["cudagraphs"] = {"calls": dict(graph_calls), "skipped": dict(skip_reasons)}
    elif column == "torch":
        counters = torch._dynamo.utils.counters
        row["graphs"] = counters["stats"]["unique_graphs"]
        if case == "decode":
            row["cudagraphs"] = {"graphs skipped": counters["inductor"]["cudagraph_skips"]}
    return row


def run_one(cell: dict, device: str, tiny: bool, iters: int, warmup: int) -> dict:
    """A fresh process's cell: one column alone, or (``turns``) every column timed in turns."""
    import torch._dynamo  # noqa: F401  (imported before the clock by every column alike)

    import kiln  # noqa: F401  (likewise)

    case = cell["case"]
    if device == "cpu":
        torch.set_num_threads(1)     # a shared CPU: one thread is steadier, and the CPU run only checks the script
    size = (TINY if tiny else SIZES)[case]
    where = {"device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__}
    if "turns" in cell:
        columns = {column: prepare(case, column, size, device) for column in cell["turns"]}
        rows = time_in_turns(columns, device, iters, warmup, cell["rounds"])
        # the graph counts of a process that compiled with both compilers are still each one's own
        return {"rows": {column: {**row, "first_step_s": None, "compile_pass_s": None,
                                  **compile_stats(case, column), **where} for column, row in rows.items()}}
    column = cell["column"]
    row = time_alone(prepare(case, column, size, device), device, iters, warmup)
    return {**row, **compile_stats(case, column), **where}


def turns_only(row: dict) -> bool:
    """A row timed in turns and nowhere else (no first step of its own)."""
    return row.get("timing") == "turns" and row.get("first_step_s") is None


def with_turns(rows: list, turns: list) -> list:
    """``rows`` (cells each timed alone) with the steps of ``turns`` (the same columns timed in
    turns in one process) in their place: the step comes from the turns, the first step, cold
    compile and peak from the fresh processes (``step_ms_alone`` keeps the other step). A
    column only in ``turns`` keeps its turns row; a crashed turns cell changes nothing."""
    by = {(r["case"], r["column"]): dict(r) for r in rows}
    for t in turns:
        if not good(t):
            continue
        key = (t["case"], t["column"])
        r = by.get(key)
        if r is None or not good(r):
            by[key] = t
            continue
        r["step_ms_alone"] = r["step_ms"]
        r.update({k: t[k] for k in ("step_ms", "step_ms_by_length", "timing", "rounds") if k in t})
    return list(by.values())


# ------------------------------------------------------------------------------------------------
# The table
# ------------------------------------------------------------------------------------------------

def peaks_for(device_name: str, args) -> tuple:
    """(TFLOP/s, TB/s, where from) of a device: the flags win, then the known names."""
    flags = "--peak-tflops/--peak-tbps" if args.peak_tflops or args.peak_tbps else ""
    for key, tflops, tbps in PEAKS:
        if key in device_name:
            return args.peak_tflops or tflops, args.peak_tbps or tbps, ", ".join(filter(None, [flags, key]))
    return args.peak_tflops, args.peak_tbps, flags or "unknown device: give --peak-tflops/--peak-tbps"


def good(row) -> bool:
    return bool(row) and "crash" not in row and "skipped" not in row


def max_rel_diff(losses: list, base: list) -> float:
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, base))


def hardware_fraction(case: str, row: dict, eager: dict, args) -> str:
    tflops, tbps, _ = peaks_for(row["device_name"], args)
    seconds = row["step_ms"] / 1e3
    if case == "decode":
        return f"BW {row['bytes_per_step'] / seconds / (tbps * 1e12):.1%}" if tbps else ""
    flops = row.get("flops") or (eager or {}).get("flops")
    return f"MFU {flops / seconds / (tflops * 1e12):.1%}" if flops and tflops else ""


def first_minus_eager(row, eager, key: str):
    """``row[key] - eager[key]`` (the cold compile), or None where either was not measured (a
    row timed only in turns has no first step of its own)."""
    if not (good(row) and good(eager)) or row.get(key) is None or eager.get(key) is None:
        return None
    return row[key] - eager[key]


def geomean(values: list) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def print_table(rows: list, meta: list, args) -> None:
    by = {(r["case"], r["column"]): r for r in rows}
    devices = sorted({r["device_name"] for r in rows if good(r)})
    print(f"\ndevices: {', '.join(devices) or 'none'}")
    for m in meta:
        print(f"run: {m.get('device')}, torch {m.get('torch')}, transformers {m.get('transformers')}, "
              f"timm {m.get('timm')}, kiln commit {m.get('commit')}, {'tiny sizes, ' if m.get('tiny') else ''}"
              f"iters {m.get('iters')}, warmup {m.get('warmup')}")
    for name in devices:
        tflops, tbps, source = peaks_for(name, args)
        print(f"peaks used for {name}: {tflops or '?'} TFLOP/s dense bf16, {tbps or '?'} TB/s ({source})")
    print("\n| case | column | step (ms) | vs torch | first step (s) | cold compile (s) | vs torch | peak (MiB) "
          "| vs torch | hardware | losses, max rel diff from eager | graphs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    for case in CASES:
        e, t = by.get((case, "eager")), by.get((case, "torch"))
        e, t = (e if good(e) else None), (t if good(t) else None)
        for column in COLUMNS:
            r = by.get((case, column))
            if r is None:
                continue
            if "skipped" in r or "crash" in r:
                text = f"skipped: {r['skipped']}" if "skipped" in r else crash_text(r)
                print(f"| {case} | {column} | {text} | | | | | | | | | |")
                continue
            cold = first_minus_eager(r, e, "first_step_s") if column != "eager" else None
            t_cold = first_minus_eager(t, e, "first_step_s")
            diff = f"{max_rel_diff(r['losses'], e['losses']):.1e}" if e and column != "eager" else ""
            peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] else "-"
            first = "-" if r["first_step_s"] is None else f"{r['first_step_s']:.1f}"
            print(f"| {case} | {column} | {r['step_ms']:.2f} | {ratio(r['step_ms'], t and t['step_ms'])} "
                  f"| {first} "
                  f"| {'' if cold is None else f'{cold:.1f}'} "
                  f"| {ratio(cold, t_cold) if column != 'torch' else ''} | {peak} "
                  f"| {ratio(r['peak_mib'], t and t['peak_mib'])} | {hardware_fraction(case, r, e, args)} "
                  f"| {diff} | {r.get('graphs', '')} |")
            if case == "qwen2" and column != "eager" and first_minus_eager(r, e, "compile_pass_s") is not None:
                compile_s = first_minus_eager(r, e, "compile_pass_s")
                t_compile_s = first_minus_eager(t, e, "compile_pass_s")
                notes.append(f"qwen2 / {column}: compile time across all {len(SIZES['qwen2']['lengths'])} lengths "
                             f"{compile_s:.1f} s{f' ({ratio(compile_s, t_compile_s)} torch)' if column == 'kiln' and t_compile_s else ''}"
                             f" (first pass {r['compile_pass_s']:.1f} s, eager's {e['compile_pass_s']:.1f} s)")
            if case == "decode" and e and column != "eager":
                same = sum(a == b for a, b in zip(r["tokens"], e["tokens"]))
                notes.append(f"decode / {column}: {same} of {len(e['tokens'])} generated tokens equal eager's; "
                             f"CUDA graphs: {r.get('cudagraphs')}")
    turns = {r["case"]: r.get("rounds") for r in rows if good(r) and r.get("timing") == "turns"}
    if turns:
        print(f"\nsteps of {', '.join(c for c in CASES if c in turns)}: the case's columns timed in turns in "
              f"one process ({max(turns.values())} rounds); first steps, cold compiles and peaks from a fresh "
              "process per column.")
    print("\nstep: qwen2's is the sum over its lengths of each length's median; decode's is per token. "
          "cold compile: first step minus eager's. hardware: MFU = eager's FLOP count / step / peak "
          "FLOP/s; BW = bytes a token must read / step / peak bandwidth.")
    for n in notes:
        print(f"- {n}")
    print_summary(by)


def print_summary(by: dict) -> None:
    steps, peaks, colds, diffs = {}, {}, {}, {}
    for case in CASES:
        k, t, e = by.get((case, "kiln")), by.get((case, "torch")), by.get((case, "eager"))
        if not (good(k) and good(t)):
            continue
        steps[case] = k["step_ms"] / t["step_ms"]
        if k["peak_mib"] and t["peak_mib"]:
            peaks[case] = k["peak_mib"] / t["peak_mib"]
        key = "compile_pass_s" if "compile_pass_s" in k else "first_step_s"   # qwen2: all its lengths
        k_cold, t_cold = first_minus_eager(k, e, key), first_minus_eager(t, e, key)
        if k_cold is not None and t_cold and t_cold > 0:
            colds[case] = k_cold / t_cold
        if good(e):
            diffs[case] = max_rel_diff(k["losses"], e["losses"])
    print("\nsummary, kiln / torch.compile (targets: geomean step <= 0.9x, none above 1.0x; peak <= 1.0x and "
          "cold compile <= 1.0x on every case, qwen2's over all its lengths; losses within 1e-3 of eager's):")
    if not steps:
        print("- no case with both compilers")
        return
    for label, values, target in (("step", steps, 1.0), ("peak memory", peaks, 1.0), ("cold compile", colds, 1.0)):
        if not values:
            print(f"- {label}: not measured")
            continue
        worst = max(values, key=values.get)
        over = [c for c, v in values.items() if v > target]
        print(f"- {label}: geomean {geomean(list(values.values())):.3f}x over {len(values)} cases, max "
              f"{values[worst]:.3f}x ({worst}); above {target:.1f}x: {', '.join(over) or 'none'}")
    if diffs:
        worst = max(diffs, key=diffs.get)
        over = [c for c, v in diffs.items() if v > 1e-3]
        print(f"- kiln's losses: max relative difference from eager {diffs[worst]:.1e} ({worst}); "
              f"above 1e-3: {', '.join(over) or 'none'}")


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------

def select_cases(spec: str) -> list:
    """Case names or families (``llama`` is both llama cases), in the table's order."""
    wanted = [w for w in spec.split(",") if w]
    unknown = [w for w in wanted if w not in CASES and w not in {family(c) for c in CASES}]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; known: {', '.join(CASES)} (or a family: llama, mistral)")
    return [c for c in CASES if c in wanted or family(c) in wanted]


def run_meta(args) -> dict:
    def version(module: str):
        if importlib.util.find_spec(module) is None:
            return None
        return __import__(module).__version__

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {"device": args.device,      # (its name comes from the cells: the parent does not start CUDA)
            "torch": torch.__version__, "transformers": version("transformers"), "timm": version("timm"),
            "commit": commit, "tiny": args.tiny, "iters": args.iters, "warmup": args.warmup}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(CASES), help="cases or families, comma-separated")
    p.add_argument("--columns", default=",".join(COLUMNS))
    p.add_argument("--iters", type=int, default=20, help="timed steps (qwen2: passes over its lengths; "
                                                         "decode: generations)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them (same units)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="every case shrunk, to check the script on a CPU")
    p.add_argument("--timeout", type=int, default=570, help="seconds per cell (default: under 10 minutes)")
    p.add_argument("--json", default=None, help="write the rows here (after every cell)")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="print one table from earlier --json files")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak, TFLOP/s")
    p.add_argument("--peak-tbps", type=float, default=None, help="the device's memory bandwidth, TB/s")
    p.add_argument("--timing", choices=("alone", "turns", "both"), default="both",
                   help="alone: each column in a fresh process; turns: a case's columns timed in turns in "
                        "one process (steps only); both (default): the steps from the turns, first steps, "
                        "cold compiles and peaks from the fresh processes")
    p.add_argument("--rounds", type=int, default=5, help="rounds of turns (--timing turns/both)")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cell:
        emit(run_one(json.loads(args.cell), args.device, args.tiny, args.iters, args.warmup))
        return 0
    if args.merge:
        rows, turns, meta = {}, [], []
        for path in args.merge:
            with open(path) as fh:
                got = json.load(fh)
            meta.append(got["meta"])
            # a later file wins; rows timed only in turns give their steps to the fresh rows
            rows.update({(r["case"], r["column"]): r for r in got["rows"] if not turns_only(r)})
            turns += [r for r in got["rows"] if turns_only(r)]
        print_table(with_turns(list(rows.values()), turns), meta, args)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available (use --device cpu --tiny to check the script)")
    cases = select_cases(args.models)
    columns = args.columns.split(",")
    unknown = set(columns) - set(COLUMNS)
    if unknown:
        p.error(f"unknown columns {sorted(unknown)}; known: {', '.join(COLUMNS)}")
    meta = run_meta(args)
    child_args = ["--device", args.device, "--iters", str(args.iters), "--warmup", str(args.warmup),
                  *(["--tiny"] if args.tiny else [])]
    meta["timing"], meta["rounds"] = args.timing, args.rounds
    rows, turns = [], []
    ordered = [c for c in COLUMNS if c in columns]
    for case in cases:
        skipped = case in TIMM_CASES and meta["timm"] is None
        if args.timing in ("alone", "both"):
            for column in ordered:
                cell = {"case": case, "column": column}
                r = {**cell, "skipped": "timm is not installed"} if skipped else run_cell(
                    __file__, cell, child_args, timeout=args.timeout)
                rows.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "tokens"}), flush=True)
                write_json(args.json, {"meta": meta, "rows": rows + turns})
        if args.timing in ("turns", "both") and not skipped and len(ordered) > 1:
            got = run_cell(__file__, {"case": case, "turns": ordered, "rounds": args.rounds}, child_args,
                           timeout=args.timeout)
            new = ([{"case": case, "column": c, **r} for c, r in got["rows"].items()] if "rows" in got
                   else [{"case": case, "column": c, "crash": got["crash"], "timing": "turns"} for c in ordered])
            turns += new
            for r in new:
                print(json.dumps({k: v for k, v in r.items() if k != "tokens"}), flush=True)
            write_json(args.json, {"meta": meta, "rows": rows + turns})
    print_table(with_turns(rows, turns), [meta], args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
