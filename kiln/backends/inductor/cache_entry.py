"""The compile-cache entry of one graph compiled by the ``"inductor"`` backend.

A *perfect* entry: a load returns what the compile returned, without tracing,
partitioning or lowering again. It holds

* the AOT result as ``kiln.aot.AOTArtifact`` (the partitioned ATen graphs, readable with
  ``as_text()``, and every runtime-wrapper field: mutations, aliases, regenerated views,
  saved-size ints, version checks);
* per compiled graph (inference, or forward and backward) Inductor's generated Python module
  (its source and cache key), the constants it reads, and the decisions Inductor's call
  wrapper made after compiling (inputs it realigns, donated saved tensors);
* what a later compile needs from the first: the forward's output strides and the graph meta
  that the partitioner left for the backward compiler (a partial backward, for outputs some
  backward() did not reach, is compiled on demand, as after a compile).

A load runs the generated modules. On the machine that built them, kiln loads each module and
its C++ kernel libraries itself, without importing Inductor (``generated_module``: the entry
keeps the libraries); Triton kernels too, once a process has run the module and recorded them
(``triton_kernels``: cubins and launchers, on the same GPU and torch). Otherwise the module is
imported as Inductor imports it: its kernels come from the C++ / Triton compilers' own disk
caches (compiled again from the stored source if those were cleared). A graph Inductor failed on (it
runs as FX) is not stored: the next process tries again.
"""
from __future__ import annotations

import io
import time
from typing import Any, Callable

import torch

from ... import _torch, cache, logs
from ...aot import fallback_entries
from ...aot.compile import AOTCompiled, assemble
from ...aot.donation import copies_when_graph_kept
from ...aot.dynamic import OUTSIDE_THE_TRACE, per_shape
from ...aot.export import AOTArtifact, fake_mode_of_graph
from ...aot.symbolic import has_symbols
from ...aot.symbolic_codec import Decoder, encode_value
from ...cache import compile_once, store
from ...cache.store import kernels_dir
from ...config import config
from ...cudagraphs import cudagraphify, graph_facts
from ...cudagraphs.partition import try_partition
from . import generated_module, triton_kernels, vec_isa_memo
from .generated_module import realign_inputs

FORMAT = "kiln.inductor.entry"
VERSION = 1
_GRAPH_META = ("kiln_num_fw_outputs", "kiln_num_saved", "kiln_donated")


class GeneratedCode:
    """What one Inductor compile produced, kept until the entry is written."""

    def __init__(self, kind: str, code: dict | None, donated: list[int], kept: list[int] | None = None):
        self.kind = kind
        self.code = code            # None: Inductor's result cannot be reloaded
        self.donated = list(donated)
        self.kept = kept            # (a backward made at run time) the inputs it reads

    def stored(self) -> dict:
        """What the entry keeps of it (``code`` is not None)."""
        return {**self.code, "donated": self.donated, **({"kept": self.kept} if self.kept is not None else {})}


def dump(compiled: Any, records: dict, fw_output_strides: list | None, late: dict | None = None) -> bytes:
    """The entry's bytes. Raises ValueError for a result that cannot be stored (the cache then
    keeps nothing and says why). ``late``: backwards made at run time (``function.backward_key``
    -> GeneratedCode) compiled so far, which the entry keeps beside the graphs: a segmented
    graph's backward as one, a backward for some outputs' gradients only."""
    redump = getattr(compiled, "kiln_redump", None)
    if redump is not None:          # (loaded from an entry: that entry, with what compiled since)
        return redump()
    saved = fallback_entries.dump(compiled)    # (per shape, or run as captured)
    if saved is not None:
        return saved
    if not isinstance(compiled, AOTCompiled):
        raise ValueError(f"not an AOT result ({type(compiled).__name__}): a per-shape or as-captured graph")
    parts = compiled.parts
    fallbacks = getattr(compiled, "kiln_inductor_fallbacks", None)
    if fallbacks:
        raise ValueError(f"Inductor failed on {fallbacks[0][0]}: not stored, the next process compiles again")
    # (segments: the backward is made at run time, as one graph or a piece per node)
    kinds = ["inference"] if parts.kind == "inference" else \
        ["forward"] if parts.segments is not None else ["forward", "backward"]
    graphs = {}
    split = 0
    for kind in kinds:
        rec = records.get(kind)
        if isinstance(rec, list):   # split around ops CUDA graphs cannot hold: its pieces, in order
            for i, piece in enumerate(rec):
                graphs[_piece(kind, i)] = _stored_code(piece, f"{kind} graph's part {i + 1}")
            split = len(rec)
            continue
        graphs[kind] = _stored_code(rec, f"{kind} graph")
    late_graphs = _stored_late(late or {})
    artifact = AOTArtifact(parts).to_bytes()
    graph_meta = {name: {k: gm.meta[k] for k in _GRAPH_META if k in gm.meta}
                  for name, gm in (("forward", parts.forward), ("backward", parts.backward)) if gm is not None}
    if fw_output_strides is not None and has_symbols(list(fw_output_strides)):
        strides: Any = {"sym": encode_value(list(fw_output_strides))}
    else:
        strides = None if fw_output_strides is None else \
            [None if s is None else [str(x) for x in s] for s in fw_output_strides]
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "version": VERSION, "artifact": artifact, "graphs": graphs,
                "late": late_graphs, "graph_meta": graph_meta, "fw_output_strides": strides,
                "split": split}, buf)
    return buf.getvalue()


