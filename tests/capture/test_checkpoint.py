"""``torch.utils.checkpoint.checkpoint`` in compiled code: one graph, the body inlined and
tagged as a recompute region, the same outputs and gradients as eager checkpointing."""
from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts)

import kiln
from kiln.testing import CompileCounter, assert_same

aten = torch.ops.aten


class Block(nn.Module):
    def __init__(self, d=16, p=0.0):
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.down(torch.relu(self.up(x)).sin()))


class Checkpointed(nn.Module):
    """Every block checkpointed, as a training recipe does."""

    def __init__(self, n=4, p=0.0, **ckpt_kwargs):
        super().__init__()
        self.blocks = nn.ModuleList([Block(p=p) for _ in range(n)])
        self.ckpt_kwargs = ckpt_kwargs

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, **self.ckpt_kwargs)
        return x.pow(2).mean()


def _train_step(model, x, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    loss = model(x)
    loss.backward()
    return loss.detach(), x.grad, [p.grad for p in model.parameters()]


def _compare(model, backend, x, *, seed=None, fullgraph=False, steps=2):
    """Compiled and eager training steps from the same start (and the same seed) agree."""
    ref_model = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend, fullgraph=fullgraph)
    for step in range(steps):
        xa = x.detach().clone().requires_grad_(x.requires_grad)
        xe = x.detach().clone().requires_grad_(x.requires_grad)
        for m in (model, ref_model):
            m.zero_grad(set_to_none=True)
        actual = _train_step(compiled, xa, None if seed is None else seed + step)
        after_compiled = torch.rand(1) if seed is not None else None
        expected = _train_step(ref_model, xe, None if seed is None else seed + step)
        after_eager = torch.rand(1) if seed is not None else None
        assert_same(actual, expected, rtol=1e-4, atol=1e-5)
        if seed is not None:    # the global generator ends where eager leaves it
            assert_same(after_compiled, after_eager)


