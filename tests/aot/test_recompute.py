"""Recompute regions (``kiln/aot/recompute.py``): a checkpointed region's insides are
recomputed in the backward; what the forward saves is the regions' inputs (what eager's
checkpoint saves), their random draws and what a selective policy saves."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import kiln
from kiln.aot import create_aot_state, stage1_graph_capture
from kiln.aot import fx_graphs, graph_bytes
from kiln.aot.partition import partition_capture
from kiln.backends import aot_backend
from kiln.testing import CompileCounter

aten = torch.ops.aten
MATMULS = (aten.mm.default, aten.addmm.default)


class Block(nn.Module):
    def __init__(self, d=32, p=0.0):
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.down(torch.relu(self.up(x)).sin()))


class Stack(nn.Module):
    def __init__(self, checkpointed: bool, n=3, p=0.0, **ckpt_kwargs):
        super().__init__()
        self.blocks = nn.ModuleList([Block(p=p) for _ in range(n)])
        self.checkpointed = checkpointed
        self.ckpt_kwargs = ckpt_kwargs

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False, **self.ckpt_kwargs) if self.checkpointed else block(x)
        return x.pow(2).mean()


def _joint(model, x):
    """The captured graph's AOT state and joint graph."""
    cc = CompileCounter()
    kiln.compile(model, backend=cc)(x)
    gm, = cc.graphs
    example = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
    state = create_aot_state(gm, example)
    return state, stage1_graph_capture(state)


def _by_name(capture):
    return {n.name: n for n in capture.graph.nodes}


@pytest.mark.parametrize("partitioner", ["default", "min_cut"])
def test_saved_values_are_the_regions_inputs(partitioner):
    x = torch.randn(16, 32, requires_grad=True)
    state, cap = _joint(Stack(True), x)
    with state:
        p = partition_capture(cap, partitioner)
    nodes = _by_name(cap)
    saved = [nodes[s] for s in p.saved]
    activations = [s for s in saved if s.op != "placeholder"]
    # the inputs of blocks 2 and 3 (block 1's is the input x: a placeholder) and what the
    # loss's backward reads (the last block's output, or twice it): never a matmul, a ReLU or
    # a sine inside a block
    assert len(activations) == 3, p.saved
    assert [s.target for s in activations[:2]] == [aten.add.Tensor] * 2, p.saved
    assert all(s.meta.get("ac_graph_id") is None or
               any(u.meta.get("ac_graph_id") != s.meta["ac_graph_id"] for u in s.users
                   if u.meta.get("kiln_phase") == "forward") for s in activations), p.saved
    bw_matmuls = sum(1 for n in p.backward.graph.nodes if n.target in MATMULS)
    fw_matmuls = sum(1 for n in p.forward.graph.nodes if n.target in MATMULS)
    assert bw_matmuls >= fw_matmuls + 2 * 3     # each block's two matmuls run again


@pytest.mark.parametrize("partitioner", ["default", "min_cut"])
def test_checkpointing_saves_less_than_not_checkpointing(partitioner):
    x = torch.randn(16, 32, requires_grad=True)
    sizes = []
    for checkpointed in (True, False):
        torch.manual_seed(0)
        kiln.reset()
        state, cap = _joint(Stack(checkpointed), x)
        with state:
            sizes.append(partition_capture(cap, partitioner).saved_activation_bytes)
    assert sizes[0] * 3 < sizes[1], sizes


def test_random_draws_are_saved_not_recomputed():
    x = torch.randn(16, 32, requires_grad=True)
    state, cap = _joint(Stack(True, p=0.1), x)
    with state:
        p = partition_capture(cap, "min_cut")
    assert not any(fx_graphs.is_random(n) for n in p.backward.graph.nodes)
    masks = [s for s in p.saved if _by_name(cap)[s].meta["val"].dtype == torch.bool]
    assert len(masks) == 3, p.saved            # one dropout mask per block


def test_a_selective_policy_saves_what_it_names():
    def save_matmuls(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE

    context_fn = functools.partial(create_selective_checkpoint_contexts, save_matmuls)
    x = torch.randn(16, 32, requires_grad=True)
    state, cap = _joint(Stack(True, context_fn=context_fn), x)
    nodes = _by_name(cap)
    decided = {n.target: n.meta.get("recompute") for n in cap.graph.nodes
               if n.meta.get("kiln_phase") == "forward" and n.meta.get("ac_graph_id") is not None}
    assert decided[aten.addmm.default] is CheckpointPolicy.MUST_SAVE
    assert decided[aten.relu.default] is CheckpointPolicy.PREFER_RECOMPUTE
    with state:
        p = partition_capture(cap, "default")
    saved_ops = [nodes[s].target for s in p.saved]
    # the up-projection's output (the ReLU's input) is saved; the ReLU and sine are recomputed
    assert saved_ops.count(aten.addmm.default) == 3, p.saved
    assert aten.relu.default not in saved_ops and aten.sin.default not in saved_ops
    assert sum(1 for n in p.backward.graph.nodes if n.target in MATMULS) == 2 * 2 * 3   # no matmul again


def test_compiled_forward_saves_less_with_checkpointing():
    """The forward graph kiln compiles for a training step returns fewer saved bytes."""
    def saved_bytes(model, x):
        forwards = []

        def record_forward(gm, example_inputs):
            forwards.append(gm)
            return gm

        backend = aot_backend(fw_compiler=record_forward, bw_compiler=lambda gm, example_inputs: gm,
                              partition_fn="min_cut")
        compiled = kiln.compile(model, backend=backend)
        compiled(x).backward()
        fw, = forwards
        saved = fx_graphs.flat_outputs(fw.graph)[fw.meta["kiln_num_fw_outputs"]:]
        return sum(graph_bytes.node_nbytes(s) for s in saved
                   if isinstance(s, torch.fx.Node) and s.op != "placeholder")

    x = torch.randn(64, 32, requires_grad=True)
    torch.manual_seed(0)
    with_ckpt = saved_bytes(Stack(True, n=4), x)
    kiln.reset()
    torch.manual_seed(0)
    without = saved_bytes(Stack(False, n=4), x)
    assert with_ckpt * 3 < without, (with_ckpt, without)
