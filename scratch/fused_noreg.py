import torch, kiln, sys
sys.path.insert(0, "tests/capture")
from test_regions import FusedStack
torch.manual_seed(0)
model = FusedStack()
x = torch.randn(2, 5, 8, requires_grad=True)
ref, ref_cache = model(x)
flat_ref = [t for kv in ref_cache for t in kv]
want = torch.autograd.grad(ref.pow(2).sum(), [x, *flat_ref])
with kiln.config.patch(repeated_blocks=sys.argv[1] == "1"):
    out, cache = kiln.compile(model, backend="inductor")(x)
flat = [t for kv in cache for t in kv]
got = torch.autograd.grad(out.pow(2).sum(), [x, *flat])
for a, b in zip(got, want): torch.testing.assert_close(a, b)
print("ok")
