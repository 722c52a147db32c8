"""Why a graph, or one call of it, runs outside a CUDA graph, and what happens then.

Decided at compile time from the ATen graph (``graph_facts``): ops a CUDA graph cannot hold
(CPU work, device syncs such as ``.item()``, ops with data-dependent output shapes, ops torch
tags ``cudagraph_unsafe``), several devices, and which inputs the graph writes to. The result
is plain data (``GraphFacts``), so a compiled graph loaded from a cache needs no graph module
to make the same decision.

Decided at run time (``function.py``): an input the graph writes to that is not at a stable
address, outputs of an earlier replay still needed by a pending backward, too many
recordings or sizes.

Either way ``skip`` raises ``kiln.CudagraphError`` under ``kiln.config.cudagraph_or_error``
(``KILN_CUDAGRAPH_OR_ERROR=1``); otherwise it logs the reason once per graph under
``KILN_LOGS=cudagraphs``, with the user's stack. A skip is never silent in the log.
"""
from __future__ import annotations

import dataclasses
import os
import re
import traceback

import torch
import torch.fx

from .. import logs
from ..aot.fake_tensors import DEVICES_META, UNBACKED_META, ensure_vals
from ..config import config
from ..errors import CudagraphError
from ..internal_errors import mark_users

# Ops that make the host wait for the device or whose output shape is only known after they
# ran: neither can be replayed from a recording. (A device-side assert, ``_assert_async`` on a
# CUDA tensor, as ``F.one_hot`` checks its classes, is a kernel: it replays.)
_SYNC_OPS = {"_local_scalar_dense": "a device sync (.item(), int(), bool() of a tensor)",
             "equal": "a device sync (torch.equal)",
             "is_nonzero": "a device sync (bool() of a tensor)"}


@dataclasses.dataclass
class GraphFacts:
    """What the compile-time check found, as plain data: everything a ``CudagraphFunction``
    needs besides the compiled callable (the pre-compile half of the seed's split; a cache or
    package load rebuilds the function from ``from_dict`` without the graph module)."""
    name: str                                   # for messages: "forward graph Kiln_f"
    kind: str = "inference"                     # inference | forward | backward
    skip: str | None = None                     # why the whole graph cannot be recorded
    written_inputs: list[int] = dataclasses.field(default_factory=list)
    input_names: list[str] = dataclasses.field(default_factory=list)
    static_inputs: list[int] = dataclasses.field(default_factory=list)   # parameters, buffers
    # inputs whose sizes vary (symbolic): they key the recordings, one per concrete size
    size_inputs: list[int] = dataclasses.field(default_factory=list)
    # (forward) outputs from this index on are saved for the backward
    saved_from: int | None = None
    # the skip comes from ops (CPU work, syncs...): the graph can be split around them
    op_level: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GraphFacts":
        return cls(**d)


def readable_source(source: str) -> str:
    """``L['module']._modules['a']._parameters['weight']`` -> ``module.a.weight``."""
    out = re.sub(r"\._(?:modules|parameters|buffers)\['([^']+)'\]", r".\1", source)
    return re.sub(r"^[LG]\['([^']+)'\]", r"\1", out)


def _op_name(target) -> str:
    name = getattr(target, "__name__", None) or str(target)
    return name.split(".")[0] if isinstance(target, torch._ops.OpOverload) else name


def _where(node: torch.fx.Node) -> str:
    trace = node.meta.get("stack_trace")
    if isinstance(trace, str) and trace.strip():
        lines = [ln for ln in trace.strip().splitlines() if ln.strip().startswith("File")]
        if lines:
            return " at " + lines[-1].strip()
    return ""


def _has_symbols(v) -> bool:
    if isinstance(v, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in v.shape) or \
            any(isinstance(st, torch.SymInt) for st in v.stride())
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _data_dependent(n: torch.fx.Node) -> bool:
    """Whether a node's value has a size known only at run time (or is unknown)."""
    value = n.meta.get("val")
    if value is None:
        return n.meta.get(UNBACKED_META, True)   # (a loaded graph: as traced)
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        return bool(free_unbacked_symbols(value))
    except Exception:
        return True


def _node_devices(n: torch.fx.Node) -> list:
    """The devices of a node's value (a loaded graph's op: as traced)."""
    value = n.meta.get("val")
    if value is None:
        return list(n.meta.get(DEVICES_META, ()))
    return _devices(value)


def _devices(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value.device]
    if isinstance(value, (list, tuple)):
        return [d for v in value for d in _devices(v)]
    return []


