"""Graphs holding subgraphs (GraphModule attributes that higher-order ops call) saved as data
by ``export``: each subgraph once, nested ones included; several ``get_attr`` nodes naming one
subgraph load back as one shared object, and the loaded graph computes what the original does."""
import json
import operator

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.aot.export import _decode_target, _encode_target, graph_from_data, graph_to_data
from kiln.aot.subgraph_table import SubgraphLoader, SubgraphTable

INVOKE = torch.ops.higher_order.invoke_subgraph


def _call(g: torch.fx.Graph, sub: torch.fx.Node, x: torch.fx.Node) -> torch.fx.Node:
    out = g.call_function(INVOKE, (sub, "block", x))
    return g.call_function(operator.getitem, (out, 0))


def shared_block_graph() -> torch.fx.GraphModule:
    """A block called three times through one subgraph (two get_attr nodes of one target and
    one of another target naming the same object), and an outer subgraph that calls it too."""
    offset = torch.arange(3.0)
    block = make_fx(lambda a: (a.sin() * 2 + offset,))(torch.randn(3))     # (a tensor constant)
    inner = torch.fx.Graph()
    a = inner.placeholder("a")
    inner.output((inner.call_function(torch.ops.aten.cos.default, (_call(inner, inner.get_attr("block"), a),)),))
    inner_root = torch.nn.Module()
    inner_root.block = block
    outer = torch.fx.GraphModule(inner_root, inner)

    root = torch.nn.Module()
    root.block = block
    root.alias = block
    root.outer = outer
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = _call(g, g.get_attr("block"), x)
    y = _call(g, g.get_attr("block"), y)
    y = _call(g, g.get_attr("alias"), y)
    y = _call(g, g.get_attr("outer"), y)
    g.output((y,))
    return torch.fx.GraphModule(root, g)


def _blocks(gm):
    return {n.target: getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}


def test_a_shared_subgraph_is_saved_once_and_loads_as_one_object():
    gm = shared_block_graph()
    assert gm.block is gm.alias
    data, constants = graph_to_data(gm)
    data = json.loads(json.dumps(data))               # (what the artifact stores)
    # the block once (shared at both levels), the outer graph once
    assert len(data["subgraphs"]) == 2
    refs = [d["subgraph"] for d in data["nodes"] if d["op"] == "get_attr"]
    assert refs[0] == refs[1] == refs[2] != refs[3]
    loaded = graph_from_data(data, constants)
    blocks = _blocks(loaded)
    assert blocks["block"] is blocks["alias"]
    assert blocks["outer"].block is blocks["block"]  # the nested reference too
    x = torch.randn(3)
    torch.testing.assert_close(loaded(x), gm(x))
    # the constant inside the block came back
    assert any(k.startswith("subgraphs/") for k in constants)


def test_subgraph_of_cond_branches_round_trips_with_higher_order_targets():
    def f(p, x):
        return torch.cond(p, lambda a: (a.sin(),), lambda a: (a.cos() * 3,), (x,))

    gm = make_fx(f)(torch.tensor(True), torch.randn(4))
    data, constants = graph_to_data(gm)
    loaded = graph_from_data(json.loads(json.dumps(data)), constants)
    assert any(n.target is torch.ops.higher_order.cond for n in loaded.graph.nodes)
    for p in (True, False):
        x = torch.randn(4)
        torch.testing.assert_close(loaded(torch.tensor(p), x), f(torch.tensor(p), x))


@pytest.mark.parametrize("name", ["cond", "while_loop", "scan", "map_impl", "flex_attention", "invoke_subgraph"])
def test_higher_order_targets_encode_by_name(name):
    op = getattr(torch.ops.higher_order, name)
    text = _encode_target(op)
    assert text == f"torch.ops.higher_order.{name}"
    assert _decode_target(text, type(op).__module__) is op


def test_an_unknown_higher_order_op_is_a_clear_error():
    with pytest.raises(ValueError, match="no higher-order op 'no_such_op'"):
        _decode_target("torch.ops.higher_order.no_such_op", "os")   # (only torch's and kiln's modules import)


def test_a_subgraph_holding_itself_is_refused_and_a_missing_number_is_an_error():
    table = SubgraphTable(lambda sub: table.number(sub))
    gm = make_fx(lambda a: a + 1)(torch.randn(2))
    with pytest.raises(ValueError, match="holds itself"):
        table.number(gm)
    loader = SubgraphLoader(1, lambda i: gm)
    assert loader.get(0) is loader.get(0)
    with pytest.raises(ValueError, match="does not hold"):
        loader.get(1)
