import gc

import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh_kiln(tmp_path, monkeypatch):
    """Every test starts with nothing of kiln's process-wide state (``kiln.reset()``: entries,
    profiles, CUDA-graph pools and stats, cache counters...), logs off, default config and its
    own empty cache directory, frame records off (tests/cache: on)."""
    kiln.reset()
    kiln.set_logs(None)
    cache = str(tmp_path / "kiln-cache")
    monkeypatch.setattr(kiln.config, "cache_dir", cache)
    monkeypatch.setenv("KILN_CACHE_DIR", cache)   # subprocesses the test starts
    # Frame records (written after every compile) are tested in tests/cache, which turns
    # them back on; elsewhere they would only add a write per compile to the suite's time.
    monkeypatch.setattr(kiln.config, "cache_frames", False)
    monkeypatch.setenv("KILN_CACHE_FRAMES", "0")
    torch.manual_seed(0)
    yield
    kiln.reset()
    kiln.set_logs(None)


def requires_cuda(fn):
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(fn)


_TESTS_PER_FULL_COLLECTION = 500
_tests_since_full_collection = 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test (its fixtures torn down, kiln reset): what it left unreachable is
    collected, and what is still alive is frozen (``gc.freeze``), so that later collections,
    automatic or a test's own, walk only the objects made since. A worker's heap grows to a
    million objects over the suite, and every full collection walked all of them. Every
    500 tests the frozen objects are collected too (what died since it was frozen)."""
    global _tests_since_full_collection
    yield
    _tests_since_full_collection += 1
    if _tests_since_full_collection >= _TESTS_PER_FULL_COLLECTION:
        _tests_since_full_collection = 0
        gc.unfreeze()
    gc.collect()
    gc.freeze()
