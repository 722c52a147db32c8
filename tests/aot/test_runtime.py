"""Runtime wrappers and what is rejected: duplicate and aliased inputs, mutations, RNG,
requires_grad of outputs. A call the compiled graphs do not fit runs the function as it was
given (``run_as_captured``); a loaded artifact, which has none, raises kiln.Unsupported
(never a wrong gradient)."""
import pytest
import torch

import kiln
from kiln.aot import create_aot_state, stage1_graph_capture, stage2_compile
from kiln.testing import assert_same

from _aot_helpers import DT, rg, rn


def compile_fn(fn, args, **kw):
    with create_aot_state(fn, args, **kw) as st:
        return stage2_compile(st, stage1_graph_capture(st))


def test_wrappers_are_recorded_in_pre_capture_order():
    def f(x, y, n, b):
        b.add_(n)
        return x * y
    x = rn(3)
    b = rn(6)
    with create_aot_state(f, [x, x, 2, b[1:4]]) as st:
        kinds = [w.kind for w in st.wrappers]
    assert kinds == ["rng_state", "non_tensor_inputs", "dedup_inputs", "mutations_and_aliases"]


def test_duplicate_inputs_are_deduplicated_and_checked():
    def f(x, y):
        return x * y
    x = rg(3)
    compiled = compile_fn(f, [x, x])
    assert compiled.forward_graph.code.count("primals_") >= 1
    assert len([n for n in compiled.forward_graph.graph.nodes if n.op == "placeholder"]) == 1
    out = compiled(x, x)
    out.sum().backward()
    assert_same(x.grad, 2 * x.detach())
    y = rg(3)
    out = compiled(x, y)                    # not the same tensor now: runs as given
    out.sum().backward()
    assert_same(out, x * y)
    assert_same(y.grad, x.detach())
    from kiln.aot import AOTArtifact, stage2_export

    with create_aot_state(f, [x, x]) as st:
        loaded = AOTArtifact.from_bytes(stage2_export(st, stage1_graph_capture(st)).to_bytes()).load()
    with pytest.raises(kiln.Unsupported, match="same tensor"):
        loaded(x, rg(3))


def test_non_tensor_inputs_are_specialized_and_checked():
    compiled = compile_fn(lambda x, n, s: x * n if s == "mul" else x + n, [rn(3), 3, "mul"])
    x = rn(3)
    assert_same(compiled(x, 3, "mul"), x * 3)
    assert_same(compiled(x, 4, "mul"), x * 4)      # another constant: runs as given
    assert_same(compiled(x, 4, "add"), x + 4)


def test_synthetic_base_common_base():
    def f(a, b):
        b.mul_(2)
        return a + 1
    base = rn(6)
    a, b = base[:4], base[2:]
    with create_aot_state(f, [a, b]) as st:
        assert [w.kind for w in st.wrappers][-2:] == ["synthetic_bases", "mutations_and_aliases"]
        compiled = stage2_compile(st, stage1_graph_capture(st))
    base2 = base.clone()
    out = compiled(a, b)
    ref_a, ref_b = base2[:4], base2[2:]
    ref_b.mul_(2)
    assert_same(out, ref_a + 1)
    assert_same(base, base2)
    a2, b2 = rn(6)[:4], rn(6)[2:]                   # not views of one base now: runs as given
    ref_a2, ref_b2 = a2.clone(), b2.clone()
    assert_same(compiled(a2, b2), f(ref_a2, ref_b2))
    assert_same([a2, b2], [ref_a2, ref_b2])


def test_synthetic_base_whole_storage():
    t = rn(6)
    a = t[:4]
    b = torch.empty(0, dtype=DT).set_(t.untyped_storage(), 2, (4,), (1,))   # no common _base
    assert b._base is None and a._base is t

    def f(a, b):
        b.add_(1)
        return a * 1
    compiled = compile_fn(f, [a, b])
    t2 = t.clone()
    out = compiled(a, b)
    t2[2:6] += 1
    assert_same(out, t2[:4])
    assert_same(t, t2)


def test_aliased_inputs_requiring_grad_without_common_base_are_rejected():
    leaf = rg(6)
    base = leaf * 1
    a = base[:4]
    b = base.detach()[2:]           # shares memory; another base; no grad

    def f(a, b):
        b.add_(1)
        return a * 2
    with pytest.raises(kiln.Unsupported, match="share memory"):
        create_aot_state(f, [a, b])


def test_mutated_input_aliasing_at_runtime_is_rejected():
    def f(x, y):
        x.add_(1)
        return x * y
    compiled = compile_fn(f, [rn(3), rn(3)])
    base = rn(4)
    ref = base.clone()
    assert_same(compiled(base[:3], base[1:]), f(ref[:3], ref[1:]))   # runs as given
    assert_same(base, ref)