def _stored_code(rec: GeneratedCode | None, what: str) -> dict:
    if rec is None:
        raise ValueError(f"no {what} was compiled by Inductor")
    if rec.code is None:
        raise ValueError(f"Inductor's {what} result cannot be reloaded (not a generated Python module)")
    return rec.stored()


def _piece(kind: str, i: int) -> str:
    return f"{kind}.part{i}"


def _split_again(graph: torch.fx.GraphModule, pieces: list, cudagraphs: bool) -> Callable:
    """A graph that was split around the ops CUDA graphs cannot hold, split again from the
    stored graph (the split is decided by the graph alone), each piece the stored module."""
    if not cudagraphs:
        raise ValueError("the entry is a graph split for CUDA graphs; this compile runs without them")
    given = iter(pieces)
    split = try_partition(graph, lambda piece, example_inputs: next(given), graph_facts(graph, "inference"))
    if split is None or next(given, None) is not None:
        raise ValueError("the stored graph does not split into the stored pieces")
    return split


def _load_fallback(payload: bytes, gm: torch.fx.GraphModule, make_compile: Callable, cudagraphs: bool,
                   rename: dict | None) -> Any:
    """A graph run as captured, or a per-shape result: its stored shapes load from their
    entries, others compile (and are added to the cache entry) as after a compile."""
    def make(reason: str):
        graph = make_compile(gm)
        compiled = graph.saving_shapes(per_shape(gm, reason, **graph.stage_options()))
        graph.stored_again = cache.refresher(compiled)
        return compiled
    return fallback_entries.load(payload, gm, make, lambda one: load(one, gm, make_compile, cudagraphs, rename))


def _stored_late(late: dict) -> dict:
    return {key: rec.stored() for key, rec in sorted(late.items()) if rec.code is not None}


def _with_late(payload: bytes, late: dict) -> bytes:
    """A loaded entry's bytes with the backwards compiled since its load added."""
    added = _stored_late(late)
    if not added:
        return payload
    obj = _torch.load_tensors(payload)
    obj["late"] = {**obj.get("late", {}), **added}
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def with_triton_records(payload: bytes) -> bytes:
    """The entry's bytes for a package: each graph's recorded Triton kernels added (recorded
    after the graph's first call, so after the cache stored the entry; a backward made at run
    time as well), for a package load
    that imports neither Triton nor Inductor."""
    if fallback_entries.is_entry(payload):
        return fallback_entries.map_shapes(payload, with_triton_records)
    obj = _torch.load_tensors(payload)
    added = False
    # (backwards made at run time too: a training step's backward for the loss only)
    for code in [*obj.get("graphs", {}).values(), *obj.get("late", {}).values()]:
        fast = code.get("fast") if isinstance(code, dict) else None
        if fast and fast.get("triton") and "triton_record" not in code:
            blob = triton_kernels.saved_blob(kernels_dir(), generated_module.module_digest(fast))
            if blob is not None:
                code["triton_record"] = blob
                added = True
    if not added:
        return payload
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# (an unrecorded GPT-2 training entry on an H100 loaded in 14.1 s one kernel at a time, 13.6 s
# in the pool; a handful of kernels build faster here than the pool starts: a judgment, not
# a measured crossover)
PARALLEL_LOAD_KERNELS = 12


