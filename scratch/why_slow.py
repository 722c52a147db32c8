import torch, kiln
from kiln.aot import partial as P
orig = P.inputs_read
P.inputs_read = lambda *a: (print("SLOW"), orig(*a))[1]
o2 = P.inputs_read_per_set
def w(backward, nt, givens, ns):
    g = backward.graph
    bad = [n for n in g.nodes if n.op in ("placeholder","call_function") and not isinstance(n.meta.get("val"), torch.Tensor)]
    print("no tensor val:", [(n.name, type(n.meta.get("val")).__name__) for n in bad][:8])
    return o2(backward, nt, givens, ns)
P.inputs_read_per_set = w
import transformers
cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, vocab_size=256)
m = transformers.LlamaForCausalLM(cfg); ids = torch.randint(0, 256, (2, 16))
with torch.autocast("cpu", dtype=torch.bfloat16):
    l = kiln.compile(m, backend="aot_eager")(input_ids=ids, labels=ids).loss