def test_storage_swap_is_rejected():
    def f(x, y):
        x.set_(y)
        return x + 1
    with pytest.raises(kiln.Unsupported, match="set_"):
        create_aot_state(f, [rn(3), rn(3)])


def test_metadata_mutation_of_input_requiring_grad_is_rejected():
    def f(x):
        x.t_()
        return x * 2
    with pytest.raises(kiln.Unsupported, match="metadata mutation"):
        create_aot_state(f, [rg(2, 3) * 1])


def test_data_dependent_ops_are_rejected():
    with pytest.raises(kiln.Unsupported, match="data-dependent"):
        create_aot_state(lambda x: x[x > 0], [rn(5)])


def test_grad_mode_mismatch_at_runtime_runs_as_given():
    compiled = compile_fn(lambda x, w: x * w, [rn(3), rg(3)])
    x, w = rg(3), rg(3)
    (x * w * 1).sum().backward()        # (x must get a gradient too: traced without one)
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    compiled(x, w).sum().backward()
    assert_same([x.grad, w.grad], [gx, gw])
    with torch.no_grad():
        assert not compiled(rg(3), rg(3)).requires_grad
    with torch.no_grad():
        inf = compile_fn(lambda x: x * 2, [rg(3)])
    assert inf.kind == "inference"
    x = rg(3)
    out = inf(x)                        # traced under no_grad, called with grad mode on
    assert out.requires_grad
    out.sum().backward()
    assert_same(x.grad, torch.full((3,), 2.0, dtype=DT))


def test_double_backward_is_an_error_not_a_wrong_gradient():
    """create_graph=True gives eager's first-order gradient (a gradient penalty's value, a
    jacobian never differentiated); differentiating that gradient again is a clear error,
    never a silent zero."""
    compiled = compile_fn(lambda x: x.sin(), [rg(3)])
    x = rg(3)
    (g,) = torch.autograd.grad(compiled(x).sum(), [x], create_graph=True)
    assert_same(g.detach(), x.detach().cos())
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()
    (g,) = torch.autograd.grad(compiled(x).sum(), [x])      # and without create_graph
    assert_same(g, x.detach().cos())
    x.grad = None
    compiled(x).sum().backward(create_graph=True)
    assert_same(x.grad.detach(), x.detach().cos())


