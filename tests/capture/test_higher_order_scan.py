"""``torch._higher_order_ops.scan`` and ``associative_scan`` in compiled code: one graph with a
``higher_order.scan`` / ``associative_scan`` node whose combine function is a subgraph; the
same outputs and gradients as eager."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch._higher_order_ops import associative_scan, scan

import kiln
from kiln.errors import Unsupported
from kiln.testing import CompileCounter, assert_same

SCAN = torch.ops.higher_order.scan
ASSOCIATIVE_SCAN = torch.ops.higher_order.associative_scan
BACKENDS = ["eager", "aot_eager", "inductor"]


def _nodes(gm: torch.fx.GraphModule, op) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is op]


def _close(a, b):
    assert_same(a, b, atol=1e-5, rtol=1e-5)


def cumsum_and_product(x):
    def combine(carry, xt):
        s, p = carry
        s, p = s + xt, p * xt
        return (s, p), s.clone()

    return scan(combine, (torch.zeros(x.shape[1:]), torch.ones(x.shape[1:])), x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_carry_and_per_step_outputs_one_graph(backend):
    counter = CompileCounter()
    compiled = kiln.compile(cumsum_and_product, backend=counter if backend == "eager" else backend,
                            fullgraph=True)
    for _ in range(3):
        x = torch.randn(6, 3)
        _close(compiled(x), cumsum_and_product(x))
    if backend == "eager":
        assert counter.frame_count == 1
        (node,) = _nodes(counter.graphs[0], SCAN)
        assert isinstance(getattr(counter.graphs[0], node.args[0].target), torch.fx.GraphModule)
        assert len(node.args[1]) == 2 and len(node.args[2]) == 1    # two carries, one xs


def weighted_reverse(x, w):
    # the closure's w becomes an additional input; scans along dim 1, last step first
    return scan(lambda c, xt: (c * w + xt, (c * w).sin()), torch.zeros(x.shape[0], x.shape[2]), x,
                dim=1, reverse=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reverse_dim_and_closure(backend):
    counter = CompileCounter()
    compiled = kiln.compile(weighted_reverse, backend=counter if backend == "eager" else backend,
                            fullgraph=True)
    for _ in range(2):
        x, w = torch.randn(2, 5, 3), torch.randn(3)
        _close(compiled(x, w), weighted_reverse(x, w))
    if backend == "eager":
        (node,) = _nodes(counter.graphs[0], SCAN)
        assert len(node.args[3]) == 1       # w, lifted


class SelectiveScan(nn.Module):
    """A minimal Mamba-style selective scan: h_t = exp(A) * h_{t-1} + x_t B_t^T, y_t = h_t C_t."""

    def __init__(self, d=4, n=3):
        super().__init__()
        self.A = nn.Parameter(-torch.rand(d, n))
        self.B = nn.Linear(d, n)
        self.C = nn.Linear(d, n)

    def forward(self, x):       # (batch, time, d)
        decay = torch.exp(self.A)

        def step(h, inp):
            xt, bt, ct = inp
            h = h * decay + torch.einsum("bd,bn->bdn", xt, bt)
            return h, torch.einsum("bdn,bn->bd", h, ct)

        h0 = torch.zeros(x.shape[0], x.shape[2], self.A.shape[1])
        h, ys = scan(step, h0, (x, self.B(x), self.C(x)), dim=1)
        return ys.pow(2).sum() + h.sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_selective_scan_training_matches_eager(backend):
    # inductor: its lowering of the backward scan drops the final carry's gradient, so kiln
    # runs that backward graph as ATen ops (a RuntimeWarning says so)
    torch.manual_seed(0)
    model = SelectiveScan()
    ref = copy.deepcopy(model)
    counter = CompileCounter()
    compiled = kiln.compile(model, backend=counter if backend == "eager" else backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 5, 4)
        xa, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        loss_a, loss_e = compiled(xa), ref(xe)
        loss_a.backward()
        loss_e.backward()
        _close(loss_a, loss_e)
        _close(xa.grad, xe.grad)
        for p, q in zip(model.parameters(), ref.parameters()):
            _close(p.grad, q.grad)
    if backend == "eager":
        assert counter.frame_count == 1 and _nodes(counter.graphs[0], SCAN)


def test_final_carry_gradient_with_inductor():
    def f(u, a):
        h, ys = scan(lambda h, ut: (h * a + ut, h.sin()), torch.zeros(3), u)
        return h.sum() + ys.sum()

    compiled = kiln.compile(f, backend="inductor", fullgraph=True)
    u, a = torch.randn(5, 3), torch.randn(3)
    ua, aa = u.clone().requires_grad_(), a.clone().requires_grad_()
    ue, ae = u.clone().requires_grad_(), a.clone().requires_grad_()
    with pytest.warns(RuntimeWarning, match="scan lowering"):
        compiled(ua, aa).backward()
    f(ue, ae).backward()
    _close(ua.grad, ue.grad)
    _close(aa.grad, ae.grad)


def test_view_of_a_slice_in_training_falls_back_correctly():
    # torch's scan autograd refuses this body (its partitioner saves a view of an xs slice);
    # with fullgraph=False kiln still gives eager's values and gradients
    a = torch.randn(4, 3, requires_grad=True)

    def f(u, c):
        h, ys = scan(lambda h, inp: (h * a + inp[0], (h * inp[1].unsqueeze(1)).sum(-1)),
                     torch.zeros(2, 4, 3), (u, c))
        return ys.pow(2).sum()

    u, c = torch.randn(5, 2, 4, 3), torch.randn(5, 2, 3)
    ua, ca = u.clone().requires_grad_(), c.clone().requires_grad_()
    out = kiln.compile(f, backend="aot_eager")(ua, ca)
    out.backward()
    grads = (ua.grad, ca.grad, a.grad.clone())
    a.grad = None
    ue, ce = u.clone().requires_grad_(), c.clone().requires_grad_()
    ref = f(ue, ce)
    ref.backward()
    _close(out, ref)
    for g, h in zip(grads, (ue.grad, ce.grad, a.grad)):
        _close(g, h)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_dynamic_shapes_one_graph(backend):
    counter = CompileCounter()
    compiled = kiln.compile(cumsum_and_product, backend=counter if backend == "eager" else backend,
                            dynamic=True, fullgraph=True)
    for n, d in ((4, 3), (6, 5), (9, 2)):
        x = torch.randn(n, d)
        _close(compiled(x), cumsum_and_product(x))
    if backend == "eager":
        assert counter.frame_count == 1


def test_carry_shape_mismatch_breaks_with_a_reason():
    def f(x):
        return scan(lambda c, xt: (torch.cat([c, xt]), xt.clone()), torch.zeros(3), x)

    with pytest.raises(Unsupported, match="different shapes"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(4, 3))
    x = torch.randn(4, 3)
    with pytest.raises(Exception) as eager_error:      # eager's scan rejects it
        f(x)
    with pytest.raises(type(eager_error.value)):        # the call runs natively: so does kiln's
        kiln.compile(f, backend="eager")(x)


def test_carry_dtype_and_structure_mismatch_are_refused():
    def dtypes(x):
        return scan(lambda c, xt: ((c + xt).double(), xt.clone()), torch.zeros(3), x)

    def structures(x):
        return scan(lambda c, xt: ((c + xt, c), xt.clone()), torch.zeros(3), x)

    with pytest.raises(Unsupported, match="different dtypes"):
        kiln.compile(dtypes, backend="eager", fullgraph=True)(torch.randn(4, 3))
    with pytest.raises(Unsupported, match="structure"):
        kiln.compile(structures, backend="eager", fullgraph=True)(torch.randn(4, 3))


def test_side_effect_and_alias_are_refused():
    log = []

    def effect(x):
        def combine(c, xt):
            log.append(1)
            return c + xt, xt * 2
        return scan(combine, torch.zeros(3), x)

    def aliased(x):
        def combine(c, xt):
            n = c + xt
            return n, n         # eager's scan refuses it too: clone the output
        return scan(combine, torch.zeros(3), x)

    with pytest.raises(Unsupported, match="changes Python state"):
        kiln.compile(effect, backend="eager", fullgraph=True)(torch.randn(4, 3))
    with pytest.raises(Unsupported, match="alias"):
        kiln.compile(aliased, backend="eager", fullgraph=True)(torch.randn(4, 3))


def test_non_tensor_leaf_is_refused_and_runs_eagerly():
    def f(x):
        return scan(lambda c, xt: (c + xt[0] * xt[1], c.clone()), torch.zeros(3), (x, 2.0))

    with pytest.raises(Unsupported, match="kiln captures tensors"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(4, 3))


# -- associative_scan ------------------------------------------------------------------------------

def cumsum(x):
    return associative_scan(lambda a, b: a + b, x, 1, combine_mode="generic")


def linear_recurrence(a, b):
    """h_t = a_t * h_{t+1} + b_t (reverse), by the associative combine of (a, b) pairs."""
    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]

    return associative_scan(combine, (a, b), 0, reverse=True, combine_mode="generic")


@pytest.mark.parametrize("backend", BACKENDS)
def test_associative_scan_cumsum_and_linear_recurrence(backend):
    # inductor: no associative_scan lowering on CPU, the graph runs as ATen ops (a warning)
    counter = CompileCounter()
    be = counter if backend == "eager" else backend
    c_cumsum = kiln.compile(cumsum, backend=be, fullgraph=True)
    c_rec = kiln.compile(linear_recurrence, backend=be, fullgraph=True)
    for _ in range(2):
        x, a, b = torch.randn(3, 7), torch.rand(6, 4), torch.randn(6, 4)
        _close(c_cumsum(x), cumsum(x))
        _close(c_rec(a, b), linear_recurrence(a, b))
    if backend == "eager":
        # (generic mode is eager's own recursion of tensor ops, not the higher-order op)
        assert counter.frame_count == 2
        assert all(not _nodes(gm, ASSOCIATIVE_SCAN) for gm in counter.graphs)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_associative_scan_gradients(backend):
    x = torch.randn(3, 7)
    xa, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    kiln.compile(cumsum, backend=backend, fullgraph=True)(xa).pow(2).sum().backward()
    cumsum(xe).pow(2).sum().backward()
    _close(xa.grad, xe.grad)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_associative_scan_closure_requiring_grad_gets_eagers_gradient(backend):
    # (generic mode is plain tensor ops in eager: a tensor the combine_fn reads gets a gradient)
    w = torch.randn(7, requires_grad=True)

    def f(x):
        return associative_scan(lambda a, b: a * w + b, x, 0, combine_mode="generic")

    x = torch.randn(5, 7, requires_grad=True)
    compiled = kiln.compile(f, backend=backend, fullgraph=True)
    got = torch.autograd.grad(compiled(x).pow(2).sum(), (x, w))
    want = torch.autograd.grad(f(x).pow(2).sum(), (x, w))
    _close(got, want)
    with torch.no_grad():      # inference
        _close(compiled(x), f(x))


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("length", [16, 13])
def test_associative_scan_of_many_small_factors_gets_eagers_gradients(backend, length):
    """A Mamba-style state recurrence h_t = a_t * h_{t-1} + b_t with decays well below 1: the
    gradients of the decays must be eager's, not another formula's (torch's op differentiates
    the scan otherwise, far beyond rounding here)."""
    def recurrence(a, b):
        def combine(left, right):
            return left[0] * right[0], right[0] * left[1] + right[1]
        return associative_scan(combine, (a, b), 1, combine_mode="generic")[1]

    g = torch.Generator().manual_seed(0)
    a = (torch.rand(2, length, 8, generator=g) * 0.2).requires_grad_()
    b = torch.randn(2, length, 8, generator=g).requires_grad_()
    weights = torch.randn(2, length, 8, generator=g)
    compiled = kiln.compile(recurrence, backend=backend, fullgraph=True)
    got = torch.autograd.grad((compiled(a, b) * weights).sum(), (a, b))
    want = torch.autograd.grad((recurrence(a, b) * weights).sum(), (a, b))
    assert_same(got, want, atol=1e-6, rtol=1e-5)


def test_associative_scan_non_pointwise_combine_runs_eagerly():
    def matmuls(x):
        return associative_scan(lambda a, b: a @ b, x, 0, combine_mode="generic")

    with pytest.raises(Unsupported, match="pointwise"):
        kiln.compile(matmuls, backend="eager", fullgraph=True)(torch.randn(5, 2, 2))
    x = torch.randn(5, 2, 2)
    _close(kiln.compile(matmuls, backend="eager")(x), matmuls(x))


def test_associative_scan_pointwise_mode_on_cpu_raises_as_eager():
    def f(x):
        return associative_scan(lambda a, b: a + b, x, 0)

    with pytest.raises(ValueError, match="CUDA"):
        f(torch.randn(4))
    with pytest.raises(ValueError, match="CUDA"):
        kiln.compile(f, backend="eager")(torch.randn(4))


def test_associative_scan_fullgraph_one_graph_with_code_around():
    def f(x):
        y = x * 2
        return associative_scan(lambda a, b: torch.maximum(a, b), y, 0, combine_mode="generic").sum(0) + 1

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True)
    for _ in range(2):
        x = torch.randn(6, 3)
        _close(compiled(x), f(x))
    assert counter.frame_count == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="combine_mode='pointwise' needs CUDA")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_associative_scan_pointwise_in_training_gets_the_recurrences_gradients(backend):
    """torch's associative_scan op has no correct backward (a prototype): Hugging Face's Mamba
    models scan in pointwise mode when compiled and sequentially in eager. Where a gradient is
    needed the scan is captured as its recursion of tensor ops, so the gradients are the
    sequential loop's; inference keeps the op."""
    def scanned(a, b):
        def combine(left, right):
            return left[0] * right[0], right[0] * left[1] + right[1]
        return associative_scan(combine, (a, b), 1, combine_mode="pointwise")[1]

    def loop(a, b):
        h, out = torch.zeros_like(b[:, 0]), []
        for t in range(b.shape[1]):
            h = a[:, t] * h + b[:, t]
            out.append(h)
        return torch.stack(out, 1)

    g = torch.Generator(device="cuda").manual_seed(0)
    log_a = (torch.rand(2, 12, 8, device="cuda", generator=g) * 3).requires_grad_()
    b = torch.randn(2, 12, 8, device="cuda", generator=g).requires_grad_()
    weights = torch.randn(2, 12, 8, device="cuda", generator=g)
    counter = CompileCounter()
    compiled = kiln.compile(lambda la, b: scanned(torch.exp(-la), b), backend=backend, fullgraph=True)
    got = torch.autograd.grad((compiled(log_a, b) * weights).sum(), (log_a, b))
    want = torch.autograd.grad((loop(torch.exp(-log_a), b) * weights).sum(), (log_a, b))
    assert_same(got, want, atol=1e-5, rtol=1e-4)
    counting = kiln.compile(scanned, backend=counter, fullgraph=True)
    with torch.no_grad():
        _close(counting(torch.exp(-log_a), b), loop(torch.exp(-log_a), b))
    assert counter.frame_count == 1 and _nodes(counter.graphs[0], ASSOCIATIVE_SCAN)
