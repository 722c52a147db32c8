"""Repeated blocks (kiln/capture/regions.py): the layers of a ModuleList that trace to the same
code become invoke_region calls of one shared subgraph; a layer that differs keeps its own
code; torch.compiler.nested_compile_region is honoured; the switch turns it off."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.aot.regions import invoke_region
from kiln.backends import aot_backend


@pytest.fixture(autouse=True)
def repeated_blocks():
    with kiln.config.patch(repeated_blocks=True):
        yield


class Block(torch.nn.Module):
    def __init__(self, d=8, eps=1e-6, act=F.silu):
        super().__init__()
        self.norm = torch.nn.Parameter(torch.ones(d))
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)
        self.eps, self.act = eps, act

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm
        return x + self.down(self.act(self.up(h)))


class Stack(torch.nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.layers = torch.nn.ModuleList(blocks)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Recorder:
    """A backend that hands the captured graph back and runs it as it is (regions outlined:
    the node runs the block's code where it stands)."""
    kiln_regions = True

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def region_calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is invoke_region]


def blocks_of(gm):
    return {n.args[0].target for n in region_calls(gm)}


def check_training(model, compiled, x):
    model.zero_grad()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = model(x1)
    ref.pow(2).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out = compiled(x2)
    out.pow(2).sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x2.grad, x1.grad)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g)


def test_layers_of_one_class_share_one_subgraph():
    torch.manual_seed(0)
    model = Stack([Block() for _ in range(4)])
    rec = Recorder()
    check_training(model, kiln.compile(model, backend=rec), torch.randn(3, 8))
    (gm,) = rec.graphs
    assert len(region_calls(gm)) == 4 and len(blocks_of(gm)) == 1


def test_a_layer_that_differs_keeps_its_own_code():
    torch.manual_seed(0)
    # another eps is a constant in the traced code; another activation another call
    model = Stack([Block(), Block(), Block(eps=1e-3), Block(act=torch.tanh), Block()])
    rec = Recorder()
    check_training(model, kiln.compile(model, backend=rec), torch.randn(3, 8))
    (gm,) = rec.graphs
    assert len(region_calls(gm)) == 3 and len(blocks_of(gm)) == 1
    # the two that differ are inlined: their ops are in the graph itself
    assert any(n.op == "call_function" and n.target is torch.tanh for n in gm.graph.nodes)


def test_layers_with_other_shapes_get_other_blocks():
    torch.manual_seed(0)
    model = Stack([Block(8), Block(8), Block(8)])
    model.layers.append(torch.nn.Linear(8, 4))
    model.layers.extend([Block(4), Block(4)])
    rec = Recorder()
    check_training(model, kiln.compile(model, backend=rec), torch.randn(3, 8))
    (gm,) = rec.graphs
    assert len(region_calls(gm)) == 5 and len(blocks_of(gm)) == 2


def test_a_swapped_layer_recompiles():
    torch.manual_seed(0)
    model = Stack([Block() for _ in range(3)])
    rec = Recorder()
    compiled = kiln.compile(model, backend=rec)
    x = torch.randn(3, 8, requires_grad=True)
    torch.testing.assert_close(compiled(x), model(x))
    assert len(region_calls(rec.graphs[0])) == 3
    model.layers[1].act = torch.tanh         # one layer now computes something else
    torch.testing.assert_close(compiled(x), model(x))
    assert len(rec.graphs) == 2
    assert len(region_calls(rec.graphs[1])) == 2


def test_off_by_config():
    model = Stack([Block() for _ in range(3)])
    rec = Recorder()
    with kiln.config.patch(repeated_blocks=False):
        compiled = kiln.compile(model, backend=rec)
        x = torch.randn(3, 8)
        torch.testing.assert_close(compiled(x), model(x))
    assert not region_calls(rec.graphs[0])


def test_a_compile_under_another_setting_does_not_reuse_the_others_graphs():
    """Two models of one class compiled in one process, the second with the switch off: it
    captures its own graph (the entries of a function are kept per setting)."""
    rec = Recorder()
    x = torch.randn(3, 8)
    with_blocks = Stack([Block() for _ in range(3)])
    torch.testing.assert_close(kiln.compile(with_blocks, backend=rec)(x), with_blocks(x))
    without = Stack([Block() for _ in range(3)])
    with kiln.config.patch(repeated_blocks=False):
        compiled = kiln.compile(without, backend=rec)
        torch.testing.assert_close(compiled(x), without(x))
    assert len(rec.graphs) == 2
    assert region_calls(rec.graphs[0]) and not region_calls(rec.graphs[1])


