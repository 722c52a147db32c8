"""Every table and counter kiln keeps for the whole process, and the one ``reset()`` that
clears them (``kiln.reset()`` calls it).

A leaf: it imports nothing of kiln, so every layer imports its own table from here without a
cycle. Each table says which module fills it; the modules keep their logic, this module only
the state, so that what a reset forgets is written in one place.

Cleared by ``reset()``:

* compiled entries: ``function_caches`` (each function's entries, ``runtime/function_cache.py``),
  ``break_tables`` (generated break functions per function) and ``continuation_code``
  (``capture/frame.py``), ``generated_code_origins`` (``capture/resume.py``);
* the tables behind graph-break callees (``runtime/callees.py``): ``canonical_functions``,
  ``callee_objects``, ``stack_walkers``;
* the in-memory automatic-dynamic profiles, ``dynamic_profiles`` (``shapes/profile.py``; the
  files under ``KILN_CACHE_DIR`` stay);
* CUDA graphs: ``pool_trees`` and ``pending_backwards`` (``cudagraphs/tree.py``),
  ``cudagraph_functions``, ``cudagraph_stats`` and ``cudagraph_skip_reasons``
  (``cudagraphs/function.py``), the step counter ``cudagraph_steps`` (``cudagraphs/steps.py``);
* ``activation_rows`` (``aot/saved_hooks/rows.py``, what ``kiln.activations.report()`` shows)
  and ``saved_hook_wrappers`` (``aot/saved_hooks.py``).

Kept here, not cleared, and why:

* ``module_callers`` (``runtime/module.py``): the one caller function per nn.Module class
  (held weakly, by the compiled modules), which gives all instances of the class one set of
  entries; it is an identity, not a result (its entries are in ``function_caches`` and are
  cleared);
* ``side_streams`` (``activations/stream_ops.py``): a device's copy stream, a device
  resource; copies a graph compiled before the reset started may still be in flight on it;
* ``triton_records`` (``backends/inductor/triton_kernels.py``): the kernels this process compiled,
  for packages; Inductor's own in-process caches may hand those kernels back after a reset
  without compiling (nor recording) them again;
* ``cache_stats`` and ``cache_warned`` (``cache/store.py``): the compile cache's counters
  since the process started and what it warned about once. They count the cache on disk,
  which a reset leaves: a reset followed by a call that loads from the cache is a hit of the
  same process (``kiln.cache.reset_stats()`` zeroes the counters).

Kept where they are, for the life of the process, because they are facts that do not change
(or registrations made at import), not results of compiling:

* memos of facts: ``activations/policies.py`` (the hooks per dtype, ``fp8_supported``),
  ``aot/trace_context.lstm_hidden_defect``, ``aot/decompositions._default_decompositions``,
  ``backends/inductor/generated_module.machine_facts``, ``backends/inductor/vec_isa_memo.py`` (``_facts_text``
  and the ISA records packages offer, ``_offered``), ``cache/key.versions``,
  ``capture/numpy/values._numpy_callables``, ``aot/symbolic_codec._CLASSES``,
  ``capture/bytecode_utils._cache`` (a code object's decoded instructions, weak in the code);
* registries filled at import or by the user: backends (``backends/registry.py``; a backend
  the user registered stays registered), runtime wrapper kinds (``aot/runtime.py``),
  builtin handlers (``capture/values/builtins.py``), and the op tables (constants);
* interning: ``runtime/function._counting`` (a CompiledFunction class and its subclass that
  counts CUDA-graph steps), ``CompileKey._interned`` and ``InductorBackend._configured`` (equal keys stay one
  object, so a function compiled before a reset and one compiled after agree on BACKEND_MATCH),
  ``backends/inductor._graph_numbers`` (graph names stay unique in the process), ``capture/frame._graph_ids``
  (a traced graph's id, unique in the process's trace);
* per call or per thread, empty between calls: ``runtime/recording.recorder`` (while
  ``kiln.explain`` runs), ``aot/segments._active``, ``cache/compiling`` (a context variable),
  ``capture/values/backward_capture`` (during one capture);
* settings, not state: ``kiln.config`` and the log topics (``kiln.set_logs``); the trace file being
  written (``trace.writer``, ``logs._sources``: one process, one file, whatever a reset forgets);
* on disk under ``KILN_CACHE_DIR``: the compile cache, frame records, dynamic-shape profiles,
  kernel records (``kiln.cache.clear()`` or deleting the directory removes them).

Threads: the tables written while compiled code runs (not only under ``COMPILE_LOCK``) are
written with single dict/set operations (``setdefault``, ``pop``), which CPython makes
atomic, and the registries iterated by ``reset`` are guarded by ``registry_lock``.
"""
from __future__ import annotations

