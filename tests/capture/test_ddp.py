"""DistributedDataParallel under kiln, on 2 real processes over gloo: both wrappings train as eager
DDP does, the graph is cut at DDP's gradient buckets before the backend, a bucket's all-reduce
starts while earlier pieces' backward still runs, and no_sync / find_unused_parameters /
static_graph behave as in eager DDP."""
from __future__ import annotations

import torch

import kiln
from _distributed import assert_params_equal, requires_gloo, run_ranks, same_model

pytestmark = requires_gloo

D = 64
LAYERS = 6
LAYER_BYTES = (D * D + D) * 4
TWO_LAYERS_MB = 2 * LAYER_BYTES / 2**20      # a bucket cap that holds two layers exactly


class Stack(torch.nn.Module):
    def __init__(self, unused: bool = False, d: int = D):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(d, d) for _ in range(LAYERS)])
        if unused:
            self.unused = torch.nn.Linear(D, D)     # never called: find_unused_parameters

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _ddp(model, **kw):
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, **kw)


def _batch(rank: int, step: int, n: int = 8, d: int = D):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, d, generator=g)


def _train_like_eager(rank, world, wrapping, ddp_kw, backend="aot_eager", steps=4):
    eager = _ddp(same_model(Stack), **ddp_kw)
    eager_step = eager
    if wrapping == "kiln(DDP)":
        trained = _ddp(same_model(Stack), **ddp_kw)
        step_fn = kiln.compile(trained, backend=backend)
    elif wrapping == "kiln(step calling DDP)":
        trained = _ddp(same_model(Stack), **ddp_kw)

        def step(model, x):
            return model(torch.sin(x)) * 2      # work before and after the DDP call

        compiled_step = kiln.compile(step, backend=backend)

        def step_fn(x):
            return compiled_step(trained, x)

        def eager_step(x):
            return step(eager, x)
    else:
        trained = _ddp(kiln.compile(same_model(Stack), backend=backend), **ddp_kw)
        step_fn = trained
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_k = torch.optim.SGD(trained.parameters(), lr=0.1)
    for step_index in range(steps):
        x = _batch(rank, step_index)
        losses = []
        for call, opt in ((eager_step, opt_e), (step_fn, opt_k)):
            loss = call(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    assert_params_equal(eager, trained)


def _worker_wrappings(rank, world):
    for wrapping in ("kiln(DDP)", "DDP(kiln)", "kiln(step calling DDP)"):
        _train_like_eager(rank, world, wrapping, dict(bucket_cap_mb=TWO_LAYERS_MB))
    _train_like_eager(rank, world, "kiln(DDP)", dict(bucket_cap_mb=TWO_LAYERS_MB, static_graph=True))


def test_both_wrappings_and_static_graph_train_like_eager_ddp():
    run_ranks(_worker_wrappings)


class _RecordingBackend:
    """Runs each graph as it is; keeps, per graph, which of ``params`` its inputs are."""

    def __init__(self, params):
        self.ids = {id(p): n for n, p in params}
        self.pieces = []

    def __call__(self, gm, example_inputs):
        self.pieces.append({self.ids[id(t)] for t in example_inputs if id(t) in self.ids})
        return gm.forward


def _pieces_and_buckets(rank, wrapping, d=D, **ddp_kw) -> tuple[list[set], dict[int, set]]:
    """The parameters of each graph the backend got, and of each of DDP's buckets (by index)."""
    model = same_model(lambda: Stack(d=d))
    params = [(n, p) for n, p in model.named_parameters()]
    backend = _RecordingBackend(params)
    if wrapping == "kiln(DDP)":
        ddp = _ddp(model, **ddp_kw)
        step_fn = kiln.compile(ddp, backend=backend)
    else:
        ddp = _ddp(kiln.compile(model, backend=backend), **ddp_kw)
        step_fn = ddp
    buckets = {}
    names = {id(p): n for n, p in params}

    def record(state, bucket):
        buckets[bucket.index()] = {names[id(p)] for p in bucket.parameters()}
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    ddp.register_comm_hook(None, record)
    for step in range(2):
        step_fn(_batch(rank, step, d=d)).sum().backward()
    return backend.pieces, buckets


def _worker_pieces_are_buckets(rank, world, wrapping, d=D, **ddp_kw):
    pieces, buckets = _pieces_and_buckets(rank, wrapping, d=d, **ddp_kw)
    # the backend got one piece per bucket (compiled once), each with the parameters of a bucket
    assert len(pieces) == len(buckets) > 1, (pieces, buckets)
    assert sorted(map(sorted, pieces)) == sorted(map(sorted, buckets.values())), (pieces, buckets)
    return len(buckets)


def _worker_both_cut_at_buckets(rank, world):
    for wrapping in ("kiln(DDP)", "DDP(kiln)"):
        kiln.reset()
        assert _worker_pieces_are_buckets(rank, world, wrapping, bucket_cap_mb=TWO_LAYERS_MB) == LAYERS // 2
    # DDP's defaults: a first bucket of 1 MiB (four 256-wide layers), then 25 MiB (the other two)
    kiln.reset()
    assert _worker_pieces_are_buckets(rank, world, "kiln(DDP)", d=256) == 2


def test_graph_is_cut_at_ddp_buckets_before_the_backend_in_both_wrappings():
    run_ranks(_worker_both_cut_at_buckets)


def _worker_pieces_join_consecutive_buckets(rank, world):
    one_layer_mb = LAYER_BYTES / 2**20          # a bucket per layer: LAYERS buckets
    for most, expected in ((0, LAYERS), (4, 3), (3, 3), (2, 2), (1, 1)):
        kiln.reset()
        with kiln.config.patch(ddp_pieces=most):
            pieces, buckets = _pieces_and_buckets(rank, "kiln(DDP)", bucket_cap_mb=one_layer_mb)
        assert len(buckets) == LAYERS
        assert len(pieces) == expected, (most, pieces)
        # each piece holds whole buckets, and consecutive ones (in the order DDP fills them)
        where = {name: k for k, bucket in buckets.items() for name in bucket}
        runs = sorted(sorted({where[name] for name in piece}) for piece in pieces)
        assert [k for run in runs for k in run] == list(range(LAYERS)), runs
        for piece, run in zip(sorted(pieces, key=lambda p: min(where[n] for n in p)), runs):
            assert piece == set().union(*(buckets[k] for k in run)), (piece, run)


def test_pieces_join_consecutive_buckets_up_to_config_ddp_pieces():
    # 6 one-layer buckets: 0 keeps a piece per bucket; 4 and 3 give pieces of two buckets (at
    # least a quarter, a third of the bytes); 2 gives two of three; 1 leaves the graph uncut
    run_ranks(_worker_pieces_join_consecutive_buckets)


def _node_accumulating(root, param):
    """The backward node that hands ``param`` its gradient."""
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            if nxt is not None and getattr(nxt, "variable", None) is param:
                return node
            todo.append(nxt)
    raise AssertionError("no node accumulates the parameter")


def _worker_overlap(rank, world, compiled, cap_mb):
    model = same_model(Stack)
    ddp = _ddp(model, bucket_cap_mb=cap_mb)
    step_fn = kiln.compile(ddp, backend="aot_eager") if compiled else ddp
    events = []

    def record(state, bucket):
        events.append(f"bucket {bucket.index()} ready")
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    ddp.register_comm_hook(None, record)
    for step in range(2):
        events.clear()
        loss = step_fn(_batch(rank, step)).sum()
        first = _node_accumulating(loss.grad_fn, model.layers[0].weight)
        first.register_prehook(lambda grads: events.append("first layer's backward starts"))
        loss.backward()
    started = events.index("first layer's backward starts")
    ready_before = [e for e in events[:started] if e.startswith("bucket")]
    # buckets of the later layers are all-reduced while the first layer's backward has not run
    assert len(ready_before) == LAYERS // 2 - 1, events


def _worker_overlap_like_eager(rank, world):
    _worker_overlap(rank, world, False, TWO_LAYERS_MB)     # eager DDP: the order to match
    _worker_overlap(rank, world, True, TWO_LAYERS_MB)


def test_buckets_are_all_reduced_while_earlier_pieces_run_backward():
    run_ranks(_worker_overlap_like_eager)


def _worker_no_sync(rank, world):
    eager = _ddp(same_model(Stack), bucket_cap_mb=TWO_LAYERS_MB)
    ddp = _ddp(same_model(Stack), bucket_cap_mb=TWO_LAYERS_MB)
    compiled = kiln.compile(ddp, backend="aot_eager")
    for step in range(3):
        for model, call in ((eager, eager), (ddp, compiled)):
            with model.no_sync():                 # accumulate locally, no all-reduce
                call(_batch(rank, 10 * step)).sum().backward()
            local = [p.grad.clone() for p in model.parameters()]
            call(_batch(rank, 10 * step + 1)).sum().backward()
            if model is eager:
                want_local, want = local, [p.grad.clone() for p in model.parameters()]
            else:
                got_local, got = local, [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
        for a, b in zip(got_local + got, want_local + want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the local gradients differ between ranks, the synced ones do not
    import torch.distributed as dist

    gathered = [None] * world
    dist.all_gather_object(gathered, (got_local[0], got[0]))
    assert not torch.equal(gathered[0][0], gathered[1][0])
    torch.testing.assert_close(gathered[0][1], gathered[1][1])


def _worker_no_sync_and_unused(rank, world):
    _worker_no_sync(rank, world)
    _worker_find_unused(rank, world)


def test_no_sync_and_find_unused_parameters_like_eager_ddp():
    run_ranks(_worker_no_sync_and_unused)


class Branchy(torch.nn.Module):
    """Uses its ``skip`` layer only when told: find_unused_parameters finds it unused."""

    def __init__(self):
        super().__init__()
        self.stack = Stack(unused=True)
        self.skip = torch.nn.Linear(D, D)

    def forward(self, x, use_skip: bool):
        y = self.stack(x)
        return self.skip(y) if use_skip else y


def _worker_find_unused(rank, world):
    kw = dict(bucket_cap_mb=TWO_LAYERS_MB, find_unused_parameters=True)
    eager = _ddp(same_model(Branchy), **kw)
    ddp = _ddp(same_model(Branchy), **kw)
    compiled = kiln.compile(ddp, backend="aot_eager")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, ddp)]
    for step in range(4):
        x = _batch(rank, step)
        losses = []
        for call, opt in zip((eager, compiled), opts):
            loss = call(x, step % 2 == 1).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    assert_params_equal(eager, ddp)


def _worker_ranks_agree(rank, world):
    import torch.distributed as dist

    counter = kiln.testing.CompileCounter()
    eager = _ddp(same_model(Stack), bucket_cap_mb=TWO_LAYERS_MB)
    compiled = kiln.compile(_ddp(same_model(Stack), bucket_cap_mb=TWO_LAYERS_MB), backend=counter)
    for step in range(2):
        x = _batch(rank, step)
        torch.testing.assert_close(compiled(x), eager(x))
    graphs = [gm.code for gm in counter.graphs]
    everyone = [None] * world
    dist.all_gather_object(everyone, graphs)
    assert everyone[0] == everyone[1]            # the same pieces on every rank
    # a shape seen on one rank only: that rank compiles again, the other does not wait for it
    n = 8 if rank == 0 else 5
    for step in range(2, 4):
        x = _batch(rank, step, n)
        out, want = compiled(x), eager(x)
        out.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(out, want)
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)