def _load_generated(graphs: dict, wait_for_kernels: bool = True) -> dict:
    """Each graph's generated module, imported. Modules with C++ kernels take this machine's
    stored vector-ISA answer (``vec_isa_memo``) instead of Inductor's per-process probe.
    (Inductor's precompiled-header step, also run per process, stays: the header setting is
    part of the kernels' build command, so loading without it would compile them again.)

    Kernels load in this process (``compile_threads=1``) when there are few: they come from
    the C++ and Triton compilers' disk caches, and asking for Inductor's worker pool would
    start its worker processes (seconds of CPU, and more at exit) for nothing. Many Triton
    kernels not recorded by kiln (an entry another rank compiled, or a machine whose first
    load this is) are rather missing from Triton's cache too: they compile in Inductor's pool,
    in parallel, as at a compile. Parallelism is all that setting changes.

    An entry received from the rank of a job that compiled it (``compile_once``) has no
    recorded Triton kernels yet: each such module is loaded at its first call instead, once that
    rank's record has come (``_awaiting_kernels``)."""
    kernel_dir = kernels_dir()
    modules = {kind: generated_module.load(code.get("fast"), code["constants"], kernel_dir, code.get("triton_record"))
               for kind, code in graphs.items()}
    sender = compile_once.received_from() if wait_for_kernels else None
    awaiting = {kind: code for kind, code in graphs.items()
                if modules[kind] is None and sender is not None and _kernels_may_come(code)}
    rest = {kind: code for kind, code in graphs.items() if modules[kind] is None and kind not in awaiting}
    slow = set(rest)
    cpp = any("async_compile.cpp" in code["source_code"] for code in rest.values())
    if cpp:
        vec_isa_memo.prime(config.cache_dir)
    if rest:
        unrecorded = sum(code["source_code"].count("async_compile.triton(") for code in rest.values())
        threads = {} if unrecorded >= PARALLEL_LOAD_KERNELS else {"compile_threads": 1}
        with _torch.inductor_config().patch(**threads):
            modules.update({kind: _torch.inductor_load_generated_module(code) for kind, code in rest.items()})
    if cpp:
        vec_isa_memo.remember(config.cache_dir)
    # a module loaded through Inductor records its Triton kernels for the next process
    return {kind: _awaiting_kernels(kind, code, sender) if kind in awaiting else
            _entry_point(modules[kind], code, generated_module.triton_recorder(
                code.get("fast"), vars(modules[kind]), kernel_dir if config.cache else None) if kind in slow else None)
            for kind, code in graphs.items()}


def _log(message: str) -> None:
    if logs.enabled.cache:
        logs.log("cache", message)


def _kernels_may_come(code: dict) -> bool:
    """Whether the compiling rank's record of the module's Triton kernels is worth waiting
    for: the module has Triton kernels, and no collective (its first call on that rank would
    wait for this rank, which would be waiting for the record)."""
    fast = code.get("fast")
    source = code["source_code"]
    # (collectives are ops of ``_c10d_functional`` or ``c10d``; every module's header names
    # ``torch._C._distributed_c10d`` for its symmetric-memory allocator, which is not one)
    return bool(fast and fast.get("triton")) and "torch.ops._c10d_functional." not in source \
        and "torch.ops.c10d." not in source


def _awaiting_kernels(kind: str, code: dict, sender: compile_once.Claim) -> Callable:
    """The entry point of a received module whose Triton kernels the compiling rank records at
    its own first call: at this one's first call, the module is loaded with that record (and
    the record written to this machine's cache), or through Inductor when it does not come."""
    digest = generated_module.module_digest(code["fast"])
    _log(f"rank {sender.rank}: {kind} module {digest[:12]} of {sender.function} loads at its first call, with "
         "the Triton kernels the rank that compiled it records at its own")

    def resolve() -> Callable:
        blob = sender.wait_kernels(digest)
        if blob is not None:
            kernel_dir = kernels_dir()
            module = generated_module.load(code["fast"], code["constants"], kernel_dir, blob)
            if module is not None:
                store.count("job_kernels")
                if config.cache:
                    store.write_received_kernel_record(triton_kernels.record_path(kernel_dir, digest), blob)
                _log(f"rank {sender.rank}: {kind} module {digest[:12]} loaded with the received Triton kernels")
                return _entry_point(module, code)
            _log(f"rank {sender.rank}: the received Triton kernels of module {digest[:12]} do not load here; "
                 "building them")
        return _load_generated({kind: code}, wait_for_kernels=False)[kind]

    def first(args: list):
        nonlocal call
        call = resolve()
        return call(args)
    call = first

    def boxed(args: list):
        return call(args)
    boxed._boxed_call = True
    return boxed


