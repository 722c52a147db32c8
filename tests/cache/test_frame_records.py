"""Frame records (kiln/package/frame_records.py): a warm process installs a function's recorded entries
before any capture. Every test runs fresh processes over one cache directory (the test's own,
tests/conftest.py); the child counts kiln's capture entry point and checks its results against
eager (outputs and gradients)."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.cache import envelope, store

_HELPERS = """
import torch

def helper(x):
    return torch.relu(x) * {c}
"""

_CHILD = textwrap.dedent("""
    import json, os, sys, torch, kiln, kiln.runtime.function
    captures = []
    real = kiln.runtime.function.capture
    kiln.runtime.function.capture = lambda *a, **k: (captures.append(1), real(*a, **k))[1]
    kiln.set_logs("cache")
    import frhelpers as H
    SCALE = float(os.environ.get("SCALE", "2.0"))

    def f(x, w):
        return H.helper(x @ w).sum(1) * SCALE + {own}

    def f_renamed(x, w):
        return H.helper(x @ w).sum(1) * SCALE + {own}

    def with_break(x, w):
        y = torch.tanh(x @ w)
        print("a graph break", file=sys.stderr)
        return (y.cos() * 3).sum()

    def dyn(x, w):
        return (x @ w).relu().sum(0) * 2

    import frhelpers2
    ACT = frhelpers2.helper if os.environ.get("ACT") == "2" else H.helper   # (two functions named helper)

    def with_default(x, w, act=ACT):
        return act(x @ w).sum(1)

    def check(fn, compiled, x, w):
        x2, w2 = x.detach().clone(), w.detach().clone().requires_grad_()
        out, ref = compiled(x, w), fn(x2, w2)
        torch.testing.assert_close(out, ref)
        out.sum().backward(); ref.sum().backward()
        torch.testing.assert_close(w.grad, w2.grad)

    mode, backend = sys.argv[1], sys.argv[2]
    torch.manual_seed(len(sys.argv))
    fn = {{"static": f, "renamed": f_renamed, "break": with_break, "dynamic": dyn,
           "default": with_default}}[mode]
    compiled = kiln.compile(fn, backend=backend, dynamic=True if mode == "dynamic" else None)
    for n in map(int, sys.argv[3:] or ["3"]):
        check(fn, compiled, torch.randn(n, 4), torch.randn(4, 5, requires_grad=True))
    print("RESULT " + json.dumps({{"captures": len(captures), "dynamo": "torch._dynamo" in sys.modules,
                                  **kiln.cache.stats()}}))