def test_ranks_agree_and_a_recompile_on_one_rank_does_not_hang():
    run_ranks(_worker_ranks_agree)


class AutocastInside(Stack):
    """Enters autocast inside its forward: its graph is not cut (one piece, still correct)."""

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = super().forward(x)
        return y.float()


def _worker_not_cut(rank, world):
    counter = kiln.testing.CompileCounter()
    eager = _ddp(same_model(AutocastInside), bucket_cap_mb=TWO_LAYERS_MB)
    ddp = _ddp(same_model(AutocastInside), bucket_cap_mb=TWO_LAYERS_MB)
    compiled = kiln.compile(ddp, backend=counter)
    for step in range(2):
        x = _batch(rank, step)
        for call in (eager, compiled):
            call(x).pow(2).mean().backward()
    for a, b in zip(eager.parameters(), ddp.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)
    assert counter.frame_count == 1


def test_a_graph_that_enters_autocast_is_not_cut_and_trains_like_eager():
    run_ranks(_worker_not_cut)


def _worker_fullgraph(rank, world):
    counter = kiln.testing.CompileCounter()
    eager = _ddp(same_model(Stack), bucket_cap_mb=TWO_LAYERS_MB)
    ddp = _ddp(same_model(Stack), bucket_cap_mb=TWO_LAYERS_MB)
    compiled = kiln.compile(ddp, backend=counter, fullgraph=True)
    for step in range(2):
        x = _batch(rank, step)
        for call in (eager, compiled):
            call(x).pow(2).mean().backward()
    for a, b in zip(eager.parameters(), ddp.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)
    assert counter.frame_count == LAYERS // 2        # the pieces of the one graph
    assert compiled.entries and not compiled.entries[0].graph_break


def test_compile_ddp_with_fullgraph():
    """``kiln.compile(DDP(model), fullgraph=True)``: DDP's forward around one graph of the model
    (cut at the buckets), no graph break."""
    run_ranks(_worker_fullgraph)
