import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh_kiln():
    """Every test starts with no compiled entries, logs off and default config."""
    kiln.reset()
    kiln.set_logs(None)
    torch.manual_seed(0)
    yield
    kiln.reset()
    kiln.set_logs(None)


def requires_cuda(fn):
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(fn)
