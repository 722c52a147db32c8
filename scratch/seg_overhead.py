import torch, kiln, transformers, time, sys, cProfile, pstats
torch.manual_seed(0)
L = int(sys.argv[1]); uc = sys.argv[2] == "1"
cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=L, vocab_size=128)
m = transformers.LlamaForCausalLM(cfg)
ids = torch.randint(0, 128, (1, 8))
c = kiln.compile(m, backend="aot_eager")
def step():
    loss = c(input_ids=ids, labels=ids, use_cache=uc).loss
    loss.backward()
for _ in range(3): step()
ts = []
for _ in range(30):
    t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
ts.sort(); print(f"L={L} cache={uc} step {ts[len(ts)//2]*1e3:.2f} ms")
if len(sys.argv) > 3:
    pr = cProfile.Profile(); pr.enable()
    for _ in range(10): step()
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(25)
