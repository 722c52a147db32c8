"""AOT autograd on dynamic graphs: placeholders with symbolic example values (as kiln's capture
makes them), traced once with the symbols and run at many sizes; the per-shape fallback where
the symbolic trace does not apply. Every check runs the compiled callable and the graph eagerly
on fresh random inputs and compares values, gradients and mutated inputs."""
import operator

import pytest
import torch
import torch.fx
import torch.nn.functional as F

import kiln
from kiln import _torch as T
from kiln.aot import AOTCompiled, create_aot_state, stage1_graph_capture, stage2_compile, stage2_export
from kiln.aot.dynamic import PerShapeCompiled
from kiln.backends.aot import aot_backend, aot_eager
from kiln.testing import assert_same

from _aot_helpers import DT, Recorder, _loss, _tensors

D = T.DimDynamic.DYNAMIC
S = T.DimDynamic.STATIC


# ------------------------------------------------------------------------------------------------
# Building dynamic graphs as the capture does, and comparing with eager
# ------------------------------------------------------------------------------------------------

def dynamic_graph(fn, args, dims, *, static=(), fake_run=False, root=None):
    """``torch.fx.symbolic_trace(fn)`` with each placeholder's ``example_value`` set as kiln's
    capture sets it. ``dims[i]``: for a tensor, one DimDynamic per dim (missing: static); for an
    int, ``(j, d)`` (the symbol of tensor ``j``'s dim ``d``) or ``"int"`` (a symbol of its own).
    ``fake_run`` runs the graph on its fakes first, as the capture does."""
    mode = T.new_fake_mode()
    vals = list(args)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            vals[i] = T.fake_from_real(mode, a, f"L['a{i}']", dims.get(i, [S] * a.dim()))
    for i, a in enumerate(args):
        spec = dims.get(i)
        if isinstance(spec, tuple):
            vals[i] = vals[spec[0]].shape[spec[1]]
        elif spec == "int":
            vals[i] = T.symbolic_int(mode, a, f"L['a{i}']")
    gm = torch.fx.symbolic_trace(root if root is not None else fn)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(phs) == len(args)
    for i, (p, v) in enumerate(zip(phs, vals)):
        p.meta["example_value"] = v
        if isinstance(v, torch.Tensor):
            p.meta["kiln_static"] = i in static
            p.meta["kiln_source"] = f"L['a{i}']"
    if fake_run:
        with mode:
            gm(*vals)
    return gm


def clone_args(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            c = a.detach().clone()
            out.append(c.requires_grad_(a.requires_grad) if a.is_leaf else c)
        else:
            out.append(a)
    return out


def compare(compiled, gm, args, *, seed=None):
    """One call of ``compiled`` against ``gm`` run eagerly on a copy of ``args``: outputs,
    requires_grad, then (if anything requires grad) gradients of the leaf inputs, and the
    inputs after the call (mutations)."""
    e_args = clone_args(args)
    if seed is not None:
        torch.manual_seed(seed)
    out = compiled(*args)
    if seed is not None:
        torch.manual_seed(seed)
    ref = gm(*e_args)
    assert_same(out, ref)
    outs, refs = _tensors(out), _tensors(ref)
    assert [o.requires_grad for o in outs] == [r.requires_grad for r in refs]
    if any(r.requires_grad for r in refs):
        _loss(outs).backward()
        _loss(refs).backward()
        for i, (a, b) in enumerate(zip(args, e_args)):
            if isinstance(b, torch.Tensor) and b.is_leaf and b.requires_grad:
                assert (a.grad is None) == (b.grad is None), f"grad {i}"
                if b.grad is not None:
                    assert_same(a.grad, b.grad, path=f"grad[{i}]")
    assert_same([a.detach() if isinstance(a, torch.Tensor) else a for a in args],
                [a.detach() if isinstance(a, torch.Tensor) else a for a in e_args], path="args after call")
    return out, ref


def at_sizes(compiled, gm, make, sizes, **kw):
    for n in sizes:
        compare(compiled, gm, make(n), **kw)


def baked_ints(gm, values):
    """Nodes with one of ``values`` (the traced sizes) among their int arguments."""
    found = []
    for n in gm.graph.nodes:
        torch.fx.node.map_aggregate((n.args, n.kwargs), lambda a: found.append(n) if type(a) is int and a in values else None)
    return found


def symbolic_placeholders(gm):
    return [n for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt)]


