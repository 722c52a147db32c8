"""Compiling from several threads at once: one compile at a time in the process
(``kiln/compile_lock.py``), compiled code runs concurrently, every result is eager's."""
import sys
import threading
import warnings

import pytest
import torch

import kiln


def _make(i):
    def f(x, y):
        z = x @ y + i
        if z.sum() > 0:          # (a branch on data: a graph break)
            z = z.relu()
        return z.sin() * 2
    return f


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_four_threads_compile_at_once(backend):
    fns = [_make(i) for i in range(4)]
    shared_fn = _make(10)
    shared = kiln.compile(shared_fn, backend=backend)       # one function, called from every thread
    errors: list = []
    start = threading.Barrier(4)

    def work(i):
        try:
            compiled = kiln.compile(fns[i], backend=backend)
            start.wait()
            for n in (3, 5, 3):
                x, y = torch.randn(n, 4), torch.randn(4, n)
                torch.testing.assert_close(compiled(x, y), fns[i](x, y))
                torch.testing.assert_close(shared(x, y), shared_fn(x, y))
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    # Inductor keeps process-wide state while it compiles: two compiles at once made it fail
    # (and kiln fall back to ATen ops)
    failed = [str(w.message) for w in caught if "failed" in str(w.message)]
    assert not failed, failed


def test_threads_share_entries_while_they_are_reordered():
    """One function, static shapes, an entry per size, called from 4 threads with the sizes
    in turn: every call moves the entry it hit to the front while the other threads go through
    the entries (and compile other functions). Thread switches forced often, so that a list
    changed under a reader (an entry skipped: a needless capture; an entry removed twice) or a
    table changed during iteration shows."""
    def f(x):
        return (x * 2).sin() + x.shape[0]

    cf = kiln.compile(f, backend="eager", dynamic=False)
    sizes = (2, 3, 4, 5)
    for n in sizes:
        cf(torch.randn(n))
    assert len(cf.entries) == len(sizes)
    errors: list = []
    start = threading.Barrier(4)

    def work(i):
        try:
            start.wait()
            for k in range(300):
                x = torch.randn(sizes[(i + k) % len(sizes)])
                torch.testing.assert_close(cf(x), f(x))
                if k % 100 == 0:
                    kiln.compile(_make(k), backend="eager")(torch.randn(2, 2), torch.randn(2, 2))
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
    assert len(cf.entries) == len(sizes), cf.recompile_reasons     # no call missed an entry it had
