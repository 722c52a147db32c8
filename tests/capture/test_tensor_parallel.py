"""Tensor parallelism (``parallelize_module`` with ColwiseParallel/RowwiseParallel, as TorchTitan
plans a transformer block) under kiln, on 2 real processes over gloo: the compiled block and model
train as eager tensor parallelism does (outputs, gradients and parameters after SGD and AdamW
steps), with sequence parallelism too. A module whose parameters are DTensors runs outside the
graph, with DTensor's own dispatch and collectives; the code between them (norms, attention,
activations, residual adds) is compiled."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import kiln
from _distributed import assert_params_equal, requires_gloo, run_ranks, same_model


def _has_tensor_parallel() -> bool:
    try:
        return importlib.util.find_spec("torch.distributed.tensor.parallel") is not None
    except ImportError:       # pragma: no cover - torch without torch.distributed
        return False


pytestmark = [requires_gloo, pytest.mark.skipif(not _has_tensor_parallel(),
                                                reason="needs torch.distributed.tensor.parallel (DTensor)")]

D, HEADS, VOCAB = 16, 4, 32


def _tp_api():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    return init_device_mesh, parallelize_module, ColwiseParallel, RowwiseParallel, SequenceParallel


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(D, D, bias=False)
        self.k = torch.nn.Linear(D, D, bias=False)
        self.v = torch.nn.Linear(D, D, bias=False)
        self.o = torch.nn.Linear(D, D, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        # (-1 heads: each rank holds HEADS / world of them)
        q = self.q(x).view(b, t, -1, D // HEADS).transpose(1, 2)
        k = self.k(x).view(b, t, -1, D // HEADS).transpose(1, 2)
        v = self.v(x).view(b, t, -1, D // HEADS).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(D, 2 * D, bias=False)
        self.up = torch.nn.Linear(D, 2 * D, bias=False)
        self.down = torch.nn.Linear(2 * D, D, bias=False)

    def forward(self, x):
        gate = self.gate(x)
        up = self.up(x)
        return self.down(torch.nn.functional.silu(gate) * up)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = torch.nn.RMSNorm(D)
        self.attention = Attention()
        self.ffn_norm = torch.nn.RMSNorm(D)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.ffn_norm(x))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])
        self.norm = torch.nn.RMSNorm(D)
        self.head = torch.nn.Linear(D, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _block_plan(colwise, rowwise, prefix=""):
    """TorchTitan's plan for a block: q/k/v and gate/up colwise, o and down rowwise."""
    plan = {f"attention.{n}": colwise() for n in ("q", "k", "v")}
    plan.update({f"mlp.{n}": colwise() for n in ("gate", "up")})
    plan.update({"attention.o": rowwise(), "mlp.down": rowwise()})
    return {prefix + k: v for k, v in plan.items()}


def _parallel(make, mesh):
    _, parallelize_module, colwise, rowwise, _ = _tp_api()
    model = same_model(make)
    if isinstance(model, Block):
        return parallelize_module(model, mesh, _block_plan(colwise, rowwise))
    for i, block in enumerate(model.blocks):
        parallelize_module(block, mesh, _block_plan(colwise, rowwise))
    return model


def _inputs(step, block):
    g = torch.Generator().manual_seed(100 + step)      # (the same on every rank: TP replicates it)
    if block:
        return torch.randn(2, 8, D, generator=g)
    return torch.randint(0, VOCAB, (2, 8), generator=g)


def _grads(model):
    return [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]


