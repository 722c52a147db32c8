"""Graphs and graph breaks of Hugging Face models under kiln, beside torch.compile.

For GPT-2 (GPT2LMHeadModel), BERT (BertModel) and Llama (LlamaForCausalLM), built from tiny
configs with random weights (nothing is downloaded), in inference (``model.eval()``, no grad)
and in training (``model.train()`` with dropout 0, grad enabled, labels for the LM heads), it
runs ``kiln.explain(model)`` and ``torch._dynamo.explain(model)`` on the same call and prints
graph count, break count and the break reasons (shortened) side by side.

    python benchmarks/models_explain.py [--models gpt2,bert,llama] [--modes inference,training]
                                        [--attn eager|sdpa] [--json out.json] [--verbose]

Needs ``pip install transformers``.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import warnings

import torch

import kiln

BATCH, SEQ, VOCAB = 2, 8, 100


def make_model(name: str, attn: str = "eager") -> torch.nn.Module:
    """A tiny randomly initialised model; dropout probabilities 0 (train/eval agree)."""
    import transformers
    from transformers import (BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM)

    transformers.logging.set_verbosity_error()
    if name == "gpt2":
        cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=64,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                         bos_token_id=0, eos_token_id=0, attn_implementation=attn)
        return GPT2LMHeadModel(cfg)
    if name == "bert":
        cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, use_cache=False,
                         attn_implementation=attn)
        return BertModel(cfg)
    if name == "llama":
        cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                          max_position_embeddings=64, use_cache=False, bos_token_id=0,
                          eos_token_id=0, pad_token_id=0, attn_implementation=attn)
        return LlamaForCausalLM(cfg)
    raise ValueError(f"unknown model {name!r}")


def call_args(name: str, mode: str, input_ids: torch.Tensor) -> tuple[tuple, dict]:
    """The arguments of the model call: LM heads get labels in training (loss in forward)."""
    kwargs = {"return_dict": True}
    if mode == "training" and name != "bert":
        kwargs["labels"] = input_ids
    return (input_ids,), kwargs


def prepare(model: torch.nn.Module, mode: str) -> contextlib.AbstractContextManager:
    if mode == "inference":
        model.eval()
        return torch.no_grad()
    model.train()
    return contextlib.nullcontext()


def short(text: str, width: int = 70) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _where(filename, lineno) -> str:
    if not filename:
        return "?"
    parts = filename.replace("\\", "/").split("/")
    if "transformers" in parts:
        parts = parts[parts.index("transformers"):]
    else:
        parts = parts[-2:]
    return f"{'/'.join(parts)}:{lineno}"


def kiln_explain(model, args, kwargs) -> dict:
    ex = kiln.explain(model)(*args, **kwargs)
    reasons = [{"reason": b.reason, "kind": b.kind, "where": _where(b.filename, b.lineno),
                "line": (b.source_line or "").strip()} for b in ex.break_reasons]
    return {"graph_count": ex.graph_count, "break_count": ex.graph_break_count,
            "ops_per_graph": ex.ops_per_graph, "reasons": reasons}


def dynamo_explain(model, args, kwargs) -> dict:
    import torch._dynamo

    torch._dynamo.reset()
    ex = torch._dynamo.explain(model)(*args, **kwargs)
    reasons = []
    for b in ex.break_reasons:
        frame = b.user_stack[-1] if b.user_stack else None
        reasons.append({"reason": b.reason, "kind": "graph break",
                        "where": _where(frame.filename, frame.lineno) if frame else "?",
                        "line": (frame.line or "").strip() if frame else ""})
    torch._dynamo.reset()
    return {"graph_count": ex.graph_count, "break_count": ex.graph_break_count,
            "ops_per_graph": [sum(1 for n in g.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
                              for g in ex.graphs], "reasons": reasons}


def run(models, modes, attn: str) -> list[dict]:
    rows = []
    for name in models:
        for mode in modes:
            torch.manual_seed(0)
            model = make_model(name, attn)
            input_ids = torch.randint(0, VOCAB, (BATCH, SEQ))
            args, kwargs = call_args(name, mode, input_ids)
            with prepare(model, mode), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                k = kiln_explain(model, args, kwargs)
                d = dynamo_explain(model, args, kwargs)
            rows.append({"model": name, "mode": mode, "kiln": k, "torch.compile": d})
    return rows


def _grouped(reasons: list[dict]) -> list[tuple[int, dict]]:
    counts = collections.Counter()
    first = {}
    for r in reasons:
        key = (r["kind"], r["reason"], r["where"])
        counts[key] += 1
        first.setdefault(key, r)
    return [(n, first[key]) for key, n in counts.items()]


def print_table(rows: list[dict], verbose: bool = False, out=sys.stdout) -> None:
    head = f"{'model':<7} {'mode':<10} | {'kiln graphs':>11} {'breaks':>6} | {'torch.compile graphs':>20} {'breaks':>6}"
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        k, d = r["kiln"], r["torch.compile"]
        print(f"{r['model']:<7} {r['mode']:<10} | {k['graph_count']:>11} {k['break_count']:>6} | "
              f"{d['graph_count']:>20} {d['break_count']:>6}", file=out)
    for r in rows:
        for who in ("kiln", "torch.compile"):
            reasons = r[who]["reasons"]
            if not reasons:
                continue
            print(f"\n{r['model']} {r['mode']}: {who} break reasons", file=out)
            for n, b in _grouped(reasons):
                tag = "" if b["kind"] == "graph break" else f"[{b['kind']}] "
                print(f"  {n}x {tag}{short(b['reason'], 200 if verbose else 80)}", file=out)
                print(f"       at {b['where']}" + (f": {short(b['line'], 60)}" if b["line"] else ""), file=out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2,bert,llama")
    p.add_argument("--modes", default="inference,training")
    p.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    p.add_argument("--json", default=None, help="write the rows as JSON to this path")
    p.add_argument("--verbose", action="store_true", help="longer break reasons")
    a = p.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print("models_explain.py needs `pip install transformers`", file=sys.stderr)
        return 2
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    rows = run(a.models.split(","), a.modes.split(","), a.attn)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, attn_implementation={a.attn}\n")
    print_table(rows, a.verbose)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                       "attn_implementation": a.attn, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
