"""kiln beside eager and torch.compile on many Hugging Face architectures, built from tiny
random configs (nothing is downloaded), at the settings their users run: the model's own
``use_cache``, grouped-query attention with 2 key/value heads where the model has it,
``labels``, an ``attention_mask`` with padding, ``return_dict``.

    python benchmarks/model_sweep.py [--models gpt2,t5,...] [--backend inductor,aot_eager] [--jobs N] [--json PATH]
    python benchmarks/model_sweep.py --decode [--models gpt2,llama,qwen2]
    python benchmarks/model_sweep.py --warm [--models ...]

For each model and backend, in its own process: two inference calls (``eval()``, no grad) and
two training steps (loss, ``backward``) on fresh random inputs, each compared with a
deep-copied eager model (every output tensor, the KV cache included; the loss; every
parameter's gradient; the random state is reseeded before each side, so dropout and router
noise draw the same numbers). Then kiln's graph and break counts (``kiln.explain``) beside
``torch._dynamo.explain``'s on the same call. Prints one JSON line per model
(``inf_err``/``train_err``: the largest difference relative to 1 + the largest eager value;
``inf_strides``: an output tensor whose strides are not eager's;
``crash``: the model could not be built or run) and a summary table.

``--decode``: a greedy decoding loop of 8 tokens after a padded prompt, with the model's own
``DynamicCache`` carried from call to call: the tokens must equal eager's, and the graphs kiln
compiled over the loop are counted beside torch.compile's.

``--warm``: warm start. Per model, a cold process (an empty ``KILN_CACHE_DIR``, frame records on)
runs an inference call and a training step through one compiled model; a second, warm process
over the same cache does the same. The table counts the frames each captured: a warm process
must capture none (its frame records serve every call, ``frame_hits``) and compile no graph.

Needs ``pip install transformers``. A model whose tiny config this script gets wrong for
the installed transformers shows up as a ``crash`` in eager (see its message), not as a kiln
failure.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch

# (no use_cache: each model keeps its own default; 4 heads over 2 key/value heads where the model
# has grouped-query attention)
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100,
             max_position_embeddings=64, num_key_value_heads=2, head_dim=8, pad_token_id=0)
CAUSAL = ["gpt2", "gpt_neo", "opt", "llama", "mistral", "qwen2", "qwen3", "phi", "phi3", "falcon", "bloom", "gpt_bigcode",
          "gemma", "gemma2", "gptj", "gpt_neox", "mixtral", "olmo", "stablelm", "starcoder2", "codegen", "mpt", "xglm",
          "biogpt", "cohere", "granite", "granitemoe", "olmoe", "jetmoe", "persimmon", "nemotron", "helium", "glm",
          "mamba", "falcon_mamba", "rwkv", "ctrl", "olmo2", "phimoe", "qwen2_moe", "exaone4", "smollm3", "gemma3_text",
          "deepseek_v3", "qwen3_moe", "gpt_oss", "llama4_text", "glm4", "glm4_moe", "cohere2", "ernie4_5_moe",
          "falcon_h1", "jamba", "lfm2", "mamba2", "qwen3_next", "recurrent_gemma", "seed_oss",
          "hunyuan_v1_moe", "minimax", "deepseek_v2", "ministral", "doge", "bitnet"]
ENCODERS = ["bert", "roberta", "distilbert", "albert", "electra", "deberta-v2", "deberta", "mobilebert", "xlm-roberta",
            "camembert", "mpnet", "funnel", "convbert", "layoutlm", "megatron-bert", "squeezebert", "xlnet", "fnet",
            "roformer", "esm", "big_bird", "longformer", "ibert", "nystromformer", "data2vec-text", "ernie", "rembert",
            "canine", "modernbert"]
SEQ2SEQ = ["t5", "bart", "mbart", "pegasus", "mt5", "blenderbot"]
VISION = ["vit", "swin", "convnext", "resnet", "beit", "mobilevit", "regnet", "poolformer", "segformer", "dinov2",
          "mobilenet_v2", "convnextv2", "focalnet", "swinv2", "pvt_v2", "vit_msn", "mobilenet_v1", "hiera"]
HEADS = {**{m: "AutoModelForCausalLM" for m in CAUSAL}, **{m: "AutoModelForSequenceClassification" for m in ENCODERS},
         **{m: "AutoModelForSeq2SeqLM" for m in SEQ2SEQ}, **{m: "AutoModelForImageClassification" for m in VISION}}
EXTRA = {
    # multi-head latent attention (rope and no-rope parts of each head) and routed experts
    "deepseek_v3": dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
                        head_dim=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                        moe_intermediate_size=32, first_k_dense_replace=1),
    "deepseek_v2": dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
                        head_dim=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                        moe_intermediate_size=32, first_k_dense_replace=1),
    # hybrids: one layer of each kind in the two layers
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                  num_experts=2, mamba_d_state=8, mamba_dt_rank=8),
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"], linear_num_value_heads=4,
                       linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "recurrent_gemma": dict(block_types=["recurrent", "attention"], lru_width=32, attention_window_size=16),
    "mamba2": dict(num_heads=8, head_dim=8, n_groups=1, state_size=16, chunk_size=16, expand=2),
    "t5": dict(d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2, decoder_start_token_id=0),
    "mt5": dict(d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2),
    "distilbert": dict(n_layers=2, n_heads=2, dim=32, hidden_dim=64),
    "funnel": dict(block_sizes=[1, 1], d_head=16, d_inner=64, n_head=2, d_model=32),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "mpt": dict(d_model=32, n_heads=2, n_layers=2, expansion_ratio=2, max_seq_len=64),
    "gptj": dict(rotary_dim=8), "codegen": dict(rotary_dim=8, n_head=4, n_embd=64),
    "deberta": dict(pooler_hidden_size=32), "deberta-v2": dict(pooler_hidden_size=32),
    "squeezebert": dict(embedding_size=32, q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2,
                        intermediate_groups=2, output_groups=2),
    "longformer": dict(attention_window=[4, 4]), "big_bird": dict(attention_type="original_full"),
    "xlnet": dict(d_model=32, n_layer=2, n_head=2, d_inner=64, d_head=16),
    "rwkv": dict(attention_hidden_size=32, context_length=64),
    "esm": dict(vocab_size=100, position_embedding_type="absolute"),
    "vit": dict(image_size=32, patch_size=8), "dinov2": dict(image_size=32, patch_size=8),
    "beit": dict(image_size=32, patch_size=8), "vit_msn": dict(image_size=32, patch_size=8),
    "swin": dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4),
    "swinv2": dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4),
    "convnext": dict(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2),
    "convnextv2": dict(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2),
    "resnet": dict(hidden_sizes=[8, 16], depths=[1, 1], embedding_size=8),
    "regnet": dict(hidden_sizes=[8, 16], depths=[1, 1], embedding_size=8, groups_width=8),
    "mobilenet_v2": dict(image_size=32, depth_multiplier=0.25), "mobilenet_v1": dict(image_size=32, depth_multiplier=0.25),
    "focalnet": dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], hidden_sizes=[16, 32]),
    "pvt_v2": dict(image_size=32, hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2, sr_ratios=[2, 1],
                   num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2]),
    "hiera": dict(image_size=[32, 32], patch_size=[7, 7], patch_stride=[4, 4], patch_padding=[3, 3], embed_dim=16,
                  depths=[1, 1], num_heads=[1, 2], query_stride=[2, 2], masked_unit_size=[8, 8]),
}
for _m in ("bart", "mbart", "pegasus", "blenderbot"):
    EXTRA[_m] = dict(encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                     encoder_ffn_dim=64, decoder_ffn_dim=64, d_model=32, max_position_embeddings=64)


def make(name: str, device: str):
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.AutoConfig.for_model(name)
    for k, v in SMALL.items():
        if name in VISION and k == "vocab_size":
            continue
        if hasattr(cfg, k) or k in getattr(cfg, "attribute_map", {}):
            try:
                setattr(cfg, k, v)
            except Exception:
                pass
    if name not in VISION:
        for k in ("d_model", "n_embd", "hidden_size", "dim", "embed_dim"):
            if hasattr(cfg, k):
                try:
                    setattr(cfg, k, 32)
                except Exception:
                    pass
    for k, v in EXTRA.get(name, {}).items():
        setattr(cfg, k, v)
    for k, v in cfg.to_dict().items():     # dropout off: train and eval then agree on what runs
        if ("dropout" in k or "pdrop" in k or k.endswith("drop_rate") or k == "drop_path_rate") and isinstance(v, float):
            setattr(cfg, k, 0.0)
    if hasattr(cfg, "_attn_implementation"):
        try:
            cfg._attn_implementation = "eager"
        except Exception:
            pass
    cfg.num_labels = 3
    return getattr(transformers, HEADS[name]).from_config(cfg).to(device), cfg


def inputs(name: str, cfg, g: torch.Generator, device: str) -> dict:
    batch, seq = 2, 8
    if name in VISION:
        size = getattr(cfg, "image_size", 32)
        size = size if isinstance(size, int) else 32
        return {"pixel_values": torch.randn(batch, getattr(cfg, "num_channels", 3), size, size, generator=g).to(device),
                "labels": torch.randint(0, 3, (batch,), generator=g).to(device)}
    ids = torch.randint(1, 100, (batch, seq), generator=g).to(device)
    mask = padded_mask(batch, seq, device)
    if name in CAUSAL:
        return {"input_ids": ids, "attention_mask": mask, "labels": ids}
    if name in SEQ2SEQ:
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(1, 100, (batch, 5), generator=g).to(device)}
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 3, (batch,), generator=g).to(device)}


def padded_mask(batch: int, seq: int, device: str) -> torch.Tensor:
    """All ones but the first two positions of the first row (left padding)."""
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    mask[0, :2] = 0
    return mask


def _flat(o) -> list:
    """Every tensor of a model's output: its fields, and the keys and values of its cache."""
    if isinstance(o, torch.Tensor):
        return [o]
    if hasattr(o, "to_tuple"):
        o = o.to_tuple()
    if isinstance(o, (list, tuple)):
        return [t for x in o for t in _flat(x)]
    if hasattr(o, "self_attention_cache"):         # an encoder-decoder cache
        return _flat(o.self_attention_cache) + _flat(o.cross_attention_cache)
    if hasattr(o, "layers"):                       # a DynamicCache: per layer, keys and values
        return [t for layer in o.layers for t in _flat([getattr(layer, "keys", None), getattr(layer, "values", None)])]
    return []


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() / (1 + a.abs().max().item())


