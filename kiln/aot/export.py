"""Stage 2, the alternative: ``stage2_export(state, capture) -> AOTArtifact``.

The artifact holds the partitioned graphs and every piece of metadata the runtime needs (the
runtime wrappers' data, which outputs get tangents, which primals get gradients...), as plain
data: it round-trips through bytes and rebuilds, in any process, the same callable that
``stage2_compile`` returns::

    artifact = kiln.aot.stage2_export(state, capture)
    blob = artifact.to_bytes()
    fn = kiln.aot.AOTArtifact.from_bytes(blob).load()          # fw/bw_compiler optional

Graphs are stored node by node (op, name, ATen target, arguments) as JSON next to their
Python code (for reading), the subgraphs their higher-order ops call (``cond``'s branches)
the same way, each once (``subgraph_table``), tensor constants with ``torch.save``; loading uses
``torch.load(weights_only=True)``: no pickled code.
"""
from __future__ import annotations

import importlib

import io
import json
import math
import operator
from typing import Any, Callable

import torch
import torch.fx

from .. import _torch
from ..errors import Unsupported
from ..lazy_imports import LazyModule
from . import fake_tensors
from .compile import PartsView
from .compile import AOTCompiled, CompiledParts, assemble, build_parts
from .runtime import wrapper_from_dict, wrapper_to_dict
from .saved_hooks.inlining import InlinedHooks
from .subgraph_table import SubgraphLoader, SubgraphTable, attribute, is_subgraph
from .symbolic import fake_mode_for, graph_example_values, has_symbols, is_sym
from .symbolic_codec import Decoder, encode_expr, encode_symbols, encode_value, replay_guards, standalone_fake_mode
from .traced_layouts import STRIDES_META, traced_strides

_shapes = LazyModule("torch.fx.experimental.symbolic_shapes")     # (sympy: not at a warm start)

FORMAT = "kiln.aot.artifact"
VERSION = 1

_OPERATORS = {f"operator.{name}": getattr(operator, name) for name in (
    "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "neg", "pow", "eq", "ne", "lt", "le",
    "gt", "ge", "and_", "or_", "not_")}
# what dynamic graphs compute on SymInts (``symbolic.is_sym_function``)
_OPERATORS.update({f"operator.{name}": getattr(operator, name) for name in ("abs", "pos", "xor")})
_OPERATORS.update({f"math.{name}": getattr(math, name) for name in ("ceil", "floor", "trunc")})
_OPERATORS.update({f"torch.{name}": getattr(torch, name) for name in (
    "sym_max", "sym_min", "sym_float", "sym_int", "sym_not", "sym_ite", "sym_sum", "sym_sqrt")
    if hasattr(torch, name)})
_OPERATOR_NAMES = {v: k for k, v in _OPERATORS.items()}


# ------------------------------------------------------------------------------------------------
# Graph <-> plain data
# ------------------------------------------------------------------------------------------------

_HIGHER_ORDER = "torch.ops.higher_order."


def _encode_target(t: Any) -> str:
    if isinstance(t, torch._ops.OpOverload):
        return f"torch.ops.{t.namespace}.{t._opname}.{t._overloadname}"
    if _torch.is_higher_order_op(t):
        return _HIGHER_ORDER + t.name()
    if t in _OPERATOR_NAMES:
        return _OPERATOR_NAMES[t]
    raise Unsupported(f"export: cannot serialize a call to {t!r} (only ATen ops, higher-order ops and operator.*)")


def _decode_target(s: str, module: str | None = None) -> Any:
    """``module``: where a higher-order op's class is defined (imported when the op is not
    registered yet: kiln's own)."""
    if s in _OPERATORS:
        return _OPERATORS[s]
    if s.startswith(_HIGHER_ORDER):
        return _torch.higher_order_op(s[len(_HIGHER_ORDER):], module)
    parts = s.split(".")
    if len(parts) != 5 or parts[:2] != ["torch", "ops"]:
        raise ValueError(f"artifact: unknown call target {s!r}")
    _, _, ns, op, overload = parts
    packet = getattr(getattr(torch.ops, ns), op, None)
    if packet is None and ns == "prims":
        # prims ops are registered by the modules that define them, which compiling imports
        # (decompositions) and a process that only loads an artifact has not
        for module in _PRIMS_MODULES:
            importlib.import_module(module)
            packet = getattr(torch.ops.prims, op, None)
            if packet is not None:
                break
    if packet is None and ns in _KILN_OP_MODULES:
        # kiln's own ops are registered when their module is imported
        importlib.import_module(_KILN_OP_MODULES[ns])
        packet = getattr(getattr(torch.ops, ns), op, None)
    if packet is None:
        raise ValueError(f"artifact: this torch has no op {ns}::{op}")
    return getattr(packet, overload)


