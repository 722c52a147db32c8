import torch, kiln, transformers, sys
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=8000)
m = transformers.LlamaForCausalLM(cfg)
if sys.argv[1] == "ckpt":
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
ids = torch.randint(0, 8000, (2, 256))
from kiln.backends.registry import lookup_backend
inner, _ = lookup_backend("inductor")
def be(gm, ex):
    out = inner(gm, ex)
    fw = out.parts.forward
    nfw = out.parts.num_fw_outputs
    outs = list(fw.graph.find_nodes(op="output"))[0].args[0]
    rows = []
    for o in outs[nfw:]:
        v = o.meta.get("val")
        if isinstance(v, torch.Tensor) and o.op != "placeholder":
            rows.append((v.numel() * v.element_size() / 2**20, o.name, tuple(v.shape), str(v.dtype)))
    rows.sort(reverse=True)
    print("saved activations MiB", round(sum(r[0] for r in rows), 2))
    for r in rows[:12]: print("  ", round(r[0], 2), r[1:])
    return out
c = kiln.compile(m, backend=be)
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = c(input_ids=ids, labels=ids).loss
