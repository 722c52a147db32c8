"""The compiled graph of an entry in a package: the captured FX graph (as data: its nodes,
targets by name, tensor constants) and the backend's artifact, the same bytes the compile cache stores for it
(``kiln.cache.offer``), loaded by the backend's own ``load_artifact`` (no AOT tracing, no
Inductor lowering). A dynamic (symbolic-shape) artifact loads with no capture: its symbols
get a ShapeEnv of their own (``symbolic_codec.standalone_fake_mode``), the entry's guard
program checks the capture's shape guards and the artifact's input check the trace's, on
every call. A graph whose compiled form has no saved form (a user backend without a cache
key, a graph Inductor failed on) leaves its entry out, with the backend's reason."""
from __future__ import annotations

import io
from typing import Callable

import torch
from torch.fx.immutable_collections import immutable_dict, immutable_list

from .. import _torch
from ..aot.subgraph_table import SubgraphLoader, SubgraphTable, attribute, is_subgraph
from ..cache import PAYLOAD_ATTR
from ..capture.captured_function import runtime_function
from .errors import NotPackageable
from .values import Decoder, Encoder


def save_graph(gm: torch.fx.GraphModule, compiled: Callable, add_blob: Callable[[bytes], int],
               enc: Encoder, memo: dict | None = None) -> dict:
    """The saved form of a captured graph with its compiled payload, which is read again at
    each save (a backward compiled at run time adds to it). ``memo``: where the graph's data
    is kept from one save of the same graph to the next (its tensor constants are saved as
    they are at each save)."""
    if compiled is gm or getattr(compiled, "__self__", None) is gm:
        kind = "module" if compiled is gm else "forward"   # the eager backend: the graph as it is
        payload = None
    else:
        dump = getattr(compiled, PAYLOAD_ATTR, None)
        unsaved = getattr(compiled, "kiln_unsaved_reason", None)     # (a compiled form says why)
        if dump is None and unsaved is not None:
            raise NotPackageable(unsaved)
        if dump is None:
            raise NotPackageable(f"the backend's compiled graph ({type(compiled).__name__}) has no saved "
                                 "form (only kiln's eager, aot_eager and inductor backends have one)")
        try:
            payload = dump(compiled)
        except ValueError as e:
            raise NotPackageable(f"its graph cannot be saved: {e}") from None
        kind = "artifact"
    if memo is None or memo.get("gm") is not gm:
        graph, tensors = _graph_to_data(gm, enc)
        if memo is not None:
            memo.update(gm=gm, graph=graph, tensors=tensors)
    else:
        graph, tensors = memo["graph"], memo["tensors"]
    buf = io.BytesIO()
    torch.save(tensors, buf)
    out = {"kind": kind, "graph": graph, "constants": add_blob(buf.getvalue()), "code": _readable(gm)}
    if payload is not None:
        out["artifact"] = add_blob(payload)
    return out


def _readable(gm: torch.fx.GraphModule) -> str:
    """The graph's code, then each subgraph's under its attribute's name (``kiln package inspect``)."""
    parts, seen = [gm.code.strip()], set()
    for n in gm.graph.nodes:
        sub = attribute(gm, n.target) if n.op == "get_attr" else None
        if is_subgraph(sub) and id(sub) not in seen:
            seen.add(id(sub))
            parts.append(f"# {n.target}:\n" + _readable(sub))
    return "\n\n".join(parts)


def load_graph(saved: dict, blobs: Callable[[int], bytes], backend, dec: Decoder
               ) -> tuple[torch.fx.GraphModule, Callable]:
    tensors = _torch.load_tensors(blobs(saved["constants"]))
    gm = _graph_from_data(saved["graph"], tensors, dec)
    if saved["kind"] == "module":
        return gm, gm
    if saved["kind"] == "forward":
        return gm, gm.forward
    loader = getattr(backend, "load_artifact", None)
    if loader is None:
        raise ValueError(f"backend {backend!r} cannot load a saved graph")
    return gm, loader(blobs(saved["artifact"]), gm)


# -- the captured graph as data -----------------------------------------------------------------
# Not pickled: unpickling a GraphModule traces its code again, which runs (and drops) calls
# such as torch._C._set_grad_enabled instead of recording them. Each node is kept as it is:
# its op, name, target (by name, see ``values``) and arguments.

_META = ("kiln_static", "kiln_source", "kiln_mutated", "kiln_requires_grad")


