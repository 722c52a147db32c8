"""Saved-tensor hooks around compiled calls.

Eager hooks: they see the real saved tensors (never kiln's fake tracing values), pack when the
compiled forward saves, unpack in the backward. Inlined hooks (``kiln.saved_tensors_hooks``,
``@kiln.inline_saved_tensors_hooks``): traced into the forward/backward graphs, guarded by
identity, cached by their code; untraceable ones stay eager with a logged reason.

The hooks used for comparisons with eager are exact (``t * 2`` then ``/ 2`` in float64), so
that results match eager's with the same hooks to rounding.
"""
import pytest
import torch

import kiln
from kiln.cache import store

DT = torch.float64


def f(x, w):
    return ((x @ w).sin() * x.sum()).relu().sum(0)


def inputs(n=6):
    return torch.randn(n, 5, dtype=DT, requires_grad=True), torch.randn(5, 4, dtype=DT, requires_grad=True)


def run(fn, x, w, hooks):
    x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    with hooks():
        out = fn(x, w)
    g = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    out.backward(g)
    return out.detach(), x.grad, w.grad


class Counting:
    """Exact pack/unpack (x2 then /2 for tensors of 16+ elements) that count their calls and
    record the type of what they are given."""

    def __init__(self):
        self.packs, self.unpacks, self.types = 0, 0, []

        def pack(t):
            self.packs += 1
            self.types.append(type(t))
            if t.numel() >= 16:          # hooks may branch on size (traced per saved tensor)
                return (t * 2, 2.0)
            return (t, 1.0)

        def unpack(p):
            self.unpacks += 1
            t, scale = p
            return t / scale if scale != 1.0 else t
        self.pack, self.unpack = pack, unpack

    def torch_hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def kiln_hooks(self):
        return kiln.saved_tensors_hooks(self.pack, self.unpack)


def _entry(cf):
    (entry,) = cf.entries
    return entry.compiled_graph


# -- 1. eager hooks ------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_eager_hooks_see_real_tensors_and_run_as_in_eager(backend):
    h = Counting()
    cf = kiln.compile(f, backend=backend)
    x, w = inputs()
    for _ in range(2):
        x, w = inputs()
        before = h.packs
        got = run(cf, x, w, h.torch_hooks)
        packs = h.packs - before
        assert packs > 0 and h.unpacks > 0
        expected = run(f, x, w, h.torch_hooks)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
    # never a FakeTensor (the first call's capture and AOT trace run with the hooks paused)
    assert all(t is torch.Tensor for t in h.types), set(h.types)
    assert len(cf.entries) == 1
    if backend == "aot_eager":
        saved = _entry(cf).saved_tensors
        assert packs == len(saved)          # pack runs on what the compiled forward saves


def test_eager_hooks_unpack_runs_in_backward():
    h = Counting()
    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    with h.torch_hooks():
        out = cf(x, w)
    assert h.packs > 0 and h.unpacks == 0
    out.sum().backward()
    assert h.unpacks == h.packs


# -- 2. inlined hooks ----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_inlined_hooks_match_eager(backend):
    h = Counting()
    cf = kiln.compile(f, backend=backend)
    x, w = inputs()
    got = run(cf, x, w, h.kiln_hooks)
    traced = (h.packs, h.unpacks)
    assert traced[0] > 0 and traced[1] > 0
    for _ in range(2):
        x, w = inputs()
        got = run(cf, x, w, h.kiln_hooks)
        expected = run(f, x, w, h.torch_hooks)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
    assert len(cf.entries) == 1
    compiled = _entry(cf)
    assert compiled.parts.hooks is not None and compiled.parts.hooks.packed
    x, w = inputs()
    before = h.packs
    run(cf, x, w, h.kiln_hooks)
    assert h.packs == before          # a compiled call runs no Python hook


