import os, torch, kiln, torch.nn.functional as F
torch.manual_seed(0)
V = os.environ.get("V", "mlp")
class Blk(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.q = torch.nn.Linear(16,16,bias=False); s.k = torch.nn.Linear(16,16,bias=False); s.v = torch.nn.Linear(16,16,bias=False)
        s.w = torch.nn.Parameter(torch.ones(16))
    def forward(s, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * s.w
        if V == "mlp":
            return x + s.v(F.silu(s.q(h)) * s.k(h))
        B, T, C = h.shape
        q = s.q(h).view(B, T, 4, 4).transpose(1, 2); k = s.k(h).view(B, T, 4, 4).transpose(1, 2); v = s.v(h).view(B, T, 4, 4).transpose(1, 2)
        if V == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        return x + a.transpose(1, 2).reshape(B, T, C)
class M(torch.nn.Module):
    def __init__(s): super().__init__(); s.layers = torch.nn.ModuleList([Blk() for _ in range(2)])
    def forward(s, x):
        for l in s.layers: x = l(x)
        return x.pow(2).sum()
be = os.environ.get("BE", "inductor")
m = M(); x = torch.randn(2, 8, 16, requires_grad=True)
ref = m(x); ref.backward(); gref = [p.grad.clone() for p in m.parameters()]; xg = x.grad.clone()
m.zero_grad(); x.grad = None
cm = kiln.compile(m, backend=be)
out = cm(x); out.backward()
print(V, "out", torch.allclose(out, ref), [round((p.grad - g).abs().max().item(), 5) for p, g in zip(m.parameters(), gref)], (x.grad - xg).abs().max().item())
