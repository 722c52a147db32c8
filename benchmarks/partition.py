"""Memory and time of a transformer block's training step (a stack of ``--layers`` blocks): kiln's
``aot_eager`` (no decompositions, min-cut partitioner, as torch's) beside eager and
torch.compile(backend="aot_eager"), and kiln's AOT autograd with torch's core ATen
decompositions under the min-cut and the default partitioner (what they cost run as FX).

    python benchmarks/partition.py [--device cpu|cuda] [--json PATH] [--batch 8 --seq 256 ...]

For each variant, one training step (forward + backward, after warm-up/compilation) is measured:

* saved bytes: what autograd keeps for the backward, measured the same way for every variant with
  ``torch.autograd.graph.saved_tensors_hooks`` (one count per storage), split into activations
  and inputs (parameters and the batch, which are alive anyway);
* peak: the highest memory allocated during the step above what was allocated before it. CUDA:
  ``torch.cuda.max_memory_allocated``. CPU: the CPU allocator's allocation/free events recorded by
  torch.profiler (``profile_memory=True``), summed in order (no tracemalloc);
* kiln's own estimate of the saved bytes (from the partitioned graphs), the step time, and the
  largest gradient difference from eager (same seed, so dropout masks agree).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kiln  # noqa: E402
from kiln.backends.aot import aot_backend, aot_eager  # noqa: E402


class Block(nn.Module):
    """A pre-LayerNorm GPT block: causal self-attention and a GELU MLP, with dropout."""

    def __init__(self, d: int, heads: int, ffn: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn)
        self.fc2 = nn.Linear(ffn, d)
        self.p = dropout

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(b, t, d)), self.p, self.training)
        h = F.gelu(self.fc1(self.ln2(x)))
        return x + F.dropout(self.fc2(h), self.p, self.training)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def saved_bytes_of_step(fn, x, inputs_ptrs):
    """(activation bytes, input bytes) that autograd saves during fn(x), one count per storage."""
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    act = sum(b for p, b in seen.items() if p not in inputs_ptrs)
    inp = sum(b for p, b in seen.items() if p in inputs_ptrs)
    return out, act, inp


class _quiet_stderr:
    """The profiler's C++ side logs start/stop lines to fd 2: silence them."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        self.null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self.null, 2)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        os.close(self.null)