def rg(*shape):
    return torch.randn(*shape, dtype=DT, requires_grad=True)


def rn(*shape):
    return torch.randn(*shape, dtype=DT)


SIZES = (8, 5, 3, 13, 2)    # 8 is the traced size


@torch.fx.wrap
def zeros(*size):
    """torch.zeros as one graph call (symbolic_trace does not trace factories of proxies)."""
    return torch.zeros(*size, dtype=DT)


# ------------------------------------------------------------------------------------------------
# Inference and training, traced once, run at many sizes
# ------------------------------------------------------------------------------------------------

def test_inference_symbol_in_view_arange_zeros():
    def f(s, x):
        y = torch.sin(x.view(s, -1)) + torch.arange(s, dtype=torch.float64).unsqueeze(1)
        z = zeros(s * 2, 3)
        return y, z, x.reshape(s * 3).cumsum(0)
    x = rn(8, 3)
    gm = dynamic_graph(f, [8, x], {0: (1, 0), 1: [D, S]})
    fw = Recorder()
    compiled = aot_backend(fw_compiler=fw)(gm, [8, x])
    assert isinstance(compiled, AOTCompiled) and compiled.kind == "inference"
    at_sizes(compiled, gm, lambda n: [n, rn(n, 3)], SIZES)
    assert len(fw.graphs) == 1 and compiled.fallback.compiles == 0      # one trace for all sizes
    graph, example = fw.graphs[0]
    assert isinstance(example[0], torch.SymInt)                          # the symbol stays an input
    assert any(T.is_symbolic(s) for s in example[1].shape)


def test_training_outputs_sized_by_the_symbol():
    def f(s, x, w):
        h = (x * w).view(s, 2, 2).sum(2)
        return torch.cat([h, h.flip(0)]), h.new_ones(s) * h.mean()
    x, w = rg(8, 4), rg(4)
    gm = dynamic_graph(f, [8, x, w], {0: (1, 0), 1: [D, S]})
    compiled = aot_eager(gm, [8, x, w])
    assert isinstance(compiled, AOTCompiled) and compiled.kind == "training"
    at_sizes(compiled, gm, lambda n: [n, rg(n, 4), rg(4)], SIZES)
    assert compiled.fallback.compiles == 0
    assert symbolic_placeholders(compiled.forward_graph)


def test_same_callable_many_sizes_compiles_once():
    fw, bw = Recorder(), Recorder()

    def f(x):
        return (x.size(0) * x).tanh()                  # call_method size(0), no symbol input
    x = rg(6, 5)
    gm = dynamic_graph(f, [x], {0: [D, D]})
    compiled = aot_backend(fw_compiler=fw, bw_compiler=bw)(gm, [x])
    for n, m in [(6, 5), (3, 9), (11, 2), (4, 4)]:
        compare(compiled, gm, [rg(n, m)])
    assert len(fw.graphs) == 1 and len(bw.graphs) == 1 and compiled.fallback.compiles == 0


def test_reduction_over_the_dynamic_dim():
    def f(x, w):
        y = x @ w
        return y.mean(0), y.softmax(0), y.var(0), y.amax(0), x.sum()
    x, w = rg(8, 3), rg(3, 4)
    gm = dynamic_graph(f, [x, w], {0: [D, S]})
    compiled = aot_eager(gm, [x, w])
    at_sizes(compiled, gm, lambda n: [rg(n, 3), rg(3, 4)], SIZES)
    assert compiled.fallback.compiles == 0


@pytest.mark.parametrize("partition_fn", ["default", "min_cut"])
def test_backward_needs_the_symbol(partition_fn):
    def f(s, x, w):
        m = (x * w).sum(0, keepdim=True)                   # [1, 3]
        e = m.expand(s, 3) * x                              # the backward sums over s
        return e.reshape(s * 3).view(s, 3).exp(), (x.sum(1) / s).mean()
    x, w = rg(8, 3), rg(3)
    gm = dynamic_graph(f, [8, x, w], {0: (1, 0), 1: [D, S]})
    compiled = aot_backend(partition_fn=partition_fn)(gm, [8, x, w])
    at_sizes(compiled, gm, lambda n: [n, rg(n, 3), rg(3)], SIZES)
    assert compiled.fallback.compiles == 0
    bw = compiled.backward_graph
    # every size the backward reads comes from an int or a runtime tensor, none is baked in
    assert not baked_ints(bw, {8, 24}) and not baked_ints(compiled.forward_graph, {8, 24})
    saved_ints = symbolic_placeholders(bw)
    saved = {n.name for n in bw.graph.nodes if n.op == "placeholder"}
    assert saved_ints and all(n.name in saved for n in saved_ints)
    assert compiled.saved_tensor_bytes > 0
    assert "int" in compiled.as_text()


