"""Dynamic shapes: graphs compiled, compile time and call time of kiln beside torch.compile when
a model is called with many sequence lengths, both with their default policy (``dynamic=None``:
static first, then one recompile with the changed dims symbolic).

For each model, backend ("eager", "aot_eager") and compiler (kiln, torch.compile), in one run,
``--repeats`` times (default 3, each a fresh compile; times are the medians):

* first pass: one call per length, over ``--lengths`` distinct lengths drawn from 16..200 in a
  fixed seeded order. Each call is timed alone (CUDA: synchronized before and after) and
  its output compared with eager (``torch.testing.assert_close``; a mismatch aborts the run);
* second pass: the same lengths again, outputs checked again; a graph compiled now is noted;
* steady state: the median time of ``--steady-calls`` calls at one length already seen (the
  median length), after warm-up, alternating with eager calls. On CUDA each call is timed with
  CUDA events.

Both compilers first compile a small function once per backend (one-time import costs are not
charged to the first case). On CPU torch runs one intra-op thread (``--threads``): compile and
call overhead is what is measured, and two threads on a shared two-core machine stall on
other load (a 2-thread run measured 10x swings in the same case).

Reported per (model, backend, compiler):

* graphs: graphs handed to the backend. kiln: a wrapper backend that counts its calls and
  delegates to kiln's own backend of that name (continuations of graph breaks included).
  torch.compile: the backend is passed by name and graphs are counted as the increase of
  ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (bumped once per graph dynamo hands
  to a backend, in torch 2.11 and 2.13 alike); for "eager" a counting wrapper backend
  (``gm.forward``, what torch's "eager" does) is used as well and must agree.
* compile s: the summed wall time of the first-pass calls during which the graph count rose
  (the capture, backend compile and the run of that call). Work that a backend defers to a
  later call (e.g. a per-shape fallback inside an AOT backend) is not in it, but is in:
* first calls s: the summed wall time of all first-pass calls. (kiln's AOT backend traces a
  graph again per shape when it cannot use the symbolic trace; such traces are listed in the
  notes under the table.)
* steady ms: the steady-state time per call (eager's at the same length is shown beside it).

kiln's on-disk dynamic-shape profiles (``KILN_CACHE_DIR``) would make a second case, or a
second run, dynamic from the first call: each kiln case gets a fresh temporary cache directory
(removed at the end), and ``kiln.reset()`` / ``torch._dynamo.reset()`` run between cases.
torch.compile's own on-disk profile ("local PGO") is only used under a job id, which this
script does not set. Models run in inference (``torch.no_grad()``) unless ``--grad``.

Models: ``block``, a GPT-2 style transformer block in plain torch (dim 128, 4 heads, causal
mask built from ``x.size(1)``, ``view(B, T, H, D)`` reshapes), input (4, T, 128); ``gpt2``,
``transformers.GPT2Model`` with a tiny random config (2 layers, dim 64, 4 heads, vocab 100),
input_ids (2, T) (skipped when transformers is missing); ``fn``, ``f(x, n)`` with an int ``n``
that equals the length.

    python benchmarks/dynamic.py [--device cuda] [--lengths 20] [--models block,gpt2,fn]
                                 [--backends eager,aot_eager] [--quick] [--json out.json]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings

import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.backends.registry import lookup_backend as kiln_lookup_backend

MIN_LEN, MAX_LEN = 16, 200
MODELS = ("block", "gpt2", "fn")
BACKENDS = ("eager", "aot_eager")
COMPILERS = ("kiln", "torch.compile")


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------

class Block(nn.Module):
    """A GPT-2 style pre-norm transformer block, in plain torch."""

    def __init__(self, dim: int = 128, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.size(0), x.size(1), x.size(2)
        H = self.heads
        D = C // H
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        mask = torch.tril(torch.ones(x.size(1), x.size(1), device=x.device, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def f(x, n):
    """An int argument that changes with the size: ``n == x.size(1)``. (No ``x[:, n - 1]``:
    an int index specializes ``n`` in torch.compile and in kiln, one graph per length.)"""
    y = x.view(x.size(0) * n, -1).relu()
    return y.sum(0) / n + torch.arange(n, device=x.device, dtype=x.dtype).mean() * x[:, : n // 2].sum(1)


class Model:
    """What a case needs of a model: the callable and its inputs for a length."""

    def __init__(self, name, target, make_inputs):
        self.name, self.target, self.make_inputs = name, target, make_inputs


def make_model(name: str, device: str) -> Model | None:
    torch.manual_seed(0)
    if name == "block":
        block = Block().to(device).eval()
        return Model(name, block, lambda T, g: ((torch.randn(4, T, 128, generator=g).to(device),), {}))
    if name == "fn":
        return Model(name, f, lambda T, g: ((torch.randn(4, T, 8, generator=g).to(device), T), {}))
    if name == "gpt2":
        try:
            import transformers
            from transformers import GPT2Config, GPT2Model
        except ImportError:
            print("skipping gpt2: `import transformers` failed (pip install transformers)", file=sys.stderr)
            return None
        transformers.logging.set_verbosity_error()
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=256,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                         bos_token_id=0, eos_token_id=0)
        model = GPT2Model(cfg).to(device).eval()
        return Model(name, model, lambda T, g: ((torch.randint(0, 100, (2, T), generator=g).to(device),), {}))
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


# ------------------------------------------------------------------------------------------------
# Counting, timing, comparing
# ------------------------------------------------------------------------------------------------

class Counting:
    """A backend that counts the graphs it is given and delegates to ``inner``."""

    def __init__(self, inner):
        self.inner = inner
        self.count = 0
        self.compiled = []

    def __call__(self, gm, example_inputs):
        self.count += 1
        out = self.inner(gm, example_inputs)
        self.compiled.append(out)
        return out

    @property
    def __name__(self):
        return f"counting_{getattr(self.inner, '__name__', 'backend')}"


def _torch_eager(gm, example_inputs):
    return gm.forward      # what torch's registered "eager" backend returns


def _unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _tensors(obj) -> list:
    """The tensors of an output, in order (tensors, tuples/lists, dicts and ModelOutputs)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


