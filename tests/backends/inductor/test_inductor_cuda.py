"""backend="inductor" on CUDA (Triton kernels): the checks of test_inductor.py that differ on a
GPU (random numbers, layouts, alignment), against eager. Skipped without CUDA (CI); run on
the GPU machine with ``python -m pytest tests/backends/inductor/test_inductor_cuda.py``."""
from __future__ import annotations

import copy

import pytest
import torch

import kiln
from kiln.backends import lookup_backend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


def test_dropout_same_seed_same_mask_as_eager():
    def f(x):
        return torch.nn.functional.dropout(x.sin(), 0.5, True) * 3

    compiled = kiln.compile(f, backend="inductor")
    x = torch.randn(256, 256, device=DEV, requires_grad=True)
    for seed in (1, 2):
        torch.manual_seed(seed)
        e = f(x)
        (ge,) = torch.autograd.grad(e.sum(), x)
        torch.manual_seed(seed)
        a = compiled(x)
        (ga,) = torch.autograd.grad(a.sum(), x)
        assert torch.equal(a == 0, e == 0) and torch.equal(ga == 0, ge == 0)
        close(a, e)
        close(ga, ge)


def test_batchnorm_running_stats_and_grads():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).to(DEV)
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="inductor")
    for _ in range(2):
        x = torch.randn(4, 3, 16, 16, device=DEV)
        out, out_e = compiled(x), eager(x)
        close(out, out_e, 1e-4)
        close(model[1].running_mean, eager[1].running_mean)
        close(model[1].running_var, eager[1].running_var)
        out.sum().backward()
        out_e.sum().backward()
    for p, pe in zip(model.parameters(), eager.parameters()):
        close(p.grad, pe.grad, 1e-3)


def test_input_mutation_and_output_aliases():
    def f(x, buf):
        buf.mul_(2).add_(x)
        return x.view(-1), x.t(), (x * buf).sum(0)

    compiled = kiln.compile(f, backend="inductor")
    x, buf = torch.randn(3, 4, device=DEV), torch.randn(3, 4, device=DEV)
    buf_e = buf.clone()
    flat, t, s = compiled(x, buf)
    _, t_e, s_e = f(x, buf_e)
    close(buf, buf_e)
    close(s, s_e)
    assert flat.data_ptr() == x.data_ptr() and t.stride() == t_e.stride()


def test_autocast_bf16():
    def f(x, w):
        with torch.autocast(DEV, dtype=torch.bfloat16):
            y = x @ w
        return y.float().relu() + 1

    compiled = kiln.compile(f, backend="inductor")
    x, w = torch.randn(64, 64, device=DEV), torch.randn(64, 64, device=DEV, requires_grad=True)
    out, out_e = compiled(x, w), f(x, w)
    close(out, out_e, 1e-2)
    (g,) = torch.autograd.grad(out.sum(), w)
    (g_e,) = torch.autograd.grad(out_e.sum(), w)
    close(g, g_e, 1e-2)


def test_dynamic_one_compile_for_every_size():
    graphs = []
    inductor = lookup_backend("inductor")[0]

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inductor(gm, example_inputs)

    def f(x, w):
        return (x @ w).softmax(-1) * x.shape[0]

    compiled = kiln.compile(f, backend=counting, dynamic=True)
    w = torch.randn(32, 32, device=DEV, requires_grad=True)
    for n in (3, 5, 9, 17, 100):
        x = torch.randn(n, 32, device=DEV)
        close(compiled(x, w), f(x, w))
        (g,) = torch.autograd.grad(compiled(x, w).sum(), w)
        (g_e,) = torch.autograd.grad(f(x, w).sum(), w)
        close(g, g_e, 1e-4)
    assert len(graphs) == 1


def test_donated_buffers_and_retain_graph():
    def f(x, w, target):
        return torch.nn.functional.cross_entropy(x @ w, target)

    compiled = kiln.compile(f, backend="inductor")
    x, w = torch.randn(64, 16, device=DEV), torch.randn(16, 300, device=DEV, requires_grad=True)
    target = torch.randint(0, 300, (64,), device=DEV)
    loss, loss_e = compiled(x, w, target), f(x, w, target)
    for _ in range(2):
        (g,) = torch.autograd.grad(loss, w, retain_graph=True)
        (g_e,) = torch.autograd.grad(loss_e, w, retain_graph=True)
        close(g, g_e)
