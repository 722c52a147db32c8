"""A differentiable output that feeds another is on the other's autograd path, as in eager
(kiln/aot/segments.py): grad() with respect to it, retain_grad() and its hooks see the gradient
that flows from the later output (fuzz seed 3418); the forward is still one graph."""
import pytest
import torch

import kiln
from kiln.aot.segments import cut_outputs

BACKENDS = ["aot_eager", "inductor"]


@pytest.fixture(autouse=True)
def _no_fallback(monkeypatch):
    """The segments themselves must compile: a graph run as captured would hide a failure here."""
    import kiln.aot.dynamic as D

    fallbacks = []
    as_captured = D.as_captured

    def record(gm, error):
        fallbacks.append(f"{type(error).__name__}: {error}")
        return as_captured(gm, error)
    monkeypatch.setattr(D, "as_captured", record)
    yield
    assert not fallbacks, f"the graph ran as captured: {fallbacks}"


def _grad_wrt_output(x, w):
    y = torch.log_softmax(x @ w, -1)
    loss = (y * y).sum()
    g, = torch.autograd.grad(loss, [y], retain_graph=True)    # a graph break
    return g * 2, loss


def _two_outputs(x, w):
    logits = torch.tanh(x @ w)
    loss = (logits ** 2).mean()
    return logits, loss


def _three_levels(x, w, buf):
    a = (x @ w).sigmoid()
    b = a * 3 + 1
    buf.add_(1)                          # an input mutation after the first cut
    c = (b * b).sum() + buf.sum()
    return a, b, c


def _inputs():
    return torch.randn(4, 6), torch.randn(6, 5, requires_grad=True)


