"""Training through kiln.compile(..., backend="aot_eager") (and the min-cut partitioner): outputs,
gradients (float64), input mutations and module state equal eager's on fresh inputs."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.backends.aot import aot_backend

from _aot_helpers import DT, check_training, rg, rn

BACKENDS = {"aot_eager": "aot_eager", "min_cut": aot_backend(partition_fn="min_cut")}


@pytest.fixture(params=list(BACKENDS))
def backend(request):
    return BACKENDS[request.param]


def test_mlp(backend):
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 3)).to(DT)
    check_training(module=m, make_args=lambda: (rn(4, 8),), backend=backend)


def test_convnet_batchnorm_running_stats(backend):
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(4 * 9, 5)).to(DT)
    check_training(module=m, make_args=lambda: (rn(2, 3, 8, 8),), backend=backend, steps=3)


def test_batchnorm_eval_mode(backend):
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).to(DT).eval()
    check_training(module=m, make_args=lambda: (rn(2, 3, 6, 6),), backend=backend)


def test_layernorm_groupnorm(backend):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(8)
            self.gn = nn.GroupNorm(2, 4)
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(self.ln(x)), self.gn(x.transpose(1, 2).reshape(2, 4, 2, 5))
    check_training(module=M().to(DT), make_args=lambda: (rn(2, 5, 8),), backend=backend)


def test_attention_block(backend):
    m = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).to(DT)
    check_training(module=m, make_args=lambda: (rn(2, 5, 16),), backend=backend)


def test_sdpa_and_causal_attention(backend):
    def f(q, k, v):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(a, k, v) * 2
    check_training(f, lambda: (rg(2, 2, 5, 8), rg(2, 2, 5, 8), rg(2, 2, 5, 8)), backend=backend)


def test_embedding_cross_entropy(backend):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(10, 8)
            self.l = nn.Linear(8, 10)

        def forward(self, idx, tgt):
            return F.cross_entropy(self.l(self.e(idx)).view(-1, 10), tgt.view(-1))
    check_training(module=M().to(DT), make_args=lambda: (torch.randint(0, 10, (2, 5)), torch.randint(0, 10, (2, 5))),
                   backend=backend)


def test_inplace_ops(backend):
    def f(x, w):
        y = x @ w
        y.add_(1)
        y.mul_(2)
        y = y.relu() + 1
        y.sin_()
        return y
    check_training(f, lambda: (rn(3, 4), rg(4, 5)), backend=backend)


def test_views_and_view_mutations(backend):
    def f(x, w):
        y = (x * w).view(-1)
        z = y[2:5]
        z.mul_(3)
        t = (x * w).t()
        t[0].add_(1)
        return y, z, t
    check_training(f, lambda: (rn(3, 4), rg(3, 4)), backend=backend)


def test_mutated_input_not_requiring_grad(backend):
    def f(x, w):
        x.mul_(w)          # x gets a gradient history from w, as in eager
        return x * 2
    check_training(f, lambda: (rn(3), rg(3)), backend=backend)


def test_mutated_input_requiring_grad_nonleaf(backend):
    def f(x, w, leaf):
        x.add_(w)          # x is a non-leaf that requires grad: in-place is allowed
        return x.sin(), leaf.cos()

    def make():
        leaf = rg(3)
        return (leaf * 1, rg(3), leaf)
    check_training(f, make, backend=backend)


def test_mutated_buffer(backend):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.register_buffer("ema", torch.ones(3, dtype=DT))

        def forward(self, x):
            y = self.lin(x)
            with torch.no_grad():
                self.ema.mul_(0.9).add_(y.mean(0) * 0.1)
            return y * self.ema
    check_training(module=M().to(DT), make_args=lambda: (rn(4, 3),), backend=backend, steps=3)


def test_outputs_that_view_inputs(backend):
    def f(x, w):
        return x.view(-1), (x * w).sum(), w.t(), x
    check_training(f, lambda: (rg(2, 3), rg(2, 3)), backend=backend)


def test_outputs_that_alias_each_other(backend):
    def f(x, w):
        y = x * w
        z = x + w
        return y, y.view(-1), y[0], y, z.detach(), z
    out = check_training(f, lambda: (rg(2, 3), rg(2, 3)), backend=backend)
    a, b, c, d, e, g = out(rg(2, 3), rg(2, 3))
    assert d is a and b._base is a and c._base is a      # the same aliasing as eager
    assert not e.requires_grad and g.requires_grad and e.data_ptr() == g.data_ptr()


def test_duplicate_inputs(backend):
    def g(x, y):
        y.add_(1) if not y.requires_grad else None
        return x * y + y
    check_training(lambda x: g(x, x), lambda: (rg(3),), backend=backend)
    check_training(lambda x: g(x, x), lambda: (rn(3),), backend=backend)


def test_inputs_that_view_one_another(backend):
    def f(a, b):
        b.add_(1)
        return a * 2, b.sum()

    def make():
        base = rn(5)
        return (base[:3], base[1:])
    check_training(f, make, backend=backend)


def test_inputs_that_view_one_another_with_grad(backend):
    def f(a, b, w, leaf):
        b.mul_(w[:4])
        return a * 2

    def make():
        leaf = rg(6)
        base = leaf * 1
        return (base[:4], base[2:], rg(6), leaf)
    check_training(f, make, backend=backend)


def test_inputs_without_grad_and_none_gradients(backend):
    def f(x, w, unused):
        return (x * w).sum(), x + 1
    check_training(f, lambda: (rn(3), rg(3), rg(3)), backend=backend)


def test_no_grad_region_and_detach(backend):
    def f(x, w):
        y = x * w
        with torch.no_grad():
            z = y * 2
        return y + z, z, y.detach()
    check_training(f, lambda: (rn(3), rg(3)), backend=backend)


def test_non_tensor_and_integer_outputs(backend):
    def f(x):
        return x.argmax(), x.sum(), (x > 0), 3, None
    check_training(f, lambda: (rg(5),), backend=backend)


def test_dropout_same_seed_same_result(backend):
    m = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.ReLU(), nn.Linear(16, 3)).to(DT)
    check_training(module=m, make_args=lambda: (rn(4, 8),), backend=backend, seed=1234, steps=3)


def test_metadata_mutation_of_input(backend):
    def f(x, w):
        x.unsqueeze_(0)
        return x * w
    check_training(f, lambda: (rn(3), rg(3)), backend=backend)


def test_setitem_with_grad(backend):
    def f(x, v):
        x[0] = v.sum()
        x[1:].mul_(v[0])
        return x * 1
    check_training(f, lambda: (rn(3), rg(2)), backend=backend)
