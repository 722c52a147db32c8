"""The cache key of one captured graph: named parts, hashed together.

The parts are kept apart (not only hashed) so that a miss can say which part differs from the
nearest stored entry (``miss_reasons.py``). Every fact the compiled code depends on is a part;
when in doubt a fact is included, since a needless miss costs a compile and a missing fact a
wrong answer.

Node names are not semantic: placeholders become ``in0, in1, ...`` and other nodes ``n0, n1,
...`` by position, so two functions differing only in local names share an entry.
SymInt placeholders keep their names: they are the symbols the sizes of other inputs use.
A subgraph a higher-order op calls is keyed whole (its nodes, constants and own subgraphs),
once, under a number instead of its attribute's name (``aot.subgraph_table``).
Nothing here edits the caller's graph: the text is built from a read-only walk.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
from typing import Any

import torch
import torch.fx

from .. import _torch
from ..aot.export import fake_mode_of_graph
from ..aot.saved_hooks.inlining import active
from ..aot.saved_hooks.key import cache_key
from ..aot.subgraph_table import SubgraphTable, attribute, is_subgraph
from ..config import config
from ..version import __version__

KEY_VERSION = 1


def _is_sym_placeholder(node: torch.fx.Node, example: Any) -> bool:
    v = node.meta.get("example_value", example)
    return isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _target_text(target: Any) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return f"torch.ops.{target.namespace}.{target._opname}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"torch.ops.{target._qualified_op_name}"
    if _torch.is_higher_order_op(target):
        # (its class's module: tracing may inline its implementation, which must be keyable)
        name, module = _torch.higher_order_op_home(target)
        if module.split(".")[0] not in _KEYABLE_MODULES:
            raise ValueError(f"the graph calls the higher-order op {name} of {module} (user code: not keyable)")
        return f"torch.ops.higher_order.{name} ({module})"
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    # A call to user code in the graph is keyed by its name only, so an edit to its body
    # would hit a stale entry: only torch's, Python's and kiln's own functions (their
    # versions are in the key) are keyable.
    if module.split(".")[0] not in _KEYABLE_MODULES:
        raise ValueError(f"the graph calls {module}.{name} (user code: not keyable by name)")
    return f"{module}.{name}"


_KEYABLE_MODULES = {"torch", "_operator", "operator", "builtins", "math", "kiln"}


def _tensor_digest(t: torch.Tensor) -> str:
    t = t.detach()
    if t.is_sparse or t.is_quantized or t.device.type == "meta":
        raise ValueError(f"cannot hash a {t.layout} {t.device.type} tensor constant")
    flat = t.cpu().contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return hashlib.sha256(data).hexdigest()


def _tensor_meta(t: torch.Tensor) -> dict:
    return {"dtype": str(t.dtype).replace("torch.", ""), "sizes": [str(s) for s in t.shape],
            "strides": [str(s) for s in t.stride()], "offset": str(t.storage_offset()),
            "requires_grad": bool(t.requires_grad), "device": t.device.type,
            "type": type(t).__name__, "layout": str(t.layout)}


def _arg_text(a: Any, names: dict, cuda: int | None = None) -> str:
    """``cuda``: the one CUDA device index of a graph keyed without it (``cuda_indices``): that
    device is written ``index=@``."""
    if isinstance(a, torch.fx.Node):
        return "%" + names[a]
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg_text(x, names, cuda) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner})"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {_arg_text(v, names, cuda)}" for k, v in a.items()) + "}"
    if isinstance(a, torch.Tensor):
        return f"tensor({json.dumps(_tensor_meta(a), sort_keys=True)}, {_tensor_digest(a)})"
    if isinstance(a, (bool, int, float, str, type(None), complex)):
        return f"{type(a).__name__}:{a!r}"     # typed: 1, 1.0 and True differ
    if isinstance(a, torch.device) and cuda is not None and a.type == "cuda" and a.index == cuda:
        return "device(type='cuda', index=@)"
    if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return repr(a)
    if isinstance(a, slice):
        return f"slice({_arg_text(a.start, names, cuda)}, {_arg_text(a.stop, names, cuda)}, {_arg_text(a.step, names, cuda)})"
    if a is Ellipsis:
        return "..."
    raise ValueError(f"cannot key an argument of type {type(a).__name__}")


# node meta the compiled code depends on (the rest, e.g. stack traces, does not change it)
_META_KEYS = ("kiln_static", "kiln_symbol", "ac_graph_id", "recompute", "kiln_checkpoint_policy")


def graph_text(gm: torch.fx.GraphModule, example_inputs: list, cuda: int | None = None) -> str:
    """The graph with normalized names, its constants by content, then each subgraph its
    higher-order ops call (numbered, once each: ``subgraph_table``); read-only on ``gm``.
    ``cuda``: the graph's one CUDA device, written without its index (``cuda_indices``)."""
    table = SubgraphTable(lambda sub: _graph_lines(sub, [], table, cuda))
    lines = _graph_lines(gm, example_inputs, table, cuda)
    graph_meta = {k: gm.meta[k] for k in ("kiln_fullgraph", "kiln_static_inputs") if k in gm.meta}
    lines.append("meta " + json.dumps(graph_meta, sort_keys=True, default=str))
    for i, sub in enumerate(table.entries):
        lines.append(f"subgraph sub{i}:")
        lines.extend("  " + line for line in sub)
    return "\n".join(lines)