def test_not_for_backends_that_do_not_trace_blocks():
    model = Stack([Block() for _ in range(3)])
    seen = []

    def plain(gm, example_inputs):
        seen.append(gm)
        return gm.forward
    x = torch.randn(3, 8)
    torch.testing.assert_close(kiln.compile(model, backend=plain)(x), model(x))
    assert not region_calls(seen[0])


@pytest.mark.skipif(not hasattr(torch.compiler, "nested_compile_region"),
                    reason="torch.compiler.nested_compile_region is newer than this torch")
@pytest.mark.parametrize("repeated_blocks", [True, False])
def test_nested_compile_region_is_honoured(repeated_blocks):
    @torch.compiler.nested_compile_region
    def gate(x, w):
        return torch.sigmoid(x @ w) * x

    def fn(x, w1, w2):
        return gate(gate(x, w1), w2).sum() + gate(x, w1).mean()

    rec = Recorder()
    x, w1, w2 = torch.randn(4, 4), torch.randn(4, 4), torch.randn(4, 4)
    with kiln.config.patch(repeated_blocks=repeated_blocks):
        torch.testing.assert_close(kiln.compile(fn, backend=rec)(x, w1, w2), fn(x, w1, w2))
    (gm,) = rec.graphs
    assert len(region_calls(gm)) == 3 and len(blocks_of(gm)) == 1


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("through_view", [False, True])
def test_a_block_that_writes_an_outside_tensor_stays_inlined(backend, through_view):
    """A block writing the caller's tensor stays inlined, and the write reaches it: also
    through a view the block makes itself (``acc[0].add_(1)``), under
    ``nested_compile_region`` too."""
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, acc):
            (acc[0] if through_view else acc).add_(1)
            return self.lin(x) + acc.sum(0)

    @torch.compiler.nested_compile_region
    def bump(x):
        (x[0] if through_view else x).add_(5)
        return x.sum()

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Counting() for _ in range(3)])

        def forward(self, x, acc):
            for layer in self.layers:
                x = layer(x, acc)
            return x + bump(acc)

    model = M()
    compiled = kiln.compile(model, backend=backend)
    for _ in range(2):
        x = torch.randn(2, 4)
        acc1, acc2 = torch.zeros(3, 4), torch.zeros(3, 4)
        torch.testing.assert_close(compiled(x, acc1), model(x, acc2))
        torch.testing.assert_close(acc1, acc2)
    rec = Recorder()
    kiln.compile(model, backend=rec)(torch.randn(2, 4), torch.zeros(3, 4))
    assert not region_calls(rec.graphs[0])


class KVBlock(torch.nn.Module):
    """A block that hands a tensor out (as a model hands out its KV cache) and computes further
    from it. ``cat_onto_empty``: as a KV cache's first update, ``cat`` onto an empty tensor,
    whose output eager lays out contiguously (Inductor's decompositions make it a clone keeping
    the transposed layout)."""

    def __init__(self, d=8, cat_onto_empty=False):
        super().__init__()
        self.k = torch.nn.Linear(d, d)
        self.o = torch.nn.Linear(d, d)
        self.cat_onto_empty = cat_onto_empty

    def forward(self, x, cache):
        k = self.k(x).transpose(0, 1)
        if self.cat_onto_empty:
            k = torch.cat([k.new_zeros(k.shape[0], 0), k], dim=1)
        cache.append(k)
        return x + self.o(torch.tanh(k.transpose(0, 1)))