def test_as_text_shows_inlined_pack_and_unpack():
    h = Counting()
    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    run(cf, x, w, h.kiln_hooks)
    compiled = _entry(cf)
    text = compiled.as_text()
    assert "saved-tensor hooks inlined" in text and "pack=" in text
    assert "#   pack of " in text and "aten.mul" in text.split("#   pack of ", 1)[1]
    assert "#   unpack of " in text and "aten.div" in text.split("#   unpack of ", 1)[1]
    fw_code = compiled.forward_graph.code
    bw_code = compiled.backward_graph.code
    assert "aten.mul" in fw_code and "_packed_0" in bw_code and "aten.div" in bw_code
    # the forward returns the packed value instead of the activation
    packed = compiled.parts.hooks.packed
    assert packed and all(name.endswith("_packed_0") for _, names in packed for name in names)
    assert compiled.parts.hooks.bytes_after == compiled.parts.hooks.bytes_before   # x2 keeps the size


def test_inline_marker_decorator_with_torch_context_manager():
    calls = []

    @kiln.inline_saved_tensors_hooks
    def pack(t):
        calls.append("pack")
        return t.to(torch.float32) if t.dtype == torch.float64 else t

    @kiln.inline_saved_tensors_hooks
    def unpack(t):
        return t.to(torch.float64) if t.dtype == torch.float32 else t

    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    hooks = lambda: torch.autograd.graph.saved_tensors_hooks(pack, unpack)  # noqa: E731
    got = run(cf, x, w, hooks)
    expected = run(f, x, w, hooks)
    for a, b in zip(got, expected):     # the policy's own rounding (float32), nothing more
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    hooks_info = _entry(cf).parts.hooks
    assert hooks_info is not None and hooks_info.bytes_after < hooks_info.bytes_before
    n = len(calls)
    run(cf, *inputs(), hooks)
    assert len(calls) == n


def test_new_hooks_recompile_with_a_reason():
    a, b = Counting(), Counting()
    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    run(cf, x, w, a.kiln_hooks)
    run(cf, x, w, a.kiln_hooks)
    assert len(cf.entries) == 1
    got = run(cf, x, w, b.kiln_hooks)
    assert len(cf.entries) == 2
    assert "SAVED_TENSOR_HOOKS" in cf.recompile_reasons[-1]
    assert b.packs > 0 and _entry_with(cf, b) is not None
    expected = run(f, x, w, b.torch_hooks)
    for u, v in zip(got, expected):
        torch.testing.assert_close(u, v)
    # and without hooks: a graph with no packing
    n = len(cf.entries)
    got = run(cf, x, w, _nothing)
    assert len(cf.entries) == n + 1
    plain = [e.compiled_graph for e in cf.entries if e.compiled_graph.parts.hooks is None]
    assert plain


def _entry_with(cf, h):
    for e in cf.entries:
        info = e.compiled_graph.parts.hooks
        if info is not None:
            return e
    return None


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_untraceable_hooks_stay_eager_with_a_logged_reason(capsys):
    kiln.set_logs("aot")
    counts = {"pack": 0}

    def pack(t):
        counts["pack"] += 1
        if t.sum().item() > 1e30:      # data-dependent: cannot be traced
            return t * 0
        return t.clone()

    def unpack(t):
        return t

    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    hooks = lambda: kiln.saved_tensors_hooks(pack, unpack)  # noqa: E731
    got = run(cf, x, w, hooks)
    err = capsys.readouterr().err
    assert "stay eager hooks" in err and "pack" in err
    assert _entry(cf).parts.hooks is None
    before = counts["pack"]
    got = run(cf, x, w, hooks)
    assert counts["pack"] - before == len(_entry(cf).saved_tensors)   # as eager hooks, every call
    expected = run(f, x, w, hooks)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_unpack_that_changes_the_tensor_stays_eager(capsys):
    kiln.set_logs("aot")

    def pack(t):
        return t

    def unpack(t):
        return t.to(torch.float32)     # not the saved tensor's dtype: refused, eager semantics kept

    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    with kiln.saved_tensors_hooks(pack, unpack):
        cf(x, w)
    assert "must give back a tensor like t" in capsys.readouterr().err
    assert _entry(cf).parts.hooks is None


