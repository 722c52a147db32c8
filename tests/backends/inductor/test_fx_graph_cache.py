"""Inductor's FX graph cache holds kiln's graphs under keys that do not depend on the process
or on what was compiled before: a graph compiled again (another process, a cleared kiln cache,
another compile order) is read back from it instead of being lowered again. Repeated blocks
included, whose graphs carry kiln's bookkeeping in their ``meta``, which Inductor hashes."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import kiln


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def _train_once(model, x):
    compiled = kiln.compile(model, backend="inductor")
    loss = compiled(x)
    loss.backward()
    return loss


def _fx_hits() -> int:
    return counters["inductor"]["fxgraph_cache_hit"]


@pytest.mark.parametrize("blocks", [False, True], ids=["inlined", "repeated_blocks"])
def test_a_graph_compiled_again_is_read_from_inductors_cache(blocks, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    torch.manual_seed(0)
    model = Stack()
    x = torch.randn(4, 8)
    with kiln.config.patch(repeated_blocks=blocks):
        first = _train_once(model, x)
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        # a new compile of the same program: kiln's own cache emptied, its state reset
        kiln.reset()
        kiln.cache.clear()
        before = _fx_hits()
        again = _train_once(model, x)
    assert _fx_hits() - before == 2          # the forward and the backward, not lowered again
    compiled_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(x)                      # eager
    expected.backward()
    for got in (first, again):
        torch.testing.assert_close(got, expected)
    for p, g_first, g_again in zip(model.parameters(), grads, compiled_grads):
        torch.testing.assert_close(g_first, p.grad)
        torch.testing.assert_close(g_again, p.grad)