def _errors(name: str, device: str, compile_fn, res: dict, prefix: str = "") -> None:
    """Two inference calls and two training steps of a fresh model (seed 0) through
    ``compile_fn(model)``, each beside a deep copy run eagerly: ``{prefix}inf_err`` and
    ``{prefix}train_err`` in ``res`` (and ``inf_strides``, ``*_error`` where they differ)."""
    torch.manual_seed(0)
    model, cfg = make(name, device)
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    model.eval(), ref.eval()
    compiled = compile_fn(model)
    worst = 0.0
    for _ in range(2):
        inp = inputs(name, cfg, g, device)
        with torch.no_grad():
            expected, got = _flat(ref(**inp)), _flat(compiled(**inp))
        if [t.shape for t in expected] != [t.shape for t in got]:
            res[f"{prefix}inf_error"] = "outputs differ in number or shape"
            break
        for a, b in zip(expected, got):
            worst = max(worst, _rel(a.float(), b.float()) if a.is_floating_point() else float(not torch.equal(a, b)))
            if any(n > 1 and x != y for n, x, y in zip(a.shape, a.stride(), b.stride())):
                res.setdefault(f"{prefix}inf_strides", f"an output {tuple(a.shape)} laid out {b.stride()}, eager {a.stride()}")
    res[f"{prefix}inf_err"] = worst
    model.train(), ref.train()
    compiled = compile_fn(model)
    worst = 0.0
    for call in range(2):
        inp = inputs(name, cfg, g, device)
        model.zero_grad(set_to_none=True), ref.zero_grad(set_to_none=True)
        torch.manual_seed(100 + call)
        le = ref(**inp).loss
        le.backward()
        torch.manual_seed(100 + call)
        lk = compiled(**inp).loss
        lk.backward()
        worst = max(worst, _rel(le.detach(), lk.detach()))
        for (pname, p), q in zip(ref.named_parameters(), model.parameters()):
            if (p.grad is None) != (q.grad is None):
                res[f"{prefix}train_error"] = f"a gradient exists on one side only ({pname})"
            elif p.grad is not None:
                worst = max(worst, _rel(p.grad, q.grad))
    res[f"{prefix}train_err"] = worst