def peak_of_step(step, device):
    """Peak bytes allocated during step() above the level before it."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        _sync(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    cur = peak = 0
    for _, b in events:
        cur += b
        peak = max(peak, cur)
    return peak


def run(args) -> dict:
    device = torch.device(args.device)
    torch.manual_seed(0)
    base = nn.Sequential(*[Block(args.dim, args.heads, args.ffn, args.dropout) for _ in range(args.layers)]).to(device)
    x_data = torch.randn(args.batch, args.seq, args.dim, device=device)
    g_out = torch.randn(args.batch, args.seq, args.dim, device=device)

    captured = {}

    def spy(name, backend):
        def b(gm, example_inputs):
            c = backend(gm, example_inputs)
            captured[name] = c
            return c
        return b

    import copy

    variants = {
        "eager": lambda m: m,
        "torch.compile aot_eager": lambda m: torch.compile(m, backend="aot_eager"),
        # kiln's aot_eager, as torch's: no decompositions, the min-cut partitioner
        "kiln aot_eager": lambda m: kiln.compile(m, backend=spy("aot_eager", aot_eager)),
        # with torch's core ATen decompositions (what kiln's aot_eager did before): every op is
        # decomposed into unfused ATen ops, slower and with more to save when run as FX
        "kiln aot (min-cut, core decomps)": lambda m: kiln.compile(
            m, backend=spy("min_cut_decomp", aot_backend(partition_fn="min_cut", decompositions=None))),
        "kiln aot (default partitioner, core decomps)": lambda m: kiln.compile(
            m, backend=spy("default_decomp", aot_backend(partition_fn="default", decompositions=None))),
    }
    results = []
    ref_grads = None
    for name, make in variants.items():
        model = copy.deepcopy(base)
        fn = make(model)
        params = list(model.parameters())
        input_ptrs = {p.untyped_storage().data_ptr() for p in params} | {x_data.untyped_storage().data_ptr()}

        def step(seed=0):
            for p in params:
                p.grad = None
            torch.manual_seed(seed)
            out = fn(x_data)
            out.backward(g_out)
            return out

        for _ in range(args.warmup):
            step()
        _sync(device)
        # saved bytes (one forward, hooks on)
        for p in params:
            p.grad = None
        torch.manual_seed(0)
        out, act, inp = saved_bytes_of_step(fn, x_data, input_ptrs)
        out.backward(g_out)
        del out
        for p in params:
            p.grad = None
        peak = peak_of_step(lambda: step(0), device)
        step(0)
        grads = [p.grad.detach().clone() for p in params]
        if ref_grads is None:
            ref_grads = grads
        diff = max((a - b).abs().max().item() for a, b in zip(grads, ref_grads))
        times = []
        for _ in range(args.iters):
            _sync(device)
            t0 = time.perf_counter()
            step(0)
            _sync(device)
            times.append(time.perf_counter() - t0)
        key = {"kiln aot_eager": "aot_eager", "kiln aot (min-cut, core decomps)": "min_cut_decomp",
               "kiln aot (default partitioner, core decomps)": "default_decomp"}.get(name)
        est = captured[key].saved_tensor_bytes if key in captured else None
        results.append({"variant": name, "saved_activation_bytes": act, "saved_input_bytes": inp,
                        "kiln_saved_bytes_estimate": est, "peak_bytes": peak,
                        "step_ms": statistics.median(times) * 1e3, "max_grad_diff_vs_eager": diff})
        fn = model = params = None   # free this variant's memory before the next
    return {"device": str(device), "torch": torch.__version__,
            "config": {k: getattr(args, k) for k in ("layers", "batch", "seq", "dim", "heads", "ffn", "dropout")},
            "peak_method": "torch.cuda.max_memory_allocated" if device.type == "cuda"
            else "torch.profiler CPU allocator events (profile_memory=True)",
            "results": results}


def mib(b):
    return "-" if b is None else f"{b / 2**20:8.2f}"


def table(report: dict) -> str:
    c = report["config"]
    head = (f"training step of {c['layers']} transformer blocks on {report['device']} (torch {report['torch']}): "
            f"batch {c['batch']}, "
            f"seq {c['seq']}, dim {c['dim']}, heads {c['heads']}, ffn {c['ffn']}, dropout {c['dropout']}\n"
            f"peak: {report['peak_method']}; MiB = 2**20 bytes\n")
    ref = next((r for r in report["results"] if r["variant"] == "torch.compile aot_eager"), None)

    def ratio(r, k):
        return "-" if not ref or not ref[k] or r[k] is None else f"{r[k] / ref[k]:.2f}x"
    cols = ["variant", "saved act MiB", "saved inputs MiB", "kiln est. MiB", "peak MiB", "peak / torch",
            "step ms", "step / torch", "max |dgrad|"]
    rows = [[r["variant"], mib(r["saved_activation_bytes"]), mib(r["saved_input_bytes"]),
             mib(r["kiln_saved_bytes_estimate"]), mib(r["peak_bytes"]), ratio(r, "peak_bytes"),
             f"{r['step_ms']:8.2f}", ratio(r, "step_ms"),
             f"{r['max_grad_diff_vs_eager']:.1e}"] for r in report["results"]]
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    fmt = lambda row: "| " + " | ".join(str(v).strip().rjust(w) if i else str(v).ljust(w)
                                        for i, (v, w) in enumerate(zip(row, widths))) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return head + "\n".join([fmt(cols), sep] + [fmt(r) for r in rows])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--layers", type=int, default=2, help="transformer blocks in the model (one graph)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available")
    report = run(args)
    print(table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
