"""A segmented graph's backward as one graph (kiln/aot/fused_backward.py): a plain backward()
runs one compiled backward for all segments; whatever can see a handed output's gradient at its
node (a hook, retain_grad, autograd.grad or backward(inputs=) naming it) makes the nodes run
one piece each. Either way every gradient, and what hooks see, is eager's."""
import pytest
import torch

import kiln
from kiln.aot.fused_backward import _memory_order


class _Counting:
    """An aot_backend that counts the backward graphs it compiles."""

    def __init__(self, compiler: str = "fx"):
        from kiln.aot.compile import run_as_fx
        from kiln.backends import aot_backend

        self.backwards = 0

        def bw(gm, ex):
            self.backwards += 1
            return run_as_fx(gm, ex)
        self.backend = aot_backend(fw_compiler=run_as_fx, bw_compiler=bw, partition_fn="min_cut")


def _model(layers: int = 3, own_key_projection: bool = False):
    """A decoder stack returning its keys (views of the projection: a slice of it, or with
    ``own_key_projection`` all of it, transposed) and values (new tensors), which later layers
    read, and a loss computed from the logits it also returns."""
    torch.manual_seed(0)
    lins = [torch.nn.Linear(8, 24) for _ in range(layers)]
    keys = [torch.nn.Linear(8, 8) for _ in range(layers)]
    head = torch.nn.Linear(8, 5)

    def f(x, target):
        cache = []
        h = x
        for lin, key in zip(lins, keys):
            q, k, v = lin(h).split(8, dim=-1)
            if own_key_projection:
                k = key(h)
            k = k.reshape(-1, 2, 4).transpose(0, 1)       # (2, n, 4): a view
            v = v * 1.5
            att = torch.softmax(q.reshape(-1, 2, 4).transpose(0, 1) @ k.transpose(1, 2), -1)
            h = h + (att @ v.reshape(-1, 2, 4).transpose(0, 1)).transpose(0, 1).reshape(-1, 8)
            cache += [k, v]
        logits = head(h)
        return torch.nn.functional.cross_entropy(logits, target), logits, cache
    params = [p for m in lins + (keys if own_key_projection else []) + [head] for p in m.parameters()]
    return f, params


def _run(fn, params, how: str, n: int = 6):
    """One call and a backward the way ``how`` says; the gradients and what hooks saw."""
    for p in params:
        p.grad = None
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 8, generator=g).requires_grad_()
    target = torch.randint(0, 5, (n,), generator=g)
    loss, logits, cache = fn(x, target)
    seen = []
    if how == "plain":
        loss.backward()
    elif how == "outside":              # a handed output also used outside the graph
        (loss + cache[1].square().sum() + logits.sum()).backward()
    elif how in ("hook", "hook_then_dropped"):
        got = {}
        cache[2].register_hook(lambda t: got.setdefault("k", t.clone()))
        cache[3].register_hook(lambda t: got.setdefault("v", t.clone()))
        if how == "hook_then_dropped":
            del cache
        loss.backward()
        seen += [got.get("k"), got.get("v")]     # (the order hooks run in is autograd's)
    elif how == "retain_grad":
        logits.retain_grad()
        loss.backward()
        seen.append(logits.grad)
    elif how == "grad_of_cache":
        return [t for t in torch.autograd.grad(loss, [cache[0], cache[3], *params])]
    elif how == "inputs":
        loss.backward(inputs=params[:3])
        return [p.grad for p in params[:3]]
    elif how == "twice":
        loss.backward(retain_graph=True)
        loss.backward()
    else:
        raise ValueError(how)
    return [p.grad for p in params] + [x.grad] + seen


def _same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)


def test_a_plain_backward_runs_one_backward_graph_and_matches_eager():
    f, params = _model(layers=4)
    counting = _Counting()
    cf = kiln.compile(f, backend=counting.backend)
    for step in range(3):
        _same(_run(cf, params, "plain"), _run(f, params, "plain"))
    assert counting.backwards == 1          # the fused graph, compiled once; no pieces


@pytest.mark.parametrize("how", ["outside", "hook", "hook_then_dropped", "retain_grad", "grad_of_cache", "inputs",
                                 "twice"])
def test_every_way_to_see_a_handed_outputs_gradient_matches_eager(how):
    f, params = _model()
    cf = kiln.compile(f, backend="aot_eager")
    for step in range(2):
        _same(_run(cf, params, how), _run(f, params, how))