""")


def _setup(tmp_path, helper_c="2.0", own="0.0"):
    (tmp_path / "frhelpers.py").write_text(_HELPERS.format(c=helper_c))
    (tmp_path / "frhelpers2.py").write_text(_HELPERS.format(c=helper_c).replace("relu", "tanh"))
    (tmp_path / "child.py").write_text(_CHILD.format(own=own))


def _run(tmp_path, mode, *sizes, backend="aot_eager", env=None):
    root = os.path.dirname(os.path.dirname(kiln.__file__))
    p = subprocess.run([sys.executable, str(tmp_path / "child.py"), mode, backend, *map(str, sizes)],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([root, str(tmp_path)]),
                            "PYTHONDONTWRITEBYTECODE": "1", **(env or {})})   # (edited sources: no stale .pyc)
    assert p.returncode == 0, p.stderr
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][0]
    return json.loads(line[7:]), p.stderr


@pytest.fixture(scope="module")
def cold_static(tmp_path_factory):
    """The first process of most tests here, run once for the module: ``f`` (the "static"
    mode, aot_eager) compiled over an empty cache directory, which it records. Its result, its
    stderr and the cache directory it left."""
    d = tmp_path_factory.mktemp("cold-static")
    _setup(d)
    cache = d / "kiln-cache"
    result, err = _run(d, "static", env={"KILN_CACHE_DIR": str(cache), "KILN_CACHE_FRAMES": "1"})
    return result, err, cache


def _setup_after_cold(tmp_path, cold_static):
    """``_setup(tmp_path)`` and the test's own cache directory as the cold "static" process
    left it (a copy: records and entries name no path; the test may change it freely)."""
    _setup(tmp_path)
    shutil.copytree(cold_static[2], kiln.config.cache_dir)
    return cold_static[:2]


def test_warm_process_installs_entries_without_capture(tmp_path, cold_static):
    cold, err = _setup_after_cold(tmp_path, cold_static)
    assert cold["captures"] == 1 and cold["frame_misses"] == 1 and cold["misses"] == 1
    assert "frame miss f (no record)" in err and "frame recorded f: 1 entries" in err
    [(_, record)] = store.records()
    assert store.read_header(record)["function"] == "f"
    warm, err = _run(tmp_path, "static", 3, 6)    # (a second size: a recompile, recorded too)
    assert warm["captures"] == 1 and warm["frame_hits"] == 1 and warm["hits"] == 0
    assert "frame hit f" in err
    warm, err = _run(tmp_path, "static", 6, 3)    # both sizes from the records: nothing captured
    assert warm["captures"] == 0 and warm["frame_hits"] == 1
    assert warm["hits"] == warm["misses"] == 0 and not warm["dynamo"]    # (no capture: no torch._dynamo)


def test_a_record_made_under_other_capture_settings_is_not_used(tmp_path, cold_static):
    """A record holds what a capture made under its settings (repeated blocks, int
    specialization...): switching one on captures again instead of installing the old entries."""
    _setup_after_cold(tmp_path, cold_static)      # (f compiled and recorded by a first process)
    r, _ = _run(tmp_path, "static", env={"KILN_SPECIALIZE_INT": "1"})
    assert r["captures"] == 1 and r["frame_hits"] == 0 and r["frame_misses"] == 1
    r, _ = _run(tmp_path, "static", env={"KILN_SPECIALIZE_INT": "1"})     # its own record
    assert r["captures"] == 0 and r["frame_hits"] == 1


def test_renamed_function_misses_the_frame_but_hits_the_graph_cache(tmp_path, cold_static):
    _setup_after_cold(tmp_path, cold_static)      # (f compiled and recorded by a first process)
    r, err = _run(tmp_path, "renamed")
    assert r["captures"] == 1 and r["frame_misses"] == 1 and r["frame_hits"] == 0
    assert r["hits"] == 1 and r["misses"] == 0
    assert "frame miss f_renamed (no record)" in err


def test_changed_source_of_an_inlined_callee_or_the_function_is_not_used(tmp_path, cold_static):
    _setup_after_cold(tmp_path, cold_static)      # (f compiled and recorded by a first process)
    _setup(tmp_path, helper_c="3.0")              # the inlined helper changed: the record is ignored
    r, err = _run(tmp_path, "static")             # (the child checks it against the new helper)
    assert r["captures"] == 1 and r["frame_hits"] == 0 and r["frame_misses"] == 1
    assert "the code of inlined function frhelpers.helper changed" in err
    again, _ = _run(tmp_path, "static")           # the new record serves the new source
    assert again["captures"] == 0 and again["frame_hits"] == 1
    _setup(tmp_path, helper_c="3.0", own="1.0")   # the function's own code changed: another frame
    r, err = _run(tmp_path, "static")
    assert r["captures"] == 1 and r["frame_hits"] == 0 and "frame miss f (no record)" in err


def test_changed_global_fails_the_guard_and_recompiles(tmp_path, cold_static):
    _setup_after_cold(tmp_path, cold_static)      # (f compiled and recorded by a first process)
    r, err = _run(tmp_path, "static", env={"SCALE": "5.0"})   # compared with eager at SCALE=5
    assert r["captures"] == 1 and r["frame_hits"] == 0 and r["frame_misses"] == 1
    assert "EQUALS_MATCH failed: G['SCALE'] == 2.0" in err


def test_a_function_given_as_default_argument_is_checked(tmp_path):
    """The entry finds the default where it is (its guard holds for any default): the
    default function's name and code are checked instead."""
    _setup(tmp_path)
    _run(tmp_path, "default")
    again, _ = _run(tmp_path, "default")
    assert again["captures"] == 0 and again["frame_hits"] == 1
    r, err = _run(tmp_path, "default", env={"ACT": "2"})     # (compared with eager's tanh)
    assert r["captures"] == 1 and r["frame_hits"] == 0
    assert "a function given as a default argument of the function changed" in err


def test_graph_break_continuations_come_from_the_record(tmp_path):
    _setup(tmp_path)
    cold, err = _run(tmp_path, "break")
    assert cold["captures"] >= 2 and "a graph break" in err      # the frame and its continuation
    warm, err = _run(tmp_path, "break")
    assert warm["captures"] == 0 and warm["frame_hits"] == 1 and "a graph break" in err


