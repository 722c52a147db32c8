"""The compile cache: keys, perfect entries, warm processes, robustness.

Graphs are tiny and use the aot_eager backend (test_inductor_cache.py: inductor); every test has its own
cache directory (tests/conftest.py)."""
import functools
import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap
import warnings
import zipfile

import pytest
import torch

import kiln
import kiln.aot.dynamic as aot_dynamic
import kiln.aot.function as aot_function
import kiln.aot.partial as partial_backward
from kiln.cache import key as K, store


@pytest.fixture
def traces(monkeypatch):
    """Counts kiln's AOT traces (every compile of the aot backends goes through _run_stages)."""
    calls = []
    real = aot_dynamic._run_stages

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(aot_dynamic, "_run_stages", counted)
    return calls


def mlp(x, w):
    h = torch.relu(x @ w) * 2.0
    return h.sum(1)


def mlp_renamed(inp, weight):
    hidden = torch.relu(inp @ weight) * 2.0
    return hidden.sum(1)


def mlp_other_op(x, w):
    h = torch.sigmoid(x @ w) * 2.0
    return h.sum(1)


def mlp_other_const(x, w):
    h = torch.relu(x @ w) * 3.0
    return h.sum(1)


def inputs(dtype=torch.float32, n=3, grad=True):
    return (torch.randn(n, 4, dtype=dtype, requires_grad=grad), torch.randn(4, 5, dtype=dtype, requires_grad=grad))


def run(fn, args):
    out = kiln.compile(fn, backend="aot_eager")(*args)
    return out


def check_against_eager(fn, compiled_fn=None):
    args = inputs()
    ref_args = [a.detach().clone().requires_grad_(True) for a in args]
    out = (compiled_fn or kiln.compile(fn, backend="aot_eager"))(*args)
    ref = fn(*ref_args)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    for a, r in zip(args, ref_args):
        torch.testing.assert_close(a.grad, r.grad)


def test_second_compile_loads_without_tracing(traces):
    check_against_eager(mlp)
    assert len(traces) == 1 and kiln.cache.stats()["misses"] == 1
    assert kiln.cache.stats()["bytes_written"] > 0
    kiln.reset()                                  # the in-memory entries go: a capture again
    check_against_eager(mlp)
    assert len(traces) == 1                       # loaded: no AOT trace
    s = kiln.cache.stats()
    assert s["hits"] == 1 and s["misses"] == 1 and s["bytes_read"] > 0
    assert set(s) == {"hits", "misses", "bypasses", "bytes_read", "bytes_written", "frame_hits", "frame_misses",
                      "job_hits", "job_kernels", "remote_hits", "remote_misses", "remote_errors", "remote_bytes_read",
                      "remote_bytes_written"}


def test_local_names_share_an_entry_real_changes_do_not(traces):
    run(mlp, inputs())
    run(mlp_renamed, inputs())
    assert kiln.cache.stats()["hits"] == 1 and len(traces) == 1
    for fn, args in ((mlp_other_op, inputs()), (mlp_other_const, inputs()),
                     (mlp, inputs(torch.float64)), (mlp, inputs(n=7))):
        kiln.reset()
        before = kiln.cache.stats()["misses"]
        run(fn, args)
        assert kiln.cache.stats()["misses"] == before + 1, fn.__name__


def test_grad_mode_is_part_of_the_key(traces):
    run(mlp, inputs(grad=False))
    kiln.reset()
    with torch.no_grad():
        run(mlp, inputs(grad=False))
    assert kiln.cache.stats()["hits"] == 0 and len(traces) == 2


def _mlp_body(x, w):
    h = torch.relu(x @ w) * 2.0
    return h


def mlp_checkpointed(x, w):
    return torch.utils.checkpoint.checkpoint(_mlp_body, x, w, use_reentrant=False).sum(1)


def _save_matmuls(ctx, op, *args, **kwargs):
    return op is torch.ops.aten.mm.default


