import pytest

import kiln
from kiln.cache import store


@pytest.fixture(autouse=True)
def _fresh_cache_stats(monkeypatch):
    """Each cache test counts hits, misses and warnings of its own, with frame records on
    (the default, which tests/conftest.py turns off for the rest of the suite)."""
    monkeypatch.setattr(kiln.config, "cache_frames", True)
    monkeypatch.setenv("KILN_CACHE_FRAMES", "1")
    kiln.cache.reset_stats()
    store._warned.clear()
    yield