class Mismatch(Exception):
    pass


def check(actual, expected, where: str) -> None:
    a, e = _tensors(actual), _tensors(expected)
    if len(a) != len(e):
        raise Mismatch(f"{where}: {len(a)} output tensors, eager gives {len(e)}")
    for i, (x, y) in enumerate(zip(a, e)):
        try:
            torch.testing.assert_close(x, y)
        except AssertionError as err:
            raise Mismatch(f"{where}: output {i} differs from eager:\n{err}") from None


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_call(fn, args, kwargs, device: str):
    _sync(device)
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    _sync(device)
    return out, time.perf_counter() - t


def _one_call_ms(fn, args, kwargs, device: str) -> float:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args, **kwargs)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t = time.perf_counter()
    fn(*args, **kwargs)
    return (time.perf_counter() - t) * 1e3


def steady_ms(fns: dict, args, kwargs, device: str, calls: int, warmup: int = 3) -> dict:
    """Median milliseconds of one call of each of ``fns``, after warm-up; the calls of the
    variants alternate, so a slow phase of the machine touches all alike (CUDA: CUDA events
    per call)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn(*args, **kwargs)
    _sync(device)
    samples: dict = {k: [] for k in fns}
    for _ in range(calls):
        for k, fn in fns.items():
            samples[k].append(_one_call_ms(fn, args, kwargs, device))
    return {k: statistics.median(v) for k, v in samples.items()}


def short(text: str, width: int = 90) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3] + "..."


# ------------------------------------------------------------------------------------------------
# One case
# ------------------------------------------------------------------------------------------------

def reset_all() -> None:
    torch._dynamo.reset()
    kiln.reset()


def build(compiler: str, backend: str, target):
    """(compiled callable, graphs-so-far function, extra info function)."""
    if compiler == "kiln":
        counter = Counting(kiln_lookup_backend(backend)[0])
        compiled = kiln.compile(target, backend=counter, dynamic=None)

        def info():
            entries = compiled.entries
            # kiln's AOT backend: a dynamic graph it cannot trace symbolically is a
            # PerShapeCompiled (one static trace per shape); a symbolic one keeps one as
            # ``.fallback`` for calls outside its trace. Their static traces are compiles too.
            per_shape = [c for c in counter.compiled if type(c).__name__ == "PerShapeCompiled"]
            fallbacks = [getattr(c, "fallback", None) for c in counter.compiled]
            fallbacks = [c for c in fallbacks if type(c).__name__ == "PerShapeCompiled"]
            return {"entries": len(entries),
                    "eager_entries": sum(e.is_eager for e in entries),
                    "eager_reasons": [short(e.eager_reason, 300) for e in entries if e.is_eager],
                    "symbols": [sorted(e.symbols) for e in entries],
                    "capture_seconds": [e.capture_seconds for e in entries],
                    "recompile_reasons": [short(r, 300) for r in compiled.recompile_reasons],
                    "aot_per_shape_graphs": len(per_shape),
                    "aot_per_shape_compiles": sum(getattr(c, "compiles", 0) for c in per_shape + fallbacks)}
        return compiled, lambda: counter.count, info
    base = _unique_graphs()
    if backend == "eager":
        counter = Counting(_torch_eager)
        compiled = torch.compile(target, backend=counter, dynamic=None)
    else:
        counter = None
        compiled = torch.compile(target, backend=backend, dynamic=None)

    def info():
        out = {"unique_graphs": _unique_graphs() - base}
        if counter is not None:
            out["wrapper_count"] = counter.count
        return out
    return compiled, lambda: _unique_graphs() - base, info


def run_case(model: Model, compiler: str, backend: str, lengths, inputs, expected, a) -> dict:
    """One fresh run of one (model, backend, compiler): first pass, second pass, steady state."""
    row = {"model": model.name, "backend": backend, "compiler": compiler}
    marks = [("start", time.perf_counter())]
    reset_all()
    marks.append(("reset", time.perf_counter()))
    cache_dir = tempfile.mkdtemp(prefix="kiln-dyn-bench-")
    try:
        with kiln.config.patch(cache_dir=cache_dir), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            calls = []
            phase = "build"
            try:
                compiled, graphs, info = build(compiler, backend, model.target)
                phase = "first pass"
                marks.append(("build", time.perf_counter()))
                for T in lengths:
                    args, kwargs = inputs[T]
                    before = graphs()
                    out, sec = timed_call(compiled, args, kwargs, a.device)
                    check(out, expected[T], f"{model.name}/{backend}/{compiler} first call at T={T}")
                    calls.append({"T": T, "seconds": sec, "new_graphs": graphs() - before})
                phase = "second pass"
                marks.append(("first pass", time.perf_counter()))
                before = graphs()
                second = 0.0
                for T in lengths:
                    args, kwargs = inputs[T]
                    out, sec = timed_call(compiled, args, kwargs, a.device)
                    check(out, expected[T], f"{model.name}/{backend}/{compiler} second call at T={T}")
                    second += sec
                second_new = graphs() - before
                phase = "steady state"
                marks.append(("second pass", time.perf_counter()))
                args, kwargs = inputs[a.steady_len]
                steady = steady_ms({"compiled": compiled, "eager": model.target}, args, kwargs, a.device,
                                   a.steady_calls)
                steady_new = graphs() - before - second_new
            except Mismatch:
                raise
            except Exception as e:  # a compiler failing is a result, not the end of the run
                row["error"] = f"{type(e).__name__}: {e}"
                row["error_phase"] = phase
                row["calls"] = calls
                if a.verbose:
                    traceback.print_exc()
                return row
            marks.append(("steady state", time.perf_counter()))
            extra = info()
    finally:
        reset_all()
        shutil.rmtree(cache_dir, ignore_errors=True)
    marks.append(("end", time.perf_counter()))
    row["phase_s"] = {name: t - marks[i][1] for i, (name, t) in enumerate(marks[1:])}
    row.update({
        "graphs": sum(c["new_graphs"] for c in calls),
        "compile_s": sum(c["seconds"] for c in calls if c["new_graphs"]),
        "first_calls_s": sum(c["seconds"] for c in calls),
        "second_pass_s": second,
        "second_pass_new_graphs": second_new,
        "steady_new_graphs": steady_new,
        "steady_ms": steady["compiled"],
        "eager_ms": steady["eager"],
        "steady_over_eager": _ratio(steady["compiled"], steady["eager"]),
        "compiling_calls": [c["T"] for c in calls if c["new_graphs"]],
        "calls": calls,
        "info": extra,
    })
    if compiler == "torch.compile" and "wrapper_count" in extra and extra["wrapper_count"] != extra["unique_graphs"]:
        row["warning"] = (f"counting wrapper saw {extra['wrapper_count']} graphs, "
                          f"counters['stats']['unique_graphs'] {extra['unique_graphs']}")
    return row


MEDIAN_KEYS = ("compile_s", "first_calls_s", "second_pass_s", "steady_ms", "eager_ms", "steady_over_eager")


def combine(runs: list[dict]) -> dict:
    """One row from the repeats of a case: medians of the times; the first error, if any."""
    errors = [r for r in runs if "error" in r]
    if errors:
        row = dict(errors[0])
        row["failed_repeats"] = f"{len(errors)}/{len(runs)}"
        return row
    row = dict(runs[-1])
    for k in MEDIAN_KEYS:
        row[k] = statistics.median(r[k] for r in runs)
    row["repeats"] = [{k: r[k] for k in ("graphs", "compiling_calls", *MEDIAN_KEYS)} for r in runs]
    if len({r["graphs"] for r in runs}) > 1:
        row["warning"] = (row.get("warning", "") + f" graph counts differ between repeats: "
                          f"{[r['graphs'] for r in runs]}").strip()
    return row


def warm_up(backends, compilers, device: str) -> None:
    """Pay each compiler's one-time costs (imports, first fake mode, ...) before timing."""
    def g(x):
        return (x * 2).sin().sum(1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for backend in backends:
            for compiler in compilers:
                reset_all()
                cache_dir = tempfile.mkdtemp(prefix="kiln-dyn-bench-")
                try:
                    with kiln.config.patch(cache_dir=cache_dir):
                        fn = build(compiler, backend, g)[0]
                        for T in (5, 7, 9):
                            fn(torch.randn(3, T, device=device))
                except Exception:
                    pass   # the case itself will report it
                finally:
                    shutil.rmtree(cache_dir, ignore_errors=True)
    reset_all()


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------

def _ratio(x, y) -> float:
    return x / y if y else float("nan")


def add_ratios(rows) -> None:
    """kiln/torch.compile of each number, on kiln's row (when neither failed)."""
    by = {(r["model"], r["backend"], r["compiler"]): r for r in rows}
    for k in rows:
        t = by.get((k["model"], k["backend"], "torch.compile"))
        if k["compiler"] != "kiln" or t is None or "error" in k or "error" in t:
            continue
        k["ratios_kiln_over_torch"] = {key: _ratio(k[key], t[key])
                                       for key in ("graphs", "compile_s", "first_calls_s", "steady_ms")}


def print_table(rows, n_lengths: int, out=sys.stdout) -> None:
    first = f"{n_lengths} first calls s"
    head = (f"{'model':<6} {'backend':<10} {'compiler':<14} {'graphs':>6} {'compile s':>10} "
            f"{first:>20} {'steady ms':>10} {'eager ms':>9} {'steady/eager':>12}")
    print(head, file=out)
    print("-" * len(head), file=out)
    by = {(r["model"], r["backend"], r["compiler"]): r for r in rows}
    keys = []
    for r in rows:
        if (r["model"], r["backend"]) not in keys:
            keys.append((r["model"], r["backend"]))
    for model, backend in keys:
        label = f"{model:<6} {backend:<10}"
        for compiler in COMPILERS:
            r = by.get((model, backend, compiler))
            if r is None:
                continue
            if "error" in r:
                print(f"{label} {compiler:<14} error ({r['error_phase']}): {short(r['error'], 80)}", file=out)
            else:
                print(f"{label} {compiler:<14} {r['graphs']:>6} {r['compile_s']:>10.3f} {r['first_calls_s']:>20.3f} "
                      f"{r['steady_ms']:>10.3f} {r['eager_ms']:>9.3f} {r['steady_over_eager']:>12.2f}",
                      file=out)
            label = " " * len(label)
        k, t = by.get((model, backend, "kiln")), by.get((model, backend, "torch.compile"))
        ratios = k.get("ratios_kiln_over_torch") if k else None
        if ratios:
            print(f"{label} {'kiln/torch':<14} {ratios['graphs']:>6.2f} {ratios['compile_s']:>10.2f} "
                  f"{ratios['first_calls_s']:>20.2f} {ratios['steady_ms']:>10.2f}", file=out)
        elif k and t:
            print(f"{label} {'kiln/torch':<14} {'-':>6}", file=out)
    notes = []
    for r in rows:
        who = f"{r['model']}/{r['backend']}/{r['compiler']}"
        if "error" in r:
            notes.append(f"{who}: error in the {r['error_phase']} after {len(r['calls'])} first calls: "
                         f"{short(r['error'], 400)}")
            continue
        info = r["info"]
        if r["second_pass_new_graphs"] or r["steady_new_graphs"]:
            notes.append(f"{who}: compiled {r['second_pass_new_graphs']} graph(s) on the second pass and "
                         f"{r['steady_new_graphs']} in the steady state (lengths already seen)")
        if info.get("eager_entries"):
            notes.append(f"{who}: {info['eager_entries']} entr(y/ies) run eagerly: {info['eager_reasons']}")
        if info.get("aot_per_shape_compiles"):
            notes.append(f"{who}: kiln's AOT backend traced {info['aot_per_shape_compiles']} graph(s) per "
                         f"concrete shape ({info['aot_per_shape_graphs']} graph(s) not traced symbolically)")
        if "warning" in r:
            notes.append(f"{who}: {r['warning']}")
    if notes:
        print("\nnotes:", file=out)
        for n in notes:
            print(f"  {n}", file=out)


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------

def lengths_for(n: int, seed: int) -> list[int]:
    if not 1 <= n <= MAX_LEN - MIN_LEN + 1:
        raise SystemExit(f"--lengths must be in 1..{MAX_LEN - MIN_LEN + 1}")
    return random.Random(seed).sample(range(MIN_LEN, MAX_LEN + 1), n)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--lengths", type=int, default=None, help="distinct sequence lengths (default 20; 6 with --quick)")
    p.add_argument("--seed", type=int, default=0, help="seed of the lengths' order")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--compilers", default=",".join(COMPILERS))
    p.add_argument("--steady-calls", type=int, default=None,
                   help="timed steady-state calls (default 20; 5 with --quick)")
    p.add_argument("--repeats", type=int, default=None,
                   help="fresh runs of each case; times are their medians (default 3; 1 with --quick)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU: torch intra-op threads (default 1: compile and call overhead is what is "
                        "measured, and one thread is not stalled by other load on a shared machine)")
    p.add_argument("--grad", action="store_true", help="run with grad enabled (forward only) instead of no_grad")
    p.add_argument("--quick", action="store_true", help="a smaller run: 6 lengths, 1 repeat, 5 steady-state calls")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--verbose", action="store_true",
                   help="print each case's phase times, and tracebacks of compiler errors")
    a = p.parse_args(argv)
    if a.lengths is None:
        a.lengths = 6 if a.quick else 20
    if a.steady_calls is None:
        a.steady_calls = 5 if a.quick else 20
    if a.repeats is None:
        a.repeats = 1 if a.quick else 3
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    models = [m for m in a.models.split(",") if m]
    backends = [b for b in a.backends.split(",") if b]
    compilers = [c for c in a.compilers.split(",") if c]
    for name, given, known in (("model", models, MODELS), ("backend", backends, BACKENDS),
                               ("compiler", compilers, COMPILERS)):
        bad = [x for x in given if x not in known]
        if bad:
            raise SystemExit(f"unknown {name}(s) {bad}; known: {', '.join(known)}")
    threads = torch.get_num_threads()
    if a.device == "cpu":
        torch.set_num_threads(max(1, a.threads))
    try:
        return _run(a, models, backends, compilers)
    finally:
        torch.set_num_threads(threads)