class KVStack(torch.nn.Module):
    def __init__(self, n=3, blocks=None):
        super().__init__()
        self.layers = torch.nn.ModuleList(blocks or [KVBlock() for _ in range(n)])

    def forward(self, x):
        cache = []
        for layer in self.layers:
            x = layer(x, cache)
        return x, cache


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_handed_out_tensor_gets_eagers_gradient(backend):
    """The cache tensor is a graph output the block computes further from: the block is cut
    there, so its gradient through the later part is eager's."""
    torch.manual_seed(0)
    model = KVStack()
    x = torch.randn(5, 8)
    ref, ref_cache = model(x)
    want = torch.autograd.grad(ref.pow(2).sum(), ref_cache)
    compiled = kiln.compile(model, backend=backend)
    out, cache = compiled(x)
    torch.testing.assert_close(out, ref)
    for a, b in zip(cache, ref_cache):
        torch.testing.assert_close(a, b)
        assert a.stride() == b.stride()
    got = torch.autograd.grad(out.pow(2).sum(), cache)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_a_block_output_keeps_eagers_layout_under_other_decompositions():
    """The traced block lays its outputs out as the captured code does: the handed-out cache
    has eager's strides, and the part of the block after the cut is traced once (not once for
    the captured layout and again for the decomposed one)."""
    from torch._inductor.decomposition import select_decomp_table

    from kiln.aot.partition import min_cut_rematerialization_partition
    torch.manual_seed(0)
    model = KVStack(blocks=[KVBlock(cat_onto_empty=True) for _ in range(3)])
    x = torch.randn(5, 8)
    ref, ref_cache = model(x)
    want = torch.autograd.grad(ref.pow(2).sum(), ref_cache)
    partitioned = []

    def partition(joint, joint_inputs, *, num_fwd_outputs):
        partitioned.append(joint)
        return min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)
    backend = aot_backend(partition_fn=partition, decompositions=select_decomp_table())
    for compiled in (kiln.compile(model, backend=backend), kiln.compile(model, backend="inductor")):
        out, cache = compiled(x)
        torch.testing.assert_close(out, ref)
        assert [c.stride() for c in cache] == [c.stride() for c in ref_cache]
        for a, b in zip(torch.autograd.grad(out.pow(2).sum(), cache), want):
            torch.testing.assert_close(a, b)
    assert len(partitioned) == 3        # the two parts of the block, once each, and the graph


def test_blocks_reach_the_aot_stages_as_one_traced_block():
    torch.manual_seed(0)
    graphs = {}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = gm
            return gm
        return compiler
    backend = aot_backend(fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    model = Stack([Block() for _ in range(4)])
    check_training(model, kiln.compile(model, backend=backend), torch.randn(3, 8))
    for kind in ("forward", "backward"):
        gm = graphs[kind]
        assert len(region_calls(gm)) == 4 and len(blocks_of(gm)) == 1, kind


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_blocks_on_cuda_under_autocast_with_adamw():
    """The GPU path: Inductor's Triton kernels for the block, bf16 autocast, AdamW steps; the
    parameters follow eager's."""
    torch.manual_seed(0)
    model = KVStack(4).cuda()
    twin = KVStack(4).cuda()
    twin.load_state_dict(model.state_dict())
    compiled = kiln.compile(twin)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, twin)]
    for _ in range(3):
        x = torch.randn(16, 8, device="cuda")
        for m, opt in zip((model, compiled), opts):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out, cache = m(x)
                loss = out.float().pow(2).mean() + sum(c.float().mean() for c in cache)
            loss.backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_dynamic_shapes(backend):
    """Blocks traced on symbolic sizes: one graph serves every length, gradients are eager's."""
    torch.manual_seed(0)
    model = Stack([Block() for _ in range(3)])
    compiled = kiln.compile(model, backend=backend, dynamic=True)
    for n in (3, 5, 7):
        check_training(model, compiled, torch.randn(n, 8))
    kv = KVStack()
    compiled = kiln.compile(kv, backend=backend)          # automatic dynamic: a second graph
    for n in (5, 6, 9):
        x = torch.randn(n, 8)
        out, cache = compiled(x)
        ref, ref_cache = kv(x)
        torch.testing.assert_close(out, ref)
        got = torch.autograd.grad(out.sum(), cache)
        want = torch.autograd.grad(ref.sum(), ref_cache)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


