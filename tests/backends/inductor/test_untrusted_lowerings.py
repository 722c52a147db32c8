"""Ops whose Inductor lowering gives wrong values (torch.compile's too): the graph holding one
runs as ATen ops, with a warning naming the reason, and its values are eager's."""
import contextlib

import pytest
import torch
import torch.nn.functional as F

import kiln


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_average_pooling_whose_last_window_overhangs_gets_eagers_gradient(dims, tmp_path):
    pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[dims]

    def f(x):
        return pool(x, 2, 2, 0, ceil_mode=True, count_include_pad=True).sin()

    with kiln.config.patch(cache_dir=str(tmp_path)):
        compiled = kiln.compile(f, backend="inductor")
        for n in (7, 9):
            x = torch.randn(1, 2, *[n] * dims, requires_grad=True)
            mine = x.detach().clone().requires_grad_()
            want = torch.autograd.grad(f(x).sum(), x)[0]
            with pytest.warns(RuntimeWarning, match="overhangs") if n == 7 else contextlib.nullcontext():
                got = torch.autograd.grad(compiled(mine).sum(), mine)[0]
            torch.testing.assert_close(got, want)

