import os, sys, time, torch
import kiln
from transformers import LlamaConfig, LlamaForCausalLM
L = int(sys.argv[1]); be = sys.argv[2] if len(sys.argv) > 2 else "inductor"
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=L, vocab_size=256, max_position_embeddings=64)
m = LlamaForCausalLM(cfg)
opt = torch.optim.AdamW(m.parameters())
ids = torch.randint(0, 256, (2, 32))
cm = kiln.compile(m, backend=be)
t = time.perf_counter()
out = cm(input_ids=ids, labels=ids)
t1 = time.perf_counter()
out.loss.backward()
t2 = time.perf_counter()
print(f"L={L} fwd {t1-t:.2f}s bwd {t2-t1:.2f}s")
