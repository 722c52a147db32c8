"""``torch.cond`` in compiled code: one graph with a ``higher_order.cond`` node whose branches
are subgraphs; the same outputs and gradients as eager ``torch.cond`` with either branch taken."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.backends.aot import aot_backend
from kiln.errors import Unsupported
from kiln.testing import CompileCounter, assert_same

COND = torch.ops.higher_order.cond
BACKENDS = ["eager", "aot_eager", "inductor"]


def _cond_nodes(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is COND]


def _signed(shape, sign):
    """A random input whose sum has the given sign (the predicates below test the sum)."""
    return torch.rand(*shape) * sign + 0.01 * sign


def simple(x, y):
    return torch.cond(x.sum() > 0, lambda a: a.sin() + y, lambda a: a.cos() * y, (x,))


def two_outputs(x):
    def true_fn(a):
        return a + 1, a.exp()

    def false_fn(a):
        return a - 1, a.abs()

    return torch.cond(x.mean() > 0, true_fn, false_fn, [x])


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_dependent_predicate_both_branches_one_graph(backend):
    counter = CompileCounter()
    be = counter if backend == "eager" else backend
    compiled = kiln.compile(simple, backend=be, fullgraph=True)
    for sign in (1, -1, 1, -1):
        x, y = _signed((4, 3), sign), torch.randn(4, 3)
        assert_same(compiled(x, y), simple(x, y))
    if backend == "eager":
        assert counter.frame_count == 1     # one graph for both branches: no recompile
        (node,) = _cond_nodes(counter.graphs[0])
        true_gm = getattr(counter.graphs[0], node.args[1].target)
        false_gm = getattr(counter.graphs[0], node.args[2].target)
        assert isinstance(true_gm, torch.fx.GraphModule) and isinstance(false_gm, torch.fx.GraphModule)
        # the closure's y is lifted into the operands, after x
        assert len(node.args[3]) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_tuple_outputs(backend):
    compiled = kiln.compile(two_outputs, backend=backend, fullgraph=True)
    for sign in (1, -1):
        x = _signed((5,), sign)
        out = compiled(x)
        assert type(out) is tuple
        assert_same(out, two_outputs(x))


def test_predicate_tensor_argument_and_code_around():
    def f(pred, x):
        h = x * 2
        out = torch.cond(pred, lambda a: a @ a, lambda a: (a * 2) @ a, (h,))
        return out.sum(0) + 1

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True)
    for p in (True, False, True):
        x = torch.randn(3, 3)
        pred = torch.tensor(p)
        assert_same(compiled(pred, x), f(pred, x))
    assert counter.frame_count == 1


def test_python_bool_predicate_inlines_the_taken_branch():
    def f(x, flag: bool):
        return torch.cond(flag, lambda a: a.sin(), lambda a: a.cos(), (x,))

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True)
    x = torch.randn(4)
    assert_same(compiled(x, True), f(x, True))
    assert_same(compiled(x, False), f(x, False))
    assert all(not _cond_nodes(gm) for gm in counter.graphs)
    assert counter.frame_count == 2     # the bool is guarded: one graph per value


class Gated(nn.Module):
    """A module whose forward picks a branch by the data; both branches read parameters."""

    def __init__(self, d=6):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.scale = nn.Parameter(torch.randn(d))

    def forward(self, x):
        def big(a):
            return self.lin(a).relu()

        def small(a):
            return (a * self.scale).tanh()

        return torch.cond(x.sum() > 0, big, small, (x,)).pow(2).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_closures_training_matches_eager(backend):
    torch.manual_seed(0)
    model = Gated()
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model, backend=backend, fullgraph=True)
    for sign in (1, -1, -1, 1):
        x = _signed((3, 6), sign)
        xa, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        loss_a, loss_e = compiled(xa), ref(xe)
        loss_a.backward()
        loss_e.backward()
        assert_same(loss_a, loss_e)
        assert_same(xa.grad, xe.grad)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert_same(p.grad, q.grad)


def test_aot_graphs_hold_aten_cond_forward_and_backward():
    seen = {"fw": [], "bw": []}

    def record(kind):
        def compiler(gm, example_inputs):
            seen[kind].append(gm)
            return gm.forward
        return compiler

    model = Gated()
    compiled = kiln.compile(model, backend=aot_backend(fw_compiler=record("fw"), bw_compiler=record("bw")),
                            fullgraph=True)
    x = _signed((3, 6), 1).requires_grad_()
    compiled(x).backward()
    assert len(seen["fw"]) == 1 and len(seen["bw"]) == 1
    assert _cond_nodes(seen["fw"][0]), "the forward ATen graph calls cond"
    assert _cond_nodes(seen["bw"][0]), "the backward ATen graph calls cond (the branches' gradients)"


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_dynamic_shapes_one_graph(backend):
    counter = CompileCounter()
    be = counter if backend == "eager" else backend
    compiled = kiln.compile(simple, backend=be, dynamic=True, fullgraph=True)
    for n, sign in ((3, 1), (5, -1), (7, 1), (2, -1)):
        x, y = _signed((n, 4), sign), torch.randn(n, 4)
        assert_same(compiled(x, y), simple(x, y))
    if backend == "eager":
        assert counter.frame_count == 1


def test_mismatched_branch_shapes_break_with_a_reason():
    # eager's cond accepts sizes that differ (the result's size is data-dependent); kiln
    # breaks the graph there and eager's cond runs
    def f(x):
        return torch.cond(x.sum() > 0, lambda a: a[:2] + 1, lambda a: a * 2, (x,))

    with pytest.raises(Unsupported, match="different shapes"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3, 4))
    x = _signed((3, 4), 1)
    explained = kiln.explain(f)(x)
    assert explained.graph_break_count >= 1
    assert any("different shapes" in str(r) for r in explained.break_reasons)
    compiled = kiln.compile(f, backend="eager")
    for sign in (1, -1):
        x = _signed((3, 4), sign)
        assert_same(compiled(x), f(x))


def test_mismatched_branch_dtypes_and_structures_are_refused():
    def dtypes(x):
        return torch.cond(x.sum() > 0, lambda a: a.int(), lambda a: a, (x,))

    def structures(x):
        return torch.cond(x.sum() > 0, lambda a: (a + 1, a), lambda a: a + 2, (x,))

    with pytest.raises(Unsupported, match="different dtypes"):
        kiln.compile(dtypes, backend="eager", fullgraph=True)(torch.randn(3))
    with pytest.raises(Unsupported, match="different structures"):
        kiln.compile(structures, backend="eager", fullgraph=True)(torch.randn(3))


def test_branch_with_python_side_effect_is_refused():
    log = []

    def f(x):
        def true_fn(a):
            log.append(1)
            return a + 1
        return torch.cond(x.sum() > 0, true_fn, lambda a: a - 1, (x,))

    with pytest.raises(Unsupported, match="changes Python state"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3))


class _Box:
    pass


@pytest.mark.parametrize("effect", ["nonlocal", "list", "attribute"])
def test_a_branch_changing_state_the_frame_made_is_refused_as_eager_refuses_it(effect):
    """A body is traced once, whatever branch runs: a change to a list, object or variable the
    frame made before the cond would be applied for both branches. torch's cond refuses Python
    effects in eager too; kiln breaks the graph and the frame raises as eager does."""
    def f(x):
        c, log, box = 0, [], _Box()

        def true_fn(a):
            nonlocal c
            if effect == "nonlocal":
                c += 1
            elif effect == "list":
                log.append(1)
            else:
                box.v = 1
            return a + 1
        return torch.cond(x.sum() > 0, true_fn, lambda a: a - 1, (x,)), c, log

    with pytest.raises(Unsupported, match="changes Python state"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3))
    with pytest.raises(Exception) as eager:
        f(torch.ones(3))
    with pytest.raises(type(eager.value)):
        kiln.compile(f, backend="aot_eager")(torch.ones(3))


def test_a_branch_may_change_what_it_made_itself():
    def f(x):
        def true_fn(a):
            parts, seen = [], {}
            for k in range(3):
                parts.append(a * k)
                seen[k] = True
            return torch.stack(parts).sum(0) + len(seen)
        return torch.cond(x.sum() > 0, true_fn, lambda a: a - 1, (x,))

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True)
    for x in (torch.ones(3), -torch.ones(3)):
        assert_same(compiled(x), f(x))
    assert counter.frame_count == 1


def test_branch_writing_its_input_in_place_is_refused():
    def f(x):
        return torch.cond(x.sum() > 0, lambda a: a.add_(1) * 2, lambda a: a - 1, (x,))

    with pytest.raises(Unsupported, match="in place"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_cond(backend):
    def f(x):
        def inner(a):
            return torch.cond(a.max() > 0.5, lambda b: b * 3, lambda b: b + 3, (a,))
        return torch.cond(x.sum() > 0, inner, lambda a: a.cos(), (x,))

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter if backend == "eager" else backend, fullgraph=True)
    for scale in (1, -1, 0.1, 1):
        x = torch.rand(4) * scale
        assert_same(compiled(x), f(x))
    if backend == "eager":
        assert counter.frame_count == 1


def test_symbolic_size_predicate_inlines_the_taken_branch():
    def f(x):
        return torch.cond(x.shape[0] > 4, lambda a: a.sin(), lambda a: a.cos(), (x,))

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, dynamic=True, fullgraph=True)
    for n in (3, 6, 8, 2):
        x = torch.randn(n)
        assert_same(compiled(x), f(x))
    assert all(not _cond_nodes(gm) for gm in counter.graphs)
    assert counter.frame_count == 2     # one graph per side of the guard on the size


def test_branch_returning_a_view_of_its_input_is_left_to_eager():
    def f(x):
        return torch.cond(x.sum() > 0, lambda a: a.view(-1), lambda a: a.reshape(-1) * 2, (x,))

    with pytest.raises(Unsupported, match="alias"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.rand(2, 3))
    x = torch.rand(2, 3)
    with pytest.raises(Exception) as eager_error:
        f(x)
    with pytest.raises(type(eager_error.value)):     # eager's cond refuses it: so does the call
        kiln.compile(f, backend="eager")(x)
