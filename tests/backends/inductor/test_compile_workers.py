"""A backend's ``before_capture`` hook, and the Inductor backend's use of it: on a process that
uses CUDA, Inductor's kernel-compiling workers and Triton's set-up start before the capture,
so that the first graph's compile does not wait for them."""
from __future__ import annotations

import threading

import pytest
import torch

import kiln
from kiln import _torch
from kiln.backends import lookup_backend


def test_before_capture_runs_before_each_capture_only():
    calls, graphs = [], []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    backend.before_capture = lambda: calls.append(len(graphs))

    @kiln.compile(backend=backend)
    def f(x):
        return x.sin() + 1

    x = torch.randn(4)
    torch.testing.assert_close(f(x), x.sin() + 1)
    f(torch.randn(4))                                   # a guard hit: no capture
    assert calls == [0]
    y = torch.randn(4, dtype=torch.float64)             # a recompile: a capture again
    torch.testing.assert_close(f(y), y.sin() + 1)
    assert calls == [0, 1] and len(graphs) == 2


def test_prefetch_ends_and_is_joined():
    _torch._start_prefetch()
    _torch.join_prefetch()
    assert _torch._prefetch and not _torch._prefetch[0].is_alive()
    _torch._start_prefetch()                            # once per process
    assert len(_torch._prefetch) == 1
    assert not any(t.name == "kiln-inductor-prefetch" and t.is_alive() for t in threading.enumerate())


def test_inductor_before_capture_without_cuda_in_use_starts_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    started = []
    monkeypatch.setattr(_torch, "inductor_wake_up_workers", lambda: started.append(1))
    lookup_backend("inductor")[0].before_capture()
    assert started == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_inductor_starts_its_workers_before_the_capture():
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads

    torch.zeros(1, device="cuda")       # (a process that uses CUDA)
    seen = []

    @kiln.compile
    def f(x):
        seen.append(AsyncCompile._ready_future is not None)     # (runs at capture, on fakes)
        return torch.relu(x) * 2

    x = torch.randn(64, device="cuda")
    torch.testing.assert_close(f(x), torch.relu(x) * 2)
    if get_compile_threads() > 1:
        assert seen and seen[0]
    assert _torch._prefetch and not _torch._prefetch[0].is_alive()
