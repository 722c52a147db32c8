"""The compile cache with graphs that hold subgraphs (``torch.cond``'s branches,
``torch.while_loop``'s condition and body): stored and loaded with no trace and no Inductor
compile, in this process and in a fresh one; keyed by the subgraphs' whole structure, each
subgraph once; a damaged subgraph is never run."""
import operator
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
import kiln.aot.dynamic as aot_dynamic
from kiln import _torch
from kiln.cache import key as K, store

BACKENDS = ["aot_eager", "inductor"]


@pytest.fixture
def work(monkeypatch):
    """Counts kiln's AOT traces and Inductor's graph compiles."""
    counts = {"traces": 0, "inductor": 0}
    real_stages, real_inductor = aot_dynamic._run_stages, _torch.inductor_compile_graph

    def stages(*a, **kw):
        counts["traces"] += 1
        return real_stages(*a, **kw)

    def inductor(*a, **kw):
        counts["inductor"] += 1
        return real_inductor(*a, **kw)
    monkeypatch.setattr(aot_dynamic, "_run_stages", stages)
    monkeypatch.setattr(_torch, "inductor_compile_graph", inductor)
    return counts


def branchy(x, y):
    return torch.cond(x.sum() > 0, lambda a: a.sin() + y, lambda a: a.cos() * y, (x,))


def branchy_renamed(inp, other):
    def positive(t):
        return t.sin() + other

    def negative(t):
        return t.cos() * other
    return torch.cond(inp.sum() > 0, positive, negative, (inp,))


def branchy_other_false_branch(x, y):
    return torch.cond(x.sum() > 0, lambda a: a.sin() + y, lambda a: a.cos() * y * 2, (x,))


def doubling(x, w):
    return torch.while_loop(lambda i, a: (i < 5) & (a.sum() < 100), lambda i, a: (i + 1, a * 2 + w),
                            (torch.tensor(0), x))


def _signed(sign):
    return torch.rand(4, 3) * sign + 0.01 * sign


def _check_both_branches(compiled, fn=branchy):
    for sign in (1, -1):
        x, y = _signed(sign), torch.randn(4, 3)
        torch.testing.assert_close(compiled(x, y), fn(x, y))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_graph_with_cond_is_stored_and_loads_without_tracing_or_lowering(backend, work):
    _check_both_branches(kiln.compile(branchy, backend=backend, fullgraph=True))
    s = kiln.cache.stats()
    assert s["misses"] == 1 and s["bypasses"] == 0 and s["bytes_written"] > 0
    compiled_work = dict(work)
    assert compiled_work["traces"] == 1
    kiln.reset()                                     # in-memory entries go: capture again
    _check_both_branches(kiln.compile(branchy, backend=backend, fullgraph=True))
    assert kiln.cache.stats()["hits"] == 1
    assert work == compiled_work                     # loaded: nothing traced or lowered


def test_a_training_graph_with_cond_loads_its_backward_too(work):
    x0, y0 = _signed(-1), torch.randn(4, 3)

    def grads(fn):
        x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
        fn(x, y).sum().backward()
        return x.grad, y.grad
    first = grads(kiln.compile(branchy, backend="aot_eager", fullgraph=True))
    kiln.reset()
    second = grads(kiln.compile(branchy, backend="aot_eager", fullgraph=True))
    assert kiln.cache.stats()["hits"] == 1 and work["traces"] == 1
    torch.testing.assert_close(second, first)
    torch.testing.assert_close(second, grads(branchy))


def two_outputs(x, y):
    a = torch.cond(x.sum() > 0, lambda a: a.sin() + y, lambda a: a.cos() * y, (x,))
    return a * 2, (a * y).exp()


def test_a_loaded_graph_with_cond_compiles_a_partial_backward_with_inductor(work):
    """The first process's backward reached both outputs; the next one's only the first: its
    backward is compiled from the loaded graph, whose subgraphs' inputs get fake values too
    (Inductor checks them against the cond's operands)."""
    for full in (True, False):
        kiln.reset()
        compiled = kiln.compile(two_outputs, fullgraph=True)
        for sign in (1, -1):
            x, y = _signed(sign), torch.randn(4, 3, requires_grad=True)
            xa, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
            (o1, o2), (r1, r2) = compiled(xa, y), two_outputs(xe, y)
            torch.testing.assert_close((o1, o2), (r1, r2))
            with warnings.catch_warnings():
                warnings.filterwarnings("error", "kiln: Inductor failed", RuntimeWarning)
                (o1.sum() + o2.sum() if full else o1.sum()).backward()
            (r1.sum() + r2.sum() if full else r1.sum()).backward()
            torch.testing.assert_close(xa.grad, xe.grad)
    assert kiln.cache.stats()["hits"] == 1 and work["traces"] == 1
    assert work["inductor"] == 3                     # forward, backward; then the partial backward


