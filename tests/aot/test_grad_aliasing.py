"""Gradients accumulate as eager's do over several backward passes: no two leaves share one
``.grad`` (``kiln/aot/grad_aliasing.py``)."""
import copy
import operator

import pytest
import torch

import kiln
from kiln.aot.grad_aliasing import distinct


class TwoBiases(torch.nn.Module):
    """A Linear's bias and a second bias added to its output: the backward computes
    ``tangent.sum(0)`` once for both."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 4)
        self.bias2 = torch.nn.Parameter(torch.ones(4) * 0.1)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])

    def forward(self, t):
        h = torch.relu(self.lin(t)) * 0.5
        for layer in self.layers:
            h = h + layer(h)
        return (h + self.bias2) * 2


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("shape", ["one_graph", "graph_break", "segments"])
def test_gradients_accumulate_over_steps_as_eagers(backend, shape):
    torch.manual_seed(0)
    model = TwoBiases()
    reference = copy.deepcopy(model)

    def step(m, x):
        out = m(x)
        if shape == "graph_break":
            print("", end="")           # a graph break between the model and the loss
        loss = (out * torch.arange(out.numel()).reshape(out.shape)).sum()
        return (out, loss) if shape == "segments" else loss   # (the loss computed from a returned value)

    def loss_of(result):
        return result[1] if shape == "segments" else result

    compiled = kiln.compile(step, backend=backend)
    for n in (4, 4, 7, 4):
        x = torch.randn(n, 2, requires_grad=True)
        loss_of(compiled(model, x)).backward()
        loss_of(step(reference, x.detach().requires_grad_())).backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=f"{name}.grad after n={n}")
    grads = [p.grad for p in model.parameters()]
    assert len({g.untyped_storage().data_ptr() for g in grads}) == len(grads)


def test_adamw_steps_match_eager():
    torch.manual_seed(0)
    model = TwoBiases()
    reference = copy.deepcopy(model)
    opt, ref_opt = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, reference))
    compiled = kiln.compile(model, backend="aot_eager")
    for _ in range(4):
        x = torch.randn(8, 2)
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
        opt.step()
        ref_opt.step()          # (no zero_grad: gradients accumulate across steps, as eager's)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_distinct_copies_only_what_overlaps():
    base = torch.arange(12.0)
    a, b = base[:6], base[6:]            # a cat's gradients: views of one buffer, apart
    same = torch.ones(3)
    out = distinct([a, b, same, same, base[4:8], None])
    assert out[0] is a and out[1] is b and out[2] is same
    assert out[3] is not same and torch.equal(out[3], same)
    assert out[4].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert out[5] is None


def _graph(body):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    outs = body(g, x)
    g.output(tuple(outs))
    return g


aten = torch.ops.aten


@pytest.mark.parametrize("body, alias", [
    (lambda g, x: [g.call_function(aten.sin.default, (x,)), g.call_function(aten.cos.default, (x,))], False),
    (lambda g, x: [(s := g.call_function(aten.sum.dim_IntList, (x, [0]))), s], True),
    (lambda g, x: [(s := g.call_function(aten.mul.Tensor, (x, 2))), g.call_function(aten.view.default, (s, [-1]))], True),
    (lambda g, x: [g.call_function(operator.getitem, (g.call_function(aten.split.Tensor, (x, 2)), i)) for i in (0, 1)], True),
    (lambda g, x: [g.call_function(operator.getitem, (g.call_function(aten.native_layer_norm.default,
                                                                      (x, [4], None, None, 1e-5)), i)) for i in (0, 1)], False),
], ids=["distinct", "same_node", "view_of_another", "split_items", "items_of_new_tensors"])
def test_outputs_may_share_memory(body, alias):
    from kiln.aot.grad_aliasing import outputs_may_share_memory

    assert outputs_may_share_memory(_graph(body)) is alias