def _clone(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) for a in args]


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_with_respect_to_an_output_that_feeds_another(backend):
    args = _inputs()
    ref = _clone(args)
    got = kiln.compile(_grad_wrt_output, backend=backend)(*args)
    want = _grad_wrt_output(*ref)
    torch.testing.assert_close(got[0], want[0])
    got[1].backward()
    want[1].backward()
    torch.testing.assert_close(args[1].grad, ref[1].grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_retain_grad_and_hooks_on_an_output_see_the_later_outputs_gradient(backend):
    args = _inputs()
    ref = _clone(args)
    cf = kiln.compile(_two_outputs, backend=backend)
    for _ in range(2):                   # the compile, then the entry
        logits, loss = cf(*args)
        r_logits, r_loss = _two_outputs(*ref)
        seen = []
        logits.register_hook(lambda g: seen.append(g))
        logits.retain_grad()
        r_logits.retain_grad()
        loss.backward()
        r_loss.backward()
        assert logits.grad is not None and len(seen) == 1
        torch.testing.assert_close(logits.grad, r_logits.grad)
        torch.testing.assert_close(seen[0], r_logits.grad)
        torch.testing.assert_close(args[1].grad, ref[1].grad)


def test_chain_of_three_with_a_mutation_between_matches_eager():
    x, w = _inputs()
    buf = torch.zeros(3)
    rx, rw, rbuf = x.clone(), w.detach().clone().requires_grad_(), buf.clone()
    cf = kiln.compile(_three_levels, backend="aot_eager")
    a, b, c = cf(x, w, buf)
    ra, rb, rc = _three_levels(rx, rw, rbuf)
    torch.testing.assert_close(buf, rbuf)
    for t, r in ((a, ra), (b, rb), (c, rc)):
        torch.testing.assert_close(t, r)
    ga, gb = torch.autograd.grad(c, [a, b], retain_graph=True)
    rga, rgb = torch.autograd.grad(rc, [ra, rb], retain_graph=True)
    torch.testing.assert_close(ga, rga)
    torch.testing.assert_close(gb, rgb)
    c.backward()
    rc.backward()
    torch.testing.assert_close(w.grad, rw.grad)


def test_graph_count_is_unchanged_and_inference_is_not_segmented():
    from kiln.testing import CompileCounter

    seen = []

    def spy(gm, example_inputs):
        seen.append(bool(torch.is_grad_enabled() and cut_outputs(gm)))
        return gm.forward
    counter = CompileCounter()
    kiln.compile(_two_outputs, backend=counter)(*_inputs())
    assert counter.frame_count == 1
    kiln.compile(_two_outputs, backend=spy)(*_inputs())
    with torch.no_grad():
        kiln.compile(_two_outputs, backend=spy)(*_inputs())
    assert seen == [True, False]      # nothing to segment without gradients


def test_a_segmented_graph_is_one_cache_entry_that_loads():
    kiln.cache.reset_stats()
    kiln.compile(_two_outputs, backend="aot_eager")(*_inputs())
    assert kiln.cache.stats()["misses"] == 1
    kiln.reset()
    args = _inputs()
    ref = _clone(args)
    got = kiln.compile(_two_outputs, backend="aot_eager")(*args)
    assert kiln.cache.stats()["hits"] == 1
    _logits_grad_matches_eager(got, args, ref)


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_dynamic_graph_chain_matches_eager_for_each_size(backend):
    cf = kiln.compile(_two_outputs, backend=backend, dynamic=True)
    for n in (4, 7, 4, 9):
        args = (torch.randn(n, 6), torch.randn(6, 5, requires_grad=True))
        ref = _clone(args)
        _logits_grad_matches_eager(cf(*args), args, ref)


def _logits_grad_matches_eager(got, args, ref):
    """``_two_outputs``' (logits, loss) from kiln: backward() from the loss gives the retained
    logits' gradient and the weight's gradient eager gives on ``ref``."""
    logits, loss = got
    r_logits, r_loss = _two_outputs(*ref)
    logits.retain_grad()
    r_logits.retain_grad()
    loss.backward()
    r_loss.backward()
    torch.testing.assert_close(logits.grad, r_logits.grad)
    torch.testing.assert_close(args[1].grad, ref[1].grad)


# -- one forward graph, a node per segment ------------------------------------------------------

class _Forwards:
    """An aot_backend whose forward compiler counts the forward graphs and keeps the AOT result."""

    def __init__(self):
        from kiln.aot.compile import run_as_fx
        from kiln.backends import aot_backend

        self.forwards = 0
        self.backwards = 0

        def fw(gm, ex):
            self.forwards += 1
            return run_as_fx(gm, ex)

        def bw(gm, ex):
            self.backwards += 1
            return run_as_fx(gm, ex)
        self.backend = aot_backend(fw_compiler=fw, bw_compiler=bw, partition_fn="min_cut")


def _kv_model(layers=3, window=None):
    """A decoder stack that returns each layer's keys and values (a KV cache) and the loss.
    ``window``: the cache keeps the last ``window`` keys and values, slices that nothing
    later reads (Mistral's sliding-window cache)."""
    torch.manual_seed(0)
    ws = [torch.nn.Linear(8, 24) for _ in range(layers)]
    head = torch.nn.Linear(8, 5)

    def f(x, target):
        cache = []
        h = x
        for lin in ws:
            q, k, v = lin(h).split(8, dim=-1)
            k = torch.cat([torch.empty(0), k.transpose(0, 1).reshape(-1)]).view(8, -1).t()
            att = torch.softmax(q @ k.transpose(0, 1), -1)
            h = h + att @ v
            cache += [k, v] if window is None else [k[-window:], v[-window:]]
        logits = head(h)
        loss = torch.nn.functional.cross_entropy(logits, target)
        return loss, logits, cache
    return f, ws + [head]


def test_kv_cache_graph_is_one_forward_and_grads_match_eager():
    f, mods = _kv_model()
    counter = _Forwards()
    cf = kiln.compile(f, backend=counter.backend)
    for step in range(2):
        x = torch.randn(6, 8, requires_grad=True)
        target = torch.randint(0, 5, (6,))
        xr = x.detach().clone().requires_grad_()
        loss, logits, cache = cf(x, target)
        r_loss, r_logits, r_cache = f(xr, target)
        torch.testing.assert_close(loss, r_loss)
        for t, r in zip(cache, r_cache):
            torch.testing.assert_close(t, r)
            assert t.stride() == r.stride()
        # autograd.grad with respect to the cache: the gradient that flows from the loss
        got = torch.autograd.grad(loss, [logits, *cache], retain_graph=True, allow_unused=True)
        want = torch.autograd.grad(r_loss, [r_logits, *r_cache], retain_graph=True, allow_unused=True)
        for g, w in zip(got, want):
            assert (g is None) == (w is None)
            if g is not None:
                torch.testing.assert_close(g, w)
        grads = [p.grad for m in mods for p in m.parameters()]
        for m in mods:
            m.zero_grad()
        (loss + cache[0].sum()).backward()
        got_p = [p.grad.clone() for m in mods for p in m.parameters()]
        for m in mods:
            m.zero_grad()
        (r_loss + r_cache[0].sum()).backward()
        for g, m_p in zip(got_p, [p for m in mods for p in m.parameters()]):
            torch.testing.assert_close(g, m_p.grad)
        torch.testing.assert_close(x.grad, xr.grad)
        del grads
    assert counter.forwards == 1
    assert counter.backwards >= 2       # one per segment that has a gradient


def _kiln_nodes(loss) -> list:
    """The autograd nodes of kiln's compiled graphs behind ``loss``."""
    nodes, todo = {}, [loss.grad_fn]
    while todo:
        n = todo.pop()
        if n is None or n in nodes:
            continue
        nodes[n] = None
        todo.extend(m for m, _ in n.next_functions)
    return [n for n in nodes if getattr(getattr(n, "_forward_cls", None), "kiln_aot", False)]


def test_segments_save_only_what_their_backward_reads():
    f, mods = _kv_model(layers=4)
    cf = kiln.compile(f, backend="aot_eager")
    x = torch.randn(6, 8, requires_grad=True)
    loss, logits, cache = cf(x, torch.randint(0, 5, (6,)))
    kiln_nodes = _kiln_nodes(loss)
    assert len(kiln_nodes) >= 3
    saved = [{(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)) for t in n.saved_tensors
              if t is not None} for n in kiln_nodes]
    total = set().union(*saved)
    assert all(len(s) < len(total) for s in saved), ([len(s) for s in saved], len(total))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backward_through_the_loss_frees_what_it_read_while_the_outputs_are_held(backend):
    """A training loop keeps the model's outputs (its KV cache, logits, the loss) past
    backward(): eager's nodes freed their saved tensors when backward() went through them, and
    kiln's must too, not keep them for a backward through the cache that eager would refuse."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    f, mods = _kv_model(layers=4, window=4)
    cf = kiln.compile(f, backend=backend)
    x = torch.randn(6, 8, requires_grad=True)
    target = torch.randint(0, 5, (6,))
    for _ in range(2):
        loss, logits, cache = cf(x, target)
        held = {t.untyped_storage().data_ptr() for t in [x, target, logits, *cache, *(p for m in mods for p in m.parameters())]}
        saved = [StorageWeakRef(t.untyped_storage()) for n in _kiln_nodes(loss)
                 for t in n.saved_tensors if t is not None and t.untyped_storage().data_ptr() not in held]
        assert saved
        loss.backward()
        gc.collect()
        assert all(s.expired() for s in saved), sum(not s.expired() for s in saved)
    # a backward through the cache now goes through nodes backward() ran: eager refuses it
    r_loss, r_logits, r_cache = f(x, target)
    r_loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        r_cache[0].sum().backward()
    with pytest.raises(RuntimeError, match="second time"):
        cache[0].sum().backward()


def test_a_view_output_that_feeds_another_gets_its_hooks_gradient():
    def f(x, w):
        y = (x @ w).tanh()
        v = y.t()                       # returned, and a view of an intermediate
        return v, (v * v).sum()

    for backend in BACKENDS:
        x, w = torch.randn(4, 6), torch.randn(6, 5, requires_grad=True)
        wr = w.detach().clone().requires_grad_()
        v, loss = kiln.compile(f, backend=backend)(x, w)
        rv, rloss = f(x, wr)
        assert v._base is not None and v.stride() == rv.stride()
        seen = []
        v.register_hook(seen.append)
        loss.backward()
        rloss.backward()
        torch.testing.assert_close(seen[0], 2 * rv.detach())
        torch.testing.assert_close(w.grad, wr.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_handed_value_written_in_place_later_compiles_as_a_chain_and_matches(backend):
    def f(x, w):
        y = (x @ w).t()                 # handed over with a transposed layout
        z = y * 2
        y.mul_(3)                       # after the cut: eager's y and z see it
        return y, (z * y).sum()

    _output_and_loss_like_eager(f, backend)


def _output_and_loss_like_eager(f, backend, grad_of_output: bool = False):
    """``f(x, w) -> (y, loss)`` compiled: ``y``, ``loss``, ``w``'s gradient (and
    ``autograd.grad(loss, [y])``) equal eager's, twice."""
    for _ in range(2):
        x, w = torch.randn(4, 6), torch.randn(6, 5, requires_grad=True)
        wr = w.detach().clone().requires_grad_()
        y, loss = kiln.compile(f, backend=backend, fullgraph=True)(x, w)
        ry, rloss = f(x, wr)
        torch.testing.assert_close(y, ry)
        torch.testing.assert_close(loss, rloss)
        if grad_of_output:
            g, = torch.autograd.grad(loss, [y], retain_graph=True)
            rg, = torch.autograd.grad(rloss, [ry], retain_graph=True)
            torch.testing.assert_close(g, rg)
        loss.backward()
        rloss.backward()
        torch.testing.assert_close(w.grad, wr.grad)


