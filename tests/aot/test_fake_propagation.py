"""kiln.aot.fake_propagation.propagate_fake(keep_unchanged=True): after an edit, only what
changed is run again, and the values kept still describe the graph (shapes and memory sharing)."""
import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.aot import fake_propagation, fake_tensors
from kiln import _torch

aten = torch.ops.aten


def _graph():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.sin.default, (x,))
    v = g.call_function(aten.view.default, (a, [8]))        # a view: shares a's memory
    b = g.call_function(aten.mul.Tensor, (v, 2.0))
    g.output((v, b))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _storage(n):
    return StorageWeakRef(n.meta["val"].untyped_storage())


def _propagated():
    """The graph with its fake values, each noted with the call it was made for; its input."""
    gm = _graph()
    mode = _torch.new_fake_mode()
    with mode:
        x = torch.empty(2, 4)
    fake_propagation.propagate_fake(gm, [x], mode)
    fake_propagation.record_val_calls(gm.graph)
    return gm, mode, x


def test_unchanged_calls_keep_their_values_and_edits_rerun():
    gm, mode, x = _propagated()
    before = {n: n.meta.get("val") for n in gm.graph.nodes}
    fake_propagation.propagate_fake(gm, [x], mode, keep_unchanged=True)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            assert n.meta["val"] is before[n], n.name             # nothing edited: nothing re-run
    a = next(n for n in gm.graph.nodes if n.target is aten.sin.default)
    a.target = aten.cos.default                                   # an edit
    fake_propagation.propagate_fake(gm, [x], mode, keep_unchanged=True)
    v = next(n for n in gm.graph.nodes if n.target is aten.view.default)
    b = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    assert a.meta["val"] is not before[a]
    # the view of the re-run node is re-run too (it must share the new value's memory) ...
    assert _storage(v) == _storage(a)
    # ... while the mul, whose inputs kept their shapes and which aliases nothing, keeps its value
    assert b.meta["val"] is before[b]


def test_a_changed_shape_reruns_the_users():
    gm, mode, x = _propagated()
    a = next(n for n in gm.graph.nodes if n.target is aten.sin.default)
    with gm.graph.inserting_before(a):
        t = gm.graph.call_function(aten.sum.dim_IntList, (a.args[0], [1], True))
    a.args = (t,)                                                 # now the sin of a 2x1 sum
    v = next(n for n in gm.graph.nodes if n.target is aten.view.default)
    v.args = (a, [2])
    fake_propagation.propagate_fake(gm, [x], mode, keep_unchanged=True)
    assert tuple(a.meta["val"].shape) == (2, 1)
    b = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    assert tuple(b.meta["val"].shape) == (2,)                     # (its call is unchanged)


def test_values_are_propagated_without_the_callers_autocast():
    """A graph's ATen ops already hold autocast's casts (a float32 matmul is one that autocast
    left alone, such as a rotary embedding's frequencies). A compile runs inside the user's
    ``torch.autocast``; propagating values again there must not make that matmul bfloat16 (the
    KV cache of Llama-family models was then seen as a changed output, and Inductor's joint
    passes were dropped)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(a, b):
        return torch.mm(a, b) + 1

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 4), torch.randn(4, 4))
    fakes = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fake_propagation.propagate_fake(gm, fakes, fake_tensors.fake_mode_of(fakes))
    assert all(n.meta["val"].dtype == torch.float32 for n in gm.graph.nodes if n.op == "call_function")