def _graph_lines(gm: torch.fx.GraphModule, example_inputs: list, table: SubgraphTable,
                 cuda: int | None = None) -> list[str]:
    names: dict = {}
    lines = []
    placeholders = 0
    others = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            ex = example_inputs[placeholders] if placeholders < len(example_inputs) else None
            names[node] = node.name if _is_sym_placeholder(node, ex) else f"in{placeholders}"
            placeholders += 1
        else:
            names[node] = f"n{others}"
            others += 1
        meta = {k: node.meta[k] for k in _META_KEYS if k in node.meta}
        obj = attribute(gm, str(node.target)) if node.op == "get_attr" else None
        # a subgraph is named by its number (its attribute's name is as local as a node's)
        target = "" if node.op == "placeholder" else \
            f"sub{table.number(obj)}" if is_subgraph(obj) else _target_text(node.target)
        captured = getattr(node.target, "kiln_captured_function", None) if node.op == "call_function" else None
        if captured is not None:
            target += _captured_function_text(captured, table)
        line = f"{names[node]} = {node.op} {target}" \
               f"({_arg_text(node.args, names, cuda)}, {_arg_text(node.kwargs, names, cuda)}) {json.dumps(meta, sort_keys=True, default=str)}"
        if node.op == "get_attr" and not is_subgraph(obj):
            if not isinstance(obj, torch.Tensor):
                raise ValueError(f"cannot key attribute {node.target} of type {type(obj).__name__}")
            line += " = " + _arg_text(obj, names, cuda)
        if node.op == "call_module":
            raise ValueError("cannot key a call_module node")
        lines.append(line)
    return lines


def _captured_function_text(captured: dict, table: SubgraphTable) -> str:
    """A captured autograd.Function is its forward and backward graphs (keyed whole, like a
    higher-order op's subgraphs) and how its outputs are marked, not its class's name: two
    classes of one name, or a class whose forward was edited, are other entries."""
    graphs = []
    for part in ("fwd", "bwd"):
        gm = captured[part]
        if gm is None:
            graphs.append(f"{part}=None")
        elif is_subgraph(gm):
            graphs.append(f"{part}=sub{table.number(gm)}")
        else:
            raise ValueError(f"cannot key the {part} of a captured autograd.Function ({type(gm).__name__})")
    rest = {k: captured[k] for k in ("n_out", "n_sfb", "non_diff", "dirty_inputs")}
    return f"[{', '.join(graphs)}, {json.dumps(rest, sort_keys=True)}]"