import collections
import threading
import weakref

# Guards the weak registries below: a WeakSet's iteration raises if another thread adds to
# it meanwhile. Taken only where an object registers (once per function) and by reset().
registry_lock = threading.Lock()

# -- compiled entries ------------------------------------------------------------------------------

function_caches: "weakref.WeakSet" = weakref.WeakSet()     # FunctionCache of every function
break_tables: "weakref.WeakSet" = weakref.WeakSet()        # each function's break functions
continuation_code: dict = {}          # (code, exit) -> the continuation's code object
generated_code_origins: dict = {}     # generated code (name blanked) -> the user's code
continuation_starts: dict = {}        # continuation code (name blanked) -> (prologue's jump, start)

# -- graph-break callees ---------------------------------------------------------------------------

canonical_functions: dict = {}        # (code, id(globals)) -> the one function object compiled
callee_objects: dict = {}             # code -> WeakSet of the closures compiled for it
stack_walkers: dict = {}              # code -> whether it reads its callers' frames

# -- dynamic shapes --------------------------------------------------------------------------------

dynamic_profiles: dict = {}           # code identity (JSON) -> FrameProfile

# -- CUDA graphs -----------------------------------------------------------------------------------


class CudagraphSteps:
    """The step counter of CUDA graphs (``cudagraphs/steps.py`` says what a step is):
    ``count``, the current step; ``warming``, the step in which a graph last warmed up;
    ``inside.in_step``, per thread, whether a step is running (a call inside it is part of
    it)."""

    __slots__ = ("count", "warming", "inside")

    def __init__(self) -> None:
        self.count = 0
        self.warming = -1
        self.inside = threading.local()

    def reset(self) -> None:
        self.count = 0
        self.warming = -1


cudagraph_steps = CudagraphSteps()
pool_trees: dict = {}                 # device index -> PoolTree
pending_backwards: dict = {}          # protected storage (StorageImpl address) -> Generation
cudagraph_functions: "weakref.WeakSet" = weakref.WeakSet()   # CudagraphFunctions alive
cudagraph_stats: collections.Counter = collections.Counter()         # calls by outcome
cudagraph_skip_reasons: collections.Counter = collections.Counter()  # skips by reason

# -- the compile cache (kept across reset()) ------------------------------------------------------

cache_stats: dict = {"hits": 0, "misses": 0, "bypasses": 0, "bytes_read": 0, "bytes_written": 0,
                     "frame_hits": 0, "frame_misses": 0, "job_hits": 0, "job_kernels": 0,
                     # the remote cache (remote_cache.py)
                     "remote_hits": 0, "remote_misses": 0, "remote_errors": 0,
                     "remote_bytes_read": 0, "remote_bytes_written": 0}
cache_stats_lock = threading.Lock()   # (a count may come from a compile on autograd's thread)
cache_warned: set = set()             # what the cache warned about once

# -- activations -----------------------------------------------------------------------------------

activation_rows: list = []            # one row per graph whose saved-tensor hooks were inlined
saved_hook_wrappers: dict = {}        # key of a callable -> (callable, its marked wrapper)

# -- kept across reset() (see above) ----------------------------------------------------------------

module_callers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # module class -> weakref to its caller
side_streams: dict = {}               # CUDA device index -> its copy stream
triton_records: dict = {}             # module digest -> the kernels' record (newest last)


def reset_cache_stats() -> None:
    with cache_stats_lock:
        for k in cache_stats:
            cache_stats[k] = 0


def reset() -> None:
    """Clear every table above except those kept across resets (``module_callers``,
    ``side_streams``, ``triton_records``, ``cache_stats``, ``cache_warned``)."""
    with registry_lock:
        registries = (list(function_caches), list(break_tables))
    for registry in registries:
        for held in registry:       # (each holds its entries; the objects stay registered)
            held.clear()
    for table in (continuation_code, generated_code_origins, continuation_starts, canonical_functions,
                  callee_objects,
                  stack_walkers, dynamic_profiles, pool_trees, pending_backwards, cudagraph_stats,
                  cudagraph_skip_reasons, activation_rows, saved_hook_wrappers):
        table.clear()
    with registry_lock:
        cudagraph_functions.clear()
    cudagraph_steps.reset()
