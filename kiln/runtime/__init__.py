"""The runtime object model: what ``kiln.compile`` returns and how a call finds its entry.

Modules: ``compile_key`` (what an entry was compiled for), ``function_cache`` (one function's
entries), ``function`` (``CompiledFunction``: the call path, a miss's capture, and the
factory of the functions a graph break hands control to), ``callees`` (the tables behind
that factory), ``method`` (``CompiledMethod``), ``module`` (``CompiledModule``),
``eager_callable`` (a callable with no bytecode), ``recording`` (what ``kiln.explain``
collects), ``artifacts`` (what a compiled function asks of the layer above it, ``kiln.package``:
packages and frame records).
"""
from .compile_key import CompileKey
from .eager_callable import EagerCallable
from .function import CompiledFactory, CompiledFunction
from .function_cache import FunctionCache, cache_for
from .method import CompiledMethod
from .module import CompiledModule

__all__ = ["CompileKey", "CompiledFunction", "CompiledFactory", "CompiledMethod", "CompiledModule",
           "EagerCallable", "FunctionCache", "cache_for"]