def _arg(a, enc: Encoder):
    if isinstance(a, torch.fx.Node):
        return ["node", a.name]
    if type(a) in (tuple, list, immutable_list):     # (FX keeps lists as immutable_list)
        return [("tuple" if type(a) is tuple else "list") + "_of", [_arg(x, enc) for x in a]]
    if type(a) in (dict, immutable_dict):
        return ["dict_of", [[enc.encode(k), _arg(v, enc)] for k, v in a.items()]]
    if type(a) is slice:
        return ["slice_of", [_arg(x, enc) for x in (a.start, a.stop, a.step)]]
    return enc.encode(a)


def _unarg(a, env: dict, dec: Decoder):
    tag = a[0]
    if tag == "node":
        return env[a[1]]
    if tag == "tuple_of":
        return tuple(_unarg(x, env, dec) for x in a[1])
    if tag == "list_of":
        return [_unarg(x, env, dec) for x in a[1]]
    if tag == "dict_of":
        return {dec.decode(k): _unarg(v, env, dec) for k, v in a[1]}
    if tag == "slice_of":
        return slice(*(_unarg(x, env, dec) for x in a[1]))
    return dec.decode(a)


def _graph_to_data(gm: torch.fx.GraphModule, enc: Encoder) -> tuple[dict, dict]:
    """(the graph as data, its tensor constants). Its subgraphs (the GraphModules its
    higher-order ops call) are kept in ``"subgraphs"``, each once (``subgraph_table``), their
    tensor constants under ``subgraph<_SUB><number><_SUB><target>``."""
    tensors: dict = {}
    table = SubgraphTable(lambda sub: _nodes_to_data(sub, enc, table))
    data, tensors = _nodes_to_data(gm, enc, table)
    if table.entries:
        data["subgraphs"] = []
        for i, (sub_data, sub_tensors) in enumerate(table.entries):
            data["subgraphs"].append(sub_data)
            tensors.update({f"{_SUBGRAPH}{i}{_SUB}{target}": t for target, t in sub_tensors.items()})
    return data, tensors


def _nodes_to_data(gm: torch.fx.GraphModule, enc: Encoder, table: SubgraphTable) -> tuple[dict, dict]:
    nodes, tensors, objects = [], {}, {}
    for n in gm.graph.nodes:
        d = {"op": n.op, "name": n.name}
        if n.op == "placeholder":
            d["meta"] = {k: (v if isinstance(v, (bool, int, str)) else str(v))
                         for k, v in n.meta.items() if k in _META}
        elif n.op == "get_attr":
            obj = attribute(gm, n.target)
            if is_subgraph(obj):
                try:
                    d["subgraph"] = table.number(obj)
                except ValueError as e:
                    raise NotPackageable(f"graph constant {n.target}: {e}") from None
            elif isinstance(obj, torch.Tensor):
                if type(obj) not in (torch.Tensor, torch.nn.Parameter):
                    raise NotPackageable(f"graph constant {n.target} is a {type(obj).__name__}")
                tensors[n.target] = obj.detach()
            else:
                try:
                    objects[n.target] = enc.encode(obj, identity=True)
                except NotPackageable as e:
                    raise NotPackageable(f"graph constant {n.target}: {e}") from None
            d["target"] = n.target
        elif n.op == "call_function" and getattr(n.target, "kiln_captured_function", None) is not None:
            d["target"] = _captured_function_to_data(n.name, n.target.kiln_captured_function, enc, tensors)
            d["args"], d["kwargs"] = _arg(tuple(n.args), enc), _arg(dict(n.kwargs), enc)
        elif n.op in ("call_function", "call_method"):
            try:
                d["target"] = n.target if n.op == "call_method" else enc.encode(n.target, identity=True)
                d["args"], d["kwargs"] = _arg(tuple(n.args), enc), _arg(dict(n.kwargs), enc)
            except NotPackageable as e:
                raise NotPackageable(f"graph node {n.name}: {e}") from None
        elif n.op == "output":
            d["args"] = _arg(tuple(n.args), enc)
        else:
            raise NotPackageable(f"a {n.op} node in the captured graph ({n.name})")
        nodes.append(d)
    meta = {k: v for k, v in gm.meta.items() if isinstance(v, (bool, int, str, list)) and k.startswith("kiln_")}
    return {"class": type(gm).__name__, "nodes": nodes, "objects": objects, "meta": meta}, tensors