def _run(a, models, backends, compilers) -> int:
    lengths = lengths_for(a.lengths, a.seed)
    a.steady_len = sorted(lengths)[len(lengths) // 2]

    rows, skipped = [], []
    t_start = time.perf_counter()
    grad = contextlib.nullcontext() if a.grad else torch.no_grad()
    with grad:
        warm_up(backends, compilers, a.device)
        for name in models:
            model = make_model(name, a.device)
            if model is None:
                skipped.append(name)
                continue
            inputs = {}
            for T in lengths:
                g = torch.Generator().manual_seed(T)
                inputs[T] = model.make_inputs(T, g)
            expected = {T: model.target(*args, **kwargs) for T, (args, kwargs) in inputs.items()}
            for backend in backends:
                runs: dict = {c: [] for c in compilers}
                for r in range(a.repeats):
                    # alternate which compiler goes first, so neither always follows the other
                    for compiler in (compilers if r % 2 == 0 else compilers[::-1]):
                        try:
                            t_case = time.perf_counter()
                            runs[compiler].append(run_case(model, compiler, backend, lengths, inputs, expected, a))
                            if a.verbose:
                                phases = runs[compiler][-1].get("phase_s", {})
                                print(f"  {name}/{backend}/{compiler} repeat {r}: "
                                      f"{time.perf_counter() - t_case:.1f} s "
                                      f"({', '.join(f'{k} {v:.2f}' for k, v in phases.items())})", file=sys.stderr)
                        except Mismatch as e:
                            raise SystemExit(f"error: wrong result: {e}") from None
                rows += [combine(runs[c]) for c in compilers]
    wall = time.perf_counter() - t_start

    print(f"dynamic shapes on {a.device} (torch {torch.__version__}, Python {sys.version.split()[0]}), "
          f"dynamic=None, {'grad enabled' if a.grad else 'no_grad'}; {len(lengths)} lengths in "
          f"{MIN_LEN}..{MAX_LEN} (seed {a.seed}): {lengths}")
    print(f"medians of {a.repeats} fresh run(s) per case. compile s: the first calls that compiled a graph; "
          f"steady ms / eager ms: median of {a.steady_calls} calls at T={a.steady_len} (already seen), "
          f"compiled and eager alternating (steady/eager is the robust comparison on a busy machine)\n")
    add_ratios(rows)
    print_table(rows, len(lengths))
    if skipped:
        print(f"\nskipped (not importable): {', '.join(skipped)}")
    print(f"\nbenchmark wall time {wall:.1f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": a.device, "torch": torch.__version__, "python": sys.version.split()[0],
                       "grad": a.grad, "lengths": lengths, "seed": a.seed, "steady_len": a.steady_len,
                       "steady_calls": a.steady_calls, "repeats": a.repeats, "skipped": skipped,
                       "wall_s": wall, "rows": rows}, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
