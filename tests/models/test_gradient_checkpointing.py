"""Hugging Face decoders with ``gradient_checkpointing_enable()`` in training: kiln captures
the checkpointed layers as recompute regions, in no more graphs than torch.compile, and the
loss and every gradient match eager's (HF turns the cache off itself under checkpointing)."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import kiln
from kiln.testing import CompileCounter

transformers = pytest.importorskip("transformers")

VOCAB = 100


def make_model(name: str) -> torch.nn.Module:
    transformers.logging.set_verbosity_error()
    if name == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="eager")
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
            bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")
        model = transformers.LlamaForCausalLM(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # (renamed activation_checkpointing_enable)
        model.gradient_checkpointing_enable()
    return model.train()


def _torch_compile_graph_count(model, ids) -> int:
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter as DynamoCounter

    torch._dynamo.reset()
    counter = DynamoCounter()
    try:
        torch.compile(model, backend=counter)(input_ids=ids, labels=ids).loss.backward()
    finally:
        torch._dynamo.reset()
    return counter.frame_count


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_gradient_checkpointing_matches_eager(name):
    model = make_model(name)
    ref = copy.deepcopy(model)
    peer = copy.deepcopy(model)
    cc = CompileCounter()
    compiled = kiln.compile(model, backend="aot_eager")
    for step in range(2):
        ids = torch.randint(0, VOCAB, (2, 8))
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        expected = ref(input_ids=ids, labels=ids).loss
        expected.backward()
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            assert (p.grad is None) == (q.grad is None), n
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=n)

    kiln.reset()
    kiln.compile(model, backend=cc)(input_ids=ids, labels=ids)
    regions = {n.meta.get("ac_graph_id") for g in cc.graphs for n in g.graph.nodes} - {None}
    assert len(regions) == 2            # one per decoder layer
    assert cc.frame_count <= _torch_compile_graph_count(peer, ids)
