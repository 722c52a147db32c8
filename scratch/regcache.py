import torch, kiln, sys
sys.path.insert(0,'tests/capture')
from test_regions import Stack, Block, check_training
torch.manual_seed(0)
m = Stack([Block() for _ in range(4)])
check_training(m, kiln.compile(m, backend=sys.argv[1]), torch.randn(3, 8))
print(kiln.cache.stats())
