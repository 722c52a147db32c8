"""Partitions (kiln/cudagraphs/partition.py): an inference graph split around the ops CUDA
graphs cannot hold. On CPU the CUDA pieces cannot record (they run as compiled, logged), so
these tests check the split itself: which graphs are split, the pieces, the routing of values
between them, the reasons logged for what runs outside, and or-error."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.aot.compile import run_as_fx
from kiln.cudagraphs import GraphFacts, graph_facts
from kiln.cudagraphs.partition import can_partition, partitioned


def f(x, w):
    a = torch.relu(x @ w)
    b = a.sum()
    c = torch.sin(a) * b
    return c, a, b


def pretend_outside(op_name):
    return lambda n: f"op {op_name} (pretend)" if op_name in str(n.target) else None


def split_of(classify):
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    gm = make_fx(f)(x, w)
    pieces = []

    def compile_piece(piece, examples):
        assert len(examples) == sum(1 for n in piece.graph.nodes if n.op == "placeholder")
        pieces.append(piece)
        return run_as_fx(piece, examples)
    run = partitioned(gm, compile_piece, graph_facts(gm, "inference"), classify)
    return run, pieces


def test_pieces_run_in_order_and_values_are_routed(capfd):
    kiln.set_logs("cudagraphs")
    run, pieces = split_of(pretend_outside("sum"))
    assert len(pieces) == 2                  # relu(x @ w) | sum outside | sin(a) * b
    for _ in range(3):
        x, w = torch.randn(4, 4), torch.randn(4, 4)
        got, want = run([x, w]), f(x, w)
        assert len(got) == 3
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
    err = capfd.readouterr().err
    assert "is split: 2 part(s) recorded as CUDA graphs, 1 run between them" in err
    assert "op sum (pretend) (this part of the graph runs between CUDA graphs)" in err


def test_outside_part_raises_under_or_error():
    run, _ = split_of(pretend_outside("mm"))     # the first op runs outside
    with kiln.config.patch(cudagraph_or_error=True):
        with pytest.raises(kiln.CudagraphError, match=r"op mm \(pretend\)"):
            run([torch.randn(4, 4), torch.randn(4, 4)])


def test_which_graphs_are_split():
    op = GraphFacts(name="g", kind="inference", skip="op x is on the cpu device", op_level=True)
    assert can_partition(op)
    assert not can_partition(GraphFacts(name="g", kind="forward", skip="op x", op_level=True))
    assert not can_partition(GraphFacts(name="g", kind="inference", skip="input x is on the cpu device"))
    assert not can_partition(GraphFacts(name="g", kind="inference", skip="op", op_level=True, size_inputs=[0]))
    assert not can_partition(GraphFacts(name="g", kind="inference"))