def run_one(name: str, backend: str, device: str, peer: bool = False) -> dict:
    import torch._dynamo

    import kiln

    res: dict = {"model": name}

    def with_kiln(model):
        kiln.reset()
        return kiln.compile(model, backend=backend)
    _errors(name, device, with_kiln, res)
    if peer:
        def with_torch(model):
            torch._dynamo.reset()
            return torch.compile(model, backend=backend)
        try:
            _errors(name, device, with_torch, res, prefix="torch_")
        except Exception as e:      # (the peer's failure is not kiln's)
            res["torch_crash"] = f"{type(e).__name__}: {str(e)[:200]}"
    torch.manual_seed(0)
    pristine, cfg = make(name, device)
    g = torch.Generator().manual_seed(2)
    for mode in ("inf", "train"):
        probe = copy.deepcopy(pristine).train(mode == "train")
        ctx = torch.no_grad() if mode == "inf" else torch.enable_grad()
        with ctx:
            ex = kiln.explain(probe)(**inputs(name, cfg, g, device))
        res[f"{mode}_kiln"] = [ex.graph_count, ex.graph_break_count]
        res[f"{mode}_reasons"] = [str(b).split("\n")[0][:160] for b in ex.break_reasons][:3]
        torch._dynamo.reset()
        with ctx:
            tex = torch._dynamo.explain(copy.deepcopy(pristine).train(mode == "train"))(**inputs(name, cfg, g, device))
        res[f"{mode}_torch"] = [tex.graph_count, tex.graph_break_count]
    return res


