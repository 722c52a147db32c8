import torch, transformers, sys
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=8000)
m = transformers.LlamaForCausalLM(cfg)
m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
ids = torch.randint(0, 8000, (2, 256))
def fw(gm, ex):
    outs = list(gm.graph.find_nodes(op="output"))[0].args[0]
    rows = []
    for o in outs:
        v = o.meta.get("val")
        if isinstance(v, torch.Tensor) and o.op != "placeholder":
            rows.append((v.numel() * v.element_size() / 2**20, o.name, tuple(v.shape), str(v.dtype)))
    rows.sort(reverse=True)
    print("fw outputs (incl saved) MiB", round(sum(r[0] for r in rows), 2))
    for r in rows[:12]: print("  ", round(r[0], 2), r[1:])
    return gm.forward
def be(gm, ex):
    return aot_module_simplified(gm, ex, fw_compiler=fw, bw_compiler=lambda g, e: g.forward,
                                 partition_fn=min_cut_rematerialization_partition)
c = torch.compile(m, backend=be)
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = c(input_ids=ids, labels=ids).loss