def inputs_meta(gm: torch.fx.GraphModule, example_inputs: list) -> list:
    """Each input's metadata; for a dynamic graph, as the capture traced it (symbolic sizes,
    SymInt inputs as their symbols), not the example's concrete sizes."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    static = [n.meta.get("kiln_static", False) for n in placeholders]
    traced = [n.meta.get("example_value") for n in placeholders]
    dynamic = is_dynamic(gm, example_inputs)
    out = []
    for i, real in enumerate(example_inputs):
        x = real
        if dynamic and i < len(traced) and isinstance(traced[i], (torch.Tensor, torch.SymInt, torch.SymFloat,
                                                                  torch.SymBool)):
            x = traced[i]
        if isinstance(x, torch.Tensor):
            d = _tensor_meta(x)
            d["type"] = type(real).__name__       # (a traced value is a FakeTensor: the input's own type)
            d["static"] = bool(static[i]) if i < len(static) else False
        elif isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            d = {"symbol": str(x)}
        elif isinstance(x, (bool, int, float)):
            d = {"value": f"{type(x).__name__}:{x!r}"}
        else:
            raise ValueError(f"cannot key an input of type {type(x).__name__}")
        out.append(d)
    return out


def global_state() -> dict:
    """The global state compiled code depends on (grad mode, autocast, determinism, matmul)."""
    return {
        "grad_mode": torch.is_grad_enabled(),
        "autocast_cpu": [torch.is_autocast_enabled("cpu"), str(torch.get_autocast_dtype("cpu"))],
        "autocast_cuda": [torch.is_autocast_enabled("cuda"), str(torch.get_autocast_dtype("cuda"))],
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()),
        "tf32": [torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32],
        "reduced_precision_reduction": [torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
                                        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction],
    }


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    """torch, triton and kiln versions; kiln's is a digest of its source, so an edit to kiln
    (same version number) never loads entries an older kiln wrote."""
    kiln_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(kiln_dir)):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                h.update(os.path.relpath(path, kiln_dir).encode())
                with open(path, "rb") as fh:
                    h.update(fh.read())
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    return {"torch": torch.__version__, "triton": triton, "kiln": f"{__version__}+{h.hexdigest()[:16]}",
            "key": KEY_VERSION}


def device_info(example_inputs: list, one_cuda_device: bool = False) -> dict:
    """The kinds of device the inputs are on; for CUDA, the GPU's name and capability and the
    device indices. ``one_cuda_device``: the graph names one CUDA device and its entry is
    rebound to another at load (``cached``'s ``rebind``), so the index is left out: the ranks
    of one machine, each on its own GPU, share the entry."""
    kinds = sorted({x.device.type for x in example_inputs if isinstance(x, torch.Tensor)})
    info: dict = {"kinds": kinds}
    if "cuda" in kinds and torch.cuda.is_available():
        indices = sorted({x.device.index for x in example_inputs if isinstance(x, torch.Tensor)
                          and x.device.type == "cuda"})
        idx = indices[0]
        info["cuda"] = [torch.cuda.get_device_name(idx), list(torch.cuda.get_device_capability(idx))]
        # Inductor's code names the device it was compiled for (its device guard, its streams):
        # an entry compiled for cuda:0 runs on cuda:1 only rebound (the ranks of one machine)
        info["cuda_indices"] = "one, rebound at load" if one_cuda_device else indices
    return info


def cuda_indices(gm: torch.fx.GraphModule, example_inputs: list) -> list[int]:
    """The CUDA device indices a graph names: its inputs', its tensor constants' and its device
    arguments' (its subgraphs' too). A device given without an index is the current one."""
    found: set = set()

    def note(v: Any) -> None:
        if isinstance(v, torch.Tensor) and v.device.type == "cuda":
            found.add(v.device.index)
        elif isinstance(v, torch.device) and v.type == "cuda":
            found.add(v.index if v.index is not None else torch.cuda.current_device())

    for x in example_inputs:
        note(x)
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op == "get_attr":
                note(attribute(module, str(node.target)))
            torch.fx.node.map_aggregate((node.args, node.kwargs), lambda v: note(v) or v)
    return sorted(found)


def is_dynamic(gm: torch.fx.GraphModule, example_inputs: list) -> bool:
    """Whether the graph has symbolic inputs or sizes (the capture's fake values, or the
    example inputs, hold symbols)."""
    values = list(example_inputs) + [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    for x in values:
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride())):
            return True
    return False


def shape_facts(gm: torch.fx.GraphModule, example_inputs: list) -> dict | None:
    """What the capture's ShapeEnv knows of a dynamic graph's symbols (None for a static
    graph): its guards, replacements, value ranges and divisibility facts. Tracing may rely on
    any of them without adding a guard, so they are part of the key (symbol names are stable:
    the same program gives the same facts)."""
    if not is_dynamic(gm, example_inputs):
        return None
    mode = fake_mode_of_graph(gm)
    if mode is None:
        raise ValueError("a dynamic graph without symbolic example values on its placeholders")
    env = mode.shape_env
    return {"guards": [str(g.expr) for g in env.guards],
            "replacements": sorted(f"{k} -> {v}" for k, v in env.replacements.items()),
            "ranges": sorted(f"{k}: [{v.lower}, {v.upper}]" for k, v in env.var_to_range.items()),
            "divisible": sorted(str(d) for d in getattr(env, "divisible", ()))}


def key_parts(gm: torch.fx.GraphModule, example_inputs: list, backend: str, options: dict,
              cuda: int | None = None) -> dict:
    """Every part of the key, as plain JSON data. Raises ValueError for what cannot be keyed
    (the caller then bypasses the cache). ``cuda``: the one CUDA device of a graph whose entry
    is rebound to the loading process's device: the key does not name its index."""
    return {
        "shapes": shape_facts(gm, example_inputs),
        "graph": graph_text(gm, example_inputs, cuda),
        "inputs": inputs_meta(gm, example_inputs),
        "backend": {"name": backend, "options": options},
        "global_state": global_state(),
        "versions": versions(),
        "device": device_info(example_inputs, one_cuda_device=cuda is not None),
        "saved_tensor_hooks": saved_tensor_hooks(),
        "aot": {"copy_saved_parameters": config.copy_saved_parameters},
    }


def saved_tensor_hooks() -> Any:
    """The inlineable saved-tensor hooks the AOT stages will inline: each hook's
    ``user_cache_hash``, or a digest of its code and of the values it reads; None when none
    are active. Raises ValueError for a hook that cannot be hashed (the cache is bypassed)."""
    return cache_key(active())


def digest(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