def mlp_selective(x, w):
    context_fn = functools.partial(torch.utils.checkpoint.create_selective_checkpoint_contexts, _save_matmuls)
    return torch.utils.checkpoint.checkpoint(_mlp_body, x, w, use_reentrant=False, context_fn=context_fn).sum(1)


def test_checkpointing_is_part_of_the_key(traces):
    """The same ops checkpointed save other values: another entry, as is another policy."""
    for fn in (mlp, mlp_checkpointed, mlp_selective):
        kiln.reset()
        check_against_eager(fn)
    assert kiln.cache.stats()["hits"] == 0 and len(traces) == 3
    kiln.reset()
    check_against_eager(mlp_selective)
    assert kiln.cache.stats()["hits"] == 1 and len(traces) == 3


def test_key_does_not_change_the_graph():
    backend_seen = []

    def spy(gm, example_inputs):
        before = gm.code
        parts = K.key_parts(gm, list(example_inputs), "x", {})
        backend_seen.append((before, gm.code, [n.name for n in gm.graph.nodes], parts))
        return gm.forward
    kiln.compile(mlp, backend=spy)(*inputs())
    before, after, names, parts = backend_seen[0]
    assert before == after
    assert not any(n.startswith("in0") for n in names)
    assert "in0" in parts["graph"] and "relu" in parts["graph"]


def test_miss_says_why(capsys):
    kiln.set_logs("cache")
    run(mlp, inputs())
    kiln.reset()
    run(mlp, inputs(torch.float64))
    err = capsys.readouterr().err
    assert "[kiln:cache] miss mlp" in err
    assert "input 0 dtype: float32 -> float64" in err and "input 1 dtype: float32 -> float64" in err
    assert "all else equal" in err
    kiln.reset()
    run(mlp, inputs())
    assert "[kiln:cache] hit mlp" in capsys.readouterr().err


def test_loaded_entry_equals_compiled_field_by_field(monkeypatch):
    from kiln.aot.compile import AOTCompiled
    from kiln.aot.runtime import wrapper_to_dict
    import kiln.backends.aot as A

    results = []
    real_cached = kiln.cache.cached

    def capture_cached(*a, **kw):
        out = real_cached(*a, **kw)
        results.append(out)
        return out
    monkeypatch.setattr(kiln.cache, "cached", capture_cached)

    def mutating(x, w, buf):
        buf.add_(1)                               # an input mutation: a runtime wrapper
        return (x @ w).relu(), x.view(-1)         # and an output alias
    args = lambda: (torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True), torch.zeros(2))
    a1 = args()
    b1 = [t.detach().clone().requires_grad_(t.requires_grad) for t in a1]
    kiln.compile(mutating, backend="aot_eager")(*a1)
    kiln.reset()
    a2 = [t.detach().clone().requires_grad_(t.requires_grad) for t in b1]
    out2 = kiln.compile(mutating, backend="aot_eager")(*a2)
    assert kiln.cache.stats()["hits"] == 1
    compiled, loaded = results
    assert isinstance(compiled, AOTCompiled) and isinstance(loaded, AOTCompiled)
    p, q = compiled.parts, loaded.parts
    for field in ("kind", "num_fw_outputs", "tangent_positions", "fw_output_requires_grad",
                  "primal_requires_grad", "grad_enabled", "saved", "saved_bytes", "saved_input_bytes",
                  "partitioner", "symbolic", "grad_dependencies", "check_inputs", "check_outputs",
                  "copy_saved", "watch", "late_demand", "saved_demand"):
        assert getattr(p, field) == getattr(q, field), field
    assert [wrapper_to_dict(w) for w in p.wrappers] == [wrapper_to_dict(w) for w in q.wrappers]
    assert any(type(w).__name__ == "MutationsAndAliases" for w in q.wrappers)
    assert p.forward.code == q.forward.code and p.backward.code == q.backward.code
    assert compiled.input_check is None and loaded.input_check is None
    # outputs, the mutation and gradients equal eager's
    ref = mutating(*b1)
    torch.testing.assert_close(out2[0], ref[0])
    torch.testing.assert_close(out2[1], ref[1])
    assert out2[1]._base is a2[0] or out2[1].data_ptr() == a2[0].data_ptr()
    torch.testing.assert_close(a2[2], b1[2])
    out2[0].sum().backward()
    ref[0].sum().backward()
    torch.testing.assert_close(a2[0].grad, b1[0].grad)
    torch.testing.assert_close(a2[1].grad, b1[1].grad)


