"""CUDA graphs (``mode="reduce-overhead"``, ``kiln.config.cudagraphs``) on a GPU, against eager.
Skipped without CUDA; run on the GPU machine with
``python -m pytest tests/cudagraphs/test_cuda.py``."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.cudagraphs import live_functions, skip_reasons, stats

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = "cuda"


def close(a, e, tol=1e-4):
    torch.testing.assert_close(a, e, rtol=tol, atol=tol)


@pytest.fixture(autouse=True)
def _stats():
    stats.clear()
    skip_reasons.clear()
    yield


class MLP(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.a = nn.Linear(d, 4 * d)
        self.b = nn.Linear(4 * d, d)
        self.register_buffer("scale", torch.full((d,), 0.5))

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) * self.scale + x


def recordings(kind=None):
    return [r for f in live_functions() if kind is None or f.kind == kind
            for recs in f.recordings.values() for r in recs]


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_inference_replays_with_params_in_place(backend):
    m = MLP().to(DEV).eval()
    if backend == "inductor":
        cm = kiln.compile(m, mode="reduce-overhead")
        ctx = kiln.config.patch()
    else:
        ctx = kiln.config.patch(cudagraphs=True)
        cm = kiln.compile(m, backend="aot_eager")
    with ctx, torch.no_grad():
        for _ in range(4):
            x = torch.randn(8, 64, device=DEV)
            close(cm(x), m(x))
    assert stats["warmup"] == 1 and stats["record"] == 1 and stats["replay"] == 2, stats
    (rec,) = recordings("inference")
    n_params = len(list(m.parameters())) + len(list(m.buffers()))
    assert len(rec.inplace) == n_params and len(rec.copied) == 1   # only x is copied


def test_stale_output_raises_and_clone_survives():
    m = MLP().to(DEV).eval()
    cm = kiln.compile(m, mode="reduce-overhead")
    x = torch.randn(8, 64, device=DEV)
    with torch.no_grad():
        for _ in range(2):
            cm(x)
        x1, x2 = x.clone(), torch.randn(8, 64, device=DEV)
        y1 = cm(x)
        kept = y1.clone()
        view = y1[:2]
        del y1
        x.copy_(x2)             # (x is read in place: it stayed at one address)
        y2 = cm(x)
        close(y2, m(x2))
        close(kept, m(x1))
        with pytest.raises(RuntimeError, match="overwritten by a later replay"):
            view + 1
    (rec,) = recordings("inference")
    assert rec.optimistic and not rec.copied, (rec.optimistic, rec.copied)


def test_an_input_at_a_new_address_is_copied_from_then_on():
    m = MLP().to(DEV).eval()
    cm = kiln.compile(m, mode="reduce-overhead")
    x = torch.randn(8, 64, device=DEV)
    with torch.no_grad():
        for _ in range(3):
            close(cm(x), m(x))
        keep = [torch.randn(8, 64, device=DEV) for _ in range(4)]     # other addresses
        for xi in keep:
            close(cm(xi), m(xi))
        close(cm(x), m(x))
    recs = recordings("inference")
    assert len(recs) == 2 and recs[0].optimistic and not recs[1].optimistic and len(recs[1].copied) == 1
    assert stats["skip"] == 0, skip_reasons


def test_training_forward_and_backward_share_the_pool():
    torch.manual_seed(0)
    m = MLP().to(DEV)
    ref = copy.deepcopy(m)
    cm = kiln.compile(m, mode="reduce-overhead")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(5):
        x = torch.randn(8, 64, device=DEV)
        loss = cm(x).pow(2).mean()
        loss_ref = ref(x).pow(2).mean()
        close(loss, loss_ref)
        loss.backward()
        loss_ref.backward()
        for p, pr in zip(m.parameters(), ref.parameters()):
            close(p.grad, pr.grad)
        opt.step()
        opt_ref.step()
        opt.zero_grad()
        opt_ref.zero_grad()
    fw, bw = recordings("forward"), recordings("backward")
    assert len(fw) == 1 and len(bw) == 1
    assert fw[0].tree is bw[0].tree             # one pool for the forward and the backward
    assert stats["replay"] >= 6, stats
    # the backward reads the forward's saved tensors in place: only the tangent is copied
    assert len(bw[0].copied) <= 1, bw[0].copied
    # once the backward is recorded, the forward no longer holds its saved tensors (dead
    # memory between steps); the backward itself was captured before and does not overlap
    assert fw[0].held_saved == [] and bw[0].overlaps == []


def test_two_forwards_before_backward_are_correct():
    m = MLP().to(DEV)
    ref = copy.deepcopy(m)
    cm = kiln.compile(m, mode="reduce-overhead")
    for _ in range(4):
        x1, x2 = torch.randn(8, 64, device=DEV), torch.randn(8, 64, device=DEV)
        loss = cm(x1).sum() + cm(x2).pow(2).sum()
        loss_ref = ref(x1).sum() + ref(x2).pow(2).sum()
        loss.backward()
        loss_ref.backward()
        close(loss, loss_ref)
        for p, pr in zip(m.parameters(), ref.parameters()):
            close(p.grad, pr.grad)
            p.grad = pr.grad = None


def test_replaced_parameter_records_again_then_falls_back_with_a_warning():
    m = MLP().to(DEV).eval()
    cm = kiln.compile(m, mode="reduce-overhead")
    with torch.no_grad(), kiln.config.patch(cudagraph_max_recording=2):
        x = torch.randn(8, 64, device=DEV)
        cm(x), cm(x)
        assert stats["record"] == 1
        old = [m.a.weight]       # (kept: a new weight must not reuse a freed one's address)
        m.a.weight = nn.Parameter(torch.randn_like(m.a.weight))
        close(cm(x), m(x))
        assert stats["record"] == 2
        old.append(m.a.weight)
        m.a.weight = nn.Parameter(torch.randn_like(m.a.weight))
        with pytest.warns(RuntimeWarning, match=r"runs without CUDA graphs.*module\.a\.weight"):
            close(cm(x), m(x))
        close(cm(x), m(x))
        assert stats["record"] == 2 and stats["skip"] >= 2


def test_dynamic_shapes_one_recording_per_size():
    def f(x, w):
        return torch.tanh(x @ w) * 2

    w = torch.randn(32, 32, device=DEV)
    cf = kiln.compile(f, mode="reduce-overhead", dynamic=True)
    for n in (4, 6, 4, 6, 9, 9, 4, 6, 9):
        x = torch.randn(n, 32, device=DEV)
        close(cf(x, w), f(x, w))
    assert stats["record"] == 3, stats      # (a new x each call: copied, never read in place)
    assert stats["replay"] == 3, stats


def test_cpu_op_skips_with_reason_and_or_error_raises(capfd):
    def f(x):
        return (x + 1).sum() + torch.ones(3).sum()

    kiln.set_logs("cudagraphs")
    cf = kiln.compile(f, mode="reduce-overhead")
    x = torch.randn(4, device=DEV)
    close(cf(x), f(x))
    assert "skipping CUDA graphs" in capfd.readouterr().err
    kiln.reset()
    with kiln.config.patch(cudagraph_or_error=True):
        cf = kiln.compile(f, mode="reduce-overhead")
        with pytest.raises(kiln.CudagraphError, match="cpu"):
            cf(x)


def test_cpu_op_in_the_middle_splits_the_graph():
    def f(x):
        y = torch.sin(x) * 2
        n = torch.ones(4).sum()          # CPU work between two CUDA parts
        return torch.cos(y) + 1, n

    cf = kiln.compile(f, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(64, device=DEV)
        out, n = cf(x)
        close(out, f(x)[0])
        assert n.item() == 4
    assert stats["replay"] >= 2, (stats, skip_reasons)     # the two CUDA parts replay


def _split_in_the_middle(x):
    y = torch.sin(x) * 2
    n = torch.ones(4).sum()          # CPU work between two CUDA parts
    return torch.cos(y) + 1, n


def test_a_split_graph_is_stored_and_loads_as_its_pieces(tmp_path):
    """The cache entry of a graph split around a CPU op keeps each CUDA piece's module: a new
    process (here: after reset) loads it, nothing compiled, and the pieces replay; so does a
    package."""
    from kiln.cache import store

    def run(cf):
        for _ in range(3):
            x = torch.randn(64, device=DEV)
            out, n = cf(x)
            close(out, _split_in_the_middle(x)[0])
            assert n.item() == 4

    cf = kiln.compile(_split_in_the_middle, mode="reduce-overhead")
    run(cf)
    path = str(tmp_path / "split.kiln")
    report = cf.save_package(path)
    assert report.entries == 1 and not report.left_out, report
    kiln.reset()
    stats.clear()
    store.reset_stats()
    run(kiln.compile(_split_in_the_middle, mode="reduce-overhead"))
    assert store.stats()["hits"] == 1 and store.stats()["misses"] == 0, store.stats()
    assert stats["replay"] >= 2, (stats, skip_reasons)
    kiln.reset()
    stats.clear()
    with kiln.config.patch(cache=False):
        run(kiln.load_package(path, _split_in_the_middle, on_miss="error"))
    assert stats["replay"] >= 2, (stats, skip_reasons)


def test_a_graph_loaded_from_the_cache_is_skipped_as_it_was_compiled():
    """A training graph with CPU ops runs without CUDA graphs; loaded from the cache (its ops
    have no traced values then), the same facts decide: still skipped, for the same reason."""
    from kiln.cache import store

    def f(x):
        return x.sin() * (x.detach().sum().cpu() + 1).to(x.device)     # a round trip through the CPU

    def run():
        for _ in range(3):
            x = torch.randn(64, device=DEV, requires_grad=True)
            out = kiln.compile(f, mode="reduce-overhead")(x)
            out.sum().backward()
            ref = x.detach().clone().requires_grad_()
            f(ref).sum().backward()
            close(out, f(ref))
            close(x.grad, ref.grad)

    run()
    compiled_stats = dict(stats)      # (the forward is skipped, the backward replays)
    assert stats["skip"] == 3 and any("on the cpu device" in r for r in skip_reasons), (stats, skip_reasons)
    kiln.reset()
    stats.clear()
    skip_reasons.clear()
    store.reset_stats()
    run()
    assert store.stats()["hits"] >= 1, store.stats()
    assert dict(stats) == compiled_stats and any("on the cpu device" in r for r in skip_reasons), (stats, skip_reasons)


def test_buffer_mutation_is_written_back():
    bn = nn.BatchNorm1d(16).to(DEV)
    ref = copy.deepcopy(bn)
    cm = kiln.compile(bn, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(8, 16, device=DEV)
        with torch.no_grad():
            close(cm(x), ref(x))
    close(bn.running_mean, ref.running_mean)
    close(bn.running_var, ref.running_var)
    assert stats["replay"] >= 2


def test_a_static_kv_cache_is_written_in_place_by_the_replays():
    """A decoding step writes this token's keys into a cache marked at a static address (as
    Hugging Face's StaticCache marks its tensors) and advances a length counter: the replays
    write both in place, as torch's CUDA graphs do, instead of skipping the graph."""
    def step(x, cache, length):
        cache.index_copy_(0, length, x)
        length.add_(1)
        return cache.sum(0) * 2

    cache, length = torch.zeros(16, 8, device=DEV), torch.zeros(1, dtype=torch.long, device=DEV)
    ref_cache, ref_length = cache.clone(), length.clone()
    torch._dynamo.mark_static_address(cache)
    torch._dynamo.mark_static_address(length)
    cm = kiln.compile(step, mode="reduce-overhead")
    for _ in range(6):
        x = torch.randn(1, 8, device=DEV)
        close(cm(x, cache, length), step(x, ref_cache, ref_length))
        close(cache, ref_cache)
        assert int(length) == int(ref_length)
    assert not skip_reasons, dict(skip_reasons)
    assert stats["record"] == 1 and stats["replay"] == 4, stats