_PRIMS_MODULES = ("torch._prims", "torch._inductor.inductor_prims")
_KILN_OP_MODULES = {"kiln": "kiln.activations.stream_ops"}      # namespace -> module registering it


def _encode_arg(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        return {"node": a.name}
    if a is None or isinstance(a, (bool, int, str)):
        return a
    if isinstance(a, float):
        if math.isinf(a) or math.isnan(a):
            return {"float": repr(a)}
        return a
    if isinstance(a, (list, tuple)):
        return {"list" if isinstance(a, list) else "tuple": [_encode_arg(x) for x in a]}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).replace("torch.", "")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout):
        return {"layout": str(a).replace("torch.", "")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).replace("torch.", "")}
    if isinstance(a, complex):
        return {"complex": [a.real, a.imag]}
    if isinstance(a, dict):
        return {"dict": [[k, _encode_arg(v)] for k, v in a.items()]}
    raise Unsupported(f"export: cannot serialize argument {a!r} of type {type(a).__name__}")


def _decode_arg(a: Any, env: dict) -> Any:
    if not isinstance(a, dict):
        return a
    (k, v), = a.items()
    if k == "node":
        return env[v]
    if k == "float":
        return float(v)
    if k == "list":
        return [_decode_arg(x, env) for x in v]
    if k == "tuple":
        return tuple(_decode_arg(x, env) for x in v)
    if k == "dtype":
        return fake_tensors.dtype_from_str(v)
    if k == "device":
        return torch.device(v)
    if k == "layout":
        return getattr(torch, v)
    if k == "memory_format":
        return getattr(torch, v)
    if k == "complex":
        return complex(*v)
    if k == "dict":
        return {kk: _decode_arg(vv, env) for kk, vv in v}
    raise ValueError(f"artifact: unknown argument encoding {k!r}")


def _val_meta(v: Any) -> Any:
    if is_sym(v) or (isinstance(v, torch.Tensor) and has_symbols(v)):
        return {"sym": encode_value(v)}     # (rebuilt in the loading capture's ShapeEnv)
    if isinstance(v, torch.Tensor):
        return fake_tensors.meta_of_tensor(v)
    return None


def _value_facts(v: Any) -> dict:
    tensors = [t for t in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(t, torch.Tensor)]
    if not tensors:
        return {}
    try:
        unbacked = bool(_shapes.free_unbacked_symbols(v))
    except Exception:   # noqa: BLE001 - unknown: as a size known only at run time
        unbacked = True
    return {"devices": sorted({str(t.device) for t in tensors}), "unbacked": unbacked}


def _source_text(src: Any) -> str:
    name = getattr(src, "name", None)
    name = name() if callable(name) else name
    return name if isinstance(name, str) else str(src)


_SUBGRAPHS = "subgraphs/"       # (an attribute's target never holds a /)


def graph_to_data(gm: torch.fx.GraphModule) -> tuple[dict, dict]:
    """(JSON-able description of ``gm``'s graph, its tensor constants). Its subgraphs (the
    GraphModules its higher-order ops call) are kept in ``"subgraphs"``, each once
    (``subgraph_table``), their constants under ``subgraphs/<number>/<target>``."""
    table = SubgraphTable(lambda sub: _nodes_to_data(sub, table))
    data, constants = _nodes_to_data(gm, table)
    if table.entries:
        data["subgraphs"] = []
        for i, (sub_data, sub_constants) in enumerate(table.entries):
            data["subgraphs"].append(sub_data)
            constants.update({f"{_SUBGRAPHS}{i}/{target}": t for target, t in sub_constants.items()})
    return data, constants


