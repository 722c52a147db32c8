"""The ``eager`` backend: run the captured FX graph as it is."""
from __future__ import annotations

import torch.fx

from .registry import register_backend


@register_backend("eager")
def eager(gm: torch.fx.GraphModule, example_inputs: list):
    # The bound forward skips nn.Module.__call__'s hook machinery: graph modules have no hooks.
    return gm.forward