def _old_layout_entry(header: dict, payload: bytes) -> bytes:
    """An entry as kilns before the artifact envelope wrote it (their own binary layout)."""
    head = json.dumps(header, sort_keys=True).encode()
    body = struct.pack("<I", len(head)) + head + payload
    return b"KILNAOT1" + hashlib.sha256(body).digest() + body


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "bitflip kiln.json", "bitflip payload", "garbage",
                                    "old layout", "unreadable"])
def test_corrupt_entry_is_ignored_recompiled_rewritten(damage, traces):
    run(mlp, inputs())
    [(key, path)] = store.entries()
    blob = open(path, "rb").read()
    if damage == "truncate":
        open(path, "wb").write(blob[: len(blob) // 2])
    elif damage.startswith("bitflip"):
        b = bytearray(blob)
        if damage == "bitflip":                   # (in the zip's directory)
            b[len(b) - 100] ^= 0x10
        else:                                     # in the middle of a member
            member = zipfile.ZipFile(path).getinfo(damage.split()[1])
            b[member.header_offset + 30 + len(member.filename) + member.file_size // 2] ^= 0x10
        open(path, "wb").write(bytes(b))
    elif damage == "old layout":                  # the same entry, as an earlier kiln wrote it
        header, payload = store.read(key)
        open(path, "wb").write(_old_layout_entry(header, payload))
    elif damage == "garbage":
        open(path, "wb").write(b"not an entry")
    else:
        os.unlink(path)
        os.mkdir(path)                            # a directory where the file should be
    kiln.reset()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        check_against_eager(mlp)
    cache_warnings = [x for x in w if "kiln cache" in str(x.message)]
    # one warning for the entry (a directory in its place also fails the rewrite: a second)
    assert len(cache_warnings) == (2 if damage == "unreadable" else 1), [str(x.message) for x in w]
    assert "ignoring entry" in str(cache_warnings[0].message) or "cannot read" in str(cache_warnings[0].message)
    if damage.startswith("bitflip"):
        assert "content hash mismatch" in str(cache_warnings[0].message)
    if damage == "old layout":
        assert "written by an earlier kiln" in str(cache_warnings[0].message)
    assert len(traces) == 2 and kiln.cache.stats()["hits"] == 0
    if damage != "unreadable":                    # rewritten whole: the next process hits
        assert store.read(key) is not None
        kiln.reset()
        check_against_eager(mlp)
        assert kiln.cache.stats()["hits"] == 1


def test_entry_from_another_kiln_is_a_miss(monkeypatch, traces):
    run(mlp, inputs())
    kiln.reset()
    monkeypatch.setitem(K.versions(), "kiln", "0.0.0+other")
    run(mlp, inputs())
    assert kiln.cache.stats()["hits"] == 0 and len(traces) == 2


def test_unwritable_dir_warns_once_and_runs(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr(kiln.config, "cache_dir", str(blocker))     # a file: mkdir fails
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        check_against_eager(mlp)
        check_against_eager(mlp_other_op)
    assert len([x for x in w if "cannot write" in str(x.message)]) == 1


def test_cache_off(traces):
    with kiln.config.patch(cache=False):
        run(mlp, inputs())
        kiln.reset()
        run(mlp, inputs())
    assert len(traces) == 2 and store.entries() == []
    assert set(kiln.cache.stats().values()) == {0}
    assert store.records() == []


def test_lru_eviction():
    """The size limit covers entries and frame records together: the least recently used go."""
    run(mlp, inputs())
    first = [p for _, p in store.entries() + store.records()]
    assert len(first) == 2                        # the graph's entry and the frame's record
    size = sum(os.path.getsize(p) for p in first)
    with kiln.config.patch(cache_size_limit=int(size * 1.5)):
        run(mlp_other_op, inputs())
    remaining = store.entries()
    assert len(remaining) == 1 and not any(os.path.exists(p) for p in first)
    assert store.read_header(remaining[0][1])["parts"]["graph"].count("sigmoid") == 1
    [(_, record)] = store.records()
    assert store.read_header(record)["function"] == "mlp_other_op"


def test_user_compilers_are_not_cached(traces):
    from kiln.backends.aot import aot_backend
    be = aot_backend(fw_compiler=lambda gm, ex: gm.forward)
    kiln.compile(mlp, backend=be)(*inputs())
    assert store.entries() == [] and kiln.cache.stats()["misses"] == 0


_CHILD = textwrap.dedent("""
    import sys, torch, kiln
    import kiln.aot.dynamic as D
    traces = []
    real = D._run_stages
    D._run_stages = lambda *a, **k: (traces.append(1), real(*a, **k))[1]
    def f(x, w):
        return torch.relu(x @ w).sum(1) * {c}
    def g(x):
        return x.sin() + {c}
    torch.manual_seed(int(sys.argv[1]))
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    out1 = kiln.compile(f, backend="aot_eager")(x, w)
    out2 = kiln.compile(g, backend="aot_eager")(x)
    torch.testing.assert_close(out1, f(x, w))
    torch.testing.assert_close(out2, g(x))
    s = kiln.cache.stats()
    print("RESULT", len(traces), s["hits"], s["misses"], s["frame_hits"])
""")


def _child(tmp_path, c, seed):
    script = tmp_path / f"child_{c}.py"
    text = _CHILD.format(c=c)
    if not script.exists() or script.read_text() != text:
        # (written once: rewriting it truncates the file a child started earlier may be reading)
        script.write_text(text)
    return subprocess.Popen([sys.executable, str(script), str(seed)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kiln.__file__))})


def _result(p):
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    line = [l for l in out.splitlines() if l.startswith("RESULT")][0]
    return tuple(int(v) for v in line.split()[1:])


def test_fresh_process_with_warm_cache_traces_nothing(tmp_path):
    assert _result(_child(tmp_path, 2, 0)) == (2, 0, 2, 0)
    assert _result(_child(tmp_path, 2, 1)) == (0, 0, 0, 2)       # frame records: no capture at all
    for _, path in store.records():                             # without them: graph-level hits
        os.unlink(path)
    assert _result(_child(tmp_path, 2, 2)) == (0, 2, 0, 0)


def test_four_processes_share_one_dir(tmp_path):
    # (two processes per constant, started together: every entry and record has two writers)
    procs = [_child(tmp_path, c % 2 + 1, i) for i, c in enumerate(range(4))]
    for p in procs:
        _result(p)                                # each checked its results against eager
    entries = store.entries()
    assert len(entries) == 4                      # 2 constants x 2 functions
    for key, path in entries:
        assert store.read(key) is not None        # every entry whole (hash checked)
    assert not [n for n in os.listdir(store.aot_dir()) if n.startswith(".tmp-")]
    records = store.records()
    assert len({k for k, _ in records}) == 4      # and the frame records: 2 constants x 2 functions
    for _, path in records:
        assert store.read_record(path) is not None
        assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".tmp-")]