def _graph_from_data(data: dict, tensors: dict, dec: Decoder) -> torch.fx.GraphModule:
    saved = data.get("subgraphs") or []

    def build(i: int) -> torch.fx.GraphModule:
        prefix = f"{_SUBGRAPH}{i}{_SUB}"
        return _graph_from_nodes(saved[i], {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)},
                                 dec, subgraphs)

    subgraphs = SubgraphLoader(len(saved), build)
    return _graph_from_nodes(data, tensors, dec, subgraphs)


def _graph_from_nodes(data: dict, tensors: dict, dec: Decoder, subgraphs: SubgraphLoader) -> torch.fx.GraphModule:
    root = torch.nn.Module()
    g = torch.fx.Graph()
    env: dict = {}
    for target, t in tensors.items():
        if _SUB not in target:         # (subgraphs and a captured autograd.Function's hold the rest)
            _set_path(root, target, t)
    for target, enc in data["objects"].items():
        _set_path(root, target, dec.decode(enc))
    for d in data["nodes"]:
        op = d["op"]
        if op == "placeholder":
            n = g.placeholder(d["name"])
            n.meta.update(d["meta"])
        elif op == "get_attr":
            if "subgraph" in d:
                _set_path(root, d["target"], subgraphs.get(d["subgraph"]))
            n = g.get_attr(d["target"])
        elif op == "output":
            n = g.output(*_unarg(d["args"], env, dec))
        else:
            target = d["target"] if op == "call_method" else \
                _captured_function_from_data(d["name"], d["target"], tensors, dec) \
                if d["target"][0] == "captured_autograd_function" else dec.decode(d["target"])
            n = g.create_node(op, target, _unarg(d["args"], env, dec), _unarg(d["kwargs"], env, dec),
                              name=d["name"])
        env[d["name"]] = n
    gm = _torch.lazy_graph_module(root, g, class_name=data["class"])
    gm.meta.update(data["meta"])
    return gm


# A user's autograd.Function, captured (``capture.values.autograd_function``): the graph node
# calls a function made at capture time around its forward and backward subgraphs. It has no
# name in another process; it is saved as what makes it: the user's class (by name), both
# subgraphs as data (their tensor constants among the graph's, under ``node<_SUB>which<_SUB>``)
# and the counts and positions it was made with.
_SUB = "::"
_SUBGRAPH = f"subgraph{_SUB}"


def _captured_function_to_data(name: str, parts: dict, enc: Encoder, tensors: dict) -> list:
    out = {k: parts[k] for k in ("n_out", "n_sfb", "non_diff", "dirty_inputs", "reads_grad_mode")}
    try:
        out["user_cls"] = enc.encode(parts["user_cls"], identity=True)
    except NotPackageable as e:
        raise NotPackageable(f"graph node {name}: the autograd.Function's class: {e}") from None
    for which in ("fwd", "bwd"):
        gm = parts[which]
        if gm is None:
            out[which] = None
            continue
        data, sub = _graph_to_data(gm, enc)
        for target, t in sub.items():
            tensors[f"{name}{_SUB}{which}{_SUB}{target}"] = t
        out[which] = data
    return ["captured_autograd_function", out]


def _captured_function_from_data(name: str, saved: list, tensors: dict, dec: Decoder):
    # (the capture layer is imported only by a package that holds such a node: a load
    # otherwise runs without it)
    d = saved[1]
    graphs = {}
    for which in ("fwd", "bwd"):
        if d[which] is None:
            graphs[which] = None
            continue
        prefix = f"{name}{_SUB}{which}{_SUB}"
        sub = {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}
        graphs[which] = _graph_from_data(d[which], sub, dec)
    return runtime_function(dec.decode(d["user_cls"]), graphs["fwd"], graphs["bwd"], d["n_out"], d["n_sfb"],
                            d["non_diff"], d["dirty_inputs"], d.get("reads_grad_mode", False))


def _set_path(root: torch.nn.Module, target: str, obj) -> None:
    *path, last = target.split(".")
    mod = root
    for p in path:
        if not hasattr(mod, p):
            mod.add_module(p, torch.nn.Module())
        mod = getattr(mod, p)
    if isinstance(obj, torch.Tensor):
        mod.register_buffer(last, obj) if not isinstance(obj, torch.nn.Parameter) else setattr(mod, last, obj)
    else:
        object.__setattr__(mod, last, obj)
