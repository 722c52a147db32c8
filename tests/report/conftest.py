import pytest

from . import workload


@pytest.fixture
def real_trace(tmp_path):
    """The trace directory of a real run (graph break, recompile, cache miss) and its results."""
    trace_dir = str(tmp_path / "trace")
    results = workload.run_traced(trace_dir)
    return trace_dir, results
