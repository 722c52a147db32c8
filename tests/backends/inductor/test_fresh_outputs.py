"""An output that is new memory in eager stays new memory after Inductor's graph passes: a pass
that removes a no-op (a multiply by a tensor of ones) handed the input back, and a write to
the output wrote the input."""
import pytest
import torch

import kiln


def by_one(x):
    return x.mul(torch.tensor([1])), x * 1.0 + 0


@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_no_op_removed_by_a_pass_still_returns_new_memory(requires_grad, tmp_path):
    with kiln.config.patch(cache_dir=str(tmp_path)):
        compiled = kiln.compile(by_one, backend="inductor")
        for _ in range(2):
            x = torch.randn(4, requires_grad=requires_grad)
            mine = x.detach().clone().requires_grad_(requires_grad)
            want, got = by_one(x), compiled(mine)
            for w, g in zip(want, got):
                torch.testing.assert_close(g, w)
                assert g.untyped_storage().data_ptr() != mine.untyped_storage().data_ptr()
                with torch.no_grad():
                    g.add_(10)
            torch.testing.assert_close(mine, x)
            if requires_grad:
                sum(w.sum() for w in want).backward()
                sum(g.sum() for g in got).backward()
                torch.testing.assert_close(mine.grad, x.grad)
