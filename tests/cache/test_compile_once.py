"""One compile per job (kiln/cache/compile_once.py): two CPU ranks over gloo, each a process with
a cache directory of its own (two hosts), run the same program or different ones."""
import datetime
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import kiln
from kiln.cache import compile_once, key as K

ROOT = os.path.dirname(os.path.dirname(kiln.__file__))

_RANK = textwrap.dedent("""
    import json, os, sys, datetime, torch, torch.distributed as dist, kiln
    import kiln.aot.dynamic as D
    traces = []
    real = D._run_stages
    D._run_stages = lambda *a, **k: (traces.append(1), real(*a, **k))[1]
    kiln.set_logs("cache")
    rank, port, program, device = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    if device == "cuda":            # (each rank on its own GPU, as torchrun's ranks of one machine)
        torch.cuda.set_device(rank)
    backend = "inductor" if device == "cuda" else "aot_eager"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))

    def shared(x, w):
        return torch.relu(x @ w).sum(1) * 2

    def only_here(x, w):
        return torch.tanh(x @ w).sum(1) + rank

    def extra(x):
        return x.cos() * 3

    fns = {"same": [shared], "differ": [only_here, shared] if rank else [shared],
           "more": [shared, extra, only_here] if rank == 0 else [only_here]}[program]
    x = torch.randn(3, 4, device=device)
    w = torch.randn(4, 5, device=device, requires_grad=True)
    for fn in fns:
        args = (x, w) if fn is not extra else (x,)
        out, ref = kiln.compile(fn, backend=backend)(*args), fn(*args)
        torch.testing.assert_close(out, ref)
        if fn is not extra:
            out.sum().backward()
    dist.barrier()          # (the job ends together: neither rank hangs before it)
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"traces": len(traces), **kiln.cache.stats()}))
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(tmp_path, program, run="a", env=None, device="cpu"):
    """Both ranks' results (each checked its outputs against eager)."""
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(port), program, device],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT, **(env or {}),
                                   "KILN_CACHE_DIR": str(tmp_path / run / f"host{rank}")})
             for rank in range(2)]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"the job hung ({program})")
        assert p.returncode == 0, err
        results.append((json.loads([x for x in out.splitlines() if x.startswith("RESULT ")][0][7:]), err))
    return results


def test_two_ranks_running_the_same_program_compile_once(tmp_path):
    (r0, err0), (r1, err1) = _job(tmp_path, "same")
    assert r0["traces"] + r1["traces"] == 1                 # one compile in the job
    assert r0["job_hits"] + r1["job_hits"] == 1             # the other rank received it
    assert "for the job" in err0 + err1 and "received shared" in err0 + err1


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_ranks_on_two_gpus_of_one_machine_compile_once(tmp_path):
    """Inductor's code names its GPU: the rank that receives the entry rebinds it to its own, and
    loads its forward and backward modules with the Triton kernels the compiling rank recorded
    at its first calls (none built again)."""
    (r0, err0), (r1, err1) = _job(tmp_path, "same", device="cuda")
    assert r0["traces"] + r1["traces"] == 1
    assert r0["job_hits"] + r1["job_hits"] == 1
    receiver = r0 if r0["job_hits"] else r1
    assert receiver["job_kernels"] == 2, err0 + err1


def test_ranks_whose_programs_differ_compile_their_own_graphs_and_share_the_rest(tmp_path):
    (r0, _), (r1, err1) = _job(tmp_path, "differ")
    assert r0["traces"] + r1["traces"] == 2                 # shared once, only_here on rank 1
    assert r0["job_hits"] + r1["job_hits"] == 1
    assert "compiles only_here" in err1


def test_ranks_compiling_different_numbers_of_graphs_do_not_hang(tmp_path):
    (r0, _), (r1, _) = _job(tmp_path, "more")
    # rank 0: shared, extra and its only_here; rank 1: its only_here (another constant: rank)
    assert r0["traces"] + r1["traces"] == 4 and r0["job_hits"] + r1["job_hits"] == 0