def _nodes_to_data(gm: torch.fx.GraphModule, table: SubgraphTable) -> tuple[dict, dict]:
    nodes = []
    constants = {}
    for n in gm.graph.nodes:
        d: dict = {"op": n.op, "name": n.name}
        if n.op == "placeholder":
            d["meta"] = _val_meta(n.meta.get("val"))
            for k in ("kiln_static", "kiln_mutated", "kiln_requires_grad", "kiln_source", "kiln_tangent"):
                if k in n.meta:
                    v = n.meta[k]
                    if k == "kiln_source" and not isinstance(v, str):
                        v = _source_text(v)     # a Source object: its text (used in messages)
                    d.setdefault("tags", {})[k] = v
        elif n.op == "get_attr":
            d["target"] = n.target
            obj = attribute(gm, n.target)
            if is_subgraph(obj):
                try:
                    d["subgraph"] = table.number(obj)
                except ValueError as e:
                    raise Unsupported(f"export: graph attribute {n.target}: {e}") from None
            elif isinstance(obj, torch.Tensor):
                constants[n.target] = obj.detach().clone()
            else:
                raise Unsupported(f"export: graph attribute {n.target} is a {type(obj).__name__}, not a tensor "
                                  "or a subgraph")
        elif n.op == "call_function":
            d["target"] = _encode_target(n.target)
            if _torch.is_higher_order_op(n.target):
                d["target_module"] = _torch.higher_order_op_home(n.target)[1]
            d["args"] = _encode_arg(tuple(n.args))
            d["kwargs"] = _encode_arg(dict(n.kwargs))
            if "kiln_phase" in n.meta:
                d["phase"] = n.meta["kiln_phase"]
            strides = traced_strides(n)     # (a loaded graph has no fakes to read them from)
            if strides:
                d["traced_strides"] = {str(i): list(s) for i, s in strides.items()}
            d.update(_value_facts(n.meta.get("val")))
        elif n.op == "output":
            d["args"] = _encode_arg(tuple(n.args))
        else:
            raise Unsupported(f"export: cannot serialize a {n.op} node ({n.name})")
        nodes.append(d)
    return {"nodes": nodes, "code": gm.code}, constants


def graph_from_data(data: dict, constants: dict, fake_mode=None, class_name: str = "KilnGraph",
                    decoder=None, shared: dict | None = None) -> torch.fx.GraphModule:
    """``decoder`` (``symbolic_codec.Decoder``) rebuilds symbolic values (dynamic graphs).
    ``fake_mode``: where the static placeholders' fake values are made; None: made on first
    need (``fake_tensors.ensure_vals``), in one mode for all graphs given the same ``shared`` dict
    (the graphs of one artifact). Subgraphs load as GraphModules of their own, each once."""
    lazy = ({} if shared is None else shared) if fake_mode is None else None
    saved = data.get("subgraphs") or []

    def build(i: int) -> torch.fx.GraphModule:
        prefix = f"{_SUBGRAPHS}{i}/"
        sub_constants = {k[len(prefix):]: t for k, t in constants.items() if k.startswith(prefix)}
        return _graph_from_nodes(saved[i], sub_constants, fake_mode, f"{class_name}Subgraph{i}", decoder, lazy,
                                 subgraphs)

    subgraphs = SubgraphLoader(len(saved), build)
    return _graph_from_nodes(data, constants, fake_mode, class_name, decoder, lazy, subgraphs)


