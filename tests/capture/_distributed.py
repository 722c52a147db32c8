"""Helpers for the tests that train with torch.distributed: real processes (2 ranks) over gloo on
the CPU, started with torch.multiprocessing's spawn and joined with a time limit, so that a rank
left waiting in a collective fails the test instead of hanging it.

``run_ranks(worker, *args)`` runs ``worker(rank, world, *args)`` in each process, inside a
process group made from a file store in a fresh directory; an exception on any rank fails the
test with that rank's traceback. Workers are module-level functions of the test module (the
spawned processes import it by name).
"""
from __future__ import annotations

import datetime
import os
import pickle
import tempfile
import time

import pytest
import torch

WORLD = 2


def gloo_available() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


requires_gloo = pytest.mark.skipif(not gloo_available(), reason="needs torch.distributed with gloo")


def _entry(rank: int, world: int, store_path: str, worker, args) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)     # (two ranks on a machine of few cores)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        worker(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Done and checked: leave without the interpreter's teardown, where a gloo thread still
    # joinable at exit now and then aborts the process ("terminate called without an active
    # exception") after every assertion passed.
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(worker, *args, world: int = WORLD, timeout: float = 120.0) -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        ctx = mp.start_processes(_entry, args=(world, store, worker, args), nprocs=world, join=False,
                                 start_method="spawn")
        end = time.monotonic() + timeout
        while any(p.is_alive() for p in ctx.processes):
            failed = any(p.exitcode not in (None, 0) for p in ctx.processes)
            if time.monotonic() > end or failed:
                # (a rank that failed leaves the others waiting in a collective: a moment for
                # them to fail too, and report why)
                for p in ctx.processes:
                    p.join(timeout=5 if failed else 0)
                    if p.is_alive():
                        p.terminate()
                        p.join()
                break
            time.sleep(0.2)
        errors = []
        for rank, p in enumerate(ctx.processes):
            if p.exitcode != 0:
                errors.append(f"rank {rank} (exit code {p.exitcode}):\n{_error_of(ctx, rank)}")
        if errors:
            pytest.fail("\n".join(errors), pytrace=False)


def _error_of(ctx, rank: int) -> str:
    path = ctx.error_files[rank]
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return "(no traceback: killed, or waiting in a collective past the time limit)"
    with open(path, "rb") as f:
        return str(pickle.load(f))


def same_model(make, seed: int = 0):
    """A model made by ``make()`` after seeding: the same initial parameters on every rank and
    for every copy (eager and compiled)."""
    torch.manual_seed(seed)
    return make()


def assert_params_equal(a: torch.nn.Module, b: torch.nn.Module, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        q = q.full_tensor() if hasattr(q, "full_tensor") else q
        torch.testing.assert_close(q, p, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
