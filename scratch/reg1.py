import os, torch, kiln
torch.manual_seed(0)
class Blk(torch.nn.Module):
    def __init__(s): super().__init__(); s.l = torch.nn.Linear(8,8); s.n = torch.nn.LayerNorm(8)
    def forward(s, x): return x + torch.relu(s.l(s.n(x)))
class M(torch.nn.Module):
    def __init__(s): super().__init__(); s.layers = torch.nn.ModuleList([Blk() for _ in range(4)])
    def forward(s, x):
        for l in s.layers: x = l(x)
        return x.sum()
be = os.environ.get("BE", "aot_eager")
m = M(); x = torch.randn(3, 8, requires_grad=True)
ref = m(x); ref.backward(); gref = [p.grad.clone() for p in m.parameters()]; xg = x.grad.clone()
m.zero_grad(); x.grad = None
cm = kiln.compile(m, backend=be)
out = cm(x); out.backward()
print("out", torch.allclose(out, ref), "grads", all(torch.allclose(p.grad, g, atol=1e-5) for p, g in zip(m.parameters(), gref)), torch.allclose(x.grad, xg, atol=1e-5))
with torch.no_grad():
    print("nograd", torch.allclose(cm(x), m(x)))
print(kiln.explain(m)(x))