def _graph_from_nodes(data: dict, constants: dict, fake_mode, class_name: str, decoder, lazy: dict | None,
                      subgraphs: SubgraphLoader) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    env: dict = {}
    root = torch.nn.Module()
    for d in data["nodes"]:
        op = d["op"]
        if op == "placeholder":
            n = g.placeholder(d["name"])
            m = d.get("meta")
            if m is not None and "sym" in m:
                if decoder is None:
                    raise ValueError("artifact: a dynamic graph loads into a capture's FakeTensorMode (none given)")
                n.meta["val"] = decoder.value(m["sym"])
            elif m is not None and lazy is not None:
                n.meta[fake_tensors.LAZY_VAL] = m
            elif m is not None:
                n.meta["val"] = fake_tensors.fake_like(fake_mode, m["shape"], m["stride"],
                                                      fake_tensors.dtype_from_str(m["dtype"]),
                                                      torch.device(m["device"]), m.get("requires_grad", False))
            n.meta.update(d.get("tags", {}))
        elif op == "get_attr":
            target = d["target"]
            obj = root
            *path, last = target.split(".")
            for p in path:
                if not hasattr(obj, p):
                    obj.add_module(p, torch.nn.Module())
                obj = getattr(obj, p)
            if "subgraph" in d:
                obj.add_module(last, subgraphs.get(d["subgraph"]))
            else:
                obj.register_buffer(last, constants[target])
            n = g.create_node("get_attr", target, name=d["name"])
        elif op == "call_function":
            n = g.create_node("call_function", _decode_target(d["target"], d.get("target_module")),
                              _decode_arg(d["args"], env), _decode_arg(d["kwargs"], env), name=d["name"])
            if "phase" in d:
                n.meta["kiln_phase"] = d["phase"]
            if "traced_strides" in d:
                n.meta[STRIDES_META] = {int(i): tuple(s) for i, s in d["traced_strides"].items()}
            if "devices" in d:
                n.meta[fake_tensors.DEVICES_META] = [torch.device(x) for x in d["devices"]]
                n.meta[fake_tensors.UNBACKED_META] = bool(d.get("unbacked", False))
        elif op == "output":
            n = g.output(*_decode_arg(d["args"], env))
        else:
            raise ValueError(f"artifact: unknown node op {op!r}")
        if n.name != d["name"] and op != "output":
            raise ValueError(f"artifact: node name {d['name']!r} is taken")
        env[d["name"]] = n
    g.lint()
    gm = _torch.lazy_graph_module(root, g, class_name=class_name)
    if lazy is not None and any(fake_tensors.LAZY_VAL in n.meta for n in g.nodes):
        gm.meta[fake_tensors.LAZY_MODE] = lazy
    return gm


# ------------------------------------------------------------------------------------------------
# The artifact
# ------------------------------------------------------------------------------------------------

