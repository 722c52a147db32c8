import torch, kiln, sys, copy
sys.path.insert(0, ".")
from benchmarks.inductor import GPT
kiln.set_logs("cudagraphs")
torch.manual_seed(0)
m = GPT(vocab=128, d=64, layers=2, heads=4, max_seq=32).cuda()
cm = kiln.compile(m, mode="reduce-overhead")
for i in range(3):
    idx = torch.randint(0, 128, (2, 16), device="cuda")
    loss = cm(idx, idx)
    loss.backward()
    print("step", i, loss.item(), flush=True)
from kiln.cudagraphs import stats
print(stats)
