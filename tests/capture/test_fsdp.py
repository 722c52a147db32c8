"""FSDP2 (``fully_shard`` per block and on the root) under kiln, on 2 real processes over gloo: kiln
compiling each block or the whole model trains as eager FSDP2 does, with mixed precision and
activation checkpointing. FSDP2's hooks (all-gather before a block, reshard after it) run
natively around the compiled forwards; the graph breaks at each sharded module's call."""
from __future__ import annotations

import pytest
import torch

import kiln
from _distributed import assert_params_equal, requires_gloo, run_ranks, same_model

pytestmark = requires_gloo

D = 32


def _fsdp_api():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:       # pragma: no cover - torch without FSDP2
        pytest.skip("torch.distributed.fsdp.fully_shard is not available")
    return fully_shard, MixedPrecisionPolicy


class Block(torch.nn.Module):
    def __init__(self, checkpointed: bool):
        super().__init__()
        self.up = torch.nn.Linear(D, 2 * D)
        self.down = torch.nn.Linear(2 * D, D)
        self.checkpointed = checkpointed

    def body(self, x):
        return x + self.down(torch.relu(self.up(x)))

    def forward(self, x):
        if self.checkpointed:
            return torch.utils.checkpoint.checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)


class Model(torch.nn.Module):
    def __init__(self, checkpointed: bool = False):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(checkpointed) for _ in range(3)])
        self.head = torch.nn.Linear(D, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _sharded(mixed_precision: bool, checkpointed: bool, world: int) -> Model:
    fully_shard, MixedPrecisionPolicy = _fsdp_api()
    from torch.distributed.device_mesh import init_device_mesh

    model = same_model(lambda: Model(checkpointed))
    # (a CPU mesh named: on a machine with CUDA, fully_shard's default mesh is on the GPU,
    # which these gloo ranks do not use)
    kw = {"mesh": init_device_mesh("cpu", (world,))}
    if mixed_precision:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


def _worker(rank, world, how, mixed_precision, checkpointed):
    eager = _sharded(mixed_precision, checkpointed, world)
    model = _sharded(mixed_precision, checkpointed, world)
    if how == "each block":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = kiln.compile(block, backend="aot_eager")
        step_fn = model
        compiled = model.blocks[0]
    else:
        step_fn = compiled = kiln.compile(model, backend="aot_eager")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    entries = []
    for step in range(3):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, D, generator=g)
        losses = []
        for call, opt in zip((eager, step_fn), opts):
            loss = call(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
        entries.append(len(compiled.compiled_function.cache.entries))
    assert_params_equal(eager, model)
    assert entries[0] == entries[-1], entries       # compiled once: no recompile per step


def test_fsdp2_each_block_compiled_with_mixed_precision_and_checkpointing():
    run_ranks(_worker, "each block", True, True)


def test_fsdp2_whole_model_compiled():
    run_ranks(_worker, "whole model", False, False)