class AOTArtifact(PartsView):
    """Exported stage-2 result: graphs + metadata, serializable. ``load()`` builds the callable."""

    def __init__(self, parts: CompiledParts):
        self.parts = parts
        self.fake_mode = None


    # serialization -------------------------------------------------------------------------
    def to_dict(self) -> tuple[dict, dict]:
        p = self.parts
        graphs, constants = {}, {}
        for name, gm in (("forward", p.forward), ("backward", p.backward)):
            if gm is None:
                continue
            graphs[name], constants[name] = graph_to_data(gm)
        meta = {
            "format": FORMAT, "version": VERSION, "torch": torch.__version__,
            "kind": p.kind, "num_fw_outputs": p.num_fw_outputs,
            "tangent_positions": list(p.tangent_positions),
            "fw_output_requires_grad": list(p.fw_output_requires_grad),
            "primal_requires_grad": list(p.primal_requires_grad),
            "grad_enabled": p.grad_enabled,
            "grad_dependencies": p.grad_dependencies,
            "check_inputs": p.check_inputs, "check_outputs": p.check_outputs, "copy_saved": p.copy_saved,
            "eager_saves": p.eager_saves, "eager_saving_outputs": p.eager_saving_outputs,
            "watch": p.watch, "late_demand": p.late_demand, "saved_demand": p.saved_demand,
            "wrappers": [wrapper_to_dict(w) for w in p.wrappers],
            "saved": list(p.saved), "saved_bytes": p.saved_bytes, "saved_input_bytes": p.saved_input_bytes,
            "partitioner": p.partitioner,
            "hooks": p.hooks.to_dict() if p.hooks is not None else None,
            "segments": p.segments, "handoffs": list(p.handoffs), "num_handed_outputs": p.num_handed_outputs,
            "segment_reads": p.segment_reads, "create_graph_refused": p.create_graph_refused,
            "graphs": graphs,
        }
        if p.symbolic:
            meta["symbolic"] = _symbolic_to_dict(p)
        return meta, constants

    def to_bytes(self) -> bytes:
        meta, constants = self.to_dict()
        try:
            text = json.dumps(meta)
        except TypeError as e:
            raise Unsupported(f"export: metadata is not serializable ({e}); e.g. a constant output of an "
                              "unsupported type") from e
        buf = io.BytesIO()
        torch.save({"format": FORMAT, "version": VERSION, "meta": text, "constants": constants}, buf)
        return buf.getvalue()

    @staticmethod
    def rebind_cuda(blob: bytes, old: int, new: int) -> bytes:
        """The artifact's bytes with every use of CUDA device ``old`` moved to ``new``: its
        graphs' device arguments and values' devices (the metadata names a device only as its
        string, ``"cuda:N"``), and its constants. (A graph compiled on one GPU of a machine,
        loaded by a rank on another.)"""
        obj = _torch.load_tensors(blob, map_location={f"cuda:{old}": f"cuda:{new}"})
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError("not a kiln AOT artifact")
        was, now = f"cuda:{old}", f"cuda:{new}"

        def moved(v: Any) -> Any:
            if isinstance(v, str):
                return now if v == was else v
            if isinstance(v, list):
                return [moved(x) for x in v]
            if isinstance(v, dict):
                return {k: moved(x) for k, x in v.items()}
            return v
        obj["meta"] = json.dumps(moved(json.loads(obj["meta"])))
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes, rename: dict | None = None, fake_mode=None) -> "AOTArtifact":
        """``rename``: input names (``L['x']`` -> ``L['inp']``) to use in the loaded metadata, for
        an artifact made from a function whose arguments had other names (a cache hit across
        a rename): messages and ``as_text()`` then name the caller's inputs.

        ``fake_mode``: for a dynamic (symbolic-shape) artifact, the FakeTensorMode of the
        capture it is loaded for (``fake_mode_of_graph(gm)``): its symbolic values are rebuilt
        there, and the guards the compile added are added to its ShapeEnv (see ``from_dict``)."""
        obj = _torch.load_tensors(blob)
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError("not a kiln AOT artifact")
        if obj.get("version") != VERSION:
            raise ValueError(f"kiln AOT artifact version {obj.get('version')} is not supported (this kiln reads {VERSION})")
        text = obj["meta"]
        if rename:
            text = rename_sources(text, rename)
        meta = json.loads(text)
        return cls.from_dict(meta, obj["constants"], fake_mode)

    @classmethod
    def from_dict(cls, meta: dict, constants: dict, fake_mode=None) -> "AOTArtifact":
        """A dynamic artifact loads into ``fake_mode`` (see ``from_bytes``): loading adds the
        compile's guards to that mode's ShapeEnv, or raises ``symbolic_codec.EntryDoesNotFit``
        (nothing added) when one does not hold for the capture's sizes. Without one (a
        package load: no capture) its symbols get a ShapeEnv of their own
        (``symbolic_codec.standalone_fake_mode``) and nothing is replayed: the per-call input
        check tests the guards. A static artifact makes no fake tensors until read."""
        decoder, shared, standalone = None, None, False
        if meta.get("symbolic") is not None:
            if fake_mode is None:
                # no capture loads it (a package): the symbols get a ShapeEnv of their own
                if "symbols" not in meta["symbolic"]:
                    raise ValueError("a dynamic artifact from an older kiln loads only into a capture")
                fake_mode, standalone = standalone_fake_mode(meta["symbolic"]["symbols"]), True
            decoder = Decoder(fake_mode)
        else:
            # a static artifact: its graphs run on real tensors; their placeholders' fake
            # values (one FakeTensorMode for both graphs) are made when something reads them
            fake_mode, shared = None, {}
        graphs = {name: graph_from_data(d, constants.get(name, {}), fake_mode,
                                        class_name="Kiln" + name.capitalize(), decoder=decoder, shared=shared)
                  for name, d in meta["graphs"].items()}
        parts = CompiledParts(
            kind=meta["kind"], forward=graphs["forward"], backward=graphs.get("backward"),
            num_fw_outputs=meta["num_fw_outputs"], tangent_positions=meta["tangent_positions"],
            fw_output_requires_grad=meta["fw_output_requires_grad"],
            primal_requires_grad=meta["primal_requires_grad"], grad_enabled=meta["grad_enabled"],
            wrappers=[wrapper_from_dict(w, decoder) for w in meta["wrappers"]], saved=meta["saved"],
            saved_bytes=meta["saved_bytes"], saved_input_bytes=meta["saved_input_bytes"],
            partitioner=meta.get("partitioner", ""), grad_dependencies=meta.get("grad_dependencies"),
            check_inputs=meta.get("check_inputs", []), check_outputs=meta.get("check_outputs", []),
            eager_saves=meta.get("eager_saves", False),
            eager_saving_outputs=meta.get("eager_saving_outputs", []),
            copy_saved=meta.get("copy_saved", []), watch=meta.get("watch", []),
            late_demand=meta.get("late_demand", []), saved_demand=meta.get("saved_demand", []),
            hooks=_hooks_from(meta.get("hooks")),
            segments=[tuple(g) for g in meta["segments"]] if meta.get("segments") is not None else None,
            handoffs=meta.get("handoffs", []), num_handed_outputs=meta.get("num_handed_outputs", 0),
            segment_reads=meta.get("segment_reads"), create_graph_refused=meta.get("create_graph_refused", False))
        if decoder is not None:
            _symbolic_from_dict(parts, meta["symbolic"], decoder, replay=not standalone)
        art = cls(parts)
        art.fake_mode = fake_mode       # (a dynamic one's: the Inductor entry decodes its strides there)
        return art

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            f.write(self.to_bytes())

    @classmethod
    def load_file(cls, path: str) -> "AOTArtifact":
        with open(path, "rb") as f:
            return cls.from_bytes(f.read())

    # rebuilding ------------------------------------------------------------------------------
    def load(self, fw_compiler: Callable | None = None, bw_compiler: Callable | None = None,
             inference_compiler: Callable | None = None) -> AOTCompiled:
        """The callable (same as ``stage2_compile``'s with the same compilers; a dynamic one
        checks each call's shapes as the compiled one does)."""
        return assemble(self.parts, fw_compiler, bw_compiler, inference_compiler)

    def as_text(self) -> str:
        return AOTCompiled(None, self.parts).as_text().replace("# kiln AOT", "# kiln AOT artifact:", 1)

    def __repr__(self) -> str:
        return f"<kiln.aot.AOTArtifact {self.kind}, {len(self.to_bytes())} bytes>"