def test_cli_ls_why_clear():
    run(mlp, inputs())
    kiln.reset()
    run(mlp, inputs(torch.float64))
    cmd = [sys.executable, "-m", "kiln", "cache"]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kiln.__file__))}
    out = subprocess.run(cmd + ["ls"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "2 entries" in out.stdout and out.stdout.count("mlp") == 3
    assert "1 frame records" in out.stdout
    out = subprocess.run(cmd + ["why", "mlp"], capture_output=True, text=True, env=env, timeout=120)
    assert "entry 2 missed: input 0 dtype: float32 -> float64" in out.stdout
    out = subprocess.run(cmd + ["clear"], capture_output=True, text=True, env=env, timeout=120)
    assert "removed 2 entries and 1 frame records" in out.stdout and store.entries() == []
    assert store.records() == []


def test_bypasses_are_counted_and_say_why(capsys):
    from kiln.backends.aot import aot_backend
    kiln.set_logs("cache")
    kiln.compile(mlp, backend=aot_backend(fw_compiler=lambda gm, ex: gm.forward))(*inputs())
    f = kiln.compile(mlp, backend="aot_eager", dynamic=True)
    check_against_eager(mlp, f)
    err = capsys.readouterr().err
    assert "[kiln:cache] bypass mlp: aot_backend with your own compilers" in err
    assert "[kiln:cache] miss mlp" in err          # a dynamic graph is cached (test_dynamic_cache.py)
    assert kiln.cache.stats()["bypasses"] == 1 and kiln.cache.stats()["misses"] == 1
    assert len(store.entries()) == 1


def test_user_code_called_from_the_graph_is_not_keyed():
    def spy(gm, example_inputs):
        builtin = gm.graph.call_function(len, ())     # keyable: a builtin
        K.key_parts(gm, list(example_inputs), "x", {})
        node = gm.graph.call_function(mlp, ())   # user code: its body could change
        with pytest.raises(ValueError, match="user code"):
            K.key_parts(gm, list(example_inputs), "x", {})
        gm.graph.erase_node(node)
        gm.graph.erase_node(builtin)
        return gm.forward
    kiln.compile(mlp, backend=spy)(*inputs())


def test_stats_is_public_after_import_kiln():
    out = subprocess.run([sys.executable, "-c", "import kiln; print(sorted(kiln.cache.stats()))"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kiln.__file__))})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("['bypasses', 'bytes_read', 'bytes_written', 'frame_hits', 'frame_misses', 'hits', "
                                  "'job_hits', 'job_kernels', 'misses', 'remote_bytes_read', 'remote_bytes_written', "
                                  "'remote_errors', 'remote_hits', 'remote_misses']")


