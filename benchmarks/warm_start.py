"""Warm start: the time a compiler adds to a program's first output, cold and warm.

    python benchmarks/warm_start.py [--device cuda] [--json PATH] [--backend inductor|aot_eager]
        [--models gpt2-infer,gpt2-train,mlp,mlp-train,qwen2-infer,qwen2-train,bert-infer,timm-infer]
        [--remote [--redis-server PATH]]

Every measurement runs in a fresh process. Per model and compiler (kiln, torch.compile):

* cold: empty caches (a fresh KILN_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR);
* warm: a second fresh process over the caches the cold one filled (torch's FX graph and AOT
  autograd caches warm too).

"kiln warm cache" counts the warm process's graph-level hits and its frame hits (a frame
record's entries served the call: no capture at all, see kiln/package/frame_records.py).

"added" is the wall time from the first call to its first output (inference: the output;
training: the loss and its backward) minus the same for eager in its own fresh process, after
every library is imported (the clock starts before ``kiln.compile``/``torch.compile`` wraps
the model: torch.compile imports torch._dynamo there). "exit" is the time from the child's last line to its exit. The
the target: warm kiln adds <= 0.5x what warm torch.compile adds.

Bytecode: the children share one PYTHONPYCACHEPREFIX, primed by an untimed cold run of each
compiler per model, so that no measured process compiles library sources to bytecode (on a
machine whose site-packages holds no .pyc files that costs several seconds per process, the
same for every compiler, and a normal installation does not pay it).

"package": the cold kiln process saves a package (``save_package``) after its first
output; a fresh process with an empty KILN_CACHE_DIR then times ``kiln.load_package`` plus the
first call: "pkg" with empty Inductor/Triton caches too (a new machine: Inductor's kernels are
built again from the generated source, nothing is traced or lowered), "pkg+k" with the kernel
caches the kiln runs filled. Target: <= 0.1 s added to eager's first output. "pkg imported"
lists which of torch._dynamo and torch._inductor that process imported (a static aot_eager
package needs neither; Inductor's generated code imports torch._inductor, which imports
torch._dynamo).

``--profile DIR``: each timed kiln child writes a cProfile summary of its first output into DIR
(``<model>-<compiler>-<pid>.txt``), to see where a warm start spends its time.

``--remote``: a fleet's fresh machine served from a warm Redis (a redis-server the benchmark
starts on a free port of 127.0.0.1, persistence off; ``--redis-server`` names its binary). Per
model and compiler: a cold process on "machine A" (its own empty local caches) fills Redis, then
a fresh process on "machine B" (empty kiln, Inductor and Triton caches, the warm Redis) is timed.
kiln uses ``KILN_REMOTE_CACHE``; torch.compile its Redis remote caches: FX graph and AOT autograd
caches (``TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE``, ``TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE``) and the
automatic-dynamic profiles (``TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO``), all at
``TORCHINDUCTOR_REDIS_URL``. Target: machine B's kiln adds <= 0.5 s to eager's first output,
and <= 0.5x what torch.compile's machine B adds.

Models (no downloads): ``gpt2-infer`` / ``gpt2-train`` a GPT-2-style decoder (6 layers, d=512,
8 heads; batch 2, sequence 64) inference and one training step; ``mlp`` / ``mlp-train`` a small
MLP on CPU, inference and one training step. Library models at their defaults (random weights):
``qwen2-infer`` / ``qwen2-train`` a Hugging Face Qwen2 decoder (4 layers, d=256, 8 heads over 2
key/value heads, KV cache on; batch 2, sequence 64 with a padded attention mask; labels when
training), ``bert-infer`` a BERT encoder (4 layers, d=256) and ``timm-infer`` timm's ResNet-18
(batch 2, 160x160).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


LIBRARY_MODELS = ("qwen2-infer", "qwen2-train", "bert-infer", "timm-infer")


def _library_model(model: str):
    """A library model at its defaults (random weights, nothing downloaded), its keyword
    arguments, and whether the step trains: a Hugging Face decoder (Qwen2: KV cache on, 2
    key/value heads, a padded attention mask, labels when training), an encoder (BERT) and a
    timm vision model (ResNet-18)."""
    if model == "timm-infer":
        import timm

        return timm.create_model("resnet18", pretrained=False).eval(), {"x": torch.randn(2, 3, 160, 160)}, False
    import transformers

    transformers.logging.set_verbosity_error()
    ids = torch.randint(1, 8192, (2, 64))
    mask = torch.ones_like(ids)
    mask[0, :16] = 0
    if model == "bert-infer":
        cfg = transformers.BertConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                                      num_attention_heads=4, vocab_size=8192)
        return transformers.BertModel(cfg).eval(), {"input_ids": ids, "attention_mask": mask}, False
    cfg = transformers.Qwen2Config(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8,
                                   num_key_value_heads=2, vocab_size=8192, max_position_embeddings=256)
    net = transformers.AutoModelForCausalLM.from_config(cfg)
    if model == "qwen2-train":
        return net, {"input_ids": ids, "attention_mask": mask, "labels": ids}, True
    return net.eval(), {"input_ids": ids, "attention_mask": mask}, False


def _child(model: str, compiler: str, device: str, backend: str, package: str | None = None) -> None:
    import torch
    sys.path.insert(0, HERE)
    import kiln
    from inductor import GPT

    torch.manual_seed(0)
    kwargs: dict = {}
    if model in LIBRARY_MODELS:
        net, kwargs, train = _library_model(model)
        args = ()
    elif model in ("mlp", "mlp-train"):
        device = "cpu"
        net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
        args = (torch.randn(32, 64),)
        train = model == "mlp-train"
        if train:
            net = WithLoss(net)
            args = (*args, torch.randn(32, 10))
    else:
        net = GPT(vocab=8192)
        args = (torch.randint(0, 8192, (2, 64)),)
        train = model == "gpt2-train"
        if train:
            args = (*args, torch.randint(0, 8192, (2, 64)))
        else:
            net.eval()
    net = net.to(device)
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
    sync()
    # from wrapping the model (torch.compile imports torch._dynamo there; kiln's first
    # capture imports it through ShapeEnv) to the first output
    profile = os.environ.get("KILN_BENCH_PROFILE") if compiler in ("kiln", "package") else None
    if profile:
        import cProfile
        import gc
        collections: list = []       # (generation, seconds) of each garbage collection
        gc.callbacks.append(lambda phase, info: collections.append(
            (info["generation"], time.perf_counter())) if phase == "start" else
            collections.append((info["generation"], time.perf_counter() - collections.pop()[1])))
        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    if compiler == "kiln":
        fn = kiln.compile(net, backend=backend)
    elif compiler == "package":
        fn = kiln.load_package(package, net, on_miss="error")   # (a miss would be a compile)
    elif compiler == "torch":
        fn = torch.compile(net, backend=backend)
    else:
        fn = net
    if train:
        out = fn(*args, **kwargs)
        (out if isinstance(out, torch.Tensor) else out.loss).backward()
    else:
        with torch.no_grad():
            fn(*args, **kwargs)
    sync()
    first = time.perf_counter() - start
    if profile:
        _write_profile(profiler, os.path.join(profile, f"{model}-{compiler}-{os.getpid()}.txt"), first, collections)
    # the heavy torch modules the first output needed (a static aot_eager package: none)
    extra = {"imported": [m for m in ("torch._dynamo", "torch._inductor", "sympy") if m in sys.modules]}
    if compiler == "kiln":
        extra = {**extra, **kiln.cache.stats()}
        if package:
            fn.save_package(package)
    elif compiler == "torch":
        from torch._dynamo.utils import counters          # (imported by torch.compile already)
        extra = {**extra, "torch_caches": {k: v for k, v in counters["inductor"].items()
                                           if k.startswith(("fxgraph_cache", "autograd_cache"))}}
    print("RESULT " + json.dumps({"first": first, **extra}), flush=True)


def _write_profile(profiler, path: str, first: float, collections: list) -> None:
    """The first output's profile (``--profile``): its garbage collections, and the 60 costliest
    calls, by cumulative and by own time."""
    import io
    import pstats
    profiler.disable()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    out.write(f"first output: {first:.3f} s\n")
    for g in (0, 1, 2):
        times = [t for gen, t in collections if gen == g]
        out.write(f"garbage collections of generation {g}: {len(times)}, {sum(times):.3f} s\n")
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(40)
    with open(path, "w") as f:
        f.write(out.getvalue())


class WithLoss(torch.nn.Module):
    """The MLP returning its loss (as GPT does given targets): one module for a training step.
    (At module level: a package finds a module's class again by its qualified name.)"""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, target):
        return torch.nn.functional.mse_loss(self.net(x), target)


def _measure(model, compiler, device, backend, env, package=None) -> dict:
    start = time.perf_counter()
    p = subprocess.Popen([sys.executable, __file__, "--child", model, compiler, "--device", device,
                          "--backend", backend, *(["--package", package] if package else [])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    result, printed = None, None
    for line in p.stdout:
        if line.startswith("RESULT "):
            result, printed = json.loads(line[7:]), time.perf_counter()
    err = p.stderr.read()
    p.wait()
    if p.returncode != 0 or result is None:
        raise RuntimeError(f"{model}/{compiler} failed:\n{err[-3000:]}")
    result["exit"] = time.perf_counter() - printed
    result["process"] = time.perf_counter() - start
    return result


def _caches_in(d: str, base: dict) -> dict:
    """``base`` with kiln's, Inductor's and Triton's caches in the directory ``d``."""
    return {**base, "KILN_CACHE_DIR": os.path.join(d, "kiln"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(d, "inductor"), "TRITON_CACHE_DIR": os.path.join(d, "triton")}


def _prime_bytecode(model, device, backend, base) -> None:
    """One untimed cold run of each compiler (and a package save) over throwaway caches: the
    modules they import leave their bytecode in PYTHONPYCACHEPREFIX."""
    base = {k: v for k, v in base.items() if k != "KILN_BENCH_PROFILE"}      # (not timed: not profiled)
    for compiler in ("kiln", "torch"):
        with tempfile.TemporaryDirectory() as d:
            env = _caches_in(d, base)
            package = os.path.join(d, "model.kiln") if compiler == "kiln" else None
            _measure(model, compiler, device, backend, env, package)
            if package:
                _measure(model, "package", device, backend, env, package)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_redis(binary: str, directory: str):
    """A redis-server of the benchmark's own (persistence off): (process, url)."""
    import redis
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", directory], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(500):
        try:
            client.ping()
            return proc, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            if proc.poll() is not None:
                break
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"could not start {binary}")


def _remote_env(compiler: str, url: str) -> dict:
    if compiler == "kiln":
        return {"KILN_REMOTE_CACHE": url}
    return {"TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
            "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO": "1", "TORCHINDUCTOR_REDIS_URL": url}


def main_remote(a, models: list, base_of) -> None:
    """``--remote``: machine A compiles into a warm Redis, a fresh machine B is timed."""
    import redis
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-redis-") as rd:
        proc, url = _start_redis(a.redis_server, rd)
        try:
            for model in models:
                base = base_of(model)
                if base is None:
                    continue
                eager = _measure(model, "eager", a.device, a.backend, base)
                row = {"model": model, "eager_first_s": eager["first"]}
                for compiler in ("kiln", "torch"):
                    redis.Redis.from_url(url).flushdb()
                    env = {**base, **_remote_env(compiler, url)}
                    with tempfile.TemporaryDirectory() as machine_a, tempfile.TemporaryDirectory() as machine_b:
                        cold = _measure(model, compiler, a.device, a.backend, _caches_in(machine_a, env))
                        fresh = _measure(model, compiler, a.device, a.backend, _caches_in(machine_b, env))
                    row[f"{compiler}_cold_added_s"] = cold["first"] - eager["first"]
                    row[f"{compiler}_remote_added_s"] = fresh["first"] - eager["first"]
                    row[f"{compiler}_remote_exit_s"] = fresh["exit"]
                    if compiler == "kiln":
                        row["kiln_remote_cache"] = {k: fresh[k] for k in ("hits", "misses", "frame_hits", "remote_hits",
                                                                          "remote_misses", "remote_errors",
                                                                          "remote_bytes_read")}
                    else:
                        row["torch_remote_cache"] = fresh.get("torch_caches", {})
                row["remote_ratio"] = row["kiln_remote_added_s"] / max(row["torch_remote_added_s"], 1e-9)
                rows.append(row)
                print(f"# {model} done: {json.dumps(row)}", file=sys.stderr, flush=True)
                if a.json:
                    with open(a.json, "w") as f:
                        json.dump({"device": a.device, "backend": a.backend, "remote": True, "rows": rows}, f, indent=1)
        finally:
            proc.terminate()
            proc.wait()
    print(f"added to first output over eager, seconds: a fresh machine (empty local caches) and a warm Redis "
          f"(device {a.device}, backend {a.backend})")
    print(f"{'model':<12} {'eager 1st':>9} | {'kiln cold':>9} {'kiln B':>7} | {'torch cold':>10} {'torch B':>8} | "
          f"{'B k/t':>6} | {'exit k/t (B)':>14} | kiln B cache | torch B caches")
    for r in rows:
        print(f"{r['model']:<12} {r['eager_first_s']:>9.3f} | {r['kiln_cold_added_s']:>9.3f} {r['kiln_remote_added_s']:>7.3f} | "
              f"{r['torch_cold_added_s']:>10.3f} {r['torch_remote_added_s']:>8.3f} | {r['remote_ratio']:>6.2f} | "
              f"{r['kiln_remote_exit_s']:>6.2f} / {r['torch_remote_exit_s']:<6.2f} | {r['kiln_remote_cache']} | "
              f"{r['torch_remote_cache']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json")
    ap.add_argument("--models", default="gpt2-infer,gpt2-train,mlp,qwen2-infer,qwen2-train,bert-infer,timm-infer")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--child", nargs=2)
    ap.add_argument("--package")
    ap.add_argument("--remote", action="store_true",
                    help="a fresh machine (empty local caches) served from a warm Redis, kiln and torch.compile")
    ap.add_argument("--redis-server", default="redis-server", help="the redis-server binary --remote starts")
    ap.add_argument("--profile", metavar="DIR",
                    help="kiln's timed children write a cProfile summary of their first output into DIR")
    ap.add_argument("--no-prime", action="store_true",
                    help="skip the untimed runs that compile library bytecode first (the cold columns then include it)")
    a = ap.parse_args()
    if a.profile and not a.child:
        os.environ["KILN_BENCH_PROFILE"] = os.path.abspath(a.profile)
    if a.child:
        _child(a.child[0], a.child[1], a.device, a.backend, a.package)
        return
    rows = []
    pycache = tempfile.TemporaryDirectory(prefix="kiln-bench-pycache-")

    def base_of(model: str) -> dict | None:
        """The children's environment for ``model`` (bytecode primed), None to skip it."""
        if model == "timm-infer" and importlib.util.find_spec("timm") is None:
            print("# timm-infer skipped: timm is not installed", file=sys.stderr, flush=True)
            return None
        base = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        # Every fresh process reads Python's bytecode caches, as it does wherever packages are
        # installed normally. Without them (a read-only site-packages, PYTHONDONTWRITEBYTECODE)
        # each process compiles torch's sources again, seconds that belong to neither compiler.
        base.pop("PYTHONDONTWRITEBYTECODE", None)
        base.setdefault("PYTHONPYCACHEPREFIX", pycache.name)
        if not a.no_prime:
            _prime_bytecode(model, a.device, a.backend, base)
        return base

    if a.remote:
        main_remote(a, a.models.split(","), base_of)
        return
    for model in a.models.split(","):
        base = base_of(model)
        if base is None:
            continue
        eager = _measure(model, "eager", a.device, a.backend, base)
        row = {"model": model, "eager_first_s": eager["first"]}
        for compiler in ("kiln", "torch"):
            with tempfile.TemporaryDirectory() as d:
                env = _caches_in(d, base)
                package = os.path.join(d, "model.kiln") if compiler == "kiln" else None
                for phase in ("cold", "warm"):
                    r = _measure(model, compiler, a.device, a.backend, env, package if phase == "cold" else None)
                    row[f"{compiler}_{phase}_added_s"] = r["first"] - eager["first"]
                    row[f"{compiler}_{phase}_exit_s"] = r["exit"]
                    if compiler == "kiln":
                        row[f"kiln_{phase}_cache"] = {k: r[k] for k in ("hits", "misses", "bypasses", "frame_hits")}
                        row[f"kiln_{phase}_imported"] = r["imported"]
                if compiler == "kiln":
                    # an empty kiln cache dir, Inductor's kernel caches as the runs above left them
                    r = _measure(model, "package", a.device, a.backend,
                                 {**env, "KILN_CACHE_DIR": os.path.join(d, "kiln-empty")}, package)
                    row["package_kernels_added_s"] = r["first"] - eager["first"]
                    # a fresh place: empty kiln and Inductor caches, only the package
                    with tempfile.TemporaryDirectory() as d2:
                        r = _measure(model, "package", a.device, a.backend, _caches_in(d2, base), package)
                        row["package_added_s"] = r["first"] - eager["first"]
                    row["package_imported"] = r["imported"]
        row["warm_ratio"] = row["kiln_warm_added_s"] / max(row["torch_warm_added_s"], 1e-9)
        rows.append(row)
        print(f"# {model} done: {json.dumps(row)}", file=sys.stderr, flush=True)
        if a.json:       # after each model: a run stopped at its time limit keeps what it measured
            with open(a.json, "w") as f:
                json.dump({"device": a.device, "backend": a.backend, "rows": rows}, f, indent=1)
    hdr = f"{'model':<12} {'eager 1st':>9} | {'kiln cold':>9} {'kiln warm':>9} {'pkg':>7} {'pkg+k':>7} | {'torch cold':>10} {'torch warm':>10} | {'warm k/t':>8} | {'exit kiln/torch (warm)':>22} | kiln warm cache | pkg imported"
    print(f"added to first output over eager, seconds (device {a.device}, backend {a.backend})")
    print(hdr)
    for r in rows:
        print(f"{r['model']:<12} {r['eager_first_s']:>9.3f} | {r['kiln_cold_added_s']:>9.3f} {r['kiln_warm_added_s']:>9.3f} "
              f"{r['package_added_s']:>7.3f} {r['package_kernels_added_s']:>7.3f} | "
              f"{r['torch_cold_added_s']:>10.3f} {r['torch_warm_added_s']:>10.3f} | {r['warm_ratio']:>8.2f} | "
              f"{r['kiln_warm_exit_s']:>10.3f} / {r['torch_warm_exit_s']:<9.3f} | {r['kiln_warm_cache']} | "
              f"{','.join(r['package_imported']) or '-'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "backend": a.backend, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