@pytest.mark.parametrize("partition_fn", ["default", "min_cut"])
def test_backward_gets_the_size_as_an_int_not_the_tensor(partition_fn):
    def f(x, w):
        return (x.sum() * w).sin()                 # d/dx expands to x's shape: only its size is read
    x, w = rg(8, 3), rg(3)
    gm = dynamic_graph(f, [x, w], {0: [D, S]})
    compiled = aot_backend(partition_fn=partition_fn)(gm, [x, w])
    at_sizes(compiled, gm, lambda n: [rg(n, 3), rg(3)], SIZES)
    bw_inputs = [n for n in compiled.backward_graph.graph.nodes if n.op == "placeholder"]
    assert [n for n in bw_inputs if isinstance(n.meta["val"], torch.SymInt)]
    big = [n.name for n in bw_inputs if isinstance(n.meta["val"], torch.Tensor) and n.meta["val"].dim() == 2]
    assert not big, f"x saved for its size: {big}"
    assert compiled.saved_tensor_bytes <= 8 * (3 + 3 + 1)


def test_min_cut_recomputes_and_matches():
    def f(x, w):
        return (x @ w).relu().sin().sum(1)
    x, w = rg(8, 6), rg(6, 6)
    gm = dynamic_graph(f, [x, w], {0: [D, S]})
    d = aot_backend(partition_fn="default")(gm, [x, w])
    m = aot_backend(partition_fn="min_cut")(gm, [x, w])
    assert m.saved_tensor_bytes <= d.saved_tensor_bytes
    at_sizes(m, gm, lambda n: [rg(n, 6), rg(6, 6)], SIZES)


def test_parameters_static_batch_dynamic():
    lin = torch.nn.Linear(4, 5).to(DT)

    def f(x, w, b):
        return F.gelu(F.linear(x, w, b)).sum(1)
    x = rg(8, 4)
    w, b = lin.weight, lin.bias
    gm = dynamic_graph(f, [x, w, b], {0: [D, S]}, static=(1, 2))
    compiled = aot_eager(gm, [x, w, b])
    for n in SIZES:
        w.grad = b.grad = None
        w2 = w.detach().clone().requires_grad_(True)
        b2 = b.detach().clone().requires_grad_(True)
        x = rg(n, 4)
        compiled(x, w, b).sum().backward()
        gm(x.detach(), w2, b2).sum().backward()
        assert_same(w.grad, w2.grad)
        assert_same(b.grad, b2.grad)


def test_int_input_with_its_own_symbol():
    def f(n, x):
        return x * n + torch.arange(n, dtype=torch.float64).sum(), torch.ones(n, dtype=torch.float64).cumsum(0)
    x = rg(4)
    gm = dynamic_graph(f, [7, x], {0: "int"})
    compiled = aot_eager(gm, [7, x])
    for n in (7, 3, 20):
        compare(compiled, gm, [n, rg(4)])
    assert compiled.fallback.compiles == 0
    # tracing arange(n)/cumsum guarded n >= 2 (the ShapeEnv's guards): 0 and 1 are compiled apart
    assert "(s" in " ".join(compiled.input_check.conditions)
    for n in (0, 1, 1):
        compare(compiled, gm, [n, rg(4)])
    assert compiled.fallback.compiles == 2


# ------------------------------------------------------------------------------------------------
# Views, mutations, aliasing, symbolic outputs
# ------------------------------------------------------------------------------------------------

