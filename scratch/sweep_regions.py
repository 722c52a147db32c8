import torch, kiln, transformers as T, sys, traceback
torch.manual_seed(0)
def small(cfg_cls, **kw):
    return cfg_cls(**kw)
MODELS = {
 "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_embd=64, n_layer=3, n_head=4, vocab_size=256, n_positions=64)),
 "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)),
 "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)),
 "opt": lambda: T.OPTForCausalLM(T.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=3, num_attention_heads=4, vocab_size=256, word_embed_proj_dim=64)),
 "bert": lambda: T.BertForMaskedLM(T.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, vocab_size=256)),
 "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256, d_kv=16, decoder_start_token_id=0, pad_token_id=0)),
 "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=256, pad_token_id=0)),
}
be = sys.argv[1]
names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(MODELS)
for name in names:
    try:
        m = MODELS[name](); m.eval()   # eval: no dropout, for exact comparison
        ids = torch.randint(1, 256, (2, 16))
        kw = dict(input_ids=ids, labels=ids)
        if name == "t5": kw = dict(input_ids=ids, labels=ids[:, :8].contiguous())
        ref = m(**kw); ref.loss.backward()
        want = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}; m.zero_grad()
        import io, contextlib, logging
        kiln.reset()
        with kiln.config.patch(repeated_blocks=True):
            out = kiln.compile(m, backend=be)(**kw)
        out.loss.backward()
        diff = max((p.grad - want[n]).abs().max().item() for n, p in m.named_parameters() if n in want)
        print(f"{name}: loss {'ok' if torch.allclose(out.loss, ref.loss, atol=1e-5) else 'BAD'} grad diff {diff:.2e}", flush=True)
    except Exception as e:
        print(f"{name}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True); traceback.print_exc()