def _worker(rank, world, what, optimizer):
    aot_eager, _ = kiln.backends.lookup_backend("aot_eager")
    init_device_mesh = _tp_api()[0]
    mesh = init_device_mesh("cpu", (world,))
    make = Block if what == "block" else Model
    eager = _parallel(make, mesh)
    model = _parallel(make, mesh)
    graphs = []

    def counting_aot_eager(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    compiled = kiln.compile(model, backend=counting_aot_eager)
    opt_cls = torch.optim.SGD if optimizer == "sgd" else torch.optim.AdamW
    opts = [opt_cls(m.parameters(), lr=0.05) for m in (eager, model)]
    for step in range(3):
        x = _inputs(step, what == "block")
        outs = []
        for call, m, opt in zip((eager, compiled), (eager, model), opts):
            out = call(x)
            assert type(out) is torch.Tensor
            out.float().pow(2).mean().backward()
            outs.append(out)
            if m is model:
                for g, h in zip(_grads(eager), _grads(model)):
                    torch.testing.assert_close(h, g, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    assert_params_equal(eager, model)
    # the code between the distributed modules was compiled (norms, attention, residual adds),
    # once: the later steps recompiled nothing
    assert graphs
    count = len(graphs)
    compiled(_inputs(9, what == "block")).sum().backward()
    assert len(graphs) == count
    if what == "block":
        _explain(model)
        _writing_rowwise_output_in_place_is_refused_as_in_eager(mesh)
    else:
        _sequence_parallel_trains_as_eager(rank, world, mesh)


def test_tensor_parallel_block_compiled_trains_as_eager_with_sgd_and_breaks_at_dtensor_modules():
    # (also: writing RowwiseParallel's output in place is refused, compiled or not)
    run_ranks(_worker, "block", "sgd")


def test_tensor_parallel_model_and_sequence_parallel_block_compiled_train_as_eager_with_adamw():
    run_ranks(_worker, "model", "adamw")


def test_a_reduced_output_is_waited_for_on_its_autograd_path():
    """RowwiseParallel's output, an AsyncCollectiveTensor, is handed on as the plain tensor it
    stands for; the gradient reaches the wrapper's own grad_fn (what eager's unwrapping does)."""
    from kiln.runtime.tensor_parallel import DTensorModuleCall

    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    class Reduced(torch.autograd.Function):     # (stands for DTensor's to_local of a reduced sum)
        @staticmethod
        def forward(ctx, t):
            return AsyncCollectiveTensor(t.detach() * 3)

        @staticmethod
        def backward(ctx, grad):
            return grad * 3

    class Rowwise(torch.nn.Module):
        def forward(self, x):
            return Reduced.apply(x), x.sum()

    x = torch.randn(4, requires_grad=True)
    out, total = DTensorModuleCall(Rowwise())(x)
    assert type(out) is torch.Tensor and type(total) is torch.Tensor
    torch.testing.assert_close(out, x.detach() * 3)
    (out * torch.arange(4.0)).sum().backward()
    torch.testing.assert_close(x.grad, torch.arange(4.0) * 3)
    with torch.no_grad():
        plain, _ = DTensorModuleCall(Rowwise())(x)
    assert type(plain) is torch.Tensor and not plain.requires_grad


def _explain(block):
    report = kiln.explain(block)(_inputs(0, True))
    reasons = [b.reason for b in report.break_reasons]
    assert reasons and all("DTensor parameters (tensor parallel)" in r for r in reasons), reasons
    code = "\n".join(g.code for g in report.graphs)
    assert "scaled_dot_product_attention" in code and "rms_norm" in code and "silu" in code, code
    # the residual add after RowwiseParallel's output (reduced over the ranks, waited for) is
    # captured with the norm after it
    assert any(" + " in g.code and "rms_norm" in g.code for g in report.graphs), code


class InPlaceResidual(Block):
    def forward(self, x):
        out = self.mlp(self.ffn_norm(x))
        out += x        # (RowwiseParallel's output: a view its autograd Function made)
        return out


def _writing_rowwise_output_in_place_is_refused_as_in_eager(mesh):
    errors = []
    for call in (lambda m: m, lambda m: kiln.compile(m, backend="aot_eager")):
        with pytest.raises(RuntimeError, match="is a view and is being modified inplace") as e:
            call(_parallel(InPlaceResidual, mesh))(_inputs(0, True))
        errors.append(e)
    assert len(errors) == 2


def _sequence_parallel_plan():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    _, _, colwise, rowwise, sequence = _tp_api()
    gather = lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))  # noqa: E731
    plan = _block_plan(colwise, lambda: rowwise(output_layouts=Shard(1)))
    plan.update({"attention_norm": sequence(), "ffn_norm": sequence(), "attention": gather(), "mlp": gather()})
    return plan


def _sequence_parallel_trains_as_eager(rank, world, mesh):
    """TorchTitan's plan with sequence parallelism: the norms on sequence shards, the block's
    input and output a rank's shard of the sequence."""
    parallelize_module = _tp_api()[1]
    eager, model = (parallelize_module(same_model(Block), mesh, _sequence_parallel_plan()) for _ in range(2))
    aot_eager, _ = kiln.backends.lookup_backend("aot_eager")
    graphs = []

    def counting_aot_eager(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    compiled = kiln.compile(model, backend=counting_aot_eager)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.05) for m in (eager, model)]
    for step in range(3):
        if step == 1:
            count = len(graphs)
        x = _inputs(step, True).chunk(world, dim=1)[rank].clone()
        outs = []
        for call, opt in zip((eager, compiled), opts):
            out = call(x)
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            outs.append(out)
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    assert_params_equal(eager, model)
    # the residual adds read the rowwise outputs (reduce-scattered, waited for at the graph's
    # entry): captured, once
    assert any(" + " in g.code for g in graphs), [g.code for g in graphs]
    assert len(graphs) == count
