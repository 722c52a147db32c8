"""The ``"inductor"`` backend: kiln's AOT stages, then Inductor as a kernel generator.

* ``backend.py``: the backend (``InductorBackend``) and one graph's compile (``GraphCompile``);
* ``options.py``: ``mode`` and ``options`` as the Inductor config a compile runs under;
* ``cache_entry.py``: a compiled graph as a compile-cache entry, and its load;
* ``generated_module.py``, ``triton_kernels.py``: Inductor's generated module and its kernels
  loaded by kiln without importing Inductor;
* ``vec_isa_memo.py``: Inductor's CPU vector-ISA probe remembered per machine;
* ``progress.py``: a long compile's progress on stderr.
"""
from .backend import GraphCompile, InductorBackend, decomposition_table, inductor

__all__ = ["GraphCompile", "InductorBackend", "decomposition_table", "inductor"]
