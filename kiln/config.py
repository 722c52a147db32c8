"""kiln's configuration: one typed object, KILN_* environment overrides, and ``patch``.

    kiln.config.recompile_limit = 4
    with kiln.config.patch(recompile_limit=1): ...

Every field can be set from the environment as ``KILN_<FIELD>`` (upper case) at import.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Iterator

# field name -> callbacks run with the new value when it is set (``observe``)
_observers: dict[str, list[Callable[[Any], None]]] = {}


def observe(field: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(value)`` whenever ``config.<field>`` is set (also by ``patch``): a
    setting that switches something on at once (``trace_dir``) rather than being read per use."""
    _observers.setdefault(field, []).append(callback)


@dataclasses.dataclass
class Config:
    # Entries one function may hold before kiln stops compiling it and runs it eagerly. For a
    # module's forward (or a method) they are counted per module instance: the layers of a
    # model, each compiled (FSDP2's per-block compile), may each differ by a constant such as
    # a layer index, as torch.compile counts entries per the module objects they match.
    recompile_limit: int = 8
    # Entries one function may hold over all its instances.
    accumulated_recompile_limit: int = 256
    # Inline the bodies of user functions called from compiled code (the only mode today).
    max_inline_depth: int = 64
    # Maximum bytecode instructions one capture may execute (guards against runaway loops).
    max_instructions: int = 1_000_000
    # Where kiln keeps what outlives a process (dynamic-shape profiles, the compile cache). KILN_CACHE_DIR.
    cache_dir: str = os.path.join("~", ".cache", "kiln")
    # The compile cache (kiln/cache): a warm process loads compiled graphs. KILN_CACHE=0: off.
    cache: bool = True
    # With the cache on, each compiled function also keeps frame records
    # (kiln/package/frame_records.py): a warm process installs its entries without capturing. KILN_CACHE_FRAMES=0: off (the
    # graph-level cache still hits after a capture).
    cache_frames: bool = True
    # Bytes the compile cache (cache_dir/aot) may hold; least recently used entries go first.
    cache_size_limit: int = 2 * 1024 ** 3
    # The remote cache (kiln/remote_cache.py, docs/cache-and-packages.md): a Redis server that
    # machines share, read after the local cache and written through. KILN_REMOTE_CACHE=
    # redis://host:port/db; "" (the default): off. Needs redis-py (pip install kiln[redis]).
    remote_cache: str = ""
    # Seconds a connection or command to the remote cache may take before kiln gives up on it
    # (and leaves the server alone for 30 s).
    remote_cache_timeout: float = 0.25
    # Values larger than this are kept local only (a value is stored in 4 MiB chunks).
    remote_cache_max_bytes: int = 256 * 1024 ** 2
    # Under torch.distributed (initialized, more than one rank), ranks that miss the same graph
    # compile it once: the first claims it in the process group's store, the others wait for
    # its entry there (kiln/cache/compile_once.py). KILN_DISTRIBUTED_COMPILE_ONCE=0: off.
    distributed_compile_once: bool = True
    # Seconds a rank waits for another rank's compile of the same graph before compiling it itself.
    distributed_compile_timeout: float = 1800.0
    # Seconds a rank that received a graph waits, at a generated module's first call, for the
    # compiling rank's record of its Triton kernels (made at that rank's first call) before it
    # builds them itself through Inductor.
    distributed_kernel_timeout: float = 60.0
    # dynamic=None: a dim (or int input) seen with a new value is recompiled symbolic.
    automatic_dynamic_shapes: bool = True
    # Python int inputs are always specialized (a new value recompiles), never symbolic.
    specialize_int: bool = False
    # A backend compile (Inductor) that runs longer than 2 s says what it is doing on stderr.
    progress: bool = True
    # Python's cyclic garbage collector is paused while kiln compiles (kiln/compile_lock.py): its
    # full passes over the process's objects find little during a compile and cost a tenth of a
    # cold compile. Cycles a compile leaves are collected at the collector's next run after it.
    # KILN_PAUSE_GC_WHILE_COMPILING=0: off.
    pause_gc_while_compiling: bool = True
    # CUDA graphs (kiln/cudagraphs) for every compile with an AOT backend, whatever the mode
    # (mode="reduce-overhead" turns them on for the inductor backend). KILN_CUDAGRAPHS=1.
    cudagraphs: bool = False
    # Recordings one compiled graph may make for new addresses of its parameters/buffers
    # (a new module instance, a replaced parameter); after that it runs without CUDA graphs.
    cudagraph_max_recording: int = 5
    # Input sizes one dynamic graph records (one recording per concrete size); new sizes
    # beyond that run without CUDA graphs.
    cudagraph_max_sizes: int = 16
    # Raise kiln.CudagraphError instead of running anything outside a CUDA graph.
    # KILN_CUDAGRAPH_OR_ERROR=1.
    cudagraph_or_error: bool = False

    # A compiled training graph saves a parameter or buffer its backward reads as it is, even
    # where eager saves only a function of it (a bf16 cast under autocast). Changing it in
    # place between the forward and backward() then raises autograd's error where eager does
    # not. True: save a copy of each such tensor on every step, as for other inputs (eager's
    # behaviour, at the cost of copying the weights each step). KILN_COPY_SAVED_PARAMETERS=1.
    copy_saved_parameters: bool = False

    # The most pieces a graph is cut into at DDP's gradient buckets (kiln/capture/ddp_buckets.py):
    # consecutive buckets join one piece until it holds 1/ddp_pieces of the graph's bucketed
    # parameter bytes. Each cut lets the all-reduce of the buckets before it overlap the backward
    # after it, and costs host time per step (a piece is its own autograd node and graph call):
    # on two H100 over NVLink, a 1 GB GPT-2-style model trained 0.86x eager DDP's step with 4
    # pieces, 0.70x uncut, 1.29x with one piece per 25 MiB bucket (docs/distributed.md). 1: not
    # cut (for fast links); 0: one piece per bucket, as torch.compile's DDPOptimizer. KILN_DDP_PIECES.
    ddp_pieces: int = 4

    # Repeated blocks (the layers of an nn.ModuleList or nn.Sequential that trace to the same
    # code) are traced, partitioned and lowered once and called per layer (kiln/capture/regions.py):
    # a cold compile that grows little with depth, for a step that cannot fuse across layers
    # (docs/compile-time.md has the measurements). Functions under
    # torch.compiler.nested_compile_region are, whatever this says. KILN_REPEATED_BLOCKS=1: on.
    repeated_blocks: bool = False

    # The partitioner kiln's AOT stages use when none is given (aot_backend(partition_fn=None)):
    # "default" (save what the backward reads), "min_cut" (recompute cheap ops instead of saving
    # them) or a callable (joint_module, joint_inputs, *, num_fwd_outputs) -> (fw, bw). The
    # built-in backends name theirs. KILN_AOT_PARTITION_FN=min_cut.
    aot_partition_fn: Any = "default"

    # A directory for the structured trace (kiln/trace.py): one JSON-lines file per process of
    # every compile event (graphs, breaks, recompiles, stage times, cache, CUDA graphs,
    # activations); ``kiln report DIR`` draws it as one HTML page (docs/report.md). "": off.
    # KILN_TRACE_DIR=DIR.
    trace_dir: str = ""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        for callback in _observers.get(name, ()):
            callback(value)

    def capture_settings(self) -> tuple:
        """The settings that shape what a capture makes (which graphs, their blocks, their
        specializations, CUDA graphs). Compiled functions and frame records made under other
        settings are not reused: switching one on takes effect at the next ``kiln.compile``."""
        fn = self.aot_partition_fn
        partition = fn if isinstance(fn, str) else \
            f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
        return (("repeated_blocks", self.repeated_blocks), ("cudagraphs", self.cudagraphs),
                ("specialize_int", self.specialize_int), ("automatic_dynamic_shapes", self.automatic_dynamic_shapes),
                ("copy_saved_parameters", self.copy_saved_parameters), ("aot_partition_fn", partition))

    def patch(self, **changes: Any) -> contextlib.AbstractContextManager:
        """Temporarily change fields: ``with kiln.config.patch(recompile_limit=1): ...``."""
        return _patch(self, changes)


@contextlib.contextmanager
def _patch(cfg: Config, changes: dict) -> Iterator[None]:
    unknown = set(changes) - {f.name for f in dataclasses.fields(cfg)}
    if unknown:
        raise ValueError(f"kiln.config has no field(s) {sorted(unknown)}; "
                         f"known: {[f.name for f in dataclasses.fields(cfg)]}")
    old = {k: getattr(cfg, k) for k in changes}
    for k, v in changes.items():
        setattr(cfg, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(cfg, k, v)


def _from_env(cfg: Config) -> Config:
    for f in dataclasses.fields(cfg):
        raw = os.environ.get(f"KILN_{f.name.upper()}")
        if raw is None:
            continue
        default = getattr(cfg, f.name)
        if isinstance(default, bool):
            value: Any = raw.strip().lower() in ("1", "true", "yes", "on")
        elif isinstance(default, int):
            value = int(raw)
        elif isinstance(default, float):
            value = float(raw)
        else:
            value = raw
        setattr(cfg, f.name, value)
    return cfg


config = _from_env(Config())