def test_graph_break_chain_reads_previous_outputs_in_place():
    def f(x):
        y = torch.sin(x) * 2
        print("break")       # a graph break: two graphs, the second reads the first's output
        return torch.cos(y) + 1

    cf = kiln.compile(f, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(64, device=DEV)
        close(cf(x), f(x))
    assert stats["replay"] >= 4, stats


def test_gpt_inference_and_training_match_eager():
    from benchmarks.cudagraphs import GPT

    torch.manual_seed(0)
    m = GPT(vocab=128, d=64, layers=2, heads=4, max_seq=32).to(DEV)
    ref = copy.deepcopy(m)
    cm = kiln.compile(m, mode="reduce-overhead")
    for _ in range(3):
        idx = torch.randint(0, 128, (2, 16), device=DEV)
        with torch.no_grad():
            close(cm(idx), ref(idx), 2e-3)
    for _ in range(3):
        idx = torch.randint(0, 128, (2, 16), device=DEV)
        loss, loss_ref = cm(idx, idx), ref(idx, idx)
        close(loss, loss_ref, 2e-3)
        loss.backward()
        loss_ref.backward()
        for p, pr in zip(m.parameters(), ref.parameters()):
            close(p.grad, pr.grad, 2e-3)
            p.grad = pr.grad = None
    assert stats["replay"] == 3 and stats["skip"] == 0, (stats, skip_reasons)


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_hf_models_match_eager(name):
    transformers = pytest.importorskip("transformers")  # noqa: F841
    from tests.models.test_transformers import inference_outputs, make_model, training_loss

    torch.manual_seed(0)
    model = make_model(name).to(DEV)
    ref = copy.deepcopy(model)
    cm = kiln.compile(model, mode="reduce-overhead")
    model.eval(), ref.eval()
    for _ in range(3):
        ids = torch.randint(0, 100, (2, 8), device=DEV)
        with torch.no_grad():
            got, exp = inference_outputs(name, cm(ids)), inference_outputs(name, ref(ids))
            for k in exp:
                close(got[k], exp[k], 1e-3)
    model.train(), ref.train()
    target = torch.randn(2, 8, 32, device=DEV)
    for _ in range(3):
        ids = torch.randint(0, 100, (2, 8), device=DEV)
        loss, loss_ref = training_loss(name, cm, ids, target), training_loss(name, ref, ids, target)
        close(loss, loss_ref, 1e-3)
        loss.backward()
        loss_ref.backward()
        for p, pr in zip(model.parameters(), ref.parameters()):
            assert (p.grad is None) == (pr.grad is None)
            if p.grad is not None:
                close(p.grad, pr.grad, 1e-3)
            p.grad = pr.grad = None
    assert stats["replay"] >= 3 and stats["skip"] == 0, (stats, skip_reasons)


def test_output_fed_back_as_input():
    def f(h, w):
        return torch.tanh(h @ w)

    w = torch.randn(32, 32, device=DEV) / 6
    cf = kiln.compile(f, mode="reduce-overhead")
    h = he = torch.randn(4, 32, device=DEV)
    for _ in range(6):
        h, he = cf(h, w), f(he, w)
        close(h, he)
    assert stats["replay"] >= 3, (stats, skip_reasons)


def test_chained_graph_training_matches_eager():
    """A differentiable output that feeds another compiles as a chain of two graphs
    (kiln/aot/chain.py): both parts record; gradients reach the first part's output."""
    def f(x, w):
        y = torch.log_softmax(x @ w, -1)
        return y, (y * y).sum()

    w = torch.randn(32, 16, device=DEV, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    cf = kiln.compile(f, mode="reduce-overhead")
    for _ in range(5):
        x = torch.randn(8, 32, device=DEV)
        (y, loss), (ye, le) = cf(x, w), f(x, we)
        close(y, ye), close(loss, le)
        (g,), (ge,) = torch.autograd.grad(loss, [y], retain_graph=True), torch.autograd.grad(le, [ye], retain_graph=True)
        close(g, ge)
        (loss + y.sum()).backward()
        (le + ye.sum()).backward()
        close(w.grad, we.grad)
        w.grad = we.grad = None
    assert stats["replay"] >= 4, (stats, skip_reasons)


def test_chained_graph_inference_and_partition_under_grad():
    """An inference call of a chained graph and a split graph (CPU op in the middle) called
    with grad on but no input requiring grad: correct, and the CUDA parts replay."""
    def f(x):
        y = torch.sin(x) * 2
        n = torch.ones(4).sum()
        return torch.cos(y) + n, y

    cf = kiln.compile(f, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(64, device=DEV)
        for got, exp in zip(cf(x), f(x)):
            close(got, exp)
    assert stats["replay"] >= 2, (stats, skip_reasons)


def test_training_graph_with_a_cpu_op_runs_without_cuda_graphs_correctly():
    def f(x, w):
        return (torch.tanh(x @ w) * torch.ones(1).sum().to(x.device)).sum()

    w = torch.randn(16, 16, device=DEV, requires_grad=True)
    we = w.detach().clone().requires_grad_()
    cf = kiln.compile(f, mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(4, 16, device=DEV)
        loss, le = cf(x, w), f(x, we)
        close(loss, le)
        loss.backward(), le.backward()
        close(w.grad, we.grad)
        w.grad = we.grad = None


def test_output_memory_is_the_pools_again_between_steps():
    """The recordings do not hold their outputs for good (as with torch's CUDA graphs): the
    gradients a backward hands to .grad, and an inference's outputs, are counted by the
    allocator only while the caller holds them; cuBLAS workspaces that warm-ups and captures
    made are dropped. Training still matches eager."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).to(DEV)
    ref = copy.deepcopy(m)
    cm = kiln.compile(m, mode="reduce-overhead")
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(16, 512, device=DEV)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    grads = sum(p.numel() * p.element_size() for p in m.parameters())       # 8 MiB
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        loss = cm(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    opt.zero_grad(set_to_none=True)
    del loss
    torch.cuda.synchronize()
    assert stats["record"] == 2 and stats["replay"] >= 6 and stats["skip"] == 0, (stats, skip_reasons)
    assert torch.cuda.memory_allocated() - base < grads / 8
    with torch.no_grad():
        for _ in range(4):
            y = cm(x)
        del y
    torch.cuda.synchronize()
    assert stats["skip"] == 0, skip_reasons
    assert torch.cuda.memory_allocated() - base < grads / 8
    with torch.no_grad():       # (after the count: an eager matmul makes a cuBLAS workspace)
        close(cm(x), m(x))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.01)
    for i in range(5):
        opt_ref.zero_grad(set_to_none=True)
        loss = ref(x).square().mean()
        loss.backward()
        opt_ref.step()
        close(torch.tensor(losses[i]), loss.detach().cpu())
    for p, pr in zip(m.parameters(), ref.parameters()):
        close(p, pr)


def test_a_held_output_is_not_overwritten_by_a_graph_recorded_after_it_died():
    """g's output memory goes back to the pool once its capture's tensors die, and h, recorded
    after that, may reuse it: while the caller holds an output of g's last replay, h's replay
    runs as compiled instead (reason logged) and the held output keeps its value until g's next
    call. A graph recorded while such an output is held is captured into a fresh pool."""
    w = torch.randn(256, 256, device=DEV) / 16

    def g(x):
        return torch.relu(x @ w) + 1

    def h(x):
        return torch.sigmoid(x @ w) * 3

    def k(x):
        return torch.tanh(x @ w) - 2

    cg, ch, ck = (kiln.compile(f, mode="reduce-overhead") for f in (g, h, k))
    x = torch.randn(64, 256, device=DEV)
    before = recordings()
    for _ in range(3):
        close(cg(x), g(x))      # warm-up, record (the capture's output dies), replay
    (rg,) = new_recordings(before)
    before = recordings()
    for _ in range(3):
        close(ch(x), h(x))      # warm-up, record (in g's pool, reusing its output memory), replay
    (rh,) = new_recordings(before)
    assert rh.pool == rg.pool and rg in [r() for r, _ in rh.reuses]
    y = cg(x)                   # a replay's output, held
    skips = stats["skip"]
    close(ch(x), h(x))          # h's replay would overwrite y: runs as compiled
    close(y, g(x))
    assert stats["skip"] == skips + 1 and any("still held" in r for r in skip_reasons), skip_reasons
    del y
    replays = stats["replay"]
    close(ch(x), h(x))
    assert stats["replay"] == replays + 1, (stats, skip_reasons)
    y = cg(x)
    before = recordings()
    for _ in range(3):
        close(ck(x), k(x))      # recorded while y is held: into a fresh pool
    close(y, g(x))
    (rk,) = new_recordings(before)
    assert rk.pool != rg.pool and rk.reuses == []
    assert stats["record"] == 3 and stats["skip"] == skips + 1, (stats, skip_reasons)


def new_recordings(before: list) -> list:
    """The recordings alive now that were not in ``before``."""
    seen = {id(r) for r in before}
    return [r for r in recordings() if id(r) not in seen]


def test_a_device_side_assert_replays():
    """``F.one_hot`` checks its classes with a device-side assert (``_assert_async``): a kernel,
    recorded and replayed like any other (a bad class would fail the device, as in eager)."""
    def route(x, experts):
        return (torch.nn.functional.one_hot(experts, 4).to(x.dtype) * x[:, :1]).sum(0)

    cf = kiln.compile(route, mode="reduce-overhead")
    x = torch.randn(8, 4, device=DEV)
    experts = torch.randint(0, 4, (8,), device=DEV)
    with torch.no_grad():
        for _ in range(3):
            close(cf(x, experts), route(x, experts))
    assert stats["skip"] == 0 and stats["replay"] >= 1, (stats, skip_reasons)
