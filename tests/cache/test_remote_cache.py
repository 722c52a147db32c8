"""The remote cache (kiln/remote_cache.py) on a real redis-server the tests start (tests/cache/
conftest.py): a machine with an empty local cache served from it, values checked before use,
a server down or silent, concurrent writers, eviction, the size limit and the CLI.

Graphs are tiny and use the aot_eager backend, except the second-machine test (inductor: its
C++ kernels come from the remote entries too)."""
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch

import kiln
import kiln.aot.dynamic as aot_dynamic
from kiln import remote_cache
from kiln.cache import store

from .conftest import start_redis, stop_redis

ROOT = os.path.dirname(os.path.dirname(kiln.__file__))


@pytest.fixture
def traces(monkeypatch):
    calls = []
    real = aot_dynamic._run_stages
    monkeypatch.setattr(aot_dynamic, "_run_stages", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def server(url):
    import redis
    return redis.Redis.from_url(url)


def mlp(x, w):
    return (torch.relu(x @ w) * 2.0).sum(1)


def check(fn=mlp, n=3):
    """Compile and run ``fn`` (aot_eager), outputs and gradients compared with eager."""
    x, w = torch.randn(n, 4), torch.randn(4, 5, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    out, ref = kiln.compile(fn, backend="aot_eager")(x, w), fn(x, w2)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(w.grad, w2.grad)


def new_machine():
    """This process as a machine that never compiled: nothing in memory, an empty local cache
    directory (entries, frame records, profiles)."""
    kiln.reset()
    shutil.rmtree(os.path.expanduser(kiln.config.cache_dir))
    kiln.cache.reset_stats()


def entry_description(url) -> tuple[str, dict]:
    r = server(url)
    names = [n.decode() for n in r.keys(remote_cache.PREFIX + "entry:*") if n.count(b":") == 3]
    assert len(names) == 1, names
    return names[0], json.loads(r.get(names[0]))


# -- served from the remote cache ------------------------------------------------------------------

def test_a_remote_hit_is_checked_written_locally_and_counted(remote, traces):
    check()
    s = kiln.cache.stats()
    assert len(traces) == 1 and s["remote_bytes_written"] > 0 and s["remote_errors"] == 0
    new_machine()
    with kiln.config.patch(cache_frames=False):
        check()
    s = kiln.cache.stats()
    assert len(traces) == 1                                    # nothing traced on the new machine
    assert s["hits"] == 1 and s["misses"] == 0 and s["remote_hits"] == 1 and s["remote_bytes_read"] > 0
    assert len(store.entries()) == 1                           # the remote hit, kept locally
    kiln.reset()
    kiln.cache.reset_stats()
    with kiln.config.patch(cache_frames=False):
        check()
    assert kiln.cache.stats()["hits"] == 1 and kiln.cache.stats()["remote_hits"] == 0   # local first


def dyn(x, w):
    return (x @ w).relu().sum(0) * 2


def test_the_dynamic_profile_comes_from_the_remote_cache(remote, traces):
    for n in (3, 5):                     # a size changes: automatic dynamic, a profile is written
        check(dyn, n)
    assert len(traces) == 2
    new_machine()
    with kiln.config.patch(cache_frames=False):
        check(dyn, 7)                    # symbolic at once (the remote profile), and loaded
    s = kiln.cache.stats()
    assert len(traces) == 2 and s["hits"] == 1 and s["misses"] == 0


_MACHINE = textwrap.dedent("""
    import json, sys, torch, kiln
    import kiln.aot.dynamic as D, kiln.runtime.function as F
    import torch._inductor.cpp_builder as B
    from kiln import _torch
    work = {"captures": 0, "traces": 0, "inductor": 0, "cpp_builds": 0}
    def counted(what, real):
        def wrapper(*a, **k):
            work[what] += 1
            return real(*a, **k)
        return wrapper
    F.capture = counted("captures", F.capture)
    D._run_stages = counted("traces", D._run_stages)
    _torch.inductor_compile_graph = counted("inductor", _torch.inductor_compile_graph)
    B.CppBuilder.build = counted("cpp_builds", B.CppBuilder.build)

    def step(x, w):
        return torch.nn.functional.silu(x @ w).sum(1)

    def dyn(x):
        return (x.cos() * 2).sum(0)

    for n in map(int, sys.argv[1:]):
        x, w = torch.randn(n, 4), torch.randn(4, 5, requires_grad=True)
        w2 = w.detach().clone().requires_grad_()
        out, ref = kiln.compile(step)(x, w), step(x, w2)
        torch.testing.assert_close(out, ref)
        out.sum().backward(); ref.sum().backward()
        torch.testing.assert_close(w.grad, w2.grad)
        torch.testing.assert_close(kiln.compile(dyn)(x), dyn(x))
    print("RESULT " + json.dumps({**work, **kiln.cache.stats()}))
""")


def _machine(tmp_path, name, *sizes, env=None):
    """A fresh process on a 'machine' of its own: its own empty kiln and Inductor cache dirs."""
    script = tmp_path / "machine.py"
    if not script.exists():
        script.write_text(_MACHINE)
    env = {**os.environ, "PYTHONPATH": ROOT, "KILN_CACHE_DIR": str(tmp_path / name / "kiln"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name / "inductor"), **(env or {})}
    p = subprocess.run([sys.executable, str(script), *map(str, sizes)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][0][7:]), p.stderr


def test_a_second_machine_runs_with_nothing_compiled(remote, tmp_path):
    """Machine 1 compiles (inductor: C++ kernels); machines 2 and 3 start with empty kiln and
    Inductor caches and the warm Redis: no capture (frame records), no AOT trace, no Inductor
    compile, no C++ build (not even the vector-ISA probe's)."""
    first, _ = _machine(tmp_path, "m1", 3, 6)
    assert first["inductor"] > 0 and first["cpp_builds"] > 0 and first["remote_bytes_written"] > 0
    second, err = _machine(tmp_path, "m2", 3, 6)
    assert (second["captures"], second["traces"], second["inductor"], second["cpp_builds"]) == (0, 0, 0, 0), err
    assert second["frame_hits"] == 2 and second["misses"] == 0 and second["remote_hits"] > 0
    # without frame records: captured, and the graphs (the dynamic one symbolic at once, from the
    # remote profile) loaded from the remote entries
    third, err = _machine(tmp_path, "m3", 8, env={"KILN_CACHE_FRAMES": "0"})
    assert (third["traces"], third["inductor"], third["cpp_builds"]) == (0, 0, 0), err
    assert third["hits"] == 2 and third["misses"] == 0       # step (forward and backward), dyn


# -- values checked before use ---------------------------------------------------------------------

def _flip_chunk(r, name, meta):
    chunk = f"{name}:{meta['id']}:0"
    data = bytearray(r.get(chunk))
    data[len(data) // 2] ^= 0x40
    r.set(chunk, bytes(data))


def _truncate_chunk(r, name, meta):
    chunk = f"{name}:{meta['id']}:0"
    r.set(chunk, r.get(chunk)[:-100])


def _garbage_description(r, name, meta):
    r.set(name, b"\x00not json")


def _drop_chunk(r, name, meta):
    r.delete(f"{name}:{meta['id']}:0")


def _lying_description(r, name, meta):
    # (a description whose hash is of other bytes: as if a writer's chunks were replaced)
    r.set(name, json.dumps({**meta, "sha256": "0" * 64}))


@pytest.mark.parametrize("damage", [_flip_chunk, _truncate_chunk, _garbage_description, _drop_chunk,
                                    _lying_description])
def test_a_damaged_remote_value_is_a_miss_and_never_loaded(remote, traces, damage):
    check()
    name, meta = entry_description(remote)
    damage(server(remote), name, meta)
    new_machine()
    with kiln.config.patch(cache_frames=False), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check()                                          # compiled again, right
    s = kiln.cache.stats()
    # (remote_hits 0: the damaged bytes never left the remote layer)
    assert len(traces) == 2 and s["remote_hits"] == 0 and s["remote_misses"] >= 1 and s["misses"] == 1


def test_a_value_whose_hash_matches_but_is_no_entry_is_a_miss(remote, traces):
    check()
    name, _ = entry_description(remote)
    key = name.split(":", 3)[3]
    assert remote_cache.put("entry", key, b"PK\x03\x04 not an envelope")   # (hashed: the layer passes it)
    new_machine()
    with kiln.config.patch(cache_frames=False), pytest.warns(RuntimeWarning, match="ignoring the remote entry"):
        check()
    assert len(traces) == 2 and kiln.cache.stats()["misses"] == 1


@pytest.mark.parametrize("field", ["kiln", "torch"])
def test_a_value_from_another_kiln_or_torch_is_a_miss(remote, traces, field):
    check()
    r = server(remote)
    name, meta = entry_description(remote)
    r.set(name, json.dumps({**meta, field: "0.0.1"}))          # the bytes intact, the versions not
    new_machine()
    kiln.set_logs("cache")
    with kiln.config.patch(cache_frames=False):
        check()
    s = kiln.cache.stats()
    assert len(traces) == 2 and s["remote_hits"] == 0 and s["misses"] == 1


# -- the server down, silent, full -----------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_many_compiles(traces):
    for c in range(4):                 # (4 graphs: a read and a write each, and frame records)
        check(eval(f"lambda x, w: (torch.relu(x @ w) * {c + 2}.0).sum(1)", {"torch": torch}))
    assert len(traces) == 4


def _time_remote_calls(monkeypatch) -> list:
    """The seconds each remote get/put takes from now on."""
    spent = []
    for fn in ("get", "put"):
        real = getattr(remote_cache, fn)

        def timed(*a, _real=real, **k):
            t = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                spent.append(time.perf_counter() - t)
        monkeypatch.setattr(remote_cache, fn, timed)
    return spent


def test_nothing_listening_costs_under_a_second_and_warns_once(monkeypatch, traces):
    pytest.importorskip("redis")
    remote_cache.forget_failures()
    monkeypatch.setattr(kiln.config, "remote_cache", f"redis://127.0.0.1:{_free_port()}/0")
    spent = _time_remote_calls(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run_many_compiles(traces)
    remote_cache.forget_failures()
    mine = [w for w in caught if "kiln remote cache" in str(w.message)]
    assert len(mine) == 1 and "failed" in str(mine[0].message)
    assert kiln.cache.stats()["remote_errors"] == 1            # then left alone: no more tries
    assert sum(spent) < 1.0 and len(spent) >= 8
    assert len(store.entries()) == 4                           # the local cache went on


def test_a_silent_server_costs_under_a_second(monkeypatch, traces):
    """A server that accepts connections and never answers (hung, or swapping): one timeout,
    then the server is left alone."""
    pytest.importorskip("redis")
    remote_cache.forget_failures()
    spent = _time_remote_calls(monkeypatch)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        monkeypatch.setattr(kiln.config, "remote_cache", f"redis://127.0.0.1:{listener.getsockname()[1]}/0")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _run_many_compiles(traces)
    remote_cache.forget_failures()
    assert kiln.cache.stats()["remote_errors"] == 1
    assert sum(spent) < 1.0 and max(spent) >= kiln.config.remote_cache_timeout * 0.9


def test_a_full_server_is_an_error_logged_once(tmp_path, monkeypatch, traces):
    """maxmemory with noeviction: writes are refused (an error), the local cache goes on."""
    proc, url = start_redis(tmp_path, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
    try:
        remote_cache.forget_failures()
        monkeypatch.setattr(kiln.config, "remote_cache", url)
        with pytest.warns(RuntimeWarning, match="kiln remote cache: .* failed"):
            check()
        assert kiln.cache.stats()["remote_errors"] == 1 and len(store.entries()) == 1
    finally:
        remote_cache.forget_failures()
        stop_redis(proc)


# -- concurrency, eviction, size -------------------------------------------------------------------

_WRITER = textwrap.dedent("""
    import hashlib, sys, kiln
    from kiln import remote_cache as R
    R.CHUNK = 4096                          # (many chunks per value)
    me = int(sys.argv[1])
    def value(writer, i):
        return (f"{writer}:{i}:".encode() * 5000)[:30000 + writer * 1000]
    seen = 0
    for i in range(60):
        assert R.put("entry", "shared", value(me, i))
        got = R.get("entry", "shared")
        if got is not None:                 # whole, and exactly one writer's value
            writer, j = map(int, got.split(b":")[:2])
            assert got == value(writer, j), (writer, j)
            seen += 1
    s = kiln.cache.stats()
    assert s["remote_errors"] == 0, s
    print("RESULT", seen)
""")


def test_four_processes_writing_one_key_at_once_never_mix(remote, tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    env = {**os.environ, "PYTHONPATH": ROOT}
    procs = [subprocess.Popen([sys.executable, str(script), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert int(out.split("RESULT")[1]) > 0
    r = server(remote)
    name = remote_cache.name("entry", "shared")
    meta = json.loads(r.get(name))
    chunks = [n for n in r.keys(name + ":*")]
    assert len(chunks) == meta["chunks"]           # the replaced values' chunks were removed


_COMPILER = textwrap.dedent("""
    import sys, torch, kiln
    import kiln.aot.dynamic as D
    traces = []
    real = D._run_stages
    D._run_stages = lambda *a, **k: (traces.append(1), real(*a, **k))[1]
    def f(x, w):
        return torch.relu(x @ w).sum(1) * 3
    def g(x):
        return x.sin() + 3
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(kiln.compile(f, backend="aot_eager")(x, w), f(x, w))
    torch.testing.assert_close(kiln.compile(g, backend="aot_eager")(x), g(x))
    s = kiln.cache.stats()
    print("RESULT", len(traces), s["remote_errors"])
""")


def test_four_processes_compiling_at_once_leave_whole_values(remote, tmp_path):
    script = tmp_path / "compiler.py"
    script.write_text(_COMPILER)

    def start(i):
        return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": ROOT,
                                                "KILN_CACHE_DIR": str(tmp_path / f"machine{i}")})

    def result(p):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        return tuple(int(v) for v in out.split("RESULT")[1].split())
    for p in [start(i) for i in range(4)]:
        assert result(p)[1] == 0
    rows = remote_cache.ls()
    assert {kind for kind, *_ in rows} >= {"entry", "frame"}
    for kind, key, _, _ in rows:
        assert remote_cache.get(kind, key) is not None             # every value whole
    assert result(start(5)) == (0, 0)                              # and a fifth machine compiles nothing


def test_evicted_chunks_read_as_a_miss(tmp_path, monkeypatch, traces):
    """allkeys-lru evicts chunks and descriptions independently: a value missing a chunk is a
    miss, never a partial value; a graph whose entry was evicted compiles again."""
    proc, url = start_redis(tmp_path, "--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru")
    try:
        remote_cache.forget_failures()
        monkeypatch.setattr(kiln.config, "remote_cache", url)
        monkeypatch.setattr(remote_cache, "CHUNK", 16 * 1024)
        values = {f"v{i}": os.urandom(100_000) for i in range(60)}    # 6 MB: twice what fits
        for key, data in values.items():
            assert remote_cache.put("entry", key, data)
        found = {key: remote_cache.get("entry", key) for key in values}
        assert all(got is None or got == values[key] for key, got in found.items())
        assert any(got is None for got in found.values())
        partial = [k for k in values if found[k] is None and server(url).exists(remote_cache.name("entry", k))]
        s = kiln.cache.stats()
        assert s["remote_errors"] == 0 and s["remote_misses"] >= len(partial)
        check()                                              # still compiles and stores
        assert len(traces) == 1
    finally:
        remote_cache.forget_failures()
        stop_redis(proc)


def test_a_value_over_the_size_limit_stays_local(remote, traces):
    with kiln.config.patch(remote_cache_max_bytes=100):
        check()
    assert len(store.entries()) == 1
    assert not [r for r in remote_cache.ls() if r[0] == "entry"]


# -- the CLI ---------------------------------------------------------------------------------------

def test_cli_ls_and_clear_remote_touch_only_kilns_keys(remote, traces):
    check()
    r = server(remote)
    r.set("someone-else:key", b"theirs")
    cmd = [sys.executable, "-m", "kiln", "cache"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(cmd + ["ls", "--remote"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "entry " in out.stdout and "frame " in out.stdout and f"torch {torch.__version__}" in out.stdout
    out = subprocess.run(cmd + ["clear", "--remote"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "removed" in out.stdout
    assert r.keys(remote_cache.PREFIX + "*") == [] and r.get("someone-else:key") == b"theirs"
    assert len(store.entries()) == 1                          # the local cache is not touched
    out = subprocess.run(cmd + ["ls", "--remote"], capture_output=True, text=True,
                         env={**env, "KILN_REMOTE_CACHE": ""}, timeout=120)
    assert out.returncode == 1 and "KILN_REMOTE_CACHE" in out.stderr


def test_kernel_records_come_from_the_remote_cache_checked(remote):
    """The Triton kernel records (GPU) go through the store as any other file: here an envelope
    of their format, written on one machine and read on another."""
    path = os.path.join(store.kernels_dir(), "triton-0123.kt")
    blob = store.encode({"format": 1, "kernels": {}}, b"cubin bytes", store.KERNELS)
    assert store.write_kernel_record(path, blob)
    new_machine()
    assert store.read_kernel_record(path) == blob and os.path.exists(path)      # fetched, kept here
    assert kiln.cache.stats()["remote_hits"] == 1
    new_machine()
    remote_cache.put("kernels", os.path.basename(path), store.encode({}, b"x"))    # an entry, not a record
    with pytest.warns(RuntimeWarning, match="ignoring the remote kernels"):
        assert store.read_kernel_record(path) is None
    assert not os.path.exists(path)
