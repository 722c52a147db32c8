import torch, kiln, sys
sys.path.insert(0, "tests/capture")
from test_regions import FusedStack
torch.manual_seed(0)
model = FusedStack()
x = torch.randn(2, 5, 8, requires_grad=True)
ref, rc = model(x); (ref.pow(2).sum() + sum(t.sum() for kv in rc for t in kv)).backward()
want = [p.grad.clone() for p in model.parameters()]; model.zero_grad()
with kiln.config.patch(repeated_blocks=sys.argv[1] == "1"):
    out, cache = kiln.compile(model, backend="inductor")(x)
(out.pow(2).sum() + sum(t.sum() for kv in cache for t in kv)).backward()
for p, w in zip(model.parameters(), want): torch.testing.assert_close(p.grad, w)
g = torch.autograd.grad(kiln.compile(model, backend="inductor")(x)[0].sum(), [x])
print("ok")