def warm_one(name: str, backend: str, device: str) -> dict:
    """One process of ``--warm``: an inference call and a training step through one compiled
    model, with the compile cache of $KILN_CACHE_DIR; how many frames it captured and what the
    cache served (a warm process: frame records, no capture)."""
    import kiln
    import kiln.runtime.function as call_path

    captures = []
    real = call_path.capture

    def counting(*a, **k):
        captures.append(1)
        return real(*a, **k)
    call_path.capture = counting
    torch.manual_seed(0)
    model, cfg = make(name, device)
    g = torch.Generator().manual_seed(1)
    compiled = kiln.compile(model, backend=backend)
    model.eval()
    with torch.no_grad():
        compiled(**inputs(name, cfg, g, device))
    model.train()
    compiled(**inputs(name, cfg, g, device)).loss.backward()
    stats = kiln.cache.stats()
    return {"model": name, "captures": len(captures), "frame_hits": stats["frame_hits"],
            "frame_misses": stats["frame_misses"], "graph_hits": stats["hits"], "graph_misses": stats["misses"]}


def warm_pair(name: str, backend: str, device: str, timeout: int) -> dict:
    """``--warm``: a cold process, then a warm one over the cache it filled."""
    import tempfile

    r: dict = {"model": name}
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "KILN_CACHE_DIR": d, "KILN_CACHE_FRAMES": "1"}
        for phase in ("cold", "warm"):
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name, "--backend", backend,
                                   "--device", device, "--warm"], capture_output=True, text=True, timeout=timeout,
                                  env=env)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            got = json.loads(lines[-1][7:]) if lines else {"crash": proc.stderr[-600:]}
            if "crash" in got:
                return {**r, "crash": f"{phase}: {got['crash']}"}
            r[phase] = {k: v for k, v in got.items() if k not in ("model", "backend")}
    return r


class _Counting:
    """A kiln backend that counts the graphs it compiles and compiles them with ``backend``."""

    def __init__(self, backend: str):
        from kiln.backends.registry import lookup_backend

        self.inner = lookup_backend(backend)[0]
        self.graphs = 0
        self.__name__ = f"counting {backend}"

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self.inner(gm, example_inputs)


