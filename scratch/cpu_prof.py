import os, sys, time, cProfile, pstats, torch, transformers
import kiln
L = int(sys.argv[1]); be = sys.argv[2]
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                               num_hidden_layers=L, vocab_size=256, max_position_embeddings=64)
m = transformers.LlamaForCausalLM(cfg)
ids = torch.randint(0, 256, (2, 32))
cm = kiln.compile(m, backend=be)
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = cm(input_ids=ids, labels=ids).loss
    loss.backward()
t = time.perf_counter()
pr = cProfile.Profile(); pr.enable(); step(); pr.disable()
print("first step", time.perf_counter() - t)
st = pstats.Stats(pr); st.sort_stats(sys.argv[3] if len(sys.argv) > 3 else "cumulative").print_stats(int(sys.argv[4]) if len(sys.argv) > 4 else 70)
for f in sys.argv[5:]:
    st.print_callees(f)