def test_double_backward_wrt_chosen_inputs_is_an_error_too():
    """A gradient penalty differentiated with ``autograd.grad(loss, x)``: autograd runs only the
    nodes on a path to ``x``, so the refusal must be on that path (it was off it: the penalty's
    term was silently dropped). Through a graph whose input is made by earlier ops (a tensor
    the backward cannot reach), create_graph=True is refused at once."""
    compiled = compile_fn(lambda x: (x * x * x).sin(), [rg(2)])
    x = rg(2)
    (g,) = torch.autograd.grad(compiled(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(g.pow(2).sum() + (x ** 2).sum(), x)
    (g,) = torch.autograd.grad(compiled(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(g.sum(), x, allow_unused=True, materialize_grads=True)
    y = x * 2                                   # not a leaf
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(compiled(y).sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(compiled(y).sum(), x)        # first order alone: eager's
    assert_same(g, 2 * 3 * (2 * x.detach()) ** 2 * ((2 * x.detach()) ** 3).cos())


def test_outputs_requires_grad_and_non_differentiable():
    def f(x):
        return x * 2, x.argmax(), (x > 0), x.detach(), x.sum().detach()
    x = rg(4)
    outs = compile_fn(f, [x])(x)
    assert [o.requires_grad for o in outs] == [True, False, False, False, False]
    assert outs[3].data_ptr() == x.data_ptr()            # detach aliases the input, as in eager


def test_unused_outputs_and_noncontiguous_grads():
    def f(x, w):
        y = x @ w
        return y, y.sin(), y.cos()
    x, w = rn(3, 4), rg(4, 5)
    compiled = compile_fn(f, [x, w])
    a, b, c = compiled(x, w)
    (b.t() * torch.arange(15, dtype=DT).view(5, 3)).sum().backward()      # a, c unused
    w2 = w.detach().clone().requires_grad_(True)
    _, b2, _ = f(x, w2)
    (b2.t() * torch.arange(15, dtype=DT).view(5, 3)).sum().backward()
    assert_same(w.grad, w2.grad)
    w.grad = None
    a, _, _ = compiled(x, w)
    a.sum().backward()                    # expanded (stride 0) gradient
    assert_same(w.grad, x.sum(0, keepdim=True).t().expand(4, 5))


def test_compiling_draws_no_random_numbers_and_dropout_matches_eager():
    def f(x, w):
        return torch.nn.functional.dropout(x @ w, 0.5) * 2
    x, w = rn(8, 8), rg(8, 8)
    torch.manual_seed(7)
    compiled = compile_fn(f, [x, w])
    r1 = torch.rand(3)
    torch.manual_seed(7)
    r2 = torch.rand(3)
    assert_same(r1, r2)
    for p in ("default", "min_cut"):
        with create_aot_state(f, [x, w]) as st:
            compiled = stage2_compile(st, stage1_graph_capture(st), partition_fn=p)
        bw = compiled.backward_graph.code
        assert "dropout" not in bw and "bernoulli" not in bw and "rand" not in bw
        torch.manual_seed(3)
        out = compiled(x, w)
        w2 = w.detach().clone().requires_grad_(True)
        torch.manual_seed(3)
        ref = f(x, w2)
        assert_same(out, ref)
        w.grad = None
        out.sum().backward()
        ref.sum().backward()
        assert_same(w.grad, w2.grad)


def test_unused_random_op_still_draws():
    def f(x):
        torch.rand(4)          # eager draws these numbers even though nothing uses them
        return x + torch.rand(3)
    x = rn(3)
    compiled = compile_fn(f, [x])
    torch.manual_seed(5)
    a = compiled(x)
    torch.manual_seed(5)
    assert_same(a, f(x).to(a.dtype))


def test_mutation_under_no_grad_of_a_parameter():
    def f(x, w):
        y = x + w
        with torch.no_grad():
            w.mul_(0.5)
        return y
    x = rn(3)
    w = rg(3)
    w_ref = w.detach().clone().requires_grad_(True)
    compiled = compile_fn(f, [x, w])
    out = compiled(x, w)
    ref = f(x, w_ref)
    assert_same(out, ref)
    assert_same(w.detach(), w_ref.detach())
    out.sum().backward()
    ref.sum().backward()
    assert_same(w.grad, w_ref.grad)


def test_saved_tensor_hooks_run_at_runtime():
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t

    compiled = compile_fn(lambda x, w: (x * w).sin(), [rn(3), rg(3)])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = compiled(rn(3), rg(3))
    assert packed                       # the compiled Function's saved tensors went through the hook
    y.sum().backward()


def test_tensor_subclass_inputs_are_rejected():
    class MyT(torch.Tensor):
        pass
    t = rn(3).as_subclass(MyT)
    with pytest.raises(kiln.Unsupported, match="subclass"):
        create_aot_state(lambda x: x + 1, [t])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_dropout_and_batchnorm_match_eager():
    import copy

    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Dropout(0.5),
                            torch.nn.GELU(), torch.nn.Linear(32, 4)).to("cuda", DT)
    ref = copy.deepcopy(m)
    cm = kiln.compile(m, backend="aot_eager", fullgraph=True)
    for step in range(3):
        x = torch.randn(8, 16, device="cuda", dtype=DT)
        torch.manual_seed(step)
        out = cm(x)
        torch.manual_seed(step)
        exp = ref(x)
        assert_same(out, exp)
        out.square().sum().backward()
        exp.square().sum().backward()
        for a, b in zip(m.parameters(), ref.parameters()):
            assert_same(a.grad, b.grad)
        assert_same(m.state_dict(), ref.state_dict())


def test_node_that_saves_nothing_backwards_twice_like_eager():
    """``t = v - w`` saves nothing in eager: a second backward() through t after one through
    ``(t * t).sum()`` works. kiln's node read ``ctx.saved_tensors`` (freed by the first
    backward) and raised "backward through the graph a second time" (fuzz seed 6271)."""
    def f(w, v):
        t = v - w
        return t, (t * t).sum()

    grads = []
    for fn in (f, kiln.compile(f, backend="aot_eager")):
        torch.manual_seed(0)
        w, v = torch.randn(4, 4, requires_grad=True), torch.randn(4, requires_grad=True)
        t, loss = fn(w, v)
        loss.backward()
        t.sum().backward()
        grads.append((w.grad, v.grad))
    torch.testing.assert_close(grads[1], grads[0])



@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_node_whose_compiled_backward_saves_nothing_still_refuses_a_second_backward(backend):
    """``zeros_like(x) * x``: eager's node saves the zeros, so a second backward() raises.
    Inductor's backward needs nothing saved (the gradient is zeros): kiln's node must raise
    all the same (it returned a second gradient instead)."""
    def f(x):
        return torch.zeros_like(x) * x

    for fn in (f, kiln.compile(f, backend=backend)):
        out = fn(torch.randn(3, requires_grad=True))
        out.sum().backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            out.sum().backward()

@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_graph_traced_under_autocast_runs_its_own_casts_only(backend):
    """The graph of a call under CPU bf16 autocast holds autocast's casts; run under autocast
    again, the ``_safe_softmax`` of its attention (traced in float32) came out bfloat16 and the
    backward, traced for float32, failed. Compiled graphs run with autocast off."""
    mask = torch.ones(6, 6, dtype=torch.bool).tril()

    def f(x, w1, w2):
        q, k, v = (x @ w1).view(2, 6, 3, 8).unbind(2)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return (att @ w2).float().pow(2).mean()

    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)
    ws = [torch.randn(8, 24, requires_grad=True), torch.randn(8, 5, requires_grad=True)]
    refs = [w.detach().clone().requires_grad_() for w in ws]
    cf = kiln.compile(f, backend=backend)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = cf(x, *ws)
            ref = f(x, *refs)
        loss.backward()
        ref.backward()
        torch.testing.assert_close(loss, ref)
        for w, r in zip(ws, refs):
            torch.testing.assert_close(w.grad, r.grad)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_views_of_an_intermediate_in_another_traced_layout_match_eager(backend):
    """A sliding-window KV cache returns ``full[:, :, -w:]`` of ``full = cat([empty(0), k])``:
    eager's ``cat`` keeps ``k``'s transposed layout, the decomposed trace made it contiguous, and
    the view the runtime takes again from the returned base (with eager's strides) read other
    elements (Mistral's cache under inductor). The base is returned in eager's layout."""
    def f(x, w):
        k = (x @ w).view(2, 8, 2, 4).transpose(1, 2)
        full = torch.cat([torch.empty(0), k], dim=-2)
        return full[:, :, -5:, :], (full * 2).sum()

    cf = kiln.compile(f, backend=backend)
    for _ in range(2):
        x, w = torch.randn(2, 8, 6), torch.randn(6, 8)
        with torch.no_grad():
            got, want = cf(x, w), f(x, w)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
            assert g.stride() == e.stride()


def test_a_backward_given_a_saved_value_in_another_layout_runs_as_aten_ops():
    """A compiled backward checks its inputs' strides before running anything (Inductor's
    ``assert_size_stride``). A saved value in another layout than compiled for (a dynamic
    graph's forward laid it out otherwise) must not reach the user as that assertion: the
    graph runs as ATen ops, its views as reshapes, and gives the same values. A static graph
    is called as it is (its saved layouts are the forward's)."""
    import warnings

    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.aot.function import layout_checked

    gm = make_fx(lambda a: [a.view(-1) * 2], tracing_mode="symbolic")(torch.randn(2, 3))
    calls = []

    def compiled(args):
        calls.append(1)
        raise AssertionError("expected size 3==3, stride 1==3 at dim=1")

    run = layout_checked(compiled, gm, "a test backward")
    a = torch.randn(3, 2).t()                       # not viewable as (-1,)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = run([a])
    torch.testing.assert_close(out[0], a.reshape(-1) * 2)
    assert any("another layout" in str(w.message) for w in rec)
    out = run([a])                                  # from now on, the ATen graph only
    torch.testing.assert_close(out[0], a.reshape(-1) * 2)
    assert len(calls) == 1

    def other_failure(args):
        raise AssertionError("a kernel's own check")
    with pytest.raises(AssertionError, match="own check"):
        layout_checked(other_failure, gm, "a test backward")([a])
    static = make_fx(lambda a: [a.view(-1) * 2])(torch.randn(2, 3))
    assert layout_checked(compiled, static, "a test backward") is compiled


@pytest.mark.parametrize("view", [
    lambda t: t.conj(),                       # a view of an input
    lambda t: (t * 2).conj(),                 # of an intermediate the function does not return
    lambda t: t.view(1, 3).mH,
    lambda t: torch._neg_view(t),
    lambda t: (lambda y: (y, y.conj()))(t * 2),   # of another output
], ids=["input", "intermediate", "mH", "neg_view", "output"])
def test_conjugate_and_negative_views_come_back_with_their_bits(view):
    """An output re-taken as a view of its base at run time keeps the conjugate and negative
    bits eager's view has (as_strided alone carries neither): values and gradients are eager's."""
    x = torch.complex(torch.randn(3), torch.randn(3)).requires_grad_()
    xk = x.detach().clone().requires_grad_()
    w = torch.complex(torch.randn(3), torch.randn(3))
    kiln.reset()
    got, want = kiln.compile(view, backend="aot_eager")(xk), view(x)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, e in zip(got, want):
        assert g.is_conj() == e.is_conj() and g.is_neg() == e.is_neg()
        torch.testing.assert_close(g.resolve_conj().resolve_neg(), e.resolve_conj().resolve_neg())
    sum((g.reshape(-1) * w).real.sum() for g in got).backward()
    sum((e.reshape(-1) * w).real.sum() for e in want).backward()
    torch.testing.assert_close(xk.grad, x.grad)
