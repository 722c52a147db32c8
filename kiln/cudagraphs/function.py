"""``CudagraphFunction``: a compiled graph (inference, forward or backward) that runs as CUDA
graph replays.

Per call (the fast path is a dict lookup, one C call comparing the addresses of the inputs read
in place, the copies of the other inputs, one ``replay()``):

1. a graph the compile-time check refused (``reasons.graph_facts``) runs as compiled;
2. the recordings for this input size (dynamic graphs: one per concrete size, up to
   ``kiln.config.cudagraph_max_sizes``; static graphs: one size) are tried in order: the first
   whose in-place inputs are at their recorded addresses replays, unless that would overwrite
   tensors a pending backward needs (``tree.conflict``: that call runs as compiled);
3. a size seen for the first time runs as compiled (warm-up: kernels autotune, libraries
   initialize outside the capture); it records on a later call, in a step (``steps.py``) in
   which no graph warmed up, so that recordings follow the order the graphs run in;
4. in-place inputs at new addresses (a new module instance, a replaced parameter) record
   again, up to ``kiln.config.cudagraph_max_recording`` recordings per size; after that the
   graph runs as compiled for good, with one warning naming the input. An input read in place
   only because the caller passed it again, unmoved (``recording.py``, optimistic), records
   once more when it moves, and is copied from then on.

Whether an input may be written is checked once, when recording (the seed's optimistic check:
the slow path when recording, trusted afterwards: a recording exists only for inputs it found
safe, and the in-place address check of step 2 guards the assumption on every call).
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable

import torch
import torch.fx

from .. import logs
from ..config import config
from ..process_state import cudagraph_functions as _live, cudagraph_skip_reasons as skip_reasons
from ..process_state import cudagraph_stats as stats, cudagraph_steps as _steps, registry_lock
from .reasons import GraphFacts, graph_facts, skip
from .recording import CannotRecord, Recording, _ptrs_equal, clear_cublas_workspaces
from .tree import _pending, consume, tree_for


# (stats: calls by outcome, "warmup", "record", "replay", "skip"; skip_reasons: skips by
# reason; for tests and benchmarks)


def live_functions() -> list:
    """The CudagraphFunctions alive (each compiled graph with CUDA graphs on) made since the
    last ``kiln.reset()``."""
    with registry_lock:
        return list(_live)


# whether the current stream is capturing a CUDA graph (the caller's own); never on a CPU build
# (whose binding is a placeholder that raises)
def _is_capturing() -> bool:
    global _is_capturing
    # (decided once: a CUDA build on a machine without a driver raises on the query itself)
    usable = torch._C._has_cuda and torch.cuda.is_available()
    _is_capturing = torch._C._cuda_isCurrentStreamCapturing if usable else (lambda: False)
    return _is_capturing()


def _caller(fn: Callable) -> Callable[[list], Any]:
    if getattr(fn, "_boxed_call", False):
        return fn
    return lambda args: fn(*args)


class CudagraphFunction:
    """A boxed callable (takes one list of arguments, empties it) replaying CUDA graphs of
    ``inner``."""
    _boxed_call = True

    def __init__(self, inner: Callable, facts: GraphFacts):
        self.inner = _caller(inner)
        self.facts = facts
        self.kind = facts.kind
        self.backward = facts.kind == "backward"
        self.static_idxs = frozenset(facts.static_inputs)
        self.protected_from = facts.saved_from
        self.key_positions = list(facts.size_inputs)
        self.recordings: dict = {}
        self.warmed: dict = {}      # size key -> inputs of its warm-up, weakly, and addresses (None: backward)
        self.rewarmed: set = set()
        self.copy_always: set = set()   # inputs that moved after being read in place optimistically
        self.disabled: str | None = self.facts.skip
        self.logged: set = set()
        self.probes: list = []      # (backward) inputs that held the forward's saved tensors
        gm_attr = getattr(inner, "graph_module", None)
        if gm_attr is not None:
            self.graph_module = gm_attr
        with registry_lock:
            _live.add(self)

    def _key(self, args: list):
        key = []
        for i in self.key_positions:
            a = args[i]
            key.append((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a)
        return tuple(key)

    def __call__(self, args: list):
        if self.backward:
            consume(args, self.probes)
        if self.disabled is not None:
            return self._without(args, self.disabled, "disabled")
        if _is_capturing():     # inside the caller's own CUDA-graph capture: its graph records us
            return self.inner(args)
        key = self._key(args) if self.key_positions else None
        recs = self.recordings.get(key)
        if recs is not None:
            for rec in recs:
                if (_ptrs_equal(args, rec.ptr_list, rec.inplace) if rec.simple_match else rec.matches(args)):
                    # (a conflict needs a pending backward, a backward's live gradients, or
                    # outputs of an earlier replay held in memory this recording reuses)
                    why = rec.tree.conflict(rec) if self.backward or _pending or rec.reuses else None
                    if why is None:
                        stats["replay"] += 1
                        return rec.replay(args)
                    return self._without(args, why, "pending")
            return self._record_again(args, key, recs)
        if key not in self.warmed:
            if len(self.warmed) >= config.cudagraph_max_sizes:
                return self._without(args, f"more than kiln.config.cudagraph_max_sizes="
                                           f"{config.cudagraph_max_sizes} input sizes recorded", "sizes")
            # (forward and inference graphs) each input tensor and its address: one the caller
            # passes again, unmoved, when recording is read in place (recording.py, optimistic)
            self.warmed[key] = None if self.backward else \
                [(weakref.ref(a), a.data_ptr()) if isinstance(a, torch.Tensor) else None for a in args]
            return self._warm_up(args, key, "")
        if _steps.warming == _steps.count and key not in self.rewarmed:
            # another graph warmed up in this step: record in the next one (steps.py)
            self.rewarmed.add(key)
            return self._warm_up(args, key, " again (a graph of this step warmed up)")
        return self._record(args, key)

    def _warm_up(self, args: list, key, why: str):
        _steps.warming = _steps.count
        stats["warmup"] += 1
        if logs.enabled.cudagraphs:
            logs.event("cudagraphs", "cudagraph", f"warm-up run of the {self.facts.name}{why}"
                                                  f"{' for sizes ' + str(key) if key else ''} (recorded on a later call)",
                       action="warm_up", graph=self.facts.name, sizes=key)
        clear_cublas_workspaces()       # (none made here stays allocated: recording.py)
        try:
            return self.inner(args)
        finally:
            clear_cublas_workspaces()

    def _without(self, args: list, reason: str, kind: str):
        stats["skip"] += 1
        skip_reasons[reason] += 1
        skip(self.facts, reason, self.logged, kind)
        return self.inner(args)

    def _record_again(self, args: list, key, recs: list):
        last = recs[-1]
        moved = last.mismatched(args)
        tree = last.tree
        optimistic = set(last.optimistic)
        unstable = [i for i in moved if i not in optimistic and not (
            isinstance(args[i], torch.Tensor) and (i in self.static_idxs or tree.owns(args[i], self.backward)))]
        if unstable:
            names = ", ".join(self.facts.input_names[i] for i in unstable)
            return self._without(args, f"input(s) {names} are not at the address the recording reads them "
                                       "from, and are not outputs of another CUDA-graph replay", "moved")
        if any(i in optimistic for i in moved):
            # inputs that stayed put until now: copied from now on (one more recording)
            self.copy_always.update(i for i in moved if i in optimistic)
            if logs.enabled.cudagraphs:
                names = ", ".join(self.facts.input_names[i] for i in moved if i in optimistic)
                logs.event("cudagraphs", "cudagraph", f"re-recording the {self.facts.name}: input(s) {names} moved; "
                                                      "they are copied into the recording from now on",
                           action="re_recorded", graph=self.facts.name, reason=f"input(s) {names} moved")
            return self._record(args, key)
        if len(recs) >= config.cudagraph_max_recording:
            names = ", ".join(self.facts.input_names[i] for i in moved) or "(copied inputs' layout)"
            self.disabled = (f"recorded {len(recs)} times (kiln.config.cudagraph_max_recording) for new addresses "
                             f"of its parameters/buffers; last moved: {names}")
            warnings.warn(f"kiln: the {self.facts.name} runs without CUDA graphs from now on: its static input(s) "
                          f"{names} changed address again after {len(recs)} recordings (a new module instance or "
                          "a replaced parameter on each call?). Raise kiln.config.cudagraph_max_recording, or keep "
                          "parameters in place (copy_ into them instead of assigning new tensors).",
                          RuntimeWarning, stacklevel=2)
            return self._without(args, self.disabled, "disabled")
        if logs.enabled.cudagraphs:
            names = ", ".join(self.facts.input_names[i] for i in moved)
            logs.event("cudagraphs", "cudagraph", f"re-recording the {self.facts.name} ({len(recs) + 1}/"
                                                  f"{config.cudagraph_max_recording}): static input(s) {names} moved",
                       action="re_recorded", graph=self.facts.name, reason=f"static input(s) {names} moved")
        return self._record(args, key)

    def _record(self, args: list, key):
        device = next(a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda")
        tree = tree_for(device)
        rec = Recording(self.facts, tree, self.static_idxs, self.protected_from, self.backward)
        warm = self.warmed.get(key)
        stable = frozenset() if warm is None else frozenset(
            i for i, w in enumerate(warm) if w is not None and i not in self.copy_always and i < len(args)
            and w[0]() is args[i] and args[i].data_ptr() == w[1])
        try:
            rec.classify(args, stable)
        except CannotRecord as e:
            return self._without(args, str(e), "classify")
        try:
            outs = rec.record(self.inner, args)
        except CannotRecord as e:
            return self._without(args, str(e), "record")
        except Exception as e:      # the capture itself failed: this graph stays uncaptured
            self.disabled = f"recording failed ({type(e).__name__}: {e})"
            return self._without(args, self.disabled, "disabled")
        self.recordings.setdefault(key, []).append(rec)
        stats["record"] += 1
        if logs.enabled.cudagraphs:
            logs.event("cudagraphs", "cudagraph", f"recorded the {self.facts.name}{' for sizes ' + str(key) if key else ''}: "
                                                  f"{len(rec.inplace)} input(s) read in place, {len(rec.copied)} copied",
                       action="recorded", graph=self.facts.name, sizes=key, in_place=len(rec.inplace),
                       copied=len(rec.copied))
        return outs

    def __repr__(self):
        return f"<kiln CUDA-graph {self.facts.name}>"


def cudagraphify(compiled: Callable, gm: torch.fx.GraphModule | None, kind: str,
                 facts: GraphFacts | None = None) -> Callable:
    """``compiled`` (a compiled ``kind`` graph: inference, forward, backward) run as CUDA
    graph replays. ``facts``: the compile-time decisions stored with a cached graph (then
    ``gm`` is not needed)."""
    if facts is None:
        facts = graph_facts(gm, kind)
    return CudagraphFunction(compiled, facts)
