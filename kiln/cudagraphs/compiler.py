"""A compiler whose results run as CUDA graphs: ``cudagraph_compiler(compiler, kind)`` wraps
any AOT backend's compiler (``kiln.config.cudagraphs``)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx

from .function import CudagraphFunction
from .partition import try_partition
from .reasons import graph_facts


def cudagraph_compiler(compiler: Callable, kind: str) -> Callable:
    """A compiler ``(gm, example_inputs) -> callable`` whose results run as CUDA graphs (an
    inference graph with a few ops CUDA graphs cannot hold is split around them)."""
    def compile_with_cudagraphs(gm: torch.fx.GraphModule, example_inputs):
        facts = graph_facts(gm, kind)
        split = try_partition(gm, compiler, facts)
        if split is not None:
            return split
        return CudagraphFunction(compiler(gm, example_inputs), facts)
    compile_with_cudagraphs.__name__ = getattr(compiler, "__name__", "compiler")
    compile_with_cudagraphs.__module__ = __name__
    return compile_with_cudagraphs