def test_views_of_inputs_are_regenerated_at_runtime_sizes():
    def f(s, x):
        return x.view(s * 3), x[1:], x.t(), x.narrow(0, 1, s - 2), x * 2
    x = rg(8, 3) * 1             # a non-leaf: the views carry its gradient
    gm = dynamic_graph(f, [8, x], {0: (1, 0), 1: [D, S]})
    compiled = aot_eager(gm, [8, x])
    for n in (8, 5, 13, 3, 2):
        base = rg(n, 3)
        x = base * 1
        outs = compiled(n, x)
        refs = gm(n, x)
        assert_same(outs, refs)
        for o, r in zip(outs[:4], refs[:4]):        # views of x, as in eager
            assert o.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            assert (o.stride(), o.storage_offset()) == (r.stride(), r.storage_offset())
        sum(o.sum() * (k + 1) for k, o in enumerate(outs)).backward()
        b2 = base.detach().clone().requires_grad_(True)
        sum(o.sum() * (k + 1) for k, o in enumerate(gm(n, b2 * 1))).backward()
        assert_same(base.grad, b2.grad)
    # narrow(0, 1, s - 2) guarded its size against 0 and 1: those sizes are compiled apart
    assert compiled.fallback.compiles == 2


def test_output_view_of_another_output():
    def f(x):
        y = x.sin()
        return y, y.view(-1), y[:, 1:]
    x = rg(8, 3)
    gm = dynamic_graph(f, [x], {0: [D, S]})
    compiled = aot_eager(gm, [x])
    for n in SIZES:
        out, ref = compare(compiled, gm, [rg(n, 3)])
        assert out[1]._base is out[0] and out[2]._base is out[0]
    assert compiled.fallback.compiles == 0


def test_a_view_of_an_intermediate_written_in_place_has_eagers_values():
    """The view is taken again from its base with ``as_strided`` at runtime: the graph must
    return the base laid out as eager's, which the traced (functionalized) write lays out
    transposed (fuzz seed 76358 gave the view's elements in the wrong places)."""
    def f(y, w):
        t = y[..., [0, 2]].transpose(0, 1)
        t.masked_fill_(t > 0.5, 0.0)
        return w @ w, t
    y, w = rg(8, 4), rg(4, 4)
    gm = dynamic_graph(f, [y, w], {0: [D, S]})
    compiled = aot_eager(gm, [y, w])
    for n in SIZES:
        out, ref = compare(compiled, gm, [rg(n, 4), rg(4, 4)])
        assert out[1].stride() == ref[1].stride()
    assert compiled.fallback.compiles == 0


def test_an_output_in_another_dense_layout_gets_eagers_strides():
    """Inductor's decompositions make ``cat`` onto an empty tensor a clone keeping its input's
    (transposed) layout; eager's ``cat`` output is contiguous."""
    from torch._inductor.decomposition import select_decomp_table

    def f(x):
        t = (x * 3).t()
        return torch.cat([zeros(0, t.shape[1]), t]), x.sin()
    x = rg(8, 3)
    gm = dynamic_graph(f, [x], {0: [D, S]})
    compiled = aot_backend(decompositions=select_decomp_table())(gm, [x])
    for n in SIZES:
        out, ref = compare(compiled, gm, [rg(n, 3)])
        assert [o.stride() for o in out] == [r.stride() for r in ref]


def test_input_mutation_with_dynamic_shape():
    def f(s, x, buf):
        buf.add_(x.detach().view(s, 3))          # buffer-style update
        x2 = x * 2
        return (x2 * buf).sum(1), buf.mean()
    x, buf = rg(8, 3), rn(8, 3)
    gm = dynamic_graph(f, [8, x, buf], {0: (1, 0), 1: [D, S], 2: [D, S]})
    compiled = aot_eager(gm, [8, x, buf])
    at_sizes(compiled, gm, lambda n: [n, rg(n, 3), rn(n, 3)], SIZES)
    with torch.no_grad():
        at_sizes(compiled, gm, lambda n: [n, rn(n, 3), rn(n, 3)], SIZES)
    assert compiled.fallback.compiles == 0


def test_inference_input_mutation_and_returned_input():
    def f(x, y):
        x.mul_(2)
        y.t_()                                      # metadata mutation: replayed at runtime sizes
        return x, x[:2], y + 1
    gm = dynamic_graph(f, [rn(8, 3), rn(8, 4)], {0: [D, S], 1: [D, D]})
    compiled = aot_eager(gm, [rn(8, 3), rn(8, 4)])
    for n, m in [(8, 4), (5, 4), (3, 7)]:
        x, y = rn(n, 3), rn(n, m)
        e = clone_args([x, y])
        out, ref = compiled(x, y), gm(*e)
        assert_same(out, ref)
        assert out[0] is x and out[1]._base is x
        assert_same([x, y], e)
        assert y.shape == (m, n) and y.stride() == e[1].stride()
    assert compiled.fallback.compiles == 0


