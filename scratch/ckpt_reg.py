import torch, kiln, transformers, sys
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, vocab_size=512, attention_dropout=float(sys.argv[3]))
m = transformers.LlamaForCausalLM(cfg)
m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
ids = torch.randint(0, 512, (2, 64))
torch.manual_seed(1); ref = m(input_ids=ids, labels=ids).loss; ref.backward()
want = {n: p.grad.clone() for n, p in m.named_parameters()}; m.zero_grad()
from kiln.backends.registry import lookup_backend
inner, _ = lookup_backend(sys.argv[1])
def be(gm, ex):
    out = inner(gm, ex)
    t = out.as_text() if hasattr(out, "as_text") else ""
    print([l[:160] for l in t.splitlines() if l.startswith("# saved")])
    return out
be.kiln_regions = True
with kiln.config.patch(repeated_blocks=sys.argv[2] == "1"):
    c = kiln.compile(m, backend=be); torch.manual_seed(1); loss = c(input_ids=ids, labels=ids).loss
loss.backward()
torch.testing.assert_close(loss, ref)
print("max grad diff", max((p.grad - want[n]).abs().max().item() for n, p in m.named_parameters()))