def _entry_point(module: Any, code: dict, after_first_call: Callable[[], None] | None = None) -> Callable:
    """The module's ``call`` (boxed: one list of arguments), inputs Inductor assumed aligned
    realigned as its own wrapper does; ``after_first_call()`` runs once, when the first call
    has returned (then it leaves the call path)."""
    call = module.call
    check = list(code["inputs_to_check"])
    mutated = set(code["mutated_input_idxs"])
    if code["defers_input_alignment"]:
        check = [i for i in check if i in mutated]
    if check:
        call = realign_inputs(call, check, mutated)
    if after_first_call is not None:
        inner = call

        def first(args: list):
            nonlocal call
            out = inner(args)
            call = inner
            after_first_call()
            return out
        call = first

    def boxed(args: list):
        return call(args)
    boxed._boxed_call = True
    return boxed


def load(payload: bytes, gm: torch.fx.GraphModule, make_compile: Callable[[torch.fx.GraphModule], Any],
         cudagraphs: bool = False, rename: dict | None = None) -> Any:
    """The compiled callable rebuilt from an entry. ``make_compile(gm)`` makes the
    ``GraphCompile`` that compiles a partial backward on demand. ``cudagraphs``: each loaded
    graph replays as CUDA graphs, decided from the stored graph as after a compile."""
    started = time.perf_counter()
    if fallback_entries.is_entry(payload):
        return _load_fallback(payload, gm, make_compile, cudagraphs, rename)
    obj = _torch.load_tensors(payload)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ValueError("not a kiln Inductor entry")
    if obj.get("version") != VERSION:
        raise ValueError(f"Inductor entry version {obj.get('version')} (this kiln reads {VERSION})")
    # a dynamic entry loads into the capture's ShapeEnv, or (a package: no capture) its own
    artifact = AOTArtifact.from_bytes(obj["artifact"], rename, fake_mode=fake_mode_of_graph(gm))
    parts, fake_mode = artifact.parts, artifact.fake_mode
    for name, meta in obj["graph_meta"].items():
        getattr(parts, name).meta.update(meta)
    loaded = _load_generated(obj["graphs"])
    for kind, code in obj["graphs"].items():
        if kind == "backward" and code["donated"]:
            loaded[kind] = copies_when_graph_kept(loaded[kind], code["donated"])

    strides = obj["fw_output_strides"]
    if isinstance(strides, dict):
        strides = [None if s is None else tuple(s) for s in Decoder(fake_mode).value(strides["sym"])]
    elif strides is not None:
        strides = [None if s is None else [int(x) for x in s] for s in strides]
    made: list = []

    def later():
        """The GraphCompile that compiles partial backwards, as after a compile (made when
        first needed: making it reads Inductor's config, which imports Inductor)."""
        if not made:
            c = make_compile(gm)
            c._fw_output_strides, c._fw_num_outputs = strides, parts.num_fw_outputs
            c.stored_again = cache.refresher(compiled)
            made.append(c)
        return made[0]

    def load_late(key: str) -> Callable:
        def load_it() -> tuple:
            code = obj["late"][key]
            fn = _load_generated({key: code})[key]
            if code["donated"]:
                fn = copies_when_graph_kept(fn, code["donated"])
            return fn, code.get("kept")
        return load_it
    # (CUDA graphs record each graph from its FX graph: those are built and compiled again)
    stored_late = {} if cudagraphs else {key: load_late(key) for key in obj.get("late", {})}

    def stored(kind: str) -> Callable:
        def compiler(graph: torch.fx.GraphModule, example_inputs: list):
            if kind == "backward" and graph is not parts.backward:
                return later().backward(graph, example_inputs)
            if obj.get("split") and kind == "inference":
                return _split_again(graph, [loaded[_piece(kind, i)] for i in range(obj["split"])], cudagraphs)
            if cudagraphs:
                return cudagraphify(loaded[kind], graph, kind, facts=graph_facts(graph, kind))
            return loaded[kind]
        # (the stored graph needs no example inputs: none are made, no FakeTensorMode, which
        # imports torch._dynamo; a partial backward gets its own when it is compiled)
        compiler.kiln_reads_example_inputs = False
        if kind == "backward":
            compiler.kiln_stored_backwards = stored_late
        return compiler

    compiled = assemble(parts, stored("forward"), stored("backward"), stored("inference"), run_as_captured=gm)
    compiled.kiln_redump = lambda: _with_late(payload, made[0].late if made else {})
    if compiled.input_check is not None:    # (a dynamic graph: as after a compile)
        compiled.fallback = per_shape(gm, OUTSIDE_THE_TRACE, **later().stage_options())
    compiled.kiln_compile_seconds = {"load": time.perf_counter() - started}   # (nothing traced nor lowered)
    compiled.kiln_inductor_fallbacks = []
    return compiled
