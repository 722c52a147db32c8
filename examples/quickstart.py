"""kiln quickstart: compile a function and a module, see the graph, the guards and a recompile.

    python examples/quickstart.py
"""
import torch

import kiln
from kiln.testing import CompileCounter


def gelu_mlp(x, w1, w2, scale: float = 0.5):
    h = torch.nn.functional.gelu(x @ w1)
    return (h @ w2) * scale, {"hidden": h.shape[-1]}


counter = CompileCounter()  # a backend that counts graphs, then runs them as they are
fast = kiln.compile(gelu_mlp, backend=counter)

x, w1, w2 = torch.randn(4, 8), torch.randn(8, 16), torch.randn(16, 8)
out, info = fast(x, w1, w2)
expected, _ = gelu_mlp(x, w1, w2)
torch.testing.assert_close(out, expected)
print("same result as eager:", info, "graphs compiled:", counter.frame_count)

entry = fast.entries[0]
print("\nthe captured graph:")
print(entry.graph_module.code.strip())
print("\nthe guards that protect it:")
print(entry.describe_guards())

fast(torch.randn(4, 8), w1, w2)            # same shapes: reuses the graph
print("\nafter a call with new values, graphs compiled:", counter.frame_count)
kiln.set_logs("recompiles")
fast(torch.randn(2, 8), w1, w2, scale=2.0)  # new shape and scale: recompiles, says why
kiln.set_logs(None)
print("graphs compiled:", counter.frame_count)

# nn.Modules: the compiled module shares parameters and state_dict with the original.
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
compiled = kiln.compile(model)
torch.testing.assert_close(compiled(x), model(x))
assert compiled.state_dict().keys() == model.state_dict().keys()
print("\nnn.Module compiled; state_dict keys:", list(compiled.state_dict()))
