import pytest

import kiln


@pytest.fixture(autouse=True)
def _frame_records_on(monkeypatch):
    """Cache tests run with frame records on (the default, which tests/conftest.py turns off
    for the rest of the suite); each counts hits, misses and warnings of its own (the root
    fixture's ``kiln.reset()``)."""
    monkeypatch.setattr(kiln.config, "cache_frames", True)
    monkeypatch.setenv("KILN_CACHE_FRAMES", "1")
    yield