def test_hooks_of_bound_methods_keep_their_identity():
    class Policy:
        def pack(self, t):
            return t * 2

        def unpack(self, t):
            return t / 2

    p = Policy()
    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    got = run(cf, x, w, lambda: kiln.saved_tensors_hooks(p.pack, p.unpack))
    run(cf, x, w, lambda: kiln.saved_tensors_hooks(p.pack, p.unpack))
    assert len(cf.entries) == 1
    expected = run(f, x, w, lambda: torch.autograd.graph.saved_tensors_hooks(p.pack, p.unpack))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_inference_calls_are_unaffected():
    h = Counting()
    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    with torch.no_grad(), h.kiln_hooks():
        out = cf(x, w)
    torch.testing.assert_close(out, f(x, w).detach())


def test_bad_arguments():
    with pytest.raises(TypeError):
        kiln.saved_tensors_hooks(1, lambda t: t)
    with pytest.raises(TypeError):
        kiln.saved_tensors_hooks(lambda t: t, lambda t: t, user_cache_hash=3)


# -- 3. the compile cache ------------------------------------------------------------------------

def _compile_once(pack, unpack, **kw):
    kiln.reset()
    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    return run(cf, x, w, lambda: kiln.saved_tensors_hooks(pack, unpack, **kw)), cf


def test_cache_hits_with_the_same_hooks_and_misses_with_others():
    kiln.cache.reset_stats()

    def pack(t):
        return t * 2

    def unpack(t):
        return t / 2

    def pack3(t):
        return t * 4

    def unpack3(t):
        return t / 4

    _compile_once(pack, unpack)
    assert kiln.cache.stats()["misses"] == 1
    _compile_once(pack, unpack)
    assert kiln.cache.stats()["hits"] == 1
    (got, cf) = _compile_once(pack3, unpack3)        # another hook never hits the old entry
    assert kiln.cache.stats()["misses"] == 2
    assert "aten.mul" in _entry(cf).forward_graph.code
    assert "4" in _entry(cf).forward_graph.code


def test_cache_key_follows_closure_values():
    def make(scale):
        def pack(t):
            return t * scale

        def unpack(t):
            return t / scale
        return pack, unpack

    kiln.cache.reset_stats()
    _compile_once(*make(2.0))
    _compile_once(*make(4.0))
    assert kiln.cache.stats()["misses"] == 2 and kiln.cache.stats().get("hits", 0) == 0
    _compile_once(*make(2.0))
    assert kiln.cache.stats()["hits"] == 1


def test_unhashable_hooks_bypass_the_cache_unless_given_a_user_cache_hash(capsys):
    class Scale:
        value = 2.0

    s = Scale()

    def pack(t):
        return t * s.value

    def unpack(t):
        return t / s.value

    kiln.set_logs("cache")
    kiln.cache.reset_stats()
    _compile_once(pack, unpack)
    err = capsys.readouterr().err
    assert "bypass" in err and "user_cache_hash" in err
    assert kiln.cache.stats()["bypasses"] >= 1
    kiln.cache.reset_stats()
    _compile_once(pack, unpack, user_cache_hash="scale-2")
    _compile_once(pack, unpack, user_cache_hash="scale-2")
    assert kiln.cache.stats()["hits"] == 1


# -- more programs ---------------------------------------------------------------------------------

def g_break(x, w):
    h = (x @ w).tanh()
    print("", end="")                 # a graph break: two graphs, each with the hooks
    return (h * h.sum()).sin().sum()


@pytest.mark.parametrize("inline", [False, True])
def test_graph_break_both_graphs_use_the_hooks(inline):
    h = Counting()
    hooks = h.kiln_hooks if inline else h.torch_hooks
    cf = kiln.compile(g_break, backend="aot_eager")
    for _ in range(2):
        x, w = inputs()
        got = run(cf, x, w, hooks)
        expected = run(g_break, x, w, hooks)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
    if not inline:      # (inlined hooks are traced: they see tracing values, at compile time only)
        assert all(t is torch.Tensor for t in h.types)
    else:
        n = h.packs
        run(cf, *inputs(), hooks)
        assert h.packs == n