def test_while_loop_is_stored_and_loads(work):
    for _ in range(2):
        kiln.reset()
        compiled = kiln.compile(doubling, backend="aot_eager", fullgraph=True)
        for scale in (1, 30):
            x, w = torch.rand(4) * scale, torch.rand(4)
            torch.testing.assert_close(compiled(x, w), doubling(x, w))
    assert kiln.cache.stats()["hits"] == 1 and work["traces"] == 1


def nested(x, y):
    def inner(a):
        return torch.cond(a.mean() > 0.5, lambda b: b.sin() + y, lambda b: b.cos(), (a,))
    return torch.cond(x.sum() > 0, inner, lambda a: a.exp() * y, (x,))


def test_a_cond_inside_a_branch_is_stored_and_loads(work):
    for _ in range(2):
        kiln.reset()
        compiled = kiln.compile(nested, backend="aot_eager", fullgraph=True)
        for x in (torch.rand(4) + 1, torch.rand(4) * 0.1, -torch.rand(4) - 0.1):     # all three paths
            y = torch.randn(4)
            torch.testing.assert_close(compiled(x, y), nested(x, y))
    assert kiln.cache.stats()["hits"] == 1 and work["traces"] == 1
    [(_, path)] = store.entries()
    assert "subgraph sub2:" in store.read_header(path)["parts"]["graph"]     # both branches, the inner cond's


def test_keys_differ_when_only_a_branch_differs_and_not_for_local_names(work):
    for fn in (branchy, branchy_renamed):
        kiln.reset()
        _check_both_branches(kiln.compile(fn, backend="aot_eager", fullgraph=True), fn)
    assert kiln.cache.stats()["hits"] == 1           # another function's names, the same graph
    kiln.reset()
    _check_both_branches(kiln.compile(branchy_other_false_branch, backend="aot_eager", fullgraph=True),
                         branchy_other_false_branch)
    assert kiln.cache.stats()["misses"] == 2 and work["traces"] == 2
    [_, text] = sorted(store.read_header(p)["parts"]["graph"] for _, p in store.entries())
    assert "subgraph sub0:" in text and "subgraph sub1:" in text


def shared_block_graph() -> torch.fx.GraphModule:
    """A block called three times through one subgraph: two get_attr nodes of one target and
    one of another target naming the same object."""
    block = make_fx(lambda a: (a.sin() * 2,))(torch.randn(3))
    root = torch.nn.Module()
    root.block = block
    root.alias = block
    g = torch.fx.Graph()
    y = g.placeholder("x")
    for target in ("block", "block", "alias"):
        out = g.call_function(torch.ops.higher_order.invoke_subgraph, (g.get_attr(target), "block", y))
        y = g.call_function(operator.getitem, (out, 0))
    g.output((y,))
    return torch.fx.GraphModule(root, g)