def rename_sources(text: str, rename: dict) -> str:
    """``text`` with every source name in ``rename`` replaced at once (so that swapped names
    stay swapped). Source names end in ``]`` or a name character, so ``L['x']`` never matches
    inside ``L['xs']``; a longer name is tried first (``L['x'].w`` before ``L['x']``)."""
    import re

    pattern = re.compile("|".join(re.escape(k) for k in sorted(rename, key=len, reverse=True)))
    return pattern.sub(lambda m: rename[m.group(0)], text)


def stage2_export(state, capture, partition_fn: Any = None) -> AOTArtifact:
    """Partition the capture and package graphs + metadata (nothing compiled).

    Dynamic (symbolic-shape) graphs are refused with kiln.Unsupported: an artifact stores
    static shapes only (its fake example inputs, the runtime wrappers' sizes), and a loaded
    artifact could not check the guards that tracing added to the capture's ShapeEnv."""
    if state.symbolic:
        raise Unsupported("export: dynamic graphs (symbolic shapes) cannot be exported yet; export a "
                          "graph captured with static shapes")
    with state.tracing():
        parts = build_parts(state, capture, partition_fn)
    for gm in (parts.forward, parts.backward):
        if gm is not None:
            graph_to_data(gm)   # fail here, not at to_bytes(), on what cannot be serialized
    return AOTArtifact(parts)


def _symbolic_to_dict(p: CompiledParts) -> dict:
    return {"input_fakes": encode_value(list(p.input_fakes)),
            "trace_guards": [encode_expr(g) for g in p.trace_guards],
            "input_guards": [encode_expr(g) for g in p.input_guards],
            "input_ranges": [[encode_expr(s), lo, hi] for s, (lo, hi) in p.input_ranges.items()],
            "symbols": encode_symbols(list(p.input_fakes))}


def _symbolic_from_dict(parts: CompiledParts, d: dict, decoder, replay: bool = True) -> None:
    parts.symbolic = True
    parts.input_fakes = decoder.value(d["input_fakes"])
    parts.input_guards = [decoder.expr(g) for g in d["input_guards"]]
    parts.input_ranges = {decoder.expr(s): (lo, hi) for s, lo, hi in d["input_ranges"]}
    parts.trace_guards = [decoder.expr(g) for g in d["trace_guards"]]
    # last: the capture's ShapeEnv gets the compile's guards only for an artifact that loaded
    # (a standalone load has no capture: each call's input check tests them)
    if replay:
        replay_guards(decoder.shape_env, parts.trace_guards)


def fake_mode_of_graph(gm: torch.fx.GraphModule):
    """The FakeTensorMode of a captured graph's symbolic example values (a dynamic graph's
    cache entry loads into it), None for a static graph."""
    n = sum(1 for p in gm.graph.nodes if p.op == "placeholder")
    vals = graph_example_values(gm, n)
    return fake_mode_for(vals) if vals is not None else None


def _hooks_from(d: dict | None):
    if d is None:
        return None
    return InlinedHooks.from_dict(d)