def test_also_where_graphs_replay_as_cuda_graphs():
    model = Stack([Block() for _ in range(3)])
    rec = Recorder()
    with kiln.config.patch(cudagraphs=True):
        x = torch.randn(3, 8, requires_grad=True)
        torch.testing.assert_close(kiln.compile(model, backend=rec)(x), model(x))
    assert len(region_calls(rec.graphs[0])) == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_blocks_replay_as_cuda_graphs(monkeypatch):
    """mode="reduce-overhead": the block is lowered once and every layer's call is recorded in
    the forward's and the backward's CUDA graphs; training and inference follow eager."""
    from kiln.aot import regions as aot_regions
    from kiln.cudagraphs import stats

    lowered = []
    to_inductor = aot_regions.to_inductor

    def counting(gm):
        lowered.append(len(region_calls(gm)))
        to_inductor(gm)
    monkeypatch.setattr(aot_regions, "to_inductor", counting)
    torch.manual_seed(0)
    model = Stack([Block() for _ in range(4)]).cuda()
    twin = Stack([Block() for _ in range(4)]).cuda()
    twin.load_state_dict(model.state_dict())
    compiled = kiln.compile(twin, mode="reduce-overhead")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    replays = stats["replay"]
    warnings.filterwarnings("error", "kiln: Inductor failed", RuntimeWarning)   # (no ATen fallback)
    for _ in range(4):
        x = torch.randn(16, 8, device="cuda")
        for m, opt in zip((model, compiled), opts):
            m(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(16, 8, device="cuda")
            torch.testing.assert_close(compiled(x), model(x))
    # forward and backward: the first layer's input needs no gradient, so it is its own code;
    # inference: all four layers
    assert sorted(lowered) == [3, 3, 4], lowered
    assert stats["replay"] > replays


class CheckpointedBlock(Block):
    """A layer whose body is checkpointed and draws dropout (HF's gradient_checkpointing)."""

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.body, x, use_reentrant=False)

    def body(self, x):
        return F.dropout(super().forward(x), p=0.3, training=True)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_checkpointed_blocks_are_shared_and_recompute_eagers_dropout(backend):
    torch.manual_seed(0)
    model = Stack([CheckpointedBlock() for _ in range(3)])
    x = torch.randn(4, 8, requires_grad=True)
    torch.manual_seed(1)
    ref = model(x)
    ref.pow(2).sum().backward()
    want = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm
    compiled = kiln.compile(model, backend=aot_backend(fw_compiler=keep) if backend == "aot_eager" else backend)
    torch.manual_seed(1)
    out = compiled(x)
    out.pow(2).sum().backward()
    torch.testing.assert_close(out, ref)
    for got, w in zip([p.grad for p in model.parameters()] + [x.grad], want):
        torch.testing.assert_close(got, w)
    if graphs:
        assert len(region_calls(graphs[0])) == 3 and len(blocks_of(graphs[0])) == 1


class FusedBlock(torch.nn.Module):
    """GPT-2's attention: keys and values split from one projection (views with gaps) handed
    out as the cache and read by the rest of the block."""

    def __init__(self, d=8):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.o = torch.nn.Linear(d, d)

    def forward(self, x, cache):
        q, k, v = self.qkv(x).split(x.shape[-1], dim=-1)
        cache.append((k, v))
        return x + self.o(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)


class FusedStack(torch.nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.layers = torch.nn.ModuleList([FusedBlock() for _ in range(n)])

    def forward(self, x):
        cache = []
        for layer in self.layers:
            x = layer(x, cache)
        return x, cache


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_blocks_reading_views_split_from_one_projection(backend):
    torch.manual_seed(0)
    model = FusedStack()
    x = torch.randn(2, 5, 8, requires_grad=True)
    ref, ref_cache = model(x)
    flat_ref = [t for kv in ref_cache for t in kv]
    want = torch.autograd.grad(ref.pow(2).sum(), [x, *flat_ref])
    out, cache = kiln.compile(model, backend=backend)(x)
    flat = [t for kv in cache for t in kv]
    torch.testing.assert_close(out, ref)
    for a, b in zip(flat, flat_ref):
        torch.testing.assert_close(a, b)
    got = torch.autograd.grad(out.pow(2).sum(), [x, *flat])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def _wrapped_twice(x):
    return x * 2


def _wrapped_thrice(x):
    return x * 3


_REGION = None


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_marked_region_is_guarded_by_the_function_it_wraps(backend, tmp_path):
    """Every ``nested_compile_region`` wrapper has the same code: the function it wraps is
    guarded by its own code. Two regions read through one global got one cache entry, and
    the second call (a new process, or after ``kiln.reset()``) ran the first's graph."""
    global _REGION
    ncr = torch.compiler.nested_compile_region

    def make():
        return lambda x: _REGION(x) + 1      # (a new function of the same code each time)

    x = torch.ones(2)
    with kiln.config.patch(cache_dir=str(tmp_path)):
        for inner, want in ((_wrapped_twice, 3.0), (_wrapped_thrice, 4.0), (_wrapped_twice, 3.0)):
            kiln.reset()
            _REGION = ncr(inner)
            torch.testing.assert_close(kiln.compile(make(), backend=backend)(x), torch.full((2,), want))
        compiled = kiln.compile(make(), backend=backend)
        for inner, want in ((_wrapped_thrice, 4.0), (_wrapped_twice, 3.0)):
            _REGION = ncr(inner)
            torch.testing.assert_close(compiled(x), torch.full((2,), want))
    _REGION = None
