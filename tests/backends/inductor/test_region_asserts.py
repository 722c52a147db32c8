"""Repeated blocks under Inductor: a block whose every call passes operands of the layout it
was lowered for is generated without input asserts, since the caller's code already gives its
operands those strides; the graph's own inputs keep theirs, and so does a block called with
other layouts. Values and gradients stay eager's."""
import re

import torch
import torch.nn.functional as F

import kiln
from kiln import _torch
from kiln.aot import regions


class Block(torch.nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.norm = torch.nn.Parameter(torch.ones(d))
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm
        return x + self.down(F.silu(self.up(h)))


class Stack(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _functions(source: str) -> dict:
    """Each top-level ``def NAME(args)`` of a generated module, and the ``call`` method, by name."""
    bodies, name = {}, None
    for line in source.splitlines():
        m = re.match(r"(?:def (\w+)\(args\)|    def (call)\(self, args\))", line)
        if m:
            name = m.group(1) or m.group(2)
            bodies[name] = []
        elif name and line and not line.startswith(" "):
            name = None
        elif name:
            bodies[name].append(line)
    return {k: "\n".join(v) for k, v in bodies.items()}


def test_blocks_called_with_their_own_layouts_skip_input_asserts(monkeypatch, tmp_path):
    sources = []
    real = _torch.inductor_generated_code

    def spy(compiled):
        code = real(compiled)
        if code is not None:
            sources.append(code["source_code"])
        return code

    monkeypatch.setattr(_torch, "inductor_generated_code", spy)
    torch.manual_seed(0)
    model = Stack(4)
    params = list(model.parameters())
    with kiln.config.patch(repeated_blocks=True, cache_dir=str(tmp_path)):
        compiled = kiln.compile(model)
        for _ in range(2):
            x = torch.randn(6, 8, requires_grad=True)
            want = torch.autograd.grad(model(x).pow(2).sum(), [x, *params])
            got = torch.autograd.grad(compiled(x).pow(2).sum(), [x, *params])
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
    assert len(sources) == 2            # the forward and the backward
    for source in sources:
        functions = _functions(source)
        blocks = [name for name in functions if name.startswith(regions.UNCHECKED_INPUTS_PREFIX)]
        assert blocks, "the block is lowered as a subgraph function"
        for name in blocks:
            assert "assert_size_stride(" not in functions[name], name
            assert source.count(f"= {name}(") == 4
        assert "assert_size_stride(" in functions["call"]       # the graph's own inputs


def test_only_blocks_whose_calls_agree_on_layouts_lose_their_asserts():
    def block():
        g = torch.fx.Graph()
        g.output((g.call_function(torch.neg, (g.placeholder("x"),)),))
        return torch.fx.GraphModule(torch.nn.Module(), g)

    root = torch.nn.Module()
    root.kiln_same, root.kiln_other = block(), block()
    graph = torch.fx.Graph()
    same, other = graph.get_attr("kiln_same"), graph.get_attr("kiln_other")
    a, b = graph.placeholder("a"), graph.placeholder("b")
    a.meta["val"] = torch.empty(4, 6)
    b.meta["val"] = torch.empty(6, 4).t()       # the same size, other strides
    outs = [graph.call_function(regions.invoke_region, (blk, x)) for blk, x in
            ((same, a), (same, a), (other, a), (other, b))]
    graph.output(tuple(outs))
    gm = torch.fx.GraphModule(root, graph)
    regions.to_inductor(gm)
    names = {n.args[0].target for n in gm.graph.nodes if n.op == "call_function"}
    assert names == {regions.UNCHECKED_INPUTS_PREFIX + "same", "kiln_other"}
    assert not hasattr(gm, "kiln_same")
