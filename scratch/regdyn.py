import torch, kiln, sys
sys.path.insert(0, "tests/capture")
from test_regions import Stack, Block, KVStack
torch.manual_seed(0)
be = sys.argv[1]
with kiln.config.patch(repeated_blocks=True):
    m = Stack([Block() for _ in range(3)])
    c = kiln.compile(m, backend=be, dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 8, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        out = c(x); ref = m(x2)
        out.sum().backward(); ref.sum().backward()
        torch.testing.assert_close(out, ref); torch.testing.assert_close(x.grad, x2.grad)
    m2 = KVStack()
    c2 = kiln.compile(m2, backend=be)     # automatic dynamic
    for n in (5, 6, 9):
        x = torch.randn(n, 8)
        out, cache = c2(x); ref, rc = m2(x)
        torch.testing.assert_close(out, ref)
        g = torch.autograd.grad(out.sum(), cache); gr = torch.autograd.grad(ref.sum(), rc)
        for a, b in zip(g, gr): torch.testing.assert_close(a, b)
print("ok")