def _region_ids(gm):
    return [n.meta.get("ac_graph_id") for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointed_blocks_are_one_graph(backend, use_reentrant):
    model = Checkpointed(use_reentrant=use_reentrant)
    x = torch.randn(8, 16, requires_grad=True)
    _compare(model, backend, x)
    cc = CompileCounter()
    out = kiln.explain(model)(x)
    assert out.graph_count == 1 and out.graph_break_count == 0, out.break_reasons
    kiln.compile(model, backend=cc)(x)
    ids = _region_ids(cc.graphs[0])
    assert sorted(set(i for i in ids if i is not None)) == [1, 2, 3, 4]
    assert ids[-1] is None      # the loss is outside every region


def test_fullgraph():
    model = Checkpointed(use_reentrant=False)
    x = torch.randn(8, 16, requires_grad=True)
    _compare(model, "aot_eager", x, fullgraph=True)


def test_default_use_reentrant_warns_as_eager_and_runs_reentrant():
    model = Checkpointed(n=2)
    x = torch.randn(8, 16, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compare(model, "aot_eager", x, steps=1)
    assert any("use_reentrant" in str(w.message) for w in caught)
    assert kiln.explain(model)(x).graph_break_count == 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_dropout_draws_eagers_numbers(backend, use_reentrant):
    """Eager restores the RNG state before it recomputes: its recomputed dropout masks are the
    forward's. The compiled backward uses the forward's masks (saved, not drawn again)."""
    model = Checkpointed(n=3, p=0.1, use_reentrant=use_reentrant)
    x = torch.randn(8, 16, requires_grad=True)
    _compare(model, backend, x, seed=123)


def test_preserve_rng_state_false_runs_one_graph():
    model = Checkpointed(n=2, p=0.0, use_reentrant=False, preserve_rng_state=False)
    x = torch.randn(8, 16, requires_grad=True)
    _compare(model, "aot_eager", x)
    assert kiln.explain(model)(x).graph_break_count == 0


@pytest.mark.parametrize("form", ["lambda", "closure", "bound_method", "module", "partial", "kwargs"])
def test_forms_of_the_checkpointed_function(form):
    block = Block()
    scale = torch.tensor(0.5)

    def closure(x):
        return block(x) * scale

    def with_kwargs(x, *, shift, factor=2.0):
        return block(x) * factor + shift

    def f(x):
        if form == "lambda":
            y = checkpoint(lambda t: block(t).cos(), x, use_reentrant=False)
        elif form == "closure":
            y = checkpoint(closure, x, use_reentrant=False)
        elif form == "bound_method":
            y = checkpoint(block.forward, x, use_reentrant=False)
        elif form == "module":
            y = checkpoint(block, x, use_reentrant=False)
        elif form == "partial":
            y = checkpoint(functools.partial(with_kwargs, shift=1.0), x, use_reentrant=False)
        else:
            y = checkpoint(with_kwargs, x, use_reentrant=False, shift=0.25, factor=3.0)
        return y.sum()

    x = torch.randn(4, 16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out = kiln.compile(f, backend="aot_eager")(x)
    out.backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad(set_to_none=True)
    ref = f(x2)
    ref.backward()
    assert_same(out, ref)
    assert_same(x.grad, x2.grad)
    assert_same(grads, [p.grad for p in block.parameters()])
    assert kiln.explain(f)(x).graph_break_count == 0


def test_nested_checkpoint_is_one_region():
    inner, outer_lin = Block(), nn.Linear(16, 16)

    def body(x):
        return outer_lin(checkpoint(inner, x, use_reentrant=False)).tanh()

    def f(x):
        return checkpoint(body, x, use_reentrant=False).sum()

    x = torch.randn(4, 16, requires_grad=True)
    cc = CompileCounter()
    kiln.compile(f, backend=cc)(x)
    ids = {i for i in _region_ids(cc.graphs[0]) if i is not None}
    assert len(ids) == 1         # the outer region: its recomputation reruns the inner one
    kiln.reset()
    x2 = x.detach().clone().requires_grad_()
    out = kiln.compile(f, backend="aot_eager")(x)
    out.backward()
    ref = f(x2)
    ref.backward()
    assert_same(out, ref)
    assert_same(x.grad, x2.grad)


def test_under_no_grad():
    model = Checkpointed(use_reentrant=False)
    x = torch.randn(8, 16)

    def f(x):
        with torch.no_grad():
            return model(x)

    out = kiln.compile(f, backend="aot_eager")(x)
    assert not out.requires_grad
    assert_same(out, f(x))
    assert kiln.explain(f)(x).graph_break_count == 0


def test_reentrant_without_inputs_that_require_grad():
    """Eager's reentrant checkpoint runs the block under no_grad: no gradient for its
    parameters, an output that does not require grad."""
    block = Block()

    def f(x):
        return checkpoint(block, x, use_reentrant=True) * 2

    x = torch.randn(4, 16)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
        out = kiln.compile(f, backend="aot_eager")(x)
    ref = f(x)
    assert out.requires_grad is ref.requires_grad is False
    assert_same(out, ref)


def test_bf16_autocast_inside():
    block = Block()

    def body(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return block(x)

    def f(x):
        return checkpoint(body, x, use_reentrant=False).float().sum()

    x = torch.randn(4, 16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out = kiln.compile(f, backend="aot_eager")(x)
    out.backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad(set_to_none=True)
    ref = f(x2)
    ref.backward()
    assert_same(out, ref, rtol=1e-2, atol=1e-2)
    assert_same(x.grad, x2.grad, rtol=1e-2, atol=1e-2)
    assert_same(grads, [p.grad for p in block.parameters()], rtol=1e-2, atol=1e-2)
    assert kiln.explain(f)(x).graph_break_count == 0


def _save_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in (aten.mm.default, aten.addmm.default) \
        else CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("policy", [_save_matmuls, [aten.addmm.default]], ids=["function", "op_list"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_selective_checkpoint_policies(policy, backend):
    context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
    model = Checkpointed(n=2, use_reentrant=False, context_fn=context_fn)
    x = torch.randn(8, 16, requires_grad=True)
    _compare(model, backend, x)
    assert kiln.explain(model)(x).graph_break_count == 0


def test_unsupported_context_fn_is_a_graph_break():
    def my_contexts():
        import contextlib
        return contextlib.nullcontext(), contextlib.nullcontext()

    model = Checkpointed(n=2, use_reentrant=False, context_fn=my_contexts)
    x = torch.randn(8, 16, requires_grad=True)
    _compare(model, "aot_eager", x, steps=1)
    reasons = [str(r) for r in kiln.explain(model)(x).break_reasons]
    assert any("context_fn" in r for r in reasons), reasons


def test_a_body_that_cannot_be_captured_runs_checkpoint_natively():
    block = Block()

    def body(x):
        print("", end="")          # not capturable
        return block(x)

    def f(x):
        return checkpoint(body, x, use_reentrant=False).sum() * 2

    x = torch.randn(4, 16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out = kiln.compile(f, backend="aot_eager")(x)
    out.backward()
    ref = f(x2)
    ref.backward()
    assert_same(out, ref)
    assert_same(x.grad, x2.grad)
    reasons = [str(r) for r in kiln.explain(f)(x).break_reasons]
    assert any("checkpoint runs natively" in r for r in reasons), reasons


def test_a_body_with_python_side_effects_runs_natively():
    """Eager runs the body again in the backward: its effects happen twice, as they do here."""
    block = Block()
    calls = []

    def body(x):
        calls.append(1)
        return block(x)

    def f(x):
        return checkpoint(body, x, use_reentrant=False).sum()

    x = torch.randn(4, 16, requires_grad=True)
    kiln.compile(f, backend="aot_eager")(x).backward()
    compiled_calls = len(calls)
    calls.clear()
    f(x).backward()
    assert compiled_calls == len(calls) == 2


def test_fullgraph_reports_what_cannot_be_captured():
    def f(x):
        return checkpoint(torch.sin, x, use_reentrant=False, debug=True)

    with pytest.raises(kiln.Unsupported, match="debug=True"):
        kiln.compile(f, backend="aot_eager", fullgraph=True)(torch.randn(3, requires_grad=True))


def test_checkpoint_sequential():
    from torch.utils.checkpoint import checkpoint_sequential

    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)])
    ref = copy.deepcopy(model)
    x = torch.randn(4, 16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()

    def f(m, x):
        return checkpoint_sequential(m, 2, x, use_reentrant=False).sum()

    out = kiln.compile(f, backend="aot_eager")(model, x)
    out.backward()
    expected = f(ref, x2)
    expected.backward()
    assert_same(out, expected)
    assert_same([x.grad, *[p.grad for p in model.parameters()]], [x2.grad, *[p.grad for p in ref.parameters()]])
    cc = CompileCounter()
    kiln.reset()
    kiln.compile(f, backend=cc)(model, x)
    assert cc.frame_count == 1
    # (torch checkpoints every segment but the last, which runs as it is)
    assert len({i for i in _region_ids(cc.graphs[0]) if i is not None}) == 1


def test_learning_the_default_mode_leaves_torch_dynamo_alone():
    """kiln learns what checkpoint does without ``use_reentrant`` by calling it, unwrapped:
    its ``torch._disable_dynamo`` wrapper would import and call torch._dynamo (the peer)."""
    import subprocess
    import sys

    code = ("import sys, kiln; from kiln import _torch; _torch.checkpoint_default_mode(); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_body_writing_a_tensor_from_outside_runs_natively(reentrant):
    # (eager's backward recomputes the body: the write happens twice, and the gradient reads
    # the tensor as written again)
    def make():
        buf = torch.zeros(3)

        def body(x):
            buf.add_(1)
            return x * buf

        def f(x):
            return torch.utils.checkpoint.checkpoint(body, x, use_reentrant=reentrant)
        return f, buf

    results = []
    for compile_ in (False, True):
        kiln.reset()
        f, buf = make()
        if compile_:
            f = kiln.compile(f, backend="aot_eager")
        x = torch.ones(3, requires_grad=True)
        f(x).sum().backward()
        results.append((x.grad, buf))
    assert_same(results[1], results[0])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("body", [
    lambda t: (t.sin(), [t.cos()]),           # a tensor in a list: eager's has no gradient
    lambda t: {"a": t.sin(), "b": t.cos()},   # the same in a dict
    lambda t: t,                              # its argument: eager returns a new tensor
    lambda t: (t.sin(), t),
], ids=["list", "dict", "identity", "tuple_with_argument"])
def test_reentrant_checkpoint_returns_what_its_autograd_function_returns(backend, body):
    """Eager's reentrant checkpoint is an autograd.Function: only tensors returned alone or as
    tuple items are its outputs. Where kiln's region would differ (a gradient for a tensor in a
    list, the argument object itself), the call runs natively: eager's values and gradients."""
    def f(x, w):
        out = checkpoint(body, x * w, use_reentrant=True)
        leaves = [v for v in (out.values() if isinstance(out, dict) else
                              out if isinstance(out, tuple) else [out])]
        flat = [v for leaf in leaves for v in (leaf if isinstance(leaf, list) else [leaf])]
        return sum(v * (i + 1) for i, v in enumerate(flat)).sum(), [v.requires_grad for v in flat]

    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    xk, wk = (t.detach().clone().requires_grad_() for t in (x, w))
    kiln.reset()
    want, got = f(x, w), kiln.compile(f, backend=backend)(xk, wk)
    assert got[1] == want[1] and got[0].requires_grad == want[0].requires_grad
    torch.testing.assert_close(got[0], want[0])
    if want[0].requires_grad:
        want[0].backward()
        got[0].backward()
        torch.testing.assert_close((xk.grad, wk.grad), (x.grad, w.grad))