def two_outputs(x, w):
    a = (x @ w).sin()
    b = (w * 3).cos()
    return a.sum(), b.sum()


def test_backward_through_one_output_then_the_other_with_retain_graph():
    h = Counting()
    cf = kiln.compile(two_outputs, backend="aot_eager")
    x, w = inputs()
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    with h.kiln_hooks():
        a, b = cf(x, w)
    with h.torch_hooks():
        ae, be = two_outputs(xe, we)
    assert _entry(cf).parts.hooks is not None
    a.backward(retain_graph=True)
    ae.backward(retain_graph=True)
    torch.testing.assert_close(x.grad, xe.grad)
    torch.testing.assert_close(w.grad, we.grad)
    b.backward()
    be.backward()
    torch.testing.assert_close(w.grad, we.grad)


def test_backward_outside_the_hooks_context_and_twice_with_retain_graph():
    h = Counting()
    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    with h.kiln_hooks():
        out = cf(x, w)
    out.sum().backward(retain_graph=True)
    g1 = x.grad.clone()
    out.sum().backward()
    torch.testing.assert_close(x.grad, 2 * g1)
    xe = x.detach().clone().requires_grad_()
    with h.torch_hooks():
        f(xe, w).sum().backward()
    torch.testing.assert_close(g1, xe.grad)


def test_dynamic_shapes_trace_the_hooks_per_size_branch():
    h = Counting()
    cf = kiln.compile(f, backend="aot_eager", dynamic=True)
    for n in (6, 9, 12, 2):           # 2: pack's numel branch changes: a guard, one more graph
        x, w = inputs(n)
        got = run(cf, x, w, h.kiln_hooks)
        expected = run(f, x, w, h.torch_hooks)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
    assert all(e.compiled_graph.parts.hooks is not None for e in cf.entries if e.compiled_graph is not None)


def test_cache_hit_gives_eager_results():
    def pack(t):
        return t * 2

    def unpack(t):
        return t / 2

    kiln.cache.reset_stats()
    first, _ = _compile_once(pack, unpack)
    (got, cf) = _compile_once(pack, unpack)
    assert kiln.cache.stats()["hits"] == 1
    assert _entry(cf).parts.hooks is not None and _entry(cf).parts.hooks.packed
    x, w = inputs()
    got = run(cf, x, w, lambda: kiln.saved_tensors_hooks(pack, unpack))
    expected = run(f, x, w, lambda: torch.autograd.graph.saved_tensors_hooks(pack, unpack))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_torch_save_on_cpu_around_a_compiled_call():
    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    got = run(cf, x, w, lambda: torch.autograd.graph.save_on_cpu())
    expected = run(f, x, w, lambda: torch.autograd.graph.save_on_cpu())
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_module_training_steps_with_inlined_hooks():
    h = Counting()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    ref = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    ref.load_state_dict(model.state_dict())
    cm = kiln.compile(model, backend="aot_eager")
    opt, opt_ref = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(8, 5, dtype=DT)
        with h.kiln_hooks():
            loss = cm(x).pow(2).mean()
        with h.torch_hooks():
            loss_ref = ref(x).pow(2).mean()
        loss.backward()
        loss_ref.backward()
        torch.testing.assert_close(loss, loss_ref)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        opt.step(), opt_ref.step(), opt.zero_grad(), opt_ref.zero_grad()
    assert len(cm.entries) == 1 and _entry(cm).parts.hooks is not None


def test_hook_that_changes_its_input_in_place_stays_eager(capsys):
    kiln.set_logs("aot")

    def pack(t):
        return t.mul_(1.0)            # in place on the saved tensor: eager semantics only

    def unpack(t):
        return t

    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    hooks = lambda: kiln.saved_tensors_hooks(pack, unpack)  # noqa: E731
    with pytest.raises(RuntimeError, match="modifying its input in place"):
        run(f, x, w, hooks)
    # not inlined (the graphs would drop the write): the eager hook runs, and raises as eager does
    with pytest.raises(RuntimeError, match="modifying its input in place"):
        run(cf, x, w, hooks)
    assert "changes its input in place" in capsys.readouterr().err
    assert _entry(cf).parts.hooks is None


