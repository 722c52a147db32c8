import pytest

import kiln
from kiln.cache import store


@pytest.fixture(autouse=True)
def _fresh_cache_stats():
    """Each cache test counts hits, misses and warnings of its own."""
    kiln.cache.reset_stats()
    store._warned.clear()
    yield