def _written_by_setitem(y):
    y[:, 1] = 2.0


def _written_in_place(y):
    y.mul_(2)


def _written_through_a_view(y):
    y[:, 1].mul_(2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("write", [_written_by_setitem, _written_in_place, _written_through_a_view])
def test_an_output_written_before_the_later_output_reads_it_is_on_its_path(backend, write):
    """Written before ``loss`` reads it, eager's ``y`` (the tensor returned) is what ``loss`` is
    computed from: ``autograd.grad(loss, [y])`` is ``2 * y``, and ``w``'s gradient flows
    through the write (fuzz seed 73140)."""
    def f(x, w):
        y = x @ w - 0.5
        write(y)
        return y, (y * y).sum()

    _output_and_loss_like_eager(f, backend, grad_of_output=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reads", [torch.zeros_like, torch.Tensor.detach], ids=["zeros_like", "detach"])
def test_a_later_output_that_reads_an_earlier_one_without_its_gradient(backend, reads):
    """``loss`` reads ``y`` only for its size or detached, and the input ``w`` itself for its
    gradient: it is still differentiable, and ``w``'s gradient through it arrives, with either
    output's backward alone or both (fuzz seed 76711: no grad_fn, ``w``'s gradient lost)."""
    def f(x, w):
        y = x @ w - 0.5
        return y, ((reads(y) + 1) @ w).pow(2).sum()

    for backward_of in ((0,), (1,), (0, 1)):
        x, w = torch.randn(4, 6), torch.randn(6, 6, requires_grad=True)
        wr = w.detach().clone().requires_grad_()
        out, ref = kiln.compile(f, backend=backend)(x, w), f(x, wr)
        assert [o.requires_grad for o in out] == [r.requires_grad for r in ref] == [True, True]
        for a, b in zip(out, ref):
            torch.testing.assert_close(a, b)
        sum(out[k].sum() for k in backward_of).backward()
        sum(ref[k].sum() for k in backward_of).backward()
        torch.testing.assert_close(w.grad, wr.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backward_through_a_middle_output_of_a_dynamic_graph(backend):
    """Only ``log1p`` (a cut output of the middle segment) reaches the loss: that node's backward
    fills the missing tangent of ``add`` with zeros whose symbolic size comes from the given
    tangent, not from a saved value only the first segment keeps (fuzz seed 73131)."""
    def f(y):
        silu = torch.nn.functional.silu(y)
        add = silu * 1e-7 + silu
        log1p = torch.log1p(silu.abs())
        return silu, add, log1p, log1p.mean()

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in (4, 5):
        y = torch.randn(n, 4, requires_grad=True)
        yr = y.detach().clone().requires_grad_()
        outs, ref = compiled(y), f(yr)
        for o, r in zip(outs, ref):
            torch.testing.assert_close(o, r)
        outs[2].sum().backward()
        ref[2].sum().backward()
        torch.testing.assert_close(y.grad, yr.grad)


def test_a_conversion_to_eagers_layout_sits_right_after_its_value():
    """An output whose traced layout or dtype is not eager's is converted right after the node
    that computes it (not at the end of the graph): in a fused forward a later segment reads
    that converted value, and must come after it (on CUDA, a KV cache read by attention)."""
    import types

    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln.aot.graph_capture import with_eager_layouts

    def f(x):
        k = x * 2
        return k, (k @ k.t()).sum()

    gm = make_fx(f, tracing_mode="fake")(torch.randn(4, 3))
    out = lambda stride, dtype: types.SimpleNamespace(stride=stride, dtype=dtype)  # noqa: E731
    meta = types.SimpleNamespace(mutated_data_indices=[], graph_output_indices=[0, 1], intermediate_bases=[],
                                 outputs=[out((1, 4), "float64"), out((), None)])
    with_eager_layouts(gm, meta)
    nodes = list(gm.graph.nodes)
    k = next(n for n in nodes if n.target is torch.ops.aten.mul.Tensor)
    convert, copy = nodes[nodes.index(k) + 1], nodes[nodes.index(k) + 2]
    assert convert.target is torch.ops.prims.convert_element_type.default and convert.args[0] is k
    assert copy.target is torch.ops.prims.copy_strided.default and copy.args[0] is convert
    returned = gm.graph.find_nodes(op="output")[0].args[0][0]
    assert returned is copy and copy.meta["val"].stride() == (1, 4) and copy.meta["val"].dtype == torch.float64
    gm.graph.lint()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_handed_value_copied_to_eagers_layout_stays_one_forward(backend):
    """The trace lays ``cat([empty(0), k])`` out contiguously where eager keeps ``k``'s
    transposed layout, so the returned cache is copied to eager's strides; the later output
    reads that copy in the fused forward, which must compute it before its reader (the copy
    sits right after the value, not at the end of the graph)."""
    torch.manual_seed(0)
    w = torch.randn(6, 8, requires_grad=True)

    def f(x):
        k = (x @ w).view(2, 8, 2, 4).transpose(1, 2)
        full = torch.cat([torch.empty(0), k], dim=-2)
        return full, (full * full).sum()

    counter = _Forwards()
    cf = kiln.compile(f, backend=counter.backend if backend == "aot_eager" else backend)
    for _ in range(2):
        x = torch.randn(2, 8, 6)
        full, loss = cf(x)
        r_full, r_loss = f(x)
        assert full.stride() == r_full.stride()
        torch.testing.assert_close(full, r_full)
        got = torch.autograd.grad(loss, [full, w])
        want = torch.autograd.grad(r_loss, [r_full, w])
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
    if backend == "aot_eager":
        assert counter.forwards == 1


def _cut_then_break(x, y):
    t5 = torch.add(y.T, -1.5)
    t6 = (y * 0.5).mean()
    t8 = torch.add(x, t6, alpha=0.5)        # computed from the output t6: a cut
    if t8.abs().max().item() > 0.5:          # a graph break: t5, t6 and t8 are outputs
        pass
    t5.sigmoid_()
    return t6


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_backward_through_some_outputs_of_a_dynamic_segment(dynamic):
    """backward() through one output of a segment, in a graph with symbolic sizes: the backward
    without the other tangents sizes their zeros from saved sizes that the node does not keep
    (fuzz seed 79164); it runs the node's whole backward with zeros instead."""
    x = torch.randn(5, 4, dtype=torch.float64)
    y = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    ye = y.detach().clone().requires_grad_(True)
    cf = kiln.compile(_cut_then_break, backend="aot_eager", dynamic=dynamic)
    out, expected = cf(x, y), _cut_then_break(x, ye)
    out.backward()
    expected.backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(y.grad, ye.grad)
