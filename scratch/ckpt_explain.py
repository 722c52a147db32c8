import torch, kiln, transformers
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=256)
m = transformers.LlamaForCausalLM(cfg)
m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
ids = torch.randint(0, 256, (2, 16))
with torch.autocast("cpu", dtype=torch.bfloat16):
    r = kiln.explain(m)(input_ids=ids, labels=ids)
print(str(r)[:200]); print([l for l in str(r).splitlines() if "reak" in l][:10])