def test_off_every_rank_compiles(tmp_path):
    (r0, _), (r1, _) = _job(tmp_path, "same", env={"KILN_DISTRIBUTED_COMPILE_ONCE": "0"})
    assert (r0["traces"], r1["traces"], r0["job_hits"] + r1["job_hits"]) == (1, 1, 0)


def test_with_a_warm_remote_cache_no_rank_compiles(tmp_path, remote):
    (r0, _), (r1, _) = _job(tmp_path, "same", run="a")
    assert r0["traces"] + r1["traces"] == 1
    (r0, _), (r1, _) = _job(tmp_path, "same", run="b")      # new hosts, empty local caches
    assert r0["traces"] + r1["traces"] == 0 and r0["remote_hits"] > 0 and r1["remote_hits"] > 0


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_without_a_job_nothing_is_claimed():
    assert compile_once.claim("0" * 64, "f") is None


@pytest.fixture
def job_store(monkeypatch):
    """A real TCPStore standing in for a job's, as rank 0 of 2 sees it."""
    from kiln import _torch
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    monkeypatch.setattr(_torch, "distributed_job", lambda: (store, 0, 2))
    return store


def test_a_claimer_without_an_entry_lets_the_others_compile_at_once(job_store):
    first, second = compile_once.claim("a" * 64, "f"), compile_once.claim("a" * 64, "f")
    assert first.mine and not second.mine
    first.publish(compile_once.FAILED)
    t = time.perf_counter()
    assert second.receive() is None and time.perf_counter() - t < 1.0


def test_a_claimer_that_never_publishes_is_waited_for_at_most_the_timeout(job_store):
    compile_once.claim("b" * 64, "f")
    waiter = compile_once.claim("b" * 64, "f")
    with kiln.config.patch(distributed_compile_timeout=0.3):
        t = time.perf_counter()
        assert waiter.receive() is None
        assert time.perf_counter() - t < 5.0


def test_a_compile_that_raises_still_publishes(job_store):
    def broken_compile():
        raise RuntimeError("the backend failed")

    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    inputs = [torch.randn(2)]
    with pytest.raises(RuntimeError, match="the backend failed"):
        kiln.cache.cached(gm, inputs, backend="aot_eager", options={}, compile=broken_compile,
                          load=lambda *a: None, dump=lambda c: b"")
    key = K.digest(K.key_parts(gm, inputs, "aot_eager", {}))
    waiter = compile_once.claim(key, "f")                  # another rank, after the failure
    assert not waiter.mine and waiter.receive() is None    # at once: it compiles for itself


def test_a_recorded_kernel_is_handed_to_the_rank_that_waits_for_it(job_store):
    claimer, receiver = compile_once.claim("c" * 64, "f"), compile_once.claim("c" * 64, "f")
    assert claimer.mine and not receiver.mine
    compile_once.publish_kernels("d" * 64, b"a kernel record")   # (after the claimer's first call)
    assert receiver.wait_kernels("d" * 64) == b"a kernel record"


def test_a_kernel_record_that_never_comes_is_waited_for_at_most_the_timeout(job_store):
    compile_once.claim("e" * 64, "f")
    receiver = compile_once.claim("e" * 64, "f")
    with kiln.config.patch(distributed_kernel_timeout=0.3):
        t = time.perf_counter()
        assert receiver.wait_kernels("f" * 64) is None         # (it builds the kernels itself)
        assert time.perf_counter() - t < 5.0


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_with_a_warm_remote_cache_ranks_on_two_gpus_capture_nothing(tmp_path, remote):
    """Each rank guards on its own GPU: each finds its own frame record in the remote cache
    (the key names the current device), so neither captures."""
    _job(tmp_path, "same", run="a", device="cuda")
    (r0, err0), (r1, err1) = _job(tmp_path, "same", run="b", device="cuda")      # new hosts
    assert r0["traces"] + r1["traces"] == 0
    assert (r0["frame_hits"], r1["frame_hits"]) == (1, 1), err0 + err1
