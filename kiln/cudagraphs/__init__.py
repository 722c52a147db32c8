"""CUDA graphs for kiln's compiled graphs: ``kiln.compile(fn, mode="reduce-overhead")`` (the
inductor backend) or ``kiln.config.cudagraphs = True`` (any AOT backend).

The compiled inference, forward and backward graphs each become a ``CudagraphFunction``
(``function.py``) that records them with ``torch.cuda.CUDAGraph`` into one graph pool per
device (``tree.py``) and replays them. Modules, one idea each:

* ``reasons.py``: what keeps a graph or a call out of a CUDA graph; logging, or-error;
* ``tree.py``: the pool and its ordered recordings; stale outputs, pending backwards;
* ``recording.py``: one recording: inputs read in place or copied, outputs per replay;
* ``function.py``: the per-call decisions (warm-up, replay, re-record, fall back);
* ``partition.py``: a graph split around the ops CUDA graphs cannot hold;
* ``compiler.py``: a compiler whose graphs run as CUDA graphs (split where they must be);
* ``steps.py``: the step counter that makes recordings follow the order graphs run in.
"""
from ..errors import CudagraphError
from .compiler import cudagraph_compiler
from .function import CudagraphFunction, cudagraphify, live_functions, skip_reasons, stats
from .reasons import GraphFacts, graph_facts

__all__ = ["CudagraphError", "CudagraphFunction", "cudagraph_compiler", "cudagraphify", "GraphFacts",
           "graph_facts", "live_functions", "skip_reasons", "stats"]
