"""Compiling one captured graph for the ``aot_backend``: symbolically when it is dynamic, and
per concrete shapes where that is not possible.

``compile_graph(gm, example_inputs, ...)`` runs the stages. For a dynamic graph (symbolic
placeholders, see ``symbolic.py``) it traces once with the symbols; the callable checks each
call's arguments against the traced shapes and the guards tracing added. The fallback is
``PerShapeCompiled``, which traces the graph again with static shapes for the concrete
arguments of a call and caches the result by their sizes, strides, int values and aliasing.
It is used:

* for every call, when the graph cannot be traced symbolically (``SymbolicUnsupported``, or an
  error only the symbolic trace meets);
* for a call whose arguments do not fit the symbolic trace (a guard tracing added fails).

Either way a call is answered by graphs traced for shapes it fits, never by a wrong one.

kiln's AOT stages failing on a graph that eager runs fine (an op tracing cannot handle, a
tensor the backward needs changed in place, ...) is kiln's problem, not the user's: the graph
then runs as captured (what the ``eager`` backend runs), with the reason logged under
``KILN_LOGS=aot,graph_breaks``. Only ``fullgraph=True`` (``gm.meta["kiln_fullgraph"]``)
turns the failure into ``kiln.Unsupported``.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Callable

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from .. import _torch, logs
from ..errors import Unsupported
from ..internal_errors import is_users
from .chain import compile_chained
from .decompositions import default_decompositions
from .compile import stage2_compile
from . import regions
from .graph_capture import stage1_graph_capture
from .partition import resolve_partition_fn
from .segments import NotSegmentable, plan
from .prepare import create_aot_state
from .symbolic import SymbolicUnsupported, symbolic_inputs

log = logging.getLogger("kiln.aot")

# Per-shape compilations one dynamic graph keeps (least recently used goes first).
PER_SHAPE_CACHE_SIZE = 16


def _run_stages(gm, example_inputs, *, dynamic, decompositions, fw_compiler, bw_compiler,
                partition_fn, inference_compiler, keep_input_mutations=False):
    # (a per-shape compile runs during a call, inside the user's saved-tensor hooks)
    with _torch.saved_tensors_hooks_paused():
        # a differentiable output that feeds another: the graph with its handoffs (segments.py)
        gm = plan(gm) or gm
        # (a repeated block's calls: traced and partitioned once, with the graph's partitioner)
        with regions.compiling(default_decompositions() if decompositions is None else dict(decompositions),
                               resolve_partition_fn(partition_fn)):
            state = create_aot_state(gm, example_inputs, decompositions=decompositions, dynamic=dynamic,
                                     keep_input_mutations=keep_input_mutations)
            capture = stage1_graph_capture(state)
        return stage2_compile(state, capture, fw_compiler=fw_compiler, bw_compiler=bw_compiler,
                              partition_fn=partition_fn, inference_compiler=inference_compiler)


def as_captured(gm: torch.fx.GraphModule, error: BaseException) -> Callable:
    """The fallback for a graph kiln's AOT stages failed on: the graph as captured (raises
    kiln.Unsupported instead under fullgraph=True)."""
    if is_users(error):
        raise error     # the user's own compiler (passed to aot_backend) raised: theirs
    reason = f"{type(error).__name__}: {error}"
    if gm.meta.get("kiln_fullgraph"):
        if isinstance(error, Unsupported):
            raise error
        raise Unsupported(f"AOT autograd failed on the graph: {reason}") from error
    for topic in ("aot", "graph_breaks"):
        if getattr(logs.enabled, topic):
            logs.log(topic, f"AOT autograd failed on graph {type(gm).__name__}; it runs as captured: {reason}")
    return run_as_captured(gm, reason)


def run_as_captured(gm: torch.fx.GraphModule, reason: str) -> Callable:
    """``gm`` run as captured, because kiln's AOT stages failed on it for ``reason`` (also
    as loaded from a cache entry or a package: ``fallback_entries``)."""
    gm.meta["kiln_aot_fallback"] = reason
    forward = gm.forward

    def graph_as_captured(*args):      # (a function: backends may set attributes on it)
        return forward(*args)
    graph_as_captured.graph_module = gm
    graph_as_captured.aot_failure = reason
    return graph_as_captured


def _arg_key(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), a.stride(), a.storage_offset(), a.dtype, a.device, a.requires_grad)
    try:
        hash(a)
    except TypeError:
        return (type(a), id(a))
    return (type(a), a)


def shape_key(args: tuple) -> tuple:
    """What a static trace depends on: grad mode, each tensor's metadata, each non-tensor's
    value, and which arguments are the same tensor or share memory."""
    same: dict = {}
    storage: dict = {}
    alias = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            # (by the storage object: a functionalized tensor's storage has no data pointer)
            alias.append((same.setdefault(id(a), i), storage.setdefault(StorageWeakRef(a.untyped_storage()), i)))
    return (torch.is_grad_enabled(), tuple(_arg_key(a) for a in args), tuple(alias))


class PerShapeCompiled:
    """The graph compiled with static shapes for each distinct ``shape_key`` of its calls.

    Its saved form (``fallback_entries``) holds the backend's payload of each shape compiled so
    far. A backend that can save its results sets ``saver`` (runs one compile and returns it
    with its payload, or None) and ``on_new`` (called once a shape compiled: the backend's cache
    entry is written again); a load fills ``stored`` (shape key as text -> payload) and
    ``load_one`` (payload -> compiled), and a call of a stored shape loads it instead of
    compiling."""

    def __init__(self, compile_static: Callable[[list], Callable], reason: str = "",
                 on_failure: Callable[[BaseException], Callable] | None = None):
        self._compile = compile_static
        self._on_failure = on_failure
        self.reason = reason
        self.cache: OrderedDict = OrderedDict()
        self.compiles = 0
        self.saver: Callable[[Callable[[], Callable]], tuple[Callable, bytes | None]] | None = None
        self.on_new: Callable[[], None] | None = None
        self.load_one: Callable[[bytes], Callable] | None = None
        self.saved: dict[str, bytes] = {}       # shape key text -> payload (compiled or loaded here)
        self.stored: dict[str, bytes] = {}      # from the entry, not loaded yet

    def __call__(self, *args):
        key = shape_key(args)
        fn = self.cache.get(key)
        if fn is None:
            text = repr(key)         # (the key's text is the same in another process)
            payload = self.stored.pop(text, None)
            if payload is not None and self.load_one is not None:
                try:
                    fn = self.load_one(payload)
                    self.saved[text] = payload
                except Exception as e:  # noqa: BLE001 - a payload that does not load: compile it
                    log.info("kiln AOT: a stored per-shape graph did not load (%s: %s)", type(e).__name__, e)
            if fn is None:
                fn = self._compile_one(list(args), text)
            self.cache[key] = fn
            if len(self.cache) > PER_SHAPE_CACHE_SIZE:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(key)
        return fn(*args)

    def _compile_one(self, args: list, text: str) -> Callable:
        def compile_it() -> Callable:
            try:
                return self._compile(args)
            except Exception as e:
                if self._on_failure is None:
                    raise
                return self._on_failure(e)
        self.compiles += 1
        if self.saver is None:
            return compile_it()
        fn, payload = self.saver(compile_it)
        if payload is not None:
            self.saved[text] = payload
            if len(self.saved) > PER_SHAPE_CACHE_SIZE:     # (the entry keeps the newest shapes)
                del self.saved[next(iter(self.saved))]
            if self.on_new is not None:
                self.on_new()
        return fn

    def __repr__(self) -> str:
        return f"<kiln.aot.PerShapeCompiled {len(self.cache)} shapes compiled ({self.reason})>"


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, *, decompositions: dict | None = None,
                  fw_compiler: Callable | None = None, bw_compiler: Callable | None = None,
                  partition_fn: Any = None, inference_compiler: Callable | None = None,
                  keep_input_mutations: bool = False) -> Callable:
    """The ``aot_backend``'s work for one graph: an ``AOTCompiled`` (symbolic for a dynamic
    graph, with a per-shape fallback), or a ``PerShapeCompiled``; the graph as captured when
    the stages fail on it (see the module's docstring). ``keep_input_mutations``: see
    ``create_aot_state``."""
    kw = dict(decompositions=decompositions, fw_compiler=fw_compiler, bw_compiler=bw_compiler,
              partition_fn=partition_fn, inference_compiler=inference_compiler,
              keep_input_mutations=keep_input_mutations)
    with _torch.global_module_hooks_paused():
        return _compile_graph_or_fall_back(gm, example_inputs, kw)


def _compile_graph_or_fall_back(gm: torch.fx.GraphModule, example_inputs: list, kw: dict) -> Callable:
    try:
        return _compile_graph(gm, example_inputs, **kw)
    except NotSegmentable as e:
        # (segments.py) the fallback: a chain of graphs compiled on their own
        log.info("kiln AOT: no segments (%s); compiling a chain of graphs", e)
        try:
            return compile_chained(
                gm, example_inputs, lambda part, args: compile_graph(part, args, **kw),
                lambda part: PerShapeCompiled(lambda args: compile_graph(part, list(args), **kw),
                                              "the second part of a chained graph"))
        except Exception as e2:
            return as_captured(gm, e2)
    except Exception as e:
        return as_captured(gm, e)


def per_shape(gm: torch.fx.GraphModule, reason: str, **kw) -> PerShapeCompiled:
    """``gm`` compiled with static shapes for each call's concrete arguments (``kw``: the
    stages' options, as for ``compile_graph``); the graph as captured where that fails. A
    dynamic result's ``fallback``, also when it was loaded from the compile cache."""
    def compile_static(args: list) -> Callable:
        return _run_stages(gm, args, dynamic=False, **kw)

    def on_failure(e: BaseException) -> Callable:
        return as_captured(gm, e)
    return PerShapeCompiled(compile_static, reason, on_failure)


OUTSIDE_THE_TRACE = "arguments outside the symbolic trace"


def _compile_graph(gm, example_inputs, **kw) -> Callable:
    if symbolic_inputs(gm, example_inputs) is None:
        return _run_stages(gm, example_inputs, dynamic=False, **kw)

    try:
        compiled = _run_stages(gm, example_inputs, dynamic=True, **kw)
    except SymbolicUnsupported as e:
        log.info("kiln AOT: compiling per shape: %s", e)
        return per_shape(gm, str(e), **kw)
    except Unsupported:
        raise               # refused for a reason static shapes share (data-dependent op...)
    except Exception as e:  # a failure only the symbolic trace meets (an op without symbolic support)
        log.info("kiln AOT: symbolic trace failed (%s: %s); compiling per shape", type(e).__name__, e)
        return per_shape(gm, f"{type(e).__name__}: {e}", **kw)
    compiled.fallback = per_shape(gm, OUTSIDE_THE_TRACE, **kw)
    return compiled
