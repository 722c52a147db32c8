import torch, kiln, transformers, sys
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, vocab_size=256)
m = transformers.LlamaForCausalLM(cfg)
if sys.argv[1] == "ckpt":
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
m.train()
ids = torch.randint(0, 256, (2, 128))
from kiln.backends.registry import lookup_backend
inner, _ = lookup_backend("inductor")
def be(gm, ex):
    out = inner(gm, ex)
    t = out.as_text() if hasattr(out, "as_text") else None
    if t: print([l for l in t.splitlines() if l.startswith("# saved")])
    else: print(type(out), [a for a in dir(out) if "saved" in a or "text" in a][:10])
    return out
c = kiln.compile(m, backend=be)
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = c(input_ids=ids, labels=ids).loss
print(kiln.explain(m) if False else "")