SCALE = 2.0


def _pack_global(t):
    return t * SCALE


def _unpack_global(t):
    return t / SCALE


def test_values_the_hooks_read_are_guarded():
    global SCALE
    cf = kiln.compile(f, backend="aot_eager")
    x, w = inputs()
    hooks = lambda: kiln.saved_tensors_hooks(_pack_global, _unpack_global)  # noqa: E731
    try:
        run(cf, x, w, hooks)
        assert "2.0" in _entry(cf).forward_graph.code
        SCALE = 4.0                   # baked into the traced pack: a change recompiles
        got = run(cf, x, w, hooks)
        assert len(cf.entries) == 2 and "SAVED_TENSOR_HOOKS" in cf.recompile_reasons[-1]
        assert any("4.0" in e.compiled_graph.forward_graph.code for e in cf.entries)
    finally:
        SCALE = 2.0

    state = {"scale": 2.0}

    def make():
        def pack(t):
            return t * state["scale"]

        def unpack(t):
            return t / state["scale"]
        return pack, unpack
    pack, unpack = make()
    kiln.reset()
    cf = kiln.compile(f, backend="aot_eager")
    run(cf, x, w, lambda: kiln.saved_tensors_hooks(pack, unpack))
    expected = run(f, x, w, lambda: kiln.saved_tensors_hooks(pack, unpack))
    got = run(cf, x, w, lambda: kiln.saved_tensors_hooks(pack, unpack))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    state["scale"] = 8.0              # changed in place: the guard sees it too
    got = run(cf, x, w, lambda: kiln.saved_tensors_hooks(pack, unpack))
    assert len(cf.entries) == 2
    assert any("8.0" in e.compiled_graph.forward_graph.code for e in cf.entries)


def test_staged_api_and_export_round_trip():
    from kiln.aot import AOTArtifact, create_aot_state, stage1_graph_capture, stage2_compile, stage2_export

    def pack(t):
        return t.to(torch.float32), t.dtype

    def unpack(p):
        return p[0].to(p[1])

    x, w = inputs()
    with kiln.saved_tensors_hooks(pack, unpack):
        state = create_aot_state(f, [x, w])
        capture = stage1_graph_capture(state)
        compiled = stage2_compile(state, capture)
        artifact = stage2_export(state, capture)
    assert "saved-tensor hooks inlined" in compiled.as_text()
    assert "torch.float32" in compiled.forward_graph.code
    loaded = AOTArtifact.from_bytes(artifact.to_bytes()).load()
    assert loaded.parts.hooks is not None and loaded.parts.hooks.packed == compiled.parts.hooks.packed
    for fn in (compiled, loaded):
        xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        with kiln.saved_tensors_hooks(pack, unpack):
            out = fn(xr, wr)
        out.sum().backward()
        xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        f(xe, we).sum().backward()
        torch.testing.assert_close(xr.grad, xe.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(wr.grad, we.grad, rtol=1e-5, atol=1e-5)


def test_hooks_that_keep_what_they_return_see_their_tensors_intact():
    # an eager hook that holds the saved tensors: the (Inductor) backward must not reuse their
    # memory for its own buffers
    kept = []

    def pack(t):
        kept.append(t)
        return t

    def unpack(t):
        return t

    def g(x, w):
        return (x @ w).exp().sin().sum()

    cf = kiln.compile(g, backend="inductor")
    x, w = inputs()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = cf(x, w)
    snapshot = [t.clone() for t in kept]
    out.backward()
    for a, b in zip(kept, snapshot):
        torch.testing.assert_close(a, b)
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    g(xe, we).backward()
    torch.testing.assert_close(x.grad, xe.grad)