@pytest.mark.parametrize("how", ["plain", "outside", "hook"])
def test_inductor_fused_and_node_by_node_match_eager(how):
    f, params = _model()
    cf = kiln.compile(f)
    _same(_run(cf, params, how), _run(f, params, how))


def test_a_hook_makes_that_calls_backward_run_node_by_node(caplog):
    f, params = _model()
    counting = _Counting()
    cf = kiln.compile(f, backend=counting.backend)
    _run(cf, params, "plain")
    assert counting.backwards == 1
    with caplog.at_level("INFO", logger="kiln.aot"):
        _same(_run(cf, params, "hook"), _run(f, params, "hook"))
    assert "runs node by node: a hook on a handed output" in caplog.text
    assert counting.backwards > 2           # one piece per segment
    pieces = counting.backwards
    _run(cf, params, "plain")               # a later call without hooks: the fused graph again
    assert counting.backwards == pieces


def test_dynamic_sizes_match_eager():
    """Missing tangents' symbolic sizes are read from values the fused graph keeps; a handed
    view that is its base transposed (a key cache) adds its gradient as a permutation."""
    f, params = _model(own_key_projection=True)
    counting = _Counting()
    cf = kiln.compile(f, backend=counting.backend, dynamic=True)
    for n in (5, 7, 9):
        _same(_run(cf, params, "plain", n), _run(f, params, "plain", n))
    assert counting.backwards == 1


def test_dynamic_sliced_views_run_one_backward_graph_and_match_eager():
    """A handed view that is a slice of its base (keys split from one projection) adds its
    gradient scattered into the base's, with the slice's size, stride and offset computed in
    the graph from the sizes of its values."""
    f, params = _model()
    counting = _Counting()
    cf = kiln.compile(f, backend=counting.backend, dynamic=True)
    for n in (5, 7, 9):
        _same(_run(cf, params, "plain", n), _run(f, params, "plain", n))
    assert counting.backwards == 1
    for how in ("outside", "hook"):
        _same(_run(cf, params, how, 6), _run(f, params, how, 6))


def test_dynamic_sliced_views_under_inductor_match_eager():
    f, params = _model()
    cf = kiln.compile(f, dynamic=True)
    for n in (5, 7):
        _same(_run(cf, params, "plain", n), _run(f, params, "plain", n))
    assert len(cf.entries) == 1


def test_memory_order_of_dense_views():
    assert _memory_order((2, 3, 4), (4, 8, 1), 24) == [1, 0, 2]    # a transpose of (3, 2, 4)
    assert _memory_order((2, 3), (3, 1), 6) == [0, 1]
    assert _memory_order((2, 3), (0, 1), 6) is None                 # expanded: elements repeat
    assert _memory_order((2, 3), (6, 1), 12) is None                # every other row


def test_an_input_returned_through_an_identity_and_read_later_gets_its_gradient():
    """The input's gradient is the returned copy's tangent itself: in the fused graph, that
    tangent plus what the loss gives the copy (Gemma's training step lost a norm's gradient)."""
    def f(x, w):
        h = x.clone()
        return h, (h @ w).pow(2).sum()

    counting = _Counting()
    cf = kiln.compile(f, backend=counting.backend)
    for _ in range(2):
        x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, 2, requires_grad=True)
        rx, rw = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        cf(x, w)[1].backward()
        f(rx, rw)[1].backward()
        _same([x.grad, w.grad], [rx.grad, rw.grad])
    assert counting.backwards == 1


class _SplitKV(torch.nn.Module):
    """Keys and values split from one projection (views with gaps), returned as a cache and read
    by the rest of the layer: GPT-2's attention without its head reshape."""

    def __init__(self, d=8):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.o = torch.nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).split(x.shape[-1], dim=-1)
        return x + self.o(torch.softmax(q @ k.transpose(-1, -2), -1) @ v), k, v


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_handed_views_split_from_one_projection(backend):
    torch.manual_seed(0)
    model = _SplitKV()
    x = torch.randn(2, 5, 8, requires_grad=True)

    def loss_of(out):
        h, k, v = out
        return h.pow(2).sum() + k.sum() + v.sum()
    loss_of(model(x)).backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss_of(kiln.compile(model, backend=backend)(x)).backward()
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w)
