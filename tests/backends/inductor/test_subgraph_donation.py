"""A backward whose graph calls subgraphs (a cond's branches, a scan's body) reuses none of
its saved tensors' memory: Inductor lowers each subgraph with its parent's donated input
positions, and would write a gradient into the subgraph's own input there, a parameter the
branch closes over among them."""
import torch

import kiln


class CondOverParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        y = x * 2
        return torch.cond(x.sum() > 0, lambda: (y + 1) * self.p, lambda: y / 2, ())


def test_a_cond_branch_closing_over_a_parameter_leaves_it_intact(tmp_path):
    torch.manual_seed(0)
    model = CondOverParameter()
    before = model.p.detach().clone()
    with kiln.config.patch(cache_dir=str(tmp_path)):
        compiled = kiln.compile(model, backend="inductor")
        for x in (torch.ones(4), -torch.ones(4), torch.rand(4)):
            x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
            want = torch.autograd.grad((model(x1) * 1.5).sum(), (x1, model.p))
            got = torch.autograd.grad((compiled(x2) * 1.5).sum(), (x2, model.p))
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
            assert got[0] is not model.p and got[1] is not model.p
            assert torch.equal(model.p.detach(), before)