def test_user_aot_backend_with_cache_key_is_cached_and_its_compilers_run_on_load(traces):
    from kiln.backends.aot import aot_backend
    compiled_graphs = []

    def my_compiler(gm, example_inputs):
        compiled_graphs.append(gm)
        return gm.forward
    be = aot_backend(fw_compiler=my_compiler, cache_key="my-compiler-v1")
    check_against_eager(mlp, kiln.compile(mlp, backend=be))
    assert len(traces) == 1 and len(compiled_graphs) == 2 and len(store.entries()) == 1
    kiln.reset()
    check_against_eager(mlp, kiln.compile(mlp, backend=be))
    assert len(traces) == 1 and kiln.cache.stats()["hits"] == 1
    assert len(compiled_graphs) == 4                  # the user's compiler ran on the loaded graphs
    # another key (the user changed the compiler's code): a miss
    be2 = aot_backend(fw_compiler=my_compiler, cache_key="my-compiler-v2")
    kiln.reset()
    check_against_eager(mlp, kiln.compile(mlp, backend=be2))
    assert len(traces) == 2 and kiln.cache.stats()["hits"] == 1


def test_register_backend_cache_key_and_bypass_reasons(capsys, traces):
    from kiln.backends import aot_backend, register_backend

    kiln.set_logs("cache")
    be = register_backend("kiln_test_keyed", aot_backend(fw_compiler=lambda gm, ex: gm.forward),
                          cache_key="keyed-v1")
    assert be.cache_key == "keyed-v1"
    run_with = lambda backend: check_against_eager(mlp, kiln.compile(mlp, backend=backend))
    run_with("kiln_test_keyed")
    kiln.reset()
    run_with("kiln_test_keyed")
    assert kiln.cache.stats()["hits"] == 1 and len(traces) == 1
    # a user backend without a key, and an aot_backend with user code but no key: bypassed, said why
    kiln.reset()
    run_with(lambda gm, ex: gm.forward)
    run_with(aot_backend(fw_compiler=lambda gm, ex: gm.forward))
    err = capsys.readouterr().err
    assert "declares no cache_key" in err
    assert "no cache_key (code the key cannot see)" in err
    with pytest.raises(TypeError, match="cache_key"):
        register_backend("kiln_test_bad", lambda gm, ex: gm.forward, cache_key=3)