def test_dynamic_entry_serves_new_sizes(tmp_path):
    _setup(tmp_path)
    cold, _ = _run(tmp_path, "dynamic", 7)    # (not 5: w has 5 columns, x.size(0) == 5 guards)
    assert cold["captures"] == 1
    warm, err = _run(tmp_path, "dynamic", 9, 12)
    assert warm["captures"] == 0 and warm["frame_hits"] == 1 and "frame hit dyn" in err


def test_corrupt_record_is_ignored_with_one_warning(tmp_path, cold_static):
    _setup_after_cold(tmp_path, cold_static)      # (f compiled and recorded by a first process)
    [(_, record)] = store.records()
    blob = bytearray(open(record, "rb").read())
    blob[len(blob) // 2] ^= 0x20
    open(record, "wb").write(bytes(blob))
    r, err = _run(tmp_path, "static")             # (still equal to eager: nothing of it ran)
    assert r["captures"] == 1 and r["frame_hits"] == 0
    assert err.count("kiln cache: ignoring entry") == 1 and "content hash mismatch" in err
    assert not os.path.exists(record)             # (removed: never usable) and a whole one written
    again, _ = _run(tmp_path, "static")
    assert again["captures"] == 0 and again["frame_hits"] == 1


def test_inductor_warm_process_installs_entries_without_capture(tmp_path):
    _setup(tmp_path)
    cold, _ = _run(tmp_path, "static", backend="inductor")
    assert cold["captures"] == 1 and cold["misses"] == 1
    warm, err = _run(tmp_path, "static", backend="inductor")
    assert warm["captures"] == 0 and warm["frame_hits"] == 1 and warm["misses"] == 0


def _make_inner():
    def inner(x):
        return x * 2
    return inner


INNER = _make_inner()
LAMBDA_INNER = (lambda: (lambda x: x * 2))()     # nested in a function with no name


def uses_inner(x):
    return INNER(x) + 1


def uses_lambda_inner(x):
    return LAMBDA_INNER(x) + 1


def plain(x):
    return x.sin() + 1


def test_a_nested_function_is_checked_through_the_named_function_that_defines_it():
    """``_make_inner.<locals>.inner``'s code is a constant of ``_make_inner``: the record keeps
    that function's code hash, so an edit to the nested one is seen."""
    import torch
    from kiln.package.identity import code_hash, describe

    x = torch.randn(3)
    c = kiln.compile(uses_inner, backend="aot_eager")
    torch.testing.assert_close(c(x), uses_inner(x))
    assert len(store.records()) == 1
    [entry] = c.entries
    saved = describe(uses_inner, uses_inner, entry.inlined)
    key = f"{__name__}:_make_inner"
    assert code_hash(_make_inner.__code__) in saved["inlined"][key]


def test_an_entry_that_cannot_be_checked_is_not_recorded(capsys):
    """A nested function whose defining function has no name either (a lambda's lambda): a new
    process could not check its source, so its entry is not recorded, and KILN_LOGS=cache
    says why."""
    import torch
    kiln.set_logs("cache")
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(uses_lambda_inner, backend="aot_eager")(x), uses_lambda_inner(x))
    err = capsys.readouterr().err
    assert "not recorded: an entry of uses_lambda_inner: it inlines" in err and "<lambda>.<locals>.<lambda>" in err
    assert store.records() == []


def test_a_backend_without_cache_key_keeps_no_records(capsys):
    import torch
    kiln.set_logs("cache")
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(plain, backend=lambda gm, ex: gm.forward)(x), plain(x))
    assert "frame records off for plain: backend '<lambda>' declares no cache_key" in capsys.readouterr().err
    assert store.records() == []


