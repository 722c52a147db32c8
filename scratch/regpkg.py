import torch, kiln, sys, os
sys.path.insert(0,'tests/capture')
from test_regions import Stack, Block, check_training
torch.manual_seed(0)
m = Stack([Block() for _ in range(4)])
if sys.argv[1] == "save":
    c = kiln.compile(m, backend="inductor")
    check_training(m, c, torch.randn(3, 8))
    print(c.save_package("/tmp/reg.kpkg"))
else:
    c = kiln.load_package("/tmp/reg.kpkg", m, on_miss="error")
    check_training(m, c, torch.randn(3, 8))
    print("loaded ok", kiln.cache.stats())