def test_a_hit_across_a_rename_names_the_callers_inputs(monkeypatch):
    from kiln.aot.export import rename_sources

    results = []
    real_cached = kiln.cache.cached

    def keep(*a, **kw):
        out = real_cached(*a, **kw)
        results.append(out)
        return out
    monkeypatch.setattr(kiln.cache, "cached", keep)
    run(mlp, inputs())
    run(mlp_renamed, inputs())
    assert kiln.cache.stats()["hits"] == 1
    compiled, loaded = results

    def names(c):      # the metadata naming inputs (graph tags, runtime wrappers), as text
        from kiln.aot.export import AOTArtifact
        return str(AOTArtifact(c.parts).to_dict()[0])
    assert "L['x']" in names(compiled) and "L['inp']" not in names(compiled)
    assert "L['inp']" in names(loaded) and "L['weight']" in names(loaded) and "L['x']" not in names(loaded)
    # one pass: swapped names stay swapped; a name is never matched inside a longer one
    assert rename_sources("L['a'] L['b'] L['ab'] L['a'].w", {"L['a']": "L['b']", "L['b']": "L['a']"}) == \
        "L['b'] L['a'] L['ab'] L['b'].w"


def test_loaded_static_graph_makes_fake_inputs_only_when_read(monkeypatch, traces):
    """A loaded static artifact runs with no fake tensors (making a FakeTensorMode imports
    torch._dynamo); a partial backward, which sizes its zeros from them, makes them then."""
    from kiln.aot import fake_tensors

    results = []
    real_cached = kiln.cache.cached

    def capture_cached(*a, **kw):
        results.append(real_cached(*a, **kw))
        return results[-1]
    monkeypatch.setattr(kiln.cache, "cached", capture_cached)

    def two(x, w):
        y = x @ w
        return y.relu(), y.sin()
    args = lambda: (torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True))
    kiln.compile(two, backend="aot_eager", dynamic=False)(*args())
    kiln.reset()
    x, w = args()
    a, b = kiln.compile(two, backend="aot_eager", dynamic=False)(x, w)
    assert kiln.cache.stats()["hits"] == 1 and len(traces) == 1
    parts = results[-1].parts
    phs = lambda gm: [n for n in gm.graph.nodes if n.op == "placeholder"]    # noqa: E731
    assert all("val" not in n.meta and fake_tensors.LAZY_VAL in n.meta for n in phs(parts.backward))
    a.sum().backward()                      # only one output: a partial backward
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in phs(parts.backward))
    # its zeros are sized from fake values, not zeros_like (Inductor has no kernel for that
    # decomposed-away op: it failed on such a graph and ran it as ATen ops)
    from kiln.aot import partial as P
    part = P.without_tangents(parts.backward, 2, frozenset({0}))
    assert not any(n.target is torch.ops.aten.zeros_like.default for n in part.graph.nodes)
    rx, rw = (t.detach().clone().requires_grad_(True) for t in (x, w))
    ra, _ = two(rx, rw)
    ra.sum().backward()
    torch.testing.assert_close(a, ra)
    torch.testing.assert_close(x.grad, rx.grad)
    torch.testing.assert_close(w.grad, rw.grad)


