"""kiln beside eager (and optionally torch.compile) on many timm architectures, at their
default configs (random weights, nothing downloaded), as their users run them: inference in
``eval()``, and training steps in ``train()`` with batch-norm statistics updating.

    python benchmarks/timm_sweep.py [--models resnet18,vit_tiny_patch16_224,...] [--backend inductor]
        [--device cuda] [--jobs 8] [--peer] [--amp] [--json PATH]

For each model, in its own process: two inference calls on fresh random images at the model's
default input size, and two training steps (cross-entropy on random labels, ``backward``),
each compared with a deep-copied eager model: every output, the loss, every parameter's
gradient and every buffer (running statistics) after the step. The random state is reseeded
before each side, so dropout and drop-path draw the same numbers. TF32 is off, so float32
errors are the compilers' reordering, not reduced-precision matmuls. ``--amp``: the training
forward under bf16 autocast, as most timm training recipes run it.

Then kiln's graph and break counts (``kiln.explain``). ``--peer``: also torch.compile's errors
against the same eager results, to tell a kiln bug from the error both compilers' fusion
makes, and ``torch._dynamo.explain``'s counts.

Prints one JSON line per model (``inf_err``/``train_err``: the largest difference relative to
1 + the largest eager value; ``crash``: the model could not be built or run, see where) and a
summary table. ``--jobs N`` runs N models at once (Inductor's compile workers are shared
out between them).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import threading
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch

# One or two small members of each family timm users train: convolutional, transformer,
# hybrid, MLP and mobile designs, which between them use most of timm's layers (drop path,
# layer scale, relative position bias, window attention, squeeze-excitation, ...).
MODELS = (
    "resnet18", "resnet50d", "resnext26ts", "seresnext26d_32x4d", "regnetx_002", "regnety_004",
    "efficientnet_b0", "mobilenetv3_small_100", "mobilenetv2_050", "mnasnet_small", "ghostnet_100",
    "rexnet_100", "densenet121", "dla34", "dpn48b", "hrnet_w18_small", "cspresnet50", "cspdarknet53",
    "inception_v3", "xception41", "nf_regnet_b0", "nfnet_l0", "gernet_s", "repvgg_a0", "resnest14d",
    "skresnet18", "res2net50_14w_8s", "selecsls42b", "tresnet_m", "convnext_atto", "convnextv2_atto",
    "efficientformer_l1", "efficientformerv2_s0", "mobilevit_xxs", "mobilevitv2_050", "edgenext_xx_small",
    "fastvit_t8", "repvit_m1", "efficientvit_b0", "efficientvit_m0", "levit_128s", "vit_tiny_patch16_224",
    "vit_small_patch16_224", "deit_tiny_distilled_patch16_224", "beit_base_patch16_224", "cait_xxs24_224",
    "coat_lite_tiny", "crossvit_tiny_240", "convit_tiny", "pit_ti_224", "tnt_s_patch16_224", "twins_svt_small",
    "visformer_tiny", "swin_tiny_patch4_window7_224", "swinv2_cr_tiny_224", "maxvit_nano_rw_256",
    "coatnet_nano_rw_224", "poolformer_s12", "mixer_s16_224", "resmlp_12_224", "gmlp_ti16_224",
    "eva02_tiny_patch14_224", "deit3_small_patch16_224", "vit_small_patch16_224.augreg_in21k",
    "hiera_tiny_224", "nest_tiny", "sequencer2d_s", "volo_d1_224", "xcit_nano_12_p16_224", "halonet26t",
    "botnet26t_256", "lambda_resnet26t", "cs3darknet_focus_s", "ese_vovnet19b_dw", "hgnetv2_b0",
)


def make(name: str, device: str):
    import timm

    model = timm.create_model(name, pretrained=False).to(device)
    cfg = getattr(model, "pretrained_cfg", None) or {}
    size = tuple(cfg.get("input_size", (3, 224, 224)))
    # (a model without a classifier, ``num_classes=0`` as eva02's MIM weights are, returns its
    # pooled features: the loss's labels index those)
    return model, size, getattr(model, "num_classes", 0) or getattr(model, "num_features", 1000)


def _outputs(o) -> list:
    if isinstance(o, torch.Tensor):
        return [o]
    if isinstance(o, (list, tuple)):
        return [t for x in o for t in _outputs(x)]
    if isinstance(o, dict):
        return [t for x in o.values() for t in _outputs(x)]
    return []


def _loss_of(out, labels):
    logits = _outputs(out)[0]       # (a distilled model returns (class, distillation) logits)
    return torch.nn.functional.cross_entropy(logits.float(), labels)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return (a - b).abs().max().item() / (1 + a.abs().max().item())


def _worst(expected: list, got: list) -> float:
    if [t.shape for t in expected] != [t.shape for t in got]:
        raise AssertionError("outputs differ in number or shape")
    worst = 0.0
    for a, b in zip(expected, got):
        worst = max(worst, _rel(a, b) if a.is_floating_point() else float(not torch.equal(a, b)))
    return worst


def compare(name: str, compile_fn, device: str, amp: bool, batch: int = 2) -> dict:
    """Errors of ``compile_fn(model)`` against eager: inference, then training steps."""
    res: dict = {}
    torch.manual_seed(0)
    model, size, classes = make(name, device)
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    model.eval(), ref.eval()
    compiled = compile_fn(model)
    worst = 0.0
    for _ in range(2):
        x = torch.randn(batch, *size, generator=g).to(device)
        with torch.no_grad():
            worst = max(worst, _worst(_outputs(ref(x)), _outputs(compiled(x))))
    res["inf_err"] = worst
    model.train(), ref.train()
    compiled = compile_fn(model)
    worst = 0.0
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=amp)
    for call in range(2):
        x = torch.randn(batch, *size, generator=g).to(device)
        labels = torch.randint(0, classes, (batch,), generator=g).to(device)
        model.zero_grad(set_to_none=True), ref.zero_grad(set_to_none=True)
        torch.manual_seed(100 + call)
        with autocast:
            le = _loss_of(ref(x), labels)
        le.backward()
        torch.manual_seed(100 + call)
        with autocast:
            lk = _loss_of(compiled(x), labels)
        lk.backward()
        worst = max(worst, _rel(le, lk))
        for (pname, p), q in zip(ref.named_parameters(), model.parameters()):
            if (p.grad is None) != (q.grad is None):
                res["train_error"] = f"a gradient exists on one side only ({pname})"
            elif p.grad is not None:
                worst = max(worst, _rel(p.grad, q.grad))
        for (bname, b), c in zip(ref.named_buffers(), model.buffers()):
            if b.is_floating_point():
                worst = max(worst, _rel(b, c))
            elif not torch.equal(b, c):
                res["train_error"] = f"buffer {bname} differs"
    res["train_err"] = worst
    return res


def run_one(name: str, backend: str, device: str, amp: bool, peer: bool) -> dict:
    import torch._dynamo

    import kiln

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def kiln_compile(model):
        kiln.reset()
        return kiln.compile(model, backend=backend)

    res: dict = {"model": name}
    res.update(compare(name, kiln_compile, device, amp))
    if peer:
        def torch_compile(model):
            torch._dynamo.reset()
            return torch.compile(model, backend=backend)
        try:
            res.update({f"torch_{k}": v for k, v in compare(name, torch_compile, device, amp).items()})
        except Exception as e:      # (the peer's failure is not kiln's)
            res["torch_crash"] = f"{type(e).__name__}: {str(e)[:200]}"
    torch.manual_seed(0)
    model, size, _ = make(name, device)
    x = torch.randn(2, *size, device=device)
    for mode in ("inf", "train"):
        ctx = torch.no_grad() if mode == "inf" else torch.enable_grad()
        with ctx:
            ex = kiln.explain(copy.deepcopy(model).train(mode == "train"))(x)
        res[f"{mode}_kiln"] = [ex.graph_count, ex.graph_break_count]
        res[f"{mode}_reasons"] = [str(b).split("\n")[0][:160] for b in ex.break_reasons][:3]
        if not peer:
            continue
        torch._dynamo.reset()
        with ctx:
            tex = torch._dynamo.explain(copy.deepcopy(model).train(mode == "train"))(x)
        res[f"{mode}_torch"] = [tex.graph_count, tex.graph_break_count]
    return res


def run_cell(name: str, args) -> dict:
    start = time.time()
    cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--backend", args.backend,
           "--device", args.device] + (["--amp"] if args.amp else []) + (["--peer"] if args.peer else [])
    env = dict(os.environ)
    if args.jobs > 1:       # (each process's Inductor workers, out of the machine's cores)
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 2) // args.jobs)))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        r = json.loads(lines[-1][7:]) if lines else {"model": name, "crash": proc.stderr[-600:]}
    except subprocess.TimeoutExpired:
        r = {"model": name, "crash": f"timeout ({args.timeout} s)"}
    r["backend"], r["seconds"] = args.backend, round(time.time() - start, 1)
    print(json.dumps({k: v for k, v in r.items() if k != "where"}), flush=True)
    with _done_lock:        # (written as models finish: a sweep cut short keeps what it ran)
        _done.append(r)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(_done, fh, indent=1)
    return r


_done: list = []
_done_lock = threading.Lock()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--backend", default="inductor")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", action="store_true", help="the training forward under bf16 autocast")
    p.add_argument("--peer", action="store_true", help="torch.compile's errors too")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--json", default=None)
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.one:
        try:
            r = run_one(args.one, args.backend, args.device, args.amp, args.peer)
        except Exception as e:
            r = {"model": args.one, "crash": f"{type(e).__name__}: {str(e)[:300]}",
                 "where": traceback.format_exc()[-800:]}
        print("RESULT " + json.dumps(r))
        return 0
    names = [n for n in args.models.split(",") if n]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        out = list(pool.map(lambda n: run_cell(n, args), names))
    print_table(out, args.peer)
    return 0


def print_table(out: list, peer: bool) -> None:
    head = "| model | inference err | training err | kiln graphs/breaks (inf, train) | torch.compile (inf, train) |"
    if peer:
        head += " torch.compile err (inf, train) |"
    ncols = head.count("|") - 1
    print("\n" + head)
    print("|" + "---|" * ncols)
    for r in out:
        if "crash" in r:
            print(f"| {r['model']} | crash: {r['crash'][:80]!r} |" + " |" * (ncols - 2))
            continue
        row = (f"| {r['model']} | {r['inf_err']:.1e} | {r['train_err']:.1e}"
               f"{' (' + r['train_error'] + ')' if r.get('train_error') else ''} "
               f"| {r['inf_kiln']}, {r['train_kiln']} | {r.get('inf_torch', '')}, {r.get('train_torch', '')} |")
        if peer:
            row += (f" {r['torch_crash'][:40]!r} |" if "torch_crash" in r
                    else f" {r.get('torch_inf_err', float('nan')):.1e}, {r.get('torch_train_err', float('nan')):.1e} |")
        print(row)


if __name__ == "__main__":
    sys.exit(main())