def test_a_shared_subgraph_is_keyed_once_whatever_its_attribute_is_called():
    gm = shared_block_graph()
    x = torch.randn(3)
    torch.testing.assert_close(gm(x)[0], (x.sin() * 2).sin().mul(2).sin().mul(2))
    text = K.graph_text(gm, [x])
    assert text.count("subgraph sub0:") == 1 and "subgraph sub1" not in text
    assert text.count("get_attr sub0(") == 3         # the three reads of the block: one number
    # renamed attributes: the same key
    gm.renamed = gm.block
    for n in gm.graph.nodes:
        if n.op == "get_attr" and n.target == "block":
            n.target = "renamed"
    gm.recompile()
    assert K.graph_text(gm, [torch.randn(3)]) == text
    # a change inside the shared block: another key
    block = gm.renamed
    mul = next(n for n in block.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    mul.args = (mul.args[0], 3)
    block.recompile()
    assert K.graph_text(gm, [torch.randn(3)]) != text


def test_a_damaged_subgraph_in_an_entry_is_never_run(work):
    _check_both_branches(kiln.compile(branchy, backend="aot_eager", fullgraph=True))
    [(key, path)] = store.entries()
    blob = bytearray(open(path, "rb").read())
    at = blob.find(b"false_graph_0")                 # (a byte inside a subgraph's data)
    assert at > 0
    blob[at + 2] ^= 0x01
    open(path, "wb").write(bytes(blob))
    _drop_frame_records()
    kiln.reset()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _check_both_branches(kiln.compile(branchy, backend="aot_eager", fullgraph=True))
    assert any("content hash mismatch" in str(x.message) for x in w)
    assert kiln.cache.stats()["hits"] == 0 and work["traces"] == 2


def test_an_entry_whose_subgraph_is_missing_is_a_miss(work):
    """An entry whose hash is whole but whose graph refers to a subgraph it does not hold
    (written by a kiln with a defect): not loaded, recompiled, the right answer."""
    import io
    import json

    _check_both_branches(kiln.compile(branchy, backend="aot_eager", fullgraph=True))
    [(key, path)] = store.entries()
    header, payload = store.read(key)
    obj = torch.load(io.BytesIO(payload), weights_only=True)
    meta = json.loads(obj["meta"])
    for d in meta["graphs"]["forward"]["nodes"]:
        if d.get("subgraph") is not None:
            d["subgraph"] = 7
    obj["meta"] = json.dumps(meta)
    buf = io.BytesIO()
    torch.save(obj, buf)
    store.write(key, header, buf.getvalue())
    _drop_frame_records()
    kiln.reset()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _check_both_branches(kiln.compile(branchy, backend="aot_eager", fullgraph=True))
    assert any("does not hold" in str(x.message) for x in w), [str(x.message) for x in w]
    assert kiln.cache.stats()["hits"] == 0 and work["traces"] == 2


def _drop_frame_records():
    for _, path in store.records():
        os.unlink(path)


_CHILD = textwrap.dedent("""
    import sys, torch, kiln
    import kiln.aot.dynamic as D
    from kiln import _torch
    work = []
    real, real_ind = D._run_stages, _torch.inductor_compile_graph
    D._run_stages = lambda *a, **k: (work.append("trace"), real(*a, **k))[1]
    _torch.inductor_compile_graph = lambda *a, **k: (work.append("inductor"), real_ind(*a, **k))[1]
    def branchy(x, y):
        return torch.cond(x.sum() > 0, lambda a: a.sin() + y, lambda a: a.cos() * y, (x,))
    torch.manual_seed(int(sys.argv[2]))
    compiled = kiln.compile(branchy, backend=sys.argv[1], fullgraph=True)
    for sign in (1, -1):
        x, y = torch.rand(4, 3) * sign + 0.01 * sign, torch.randn(4, 3)
        torch.testing.assert_close(compiled(x, y), branchy(x, y))
    s = kiln.cache.stats()
    print("RESULT", work.count("trace"), work.count("inductor"), s["hits"], s["misses"], s["frame_hits"])
""")


@pytest.mark.parametrize("backend", BACKENDS)
def test_fresh_process_with_warm_cache_compiles_nothing(tmp_path, backend):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kiln.__file__))}

    def child(seed):
        p = subprocess.run([sys.executable, str(script), backend, str(seed)], capture_output=True, text=True,
                           env=env, timeout=600)
        assert p.returncode == 0, p.stderr
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")][0]
        return tuple(int(v) for v in line.split()[1:])
    lowered = 1 if backend == "inductor" else 0
    assert child(0) == (1, lowered, 0, 1, 0)
    assert child(1) == (0, 0, 0, 0, 1)       # the frame record: not even a capture
    _drop_frame_records()
    assert child(2) == (0, 0, 1, 0, 0)       # captured, and the graph loaded


def _named_function(kind: str):
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2 if kind == "double" else x + 100

        @staticmethod
        def backward(ctx, g):
            return g * 2 if kind == "double" else g
    return Scale


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_functions_of_one_name_are_other_entries(backend):
    """A captured autograd.Function is keyed by its forward and backward graphs, not by its
    class's name: a second class of the same name (or the same one edited) is a miss."""
    first, second = _named_function("double"), _named_function("plus100")

    def f(x):
        return first.apply(x)

    def g(x):
        return second.apply(x)

    for fn in (f, g):
        x = torch.randn(3, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        got, want = kiln.compile(fn, backend=backend)(x), fn(x2)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x.grad, x2.grad)
    assert kiln.cache.stats()["hits"] == 0
