import torch, kiln
from kiln.capture.values import objects
orig = objects.NNModuleValue.call
def call(self, tx, args, kwargs):
    print(type(self.value).__name__, repr(self.source), type(self.source).__name__)
    return orig(self, tx, args, kwargs)
objects.NNModuleValue.call = call
class Blk(torch.nn.Module):
    def __init__(s): super().__init__(); s.l = torch.nn.Linear(4,4)
    def forward(s, x): return torch.relu(s.l(x))
class M(torch.nn.Module):
    def __init__(s): super().__init__(); s.layers = torch.nn.ModuleList([Blk() for _ in range(3)]); s.seq = torch.nn.Sequential(Blk(), Blk())
    def forward(s, x):
        for l in s.layers: x = l(x)
        x = s.layers[1](x)
        return s.seq(x)
kiln.compile(M(), backend="eager")(torch.randn(2,4))