def _layers_one_by_one_match_eager(layers, step) -> list:
    """Each layer compiled on its own (aot_eager), run in turn beside the eager layers
    (``step(layer, h, state) -> h``): the outputs, the gradients of the parameters and of the
    input are eager's. The compiled layers."""
    compiled = [kiln.compile(m, backend="aot_eager") for m in layers]
    x = torch.randn(3, 6, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    h, he, state, state_e = x, xe, {}, {}
    for m, c in zip(layers, compiled):
        h, he = step(c, h, state), step(m, he, state_e)
    torch.testing.assert_close(h, he)
    h.sum().backward()
    grads = [p.grad.clone() for m in layers for p in m.parameters()]
    for m in layers:
        m.zero_grad()
    he.sum().backward()
    torch.testing.assert_close(grads, [p.grad for m in layers for p in m.parameters()])
    torch.testing.assert_close(x.grad, xe.grad)
    return compiled


class _IndexedLayer(torch.nn.Module):
    def __init__(self, idx):
        super().__init__()
        self.layer_idx = idx
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x, seen):
        y = torch.tanh(self.lin(x))
        seen[self.layer_idx] = y.shape[0]       # (its own index: each layer an entry of its own)
        return y, (y * 2).sum()                 # (the second output gets no gradient)


def test_layers_compiled_one_by_one_share_the_backwards_they_make_at_run_time(monkeypatch):
    """Each layer is an entry of its own (its index), and hits the graph the first compiled.
    A backward made at run time (here for one output's gradient only) is built once for all
    of them, not once per layer; gradients are eager's."""
    builds = []
    real = partial_backward.without_tangents
    monkeypatch.setattr(partial_backward, "without_tangents", lambda *a, **k: (builds.append(1), real(*a, **k))[1])
    torch.manual_seed(0)
    compiled = _layers_one_by_one_match_eager([_IndexedLayer(i) for i in range(6)], lambda m, h, seen: m(h, seen)[0])
    assert len(compiled[0].entries) == 6 and kiln.cache.stats()["hits"] == 5
    assert len(builds) == 1, builds


class _CachingLayer(torch.nn.Module):
    def __init__(self, idx):
        super().__init__()
        self.layer_idx = idx
        self.k = torch.nn.Linear(6, 6)
        self.o = torch.nn.Linear(6, 6)

    def forward(self, x, cache):
        kv = self.k(x)
        cache[self.layer_idx] = kv              # (handed out, and computed further from: segments)
        return x + self.o(torch.tanh(kv))


def test_layers_loaded_from_the_cache_run_their_segmented_backward_as_one_graph(monkeypatch):
    """A layer that hands out a tensor it computes further from (a KV cache) has a segmented
    backward, which runs as one fused graph. The layers that load the first one's entry fuse
    it too (a loaded graph has fake values on its placeholders only: they ran each segment's
    backward on its own, each compiled again), and all share the one fused backward."""
    keys, builds = [], []
    real_key, real_build = aot_function.backward_key, partial_backward.without_tangents
    monkeypatch.setattr(aot_function, "backward_key", lambda kind, given: (keys.append(kind), real_key(kind, given))[1])
    monkeypatch.setattr(partial_backward, "without_tangents", lambda *a, **k: (builds.append(1), real_build(*a, **k))[1])
    torch.manual_seed(0)
    _layers_one_by_one_match_eager([_CachingLayer(i) for i in range(5)], lambda m, h, cache: m(h, cache))
    assert kiln.cache.stats()["hits"] == 4
    assert set(keys) == {"fused"} and len(builds) == 1, (keys, builds)