def test_duplicate_input_in_a_dynamic_graph():
    def f(x, y):
        return x * y + x
    x = rg(8, 2)
    gm = dynamic_graph(f, [x, x], {0: [D, S], 1: [D, S]})
    compiled = aot_eager(gm, [x, x])
    for n in SIZES:
        a = rg(n, 2)
        b = a.detach().clone().requires_grad_(True)
        compiled(a, a).sum().backward()
        gm(b, b).sum().backward()
        assert_same(a.grad, b.grad)


def test_symbolic_int_outputs():
    def f(s, x):
        return x.sum(0), x.size(0) * 2 + s, s
    x = rg(8, 3)
    gm = dynamic_graph(f, [8, x], {0: (1, 0), 1: [D, S]})
    compiled = aot_eager(gm, [8, x])
    for n in SIZES:
        out, ref = compare(compiled, gm, [n, rg(n, 3)])
        assert out[1:] == (3 * n, n) and type(out[1]) is int
    assert compiled.fallback.compiles == 0


def test_noncontiguous_input_with_symbolic_strides():
    def f(x):
        return (x * 2).cumsum(1), x.t()
    x = rg(3, 8).t()                                  # [8, 3], strides (1, 8)
    gm = dynamic_graph(f, [x], {0: [D, S]})
    compiled = aot_eager(gm, [x])
    for n in SIZES:
        base = torch.randn(3, n, dtype=DT)
        x = base.t().requires_grad_(True)
        out, _ = compare(compiled, gm, [x])
        assert out[1].data_ptr() == x.data_ptr()
    assert compiled.fallback.compiles == 0
    compare(compiled, gm, [rg(5, 3)])                # another layout: the per-shape fallback
    assert compiled.fallback.compiles == 1


def test_dropout_same_seed_same_mask():
    def f(x, w):
        return F.dropout(x @ w, 0.5, True) * 2
    x, w = rn(8, 6), rg(6, 6)
    gm = dynamic_graph(f, [x, w], {0: [D, S]})
    for p in ("default", "min_cut"):
        compiled = aot_backend(partition_fn=p)(gm, [x, w])
        for n in SIZES:
            compare(compiled, gm, [rn(n, 6), rg(6, 6)], seed=11 + n)
        assert compiled.fallback.compiles == 0


def test_graph_constant_under_the_captures_fake_mode():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.randn(3, dtype=DT))

        def forward(self, x):
            return x * self.c
    m = M()
    x = rg(8, 3)
    gm = dynamic_graph(None, [x], {0: [D, S]}, root=m)
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    mode = gm.graph.find_nodes(op="placeholder")[0].meta["example_value"].fake_mode
    compiled = aot_eager(gm, [x])
    assert mode.allow_non_fake_inputs is False                # restored after tracing
    at_sizes(compiled, gm, lambda n: [rg(n, 3)], SIZES)


# ------------------------------------------------------------------------------------------------
# Checks and the per-shape fallback
# ------------------------------------------------------------------------------------------------

def test_sizes_outside_the_traced_range_use_the_fallback():
    def f(x, y):
        return x + y                                   # traced with both dims >= 2 and equal
    x, y = rg(8, 3), rg(8, 3)
    gm = dynamic_graph(f, [x, y], {0: [D, S], 1: [D, S]})
    compiled = aot_eager(gm, [x, y])
    compare(compiled, gm, [rg(5, 3), rg(5, 3)])
    assert compiled.fallback.compiles == 0
    compare(compiled, gm, [rg(5, 3), rg(1, 3)])        # broadcasting: eager's answer, per shape
    compare(compiled, gm, [rg(1, 3), rg(1, 3)])
    assert compiled.fallback.compiles == 2
    compare(compiled, gm, [rg(5, 3), rg(1, 3)])        # cached by shape
    assert compiled.fallback.compiles == 2