def _subgraphs(n: torch.fx.Node) -> list:
    """The graphs a higher-order op node runs (a repeated block's ``invoke_region``, a branch
    of ``cond``): its ``get_attr`` arguments that name GraphModules of the owning module."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.HigherOrderOperator):
        return []
    owner = n.graph.owning_module
    found = []
    for a in n.args:
        if isinstance(a, torch.fx.Node) and a.op == "get_attr" and owner is not None:
            try:
                sub = owner.get_submodule(a.target)
            except AttributeError:      # (a tensor attribute, not a module)
                continue
            if isinstance(sub, torch.fx.GraphModule):
                found.append(sub)
    return found


def op_reason(n: torch.fx.Node) -> str | None:
    """Why one op of a graph cannot be in a CUDA graph (None: it can). Placeholders and
    outputs are not ops. A higher-order op is checked through the graphs it runs: a replay
    runs their ops as recorded."""
    for sub in _subgraphs(n):
        for inner in sub.graph.nodes:
            if inner.op in ("placeholder", "output"):
                continue
            why = op_reason(inner)
            if why is not None:
                return f"{why} (inside {_op_name(n.target)})"
    if n.op == "call_function" and getattr(n.target, "namespace", None) == "kiln":
        # stream_ops.py: copies on a side stream, timed by events, into pinned CPU memory
        return f"op {_op_name(n.target)} moves saved activations on a side stream (kiln.activations." \
               f"offload), which a CUDA graph does not record{_where(n)}"
    for d in _node_devices(n):
        if d.type not in ("cuda", "meta"):      # meta tensors compute nothing
            return f"op {_op_name(n.target)} is on the {d.type} device (a CUDA graph records only CUDA work){_where(n)}"
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return None
    op = n.target
    name = op._schema.name.split("::")[-1]
    if name in _SYNC_OPS:
        return f"op {name} is {_SYNC_OPS[name]}{_where(n)}"
    if torch.Tag.dynamic_output_shape in op.tags and _data_dependent(n):
        # (tagged ops such as index with integer indices have static shapes: fine)
        return f"op {name} has a data-dependent output shape (a device sync){_where(n)}"
    unsafe_tag = getattr(torch.Tag, "cudagraph_unsafe", None)
    if unsafe_tag is not None and unsafe_tag in op.tags:
        return f"op {name} is tagged cudagraph_unsafe{_where(n)}"
    return None


def graph_facts(gm: torch.fx.GraphModule, kind: str) -> GraphFacts:
    """Check one ATen graph (``kind``: inference, forward, backward) at compile time."""
    ensure_vals(gm)             # (a graph loaded from an artifact: its inputs' fakes, made now)
    facts = GraphFacts(name=f"{kind} graph {type(gm).__name__}", kind=kind)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    facts.static_inputs = [i for i, p in enumerate(placeholders) if p.meta.get("kiln_static")]
    facts.size_inputs = [i for i, p in enumerate(placeholders) if _has_symbols(p.meta.get("val"))]
    if kind == "forward":
        facts.saved_from = gm.meta.get("kiln_num_fw_outputs", 0)
    facts.input_names = [readable_source(str(p.meta.get("kiln_source") or p.name)) for p in placeholders]
    index = {p: i for i, p in enumerate(placeholders)}
    cuda: set = set()
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        for d in _node_devices(n):
            if d.type == "cuda":
                cuda.add(d.index if d.index is not None else torch.cuda.current_device())
        if n.op == "placeholder":
            for d in _devices(n.meta.get("val")):
                if d.type not in ("cuda", "meta") and facts.skip is None:
                    facts.skip = f"input {facts.input_names[index[n]]} is on the {d.type} device (a CUDA graph " \
                                 "records only CUDA work)"
            continue
        if facts.skip is None:
            reason = op_reason(n)
            if reason is not None:
                facts.skip = reason
                facts.op_level = True
        op = n.target
        if n.op == "call_function" and isinstance(op, torch._ops.OpOverload) and op._schema.is_mutable:
            for arg, value in zip(op._schema.arguments, n.args):
                if arg.alias_info is not None and arg.alias_info.is_write and value in index:
                    facts.written_inputs.append(index[value])
    if len(cuda) > 1 and facts.skip is None:
        facts.skip = f"the graph uses several CUDA devices {sorted(cuda)}"
        facts.op_level = False
    if not cuda and facts.skip is None:
        facts.skip = "the graph has no CUDA tensors"
    facts.written_inputs = sorted(set(facts.written_inputs))
    return facts


def user_stack(limit: int = 6) -> str:
    """The caller's frames outside kiln and torch (where the compiled function was called)."""
    kiln_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    frames = [f for f in traceback.extract_stack()[:-1]
              if not f.filename.startswith((kiln_dir, torch_dir)) and "<frozen" not in f.filename]
    return "".join(traceback.format_list(frames[-limit:])).rstrip()


def skip(facts: GraphFacts, reason: str, logged: set, key: str | None = None) -> None:
    """A call of the graph is about to run outside a CUDA graph for ``reason``: raise under
    ``cudagraph_or_error``, else log it (once per graph and kind of reason, ``key``)."""
    if config.cudagraph_or_error:
        e = CudagraphError(f"kiln: CUDA graphs: the {facts.name} would run without a CUDA graph: {reason}.\n"
                           f"Called from:\n{user_stack()}\n(kiln.config.cudagraph_or_error / "
                           "KILN_CUDAGRAPH_OR_ERROR is set; unset it to run such calls without CUDA graphs)")
        mark_users(e)       # kiln's own signal to the user: never turned into an eager rerun
        raise e
    k = key or reason
    if k in logged:
        return
    logged.add(k)
    if logs.enabled.cudagraphs:
        logs.event("cudagraphs", "cudagraph", f"skipping CUDA graphs for the {facts.name}: {reason}\n{user_stack()}",
                   action="skipped", graph=facts.name, reason=str(reason))
