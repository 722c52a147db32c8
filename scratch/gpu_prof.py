import os, sys, time, cProfile, pstats, torch, transformers
import kiln
L = int(sys.argv[1])
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4,
                               num_hidden_layers=L, vocab_size=32000, max_position_embeddings=1024)
m = transformers.LlamaForCausalLM(cfg).cuda()
ids = torch.randint(0, 32000, (4, 512), device="cuda")
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
cm = kiln.compile(m)
def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = cm(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
t = time.perf_counter()
pr = cProfile.Profile(); pr.enable(); step(); torch.cuda.synchronize(); pr.disable()
print("first step", time.perf_counter() - t)
st = pstats.Stats(pr); st.sort_stats("cumulative").print_stats("kiln/", 60)