def test_int_input_sharing_a_size_symbol_is_checked():
    def f(x, n):                               # the capture unified n with x.size(0)
        return x.sum(0) * n + x.size(0)
    x = rg(8, 3)
    gm = dynamic_graph(f, [x, 8], {0: [D, S], 1: (0, 0)})
    compiled = aot_eager(gm, [x, 8])
    compare(compiled, gm, [rg(5, 3), 5])
    assert compiled.fallback.compiles == 0
    compare(compiled, gm, [rg(5, 3), 6])       # n no longer equals the size: not the symbolic graph
    assert compiled.fallback.compiles == 1


def test_guards_added_by_tracing_are_checked():
    def f(x):
        return torch.cat(x.split(3)[::-1])           # the number of chunks depends on the size
    x = rg(8, 2)
    gm = dynamic_graph(f, [x], {0: [D, S]})
    compiled = aot_eager(gm, [x])
    assert compiled.input_check.conditions[-1].startswith("(")    # a guard from tracing
    for n in (8, 9):                                  # 3 chunks, the last one of 2 or 3 rows
        compare(compiled, gm, [rg(n, 2)])
    assert compiled.fallback.compiles == 0
    for n in (7, 5, 12, 3):
        compare(compiled, gm, [rg(n, 2)])
    assert compiled.fallback.compiles == 4


def test_stage_api_without_fallback_refuses_other_shapes():
    def f(x, y):
        return x * y
    gm = dynamic_graph(f, [rg(8, 3), rg(8, 3)], {0: [D, S], 1: [D, S]})
    x, y = rg(8, 3), rg(8, 3)
    with create_aot_state(gm, [x, y]) as st:
        assert st.symbolic and len(st.shape_env.guards) >= st.guard_mark
        capture = stage1_graph_capture(st)
        assert all(any(T.is_symbolic(s) for s in t.shape) for t in capture.example_inputs)
        assert capture.saved_tensor_bytes("min_cut") > 0 and "saved for backward" in capture.as_text()
        compiled = stage2_compile(st, capture)
    compare(compiled, gm, [rg(4, 3), rg(4, 3)])
    with pytest.raises(kiln.Unsupported, match="traced for"):
        compiled(rg(4, 3), rg(1, 3))
    with pytest.raises(kiln.Unsupported, match="traced for"):
        compiled(rg(4, 2), rg(4, 2))


def test_fake_changed_during_capture_compiles_per_shape():
    def f(x):
        x.t_()
        return x * 2
    gm = dynamic_graph(f, [rn(8, 3)], {0: [D, S]}, fake_run=True)   # the capture transposed the fake
    compiled = aot_eager(gm, [rn(8, 3)])
    assert isinstance(compiled, PerShapeCompiled)
    for n in (8, 5, 8):
        x = rn(n, 3)
        e = x.clone()
        assert_same(compiled(x), gm(e))
        assert_same(x, e)
    assert compiled.compiles == 2


def test_capture_run_on_the_fakes_first_still_traces_symbolically():
    def f(s, x, buf):
        buf.add_(1)
        return x.view(s, -1).sin() * buf
    args = [8, rg(8, 3), rn(8, 3)]
    gm = dynamic_graph(f, args, {0: (1, 0), 1: [D, S], 2: [D, S]}, fake_run=True)
    compiled = aot_eager(gm, args)
    assert isinstance(compiled, AOTCompiled)
    at_sizes(compiled, gm, lambda n: [n, rg(n, 3), rn(n, 3)], SIZES)
    assert compiled.fallback.compiles == 0


def test_aliased_mutated_inputs_fall_back_per_shape():
    def f(a, b):
        b.mul_(2)
        return a + 1
    base = rn(10)
    gm = dynamic_graph(f, [base[:8], base[2:]], {0: [D], 1: [D]})
    compiled = aot_eager(gm, [base[:8], base[2:]])
    assert isinstance(compiled, PerShapeCompiled) and "share memory" in compiled.reason
    for n in (10, 7):
        base = rn(n)
        ref_base = base.clone()
        out = compiled(base[:n - 2], base[2:])
        ref = gm(ref_base[:n - 2], ref_base[2:])
        assert_same(out, ref)
        assert_same(base, ref_base)


