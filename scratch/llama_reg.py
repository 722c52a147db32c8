import os, sys, time, torch
import kiln
from transformers import LlamaConfig, LlamaForCausalLM
L = int(sys.argv[1]); be = sys.argv[2] if len(sys.argv) > 2 else "inductor"
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=L, vocab_size=256, max_position_embeddings=64)
m = LlamaForCausalLM(cfg)
ids = torch.randint(0, 256, (2, 32))
UC = os.environ.get("UC", "1") == "1"
out = m(input_ids=ids, labels=ids, use_cache=UC); out.loss.backward()
ref = {n: p.grad.clone() for n, p in m.named_parameters()}; m.zero_grad()
cm = kiln.compile(m, backend=be)
t = time.perf_counter()
out2 = cm(input_ids=ids, labels=ids, use_cache=UC)
t1 = time.perf_counter()
out2.loss.backward()
t2 = time.perf_counter()
print(f"L={L} fwd {t1-t:.2f}s bwd {t2-t1:.2f}s loss", torch.allclose(out.loss, out2.loss, atol=1e-5),
      "grads", max((p.grad - ref[n]).abs().max().item() for n, p in m.named_parameters()))
if UC: print("cache", type(out2.past_key_values).__name__, all(torch.allclose(a, b, atol=1e-5) for a, b in zip(out.past_key_values.layers[0].keys.flatten(), out2.past_key_values.layers[0].keys.flatten())) if hasattr(out2.past_key_values, "layers") else None)
for n, p in m.named_parameters():
    d = (p.grad - ref[n]).abs().max().item()
    if d > 1e-4: print("BAD", n, d)