def test_a_record_from_another_kiln_or_torch_is_ignored(tmp_path, cold_static):
    """A whole record (its hash matches) written by another kiln, torch or device: ignored."""
    _setup_after_cold(tmp_path, cold_static)      # (f compiled and recorded by a first process)
    [(_, record)] = store.records()
    found = envelope.read(record, store.RECORD)
    header = {**found.header, "environment": {**found.header["environment"], "torch": "0.0.0+other"}}
    open(record, "wb").write(envelope.pack(store.RECORD, header, found.members))
    r, err = _run(tmp_path, "static")
    assert r["captures"] == 1 and r["frame_hits"] == 0 and r["hits"] == 1
    assert "written for another frame, kiln, torch or device" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_frames_key_does_not_depend_on_when_cuda_starts(tmp_path):
    """A CPU function's records are found by a process that started CUDA before compiling it
    and by one that did not (the key names the CUDA device each would use)."""
    child = tmp_path / "key.py"
    child.write_text(textwrap.dedent("""
        import sys, torch, kiln
        from kiln.package import frame_records
        if sys.argv[1] == "early":
            torch.cuda.init()

        def f(x):
            return x * 2

        cf = kiln.compile(f, backend="aot_eager")
        cf(torch.ones(2))
        print(frame_records.frame_key(cf))
    """))
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kiln.__file__))}
    keys = [subprocess.run([sys.executable, str(child), when], capture_output=True, text=True, env=env,
                           timeout=300).stdout.strip() for when in ("early", "late")]
    assert keys[0] and keys[0] == keys[1]


_LAYERS_CHILD = textwrap.dedent("""
    import json, sys, torch, kiln, kiln.runtime.function
    captures = []
    real = kiln.runtime.function.capture
    kiln.runtime.function.capture = lambda *a, **k: (captures.append(1), real(*a, **k))[1]

    class Slot:
        value = None

    class Layer(torch.nn.Module):
        def __init__(self, idx):
            super().__init__()
            self.layer_idx = idx
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, store):
            y = torch.relu(self.lin(x))
            store[self.layer_idx].value = y        # (its own slot: each layer guards its index)
            return y

    torch.manual_seed(0)
    layers = [Layer(i) for i in range(12)]
    compiled = [kiln.compile(m, backend="aot_eager") for m in layers]
    got, want = [Slot() for _ in layers], [Slot() for _ in layers]
    x = y = torch.randn(2, 4)
    for m, c in zip(layers, compiled):
        x, y = c(x, got), m(y, want)
    torch.testing.assert_close(x, y)
    assert all(torch.equal(a.value, b.value) for a, b in zip(got, want))
    print("RESULT " + json.dumps({"captures": len(captures), "entries": len(compiled[0].entries),
                                  "eager": sum(e.is_eager for e in compiled[0].entries),
                                  **kiln.cache.stats()}))
""")


def test_a_warm_process_installs_the_entries_of_every_layer(tmp_path):
    """Twelve layers compiled one by one, each with an entry of its own (its index): a warm
    process installs all twelve from the record, more than ``recompile_limit``, and captures
    none (the limit counts entries per module instance)."""
    (tmp_path / "layers.py").write_text(_LAYERS_CHILD)
    root = os.path.dirname(os.path.dirname(kiln.__file__))
    env = {**os.environ, "PYTHONPATH": root, "PYTHONDONTWRITEBYTECODE": "1",
           "KILN_CACHE_DIR": str(tmp_path / "cache"), "KILN_CACHE_FRAMES": "1"}
    results = []
    for _ in range(2):
        p = subprocess.run([sys.executable, str(tmp_path / "layers.py")], capture_output=True, text=True,
                           timeout=600, env=env)
        assert p.returncode == 0, p.stderr
        results.append(json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][0][7:]))
    cold, warm = results
    assert cold["captures"] == 12 and cold["entries"] == 12 and cold["eager"] == 0
    # (the record holds the layers' one compiled graph once, not twelve times)
    records = list((tmp_path / "cache" / "frames").glob("*/*.rec"))
    assert len(records) == 1
    blobs = [m for m in store.read_record(str(records[0])).members if m.startswith("blobs/")]
    assert 1 <= len(blobs) <= 3, blobs
    assert warm["captures"] == 0 and warm["entries"] == 12 and warm["eager"] == 0
    assert warm["frame_hits"] == 1


def _step_over(op):
    def step(x):
        return op(x) * 2
    return step


def test_a_closure_over_another_local_function_is_not_given_the_first_ones_graph():
    """Two functions of one code, closing over different local functions: the frame record
    the first wrote must not serve the second (its identity guard on the closure's function
    would compare the second function's cell with itself)."""
    def sub(a):
        return a - 1

    def add(a):
        return a + 1

    x = torch.ones(2)
    for op in (sub, add):
        fn = _step_over(op)
        torch.testing.assert_close(kiln.compile(fn, backend="aot_eager")(x), fn(x))
    for op in (lambda a: a * 3, lambda a: a * 4):     # (a loop: one cell, rebound)
        def fn(x):
            return op(x)
        torch.testing.assert_close(kiln.compile(fn, backend="aot_eager")(x), fn(x))