def test_data_dependent_ops_run_as_captured():
    def f(x):
        return x[x > 0].sum() + x.nonzero().shape[0]
    gm = dynamic_graph(f, [rn(8)], {0: [D]})
    compiled = aot_eager(gm, [rn(8)])
    assert "data-dependent" in gm.meta["kiln_aot_fallback"]
    x = rn(8)
    assert_same(compiled(x), f(x))
    gm.meta["kiln_fullgraph"] = True
    with pytest.raises(kiln.Unsupported, match="data-dependent"):
        aot_eager(gm, [rn(8)])


def test_export_of_a_dynamic_graph_is_refused():
    gm = dynamic_graph(lambda x: x.sin(), [rg(8, 3)], {0: [D, S]})
    with create_aot_state(gm, [rg(8, 3)]) as st:
        capture = stage1_graph_capture(st)
        with pytest.raises(kiln.Unsupported, match="dynamic graphs"):
            stage2_export(st, capture)


# ------------------------------------------------------------------------------------------------
# Static graphs are unchanged
# ------------------------------------------------------------------------------------------------

def test_static_graph_is_traced_as_before():
    def f(n, x):
        return x.view(n, -1).sin()
    x = rg(8, 3)
    gm = dynamic_graph(f, [8, x], {})                  # no dynamic dim: all example values static
    with create_aot_state(gm, [8, x]) as st:
        assert not st.symbolic and st.shape_env is None
        assert [w.kind for w in st.wrappers] == ["rng_state", "non_tensor_inputs", "mutations_and_aliases"]
    compiled = aot_eager(gm, [8, x])
    assert isinstance(compiled, AOTCompiled) and compiled.input_check is None
    assert not symbolic_placeholders(compiled.forward_graph)
    compare(compiled, gm, [8, rg(8, 3)])
    compare(compiled, gm, [5, rg(5, 3)])                # another int: runs as captured


def test_dynamic_false_specializes():
    def f(s, x):
        return x.view(s, -1).cos()
    x = rg(8, 3)
    gm = dynamic_graph(f, [8, x], {0: (1, 0), 1: [D, S]})
    with create_aot_state(gm, [8, x], dynamic=False) as st:
        assert not st.symbolic
        compiled = stage2_compile(st, stage1_graph_capture(st))
    assert not symbolic_placeholders(compiled.forward_graph) and compiled.input_check is None
    compare(compiled, gm, [8, rg(8, 3)])


def test_operator_nodes_on_symbols_in_the_graph():
    g = torch.fx.Graph()
    mode = T.new_fake_mode()
    x = rg(8, 3)
    fx_ = T.fake_from_real(mode, x, "L['x']", [D, S])
    s = fx_.shape[0]
    ps = g.placeholder(str(s.node.expr))
    ps.meta["example_value"] = s
    px = g.placeholder("x")
    px.meta["example_value"] = fx_
    px.meta["kiln_static"] = False
    two_s = g.call_function(operator.mul, (ps, 2))
    half = g.call_function(operator.floordiv, (two_s, 2))
    v = g.call_method("view", (px, half, -1))
    g.output((g.call_function(torch.sin, (v,)), g.call_method("new_zeros", (px, (two_s,)))))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    compiled = aot_eager(gm, [8, x])
    at_sizes(compiled, gm, lambda n: [n, rg(n, 3)], SIZES)
    assert compiled.fallback.compiles == 0


def test_compilers_get_symbolic_example_inputs_they_can_run():
    from torch._subclasses.fake_tensor import FakeTensor

    ran = []

    def compiler(gm, example_inputs):          # a compiler propagating shapes on its examples
        mode = next(e.fake_mode for e in example_inputs if isinstance(e, FakeTensor))
        with mode:
            outs = gm(*example_inputs)
        ran.append([o.shape for o in outs if isinstance(o, torch.Tensor)])
        return gm.forward

    def f(s, x, w):
        return (x * w).view(s, 2, 2).sum(2).exp()
    x, w = rg(8, 4), rg(4)
    gm = dynamic_graph(f, [8, x, w], {0: (1, 0), 1: [D, S]})
    compiled = aot_backend(fw_compiler=compiler)(gm, [8, x, w])
    assert len(ran) == 2 and T.is_symbolic(ran[0][0][0])      # forward and backward, symbolic
    at_sizes(compiled, gm, lambda n: [n, rg(n, 4), rg(4)], SIZES)


