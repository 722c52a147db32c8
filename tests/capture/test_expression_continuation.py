"""A graph break at a call hands the call's result to the continuation, which compiles the rest
of the expression around it (kiln/capture/resume.py): the feed-forward TorchTitan writes on one
line, broken at its first projection, keeps its activation, product and second projection in
a graph, with outputs and gradients equal to eager's."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln


def logged(t):
    print("projected", tuple(t.shape), end="\r")       # a side effect: the caller breaks here
    return t


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 16)

    def forward(self, x):
        return self.w2(F.silu(logged(self.w1(x))) * self.w3(x)) + x


def test_the_rest_of_the_expression_after_a_break_is_compiled():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(sorted(str(n.target) for n in gm.graph.nodes if n.op == "call_function"))
        return gm

    torch.manual_seed(0)
    model = FeedForward()
    compiled = kiln.compile(model, backend=backend)
    for _ in range(3):
        x = torch.randn(4, 8, requires_grad=True)
        out = compiled(x)
        ref_x = x.detach().requires_grad_()
        ref = model(ref_x)
        torch.testing.assert_close(out, ref)
        grads = torch.autograd.grad(out.sum(), [x, *model.parameters()])
        ref_grads = torch.autograd.grad(ref.sum(), [ref_x, *model.parameters()])
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a, b)
    # before the break: w1; the continuation: silu, w3, the product, w2 and the residual add
    assert len(graphs) == 2, graphs
    continuation = " ".join(graphs[1])
    assert "silu" in continuation and continuation.count("linear") == 2 and "mul" in continuation \
        and "add" in continuation, graphs[1]