def decode_one(name: str, backend: str, device: str, steps: int = 8) -> dict:
    """Greedy decoding with the model's own cache: kiln's tokens and graph count beside eager's
    tokens and torch.compile's graph count."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend

    import kiln

    torch.manual_seed(0)
    model, cfg = make(name, device)
    model.eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 100, (2, 8), generator=g).to(device)
    mask = padded_mask(2, 8, device)

    def greedy(m) -> torch.Tensor:
        out = m(input_ids=ids, attention_mask=mask, use_cache=True)
        am, tokens = mask, []
        for _ in range(steps):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(nxt)
            am = torch.cat([am, torch.ones_like(nxt)], dim=1)
            out = m(input_ids=nxt, attention_mask=am, past_key_values=out.past_key_values, use_cache=True)
        return torch.cat(tokens, dim=1)

    counting = _Counting(backend)
    with torch.no_grad():
        want = greedy(model)
        got = greedy(kiln.compile(model, backend=counting))
        torch._dynamo.reset()
        peer = CompileCounterWithBackend("eager")
        greedy(torch.compile(model, backend=peer))
    return {"model": name, "decode_equal": bool(torch.equal(want, got)), "decode_kiln_graphs": counting.graphs,
            "decode_torch_graphs": peer.frame_count}


def run_cell(name: str, backend: str, args) -> dict:
    """One model with one backend, in its own process (two for ``--warm``)."""
    start = time.time()
    if args.warm:
        try:
            r = warm_pair(name, backend, args.device, args.timeout)
        except subprocess.TimeoutExpired:
            r = {"model": name, "crash": f"timeout ({args.timeout} s)"}
        r["backend"], r["seconds"] = backend, round(time.time() - start, 1)
        print(json.dumps(r), flush=True)
        return r
    env = dict(os.environ)
    if args.jobs > 1:       # (each process's Inductor workers, out of the machine's cores)
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 2) // args.jobs)))
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name, "--backend", backend,
                               "--device", args.device] + (["--decode"] if args.decode else [])
                              + (["--peer"] if args.peer else []),
                              capture_output=True, text=True, timeout=args.timeout, env=env)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        r = json.loads(lines[-1][7:]) if lines else {"model": name, "crash": proc.stderr[-600:]}
    except subprocess.TimeoutExpired:
        r = {"model": name, "crash": f"timeout ({args.timeout} s)"}
    r["backend"] = backend
    r["seconds"] = round(time.time() - start, 1)
    print(json.dumps({k: v for k, v in r.items() if k != "where"}), flush=True)
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(HEADS))
    p.add_argument("--backend", default="inductor", help="comma-separated: each model runs with each")
    p.add_argument("--decode", action="store_true", help="greedy decoding with the cache instead")
    p.add_argument("--warm", action="store_true",
                   help="warm start instead: a cold and a warm process per model, frames captured in each")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--jobs", type=int, default=1, help="models run at once, each in its own process")
    p.add_argument("--peer", action="store_true", help="torch.compile's errors too, on the same checks")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.one:
        try:
            if args.decode or args.warm:
                r = (decode_one if args.decode else warm_one)(args.one, args.backend, args.device)
            else:
                r = run_one(args.one, args.backend, args.device, args.peer)
        except Exception as e:
            r = {"model": args.one, "crash": f"{type(e).__name__}: {str(e)[:300]}", "where": traceback.format_exc()[-600:]}
        r["backend"] = args.backend
        print("RESULT " + json.dumps(r))
        return 0
    if args.decode and args.models == p.get_default("models"):
        args.models = "gpt2,llama,qwen2"
    cells = [(name, backend) for name in args.models.split(",") for backend in args.backend.split(",")]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        out = list(pool.map(lambda cell: run_cell(*cell, args), cells))
    print_table(out, "decode" if args.decode else "warm" if args.warm else "peer" if args.peer else "check")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


def print_table(out: list, kind: str) -> None:
    if kind == "warm":
        head = "| model | backend | cold: captures, graph misses | warm: captures, frame hits, graph misses |"
        row = lambda r: (f"{r['cold']['captures']}, {r['cold']['graph_misses']} | "  # noqa: E731
                         f"{r['warm']['captures']}, {r['warm']['frame_hits']}, {r['warm']['graph_misses']}")
    elif kind == "decode":
        head = "| model | backend | tokens equal eager's | kiln graphs over the loop | torch.compile graphs |"
        row = lambda r: f"{r['decode_equal']} | {r['decode_kiln_graphs']} | {r['decode_torch_graphs']}"  # noqa: E731
    else:
        head = "| model | backend | inference err | training err | kiln graphs/breaks (inf, train) | torch.compile (inf, train) |"
        row = lambda r: (f"{r['inf_err']:.1e}{' (strides differ)' if r.get('inf_strides') else ''} "  # noqa: E731
                         f"| {r['train_err']:.1e} | {r['inf_kiln']}, {r['train_kiln']} "
                         f"| {r['inf_torch']}, {r['train_torch']}")
        if kind == "peer":
            head += " torch.compile err (inf, train) |"
            plain = row
            row = lambda r: plain(r) + (f" | {r['torch_crash'][:60]}" if "torch_crash" in r  # noqa: E731
                                        else f" | {r['torch_inf_err']:.1e}, {r['torch_train_err']:.1e}")
    ncols = head.count("|") - 1
    print("\n" + head)
    print("|" + "---|" * ncols)
    for r in out:
        cells = f"crash: {r['crash'][:60]}" + " |" * (ncols - 3) if "crash" in r else row(r)
        print(f"| {r['model']} | {r['backend']} | {cells} |")


if __name__ == "__main__":
    sys.exit(main())