# ------------------------------------------------------------------------------------------------
# Through kiln.compile (the capture makes the dynamic graphs)
# ------------------------------------------------------------------------------------------------

class _Spy:
    def __init__(self, inner):
        self.inner, self.compiled = inner, []

    def __call__(self, gm, example_inputs):
        c = self.inner(gm, example_inputs)
        self.compiled.append(c)
        return c


@pytest.mark.parametrize("partition_fn", ["default", "min_cut"])
def test_kiln_compile_dynamic_attention_block_training(partition_fn):
    import copy
    import math

    class Block(torch.nn.Module):
        def __init__(self, d=16, h=4):
            super().__init__()
            self.h, self.ln, self.qkv, self.o = h, torch.nn.LayerNorm(d), torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

        def forward(self, x):
            B, T_, C = x.shape
            q, k, v = (t.view(B, T_, self.h, C // self.h).transpose(1, 2)
                       for t in self.qkv(self.ln(x)).split(C, dim=2))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~torch.tril(torch.ones(T_, T_, dtype=torch.bool)), float("-inf")).softmax(-1)
            return x + self.o((att @ v).transpose(1, 2).contiguous().view(B, T_, C))
    m = Block().to(DT)
    ref = copy.deepcopy(m)
    spy = _Spy(aot_backend(partition_fn=partition_fn))
    cm = kiln.compile(m, backend=spy, dynamic=True)
    for shape in [(2, 8, 16), (3, 5, 16), (2, 7, 16), (4, 9, 16)]:
        x = rg(*shape)
        xe = x.detach().clone().requires_grad_(True)
        out, r = cm(x), ref(xe)
        assert_same(out, r)
        out.pow(2).sum().backward()
        r.pow(2).sum().backward()
        assert_same(x.grad, xe.grad)
        for (k, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
            assert_same(p.grad, q.grad, path=k)
    assert len(spy.compiled) == 1 and isinstance(spy.compiled[0], AOTCompiled)
    assert spy.compiled[0].fallback.compiles == 0


def test_kiln_compile_automatic_dynamic_with_mutation_and_views():
    def f(x, buf):
        buf.add_(x.mean(0))
        return x.t(), x[1:] * 2, buf
    spy = _Spy(aot_eager)
    cf = kiln.compile(f, backend=spy)
    for n in (4, 6, 9, 5):
        x, buf = rn(n, 3), rn(3)
        e_buf = buf.clone()
        out, ref = cf(x, buf), f(x, e_buf)
        assert_same(out, ref)
        assert out[2] is buf and out[0]._base is x
    # static first, then one dynamic graph for every later size
    assert len(spy.compiled) == 2 and spy.compiled[1].input_check is not None
    assert spy.compiled[1].fallback.compiles == 0


def test_a_shape_whose_cache_payload_cannot_be_made_still_runs():
    """A per-shape compile of a dynamic capture whose artifact cannot be serialized (a size
    left symbolic in its metadata) is not stored, and the call returns eager's result; kiln's
    export error never reaches the caller (fuzz seed 73191)."""
    hist = []

    def fn(y, w, v):
        t1 = torch.relu(v)
        (y + -1.5) @ (y + -1.5).t()
        hist.append(t1.shape[0])
        w[:, 1] = 2.0
        w.add_(t1)
        return round(float(t1.abs().max()), 3)

    compiled = kiln.compile(fn, backend="aot_eager", dynamic=True)
    for n in (5, 6):
        y = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
        w, v = torch.randn(4, 4), torch.randn(4, requires_grad=True)
        w_eager = w.clone()
        assert compiled(y, w, v) == fn(y, w_eager, v)
        torch.testing.assert_close(w, w_eager)
    assert hist == [4, 4, 4, 4]


@pytest.mark.parametrize("dynamic", [None, True])
def test_functionalize_over_a_compiled_function(dynamic):
    """``torch.func.functionalize`` hands the compiled function functional tensors, whose
    storage has no data pointer (the per-shape dispatch read it to tell aliased arguments)."""
    def f(x):
        return x.add_(1.0) + torch.nn.functional.relu_(x)

    x = torch.randn(3, 4)
    xk = x.clone()
    want = torch.func.functionalize(f)(x)
    got = torch.func.functionalize(kiln.compile(f, backend="aot_eager", dynamic=dynamic))(xk)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(xk, x)
