"""Fake tensors of the AOT stages: the mode a static graph is traced in, example inputs made
fake, and the fake values a loaded graph gets only when something reads them."""
from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from .. import _torch
from .subgraph_table import attribute, is_subgraph


def new_fake_mode(gm: torch.fx.GraphModule | None = None) -> FakeTensorMode:
    """A fake mode for AOT tracing of static graphs: no ShapeEnv (a dynamic graph is traced in
    its capture's mode, see ``symbolic.py``), except for a graph calling ``while_loop``, whose
    fake implementation makes (and then ignores) sizes known only at run time. Real tensors
    that the traced code closes over (constants) are allowed and become graph constants."""
    if gm is not None and _calls_while_loop(gm):
        from torch.fx.experimental.symbolic_shapes import ShapeEnv      # (sympy: not at a warm start)

        return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    return FakeTensorMode(allow_non_fake_inputs=True)


# loops whose fake implementations (or Inductor's lowering, a while_loop) make sizes known
# only at run time
_LOOPS = (torch.ops.higher_order.while_loop, torch.ops.higher_order.scan, torch.ops.higher_order.map_impl)


def _calls_while_loop(gm) -> bool:
    graph = getattr(gm, "graph", None)
    return graph is not None and any(n.op == "call_function" and n.target in _LOOPS for n in graph.nodes)


# A static graph loaded from an artifact (``export.graph_from_data``) gets its placeholders'
# fake values only when something reads them: a compiler that looks at its example inputs, a
# partial backward, the CUDA-graph checks. Running the graph needs none, and making a
# FakeTensorMode imports torch._dynamo (seconds), which a package load must not pay for.
LAZY_VAL = "kiln_val_spec"        # node meta: {shape, stride, dtype, device, requires_grad}
# a loaded graph's op (no fake value): its value's devices and whether a size of it is known
# only at run time, as traced (export.py writes them, CUDA graphs read them)
DEVICES_META = "kiln_value_devices"
UNBACKED_META = "kiln_value_unbacked"
LAZY_MODE = "kiln_lazy_fakes"     # graph meta: {"mode": the FakeTensorMode once made}, shared


def ensure_vals(gm: torch.fx.GraphModule) -> None:
    """Give a loaded static graph's placeholders their fake ``meta['val']`` (made once, in one
    FakeTensorMode shared by the graphs of one artifact); nothing for any other graph."""
    shared = gm.meta.get(LAZY_MODE)
    if shared is None:
        return
    if shared.get("mode") is None:
        shared["mode"] = FakeTensorMode()
    mode = shared["mode"]
    del gm.meta[LAZY_MODE]
    for n in gm.graph.nodes:
        m = n.meta.pop(LAZY_VAL, None) if n.op == "placeholder" else None
        if m is not None and "val" not in n.meta:
            n.meta["val"] = fake_like(mode, m["shape"], m["stride"], dtype_from_str(m["dtype"]),
                                      torch.device(m["device"]), m.get("requires_grad", False))
        if n.op == "get_attr":
            # a subgraph (a higher-order op's): its placeholders too, in the same mode
            # (Inductor compares them with the arguments the op passes)
            sub = attribute(gm, str(n.target))
            if is_subgraph(sub):
                ensure_vals(sub)


def fake_mode_of(inputs: Iterable[Any]) -> FakeTensorMode | None:
    for t in inputs:
        if isinstance(t, FakeTensor):
            return t.fake_mode
    return None


def to_fake(mode: FakeTensorMode, t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    if isinstance(t, FakeTensor):
        if t.fake_mode is not mode:
            raise ValueError("example inputs come from different FakeTensorModes")
        return t
    return _torch.static_fake(mode, t)


def fake_like(mode: FakeTensorMode, shape, stride, dtype, device, requires_grad=False) -> torch.Tensor:
    with mode:
        t = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device=device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def fake_storage(v: Any):
    """The storage of a fake value (equal for values that share memory); None otherwise."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(v.untyped_storage()) if isinstance(v, FakeTensor) else None


def meta_of_tensor(t: torch.Tensor) -> dict:
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).replace("torch.", ""),
            "device": str(t.device), "requires_grad": bool(t.requires_grad)}


def dtype_from_str(s: str) -> torch.dtype:
    d = getattr(torch, s, None)
    if not isinstance(d, torch.dtype):
        raise ValueError(f"unknown dtype {s!r}")
    return d
