"""Each node's fake value (``meta['val']``) computed again after a graph is edited, running only
what the edit changed."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

from .fake_tensors import fake_mode_of, fake_storage
from .subgraph_table import attribute, is_subgraph


VAL_OF = "kiln_val_of"    # node meta: the call (target, args, kwargs) its meta['val'] was made for


def record_val_calls(g: torch.fx.Graph) -> None:
    """Note, for each call's ``meta['val']``, the call it was computed for: a later
    ``propagate_fake(..., keep_unchanged=True)`` recomputes only what was edited since."""
    for n in g.nodes:
        if n.op == "call_function" and "val" in n.meta:
            n.meta[VAL_OF] = (n.target, n.args, n.kwargs)


def propagate_fake(gm: torch.fx.GraphModule, fake_inputs: list, mode: FakeTensorMode, *,
                   keep_unchanged: bool = False) -> None:
    """Run the graph on fake inputs and record each node's ``meta['val']`` (after edits).

    ``keep_unchanged``: a call whose value was made for the same call (``record_val_calls``),
    on inputs whose values kept their shapes, strides and dtypes, keeps its value without
    running: after a rewrite of a few nodes of a large graph (Inductor's joint-graph passes),
    only those nodes and what their new values change are run again."""
    changed: set = set()
    # the storages each re-run node's old value held: a kept value that aliased one of them
    # (a view of a re-run node) must be re-run too, or it would alias a storage no other value
    # has any more (the donation of saved buffers reads which values share memory)
    rerun: dict = {}
    missing = object()

    def keeps(n, old) -> bool:
        if not (n.op == "call_function" and old is not missing and _same_call(n.meta.get(VAL_OF), n)):
            return False
        ins = [a for a in n.all_input_nodes if a in rerun]
        if any(a in changed for a in ins):
            return False
        if ins:
            mine = _storages(old)
            if mine and any(mine & rerun[a] for a in ins):
                return False
        return True

    class _Prop(torch.fx.Interpreter):
        def run_node(self, n):
            old = n.meta.get("val", missing)
            if keep_unchanged and keeps(n, old):
                return old
            r = super().run_node(n)
            if keep_unchanged:
                rerun[n] = _storages(old) if old is not missing else set()
                if old is missing or not _same_meta(old, r):
                    changed.add(n)
            n.meta["val"] = r
            if n.op == "call_function":
                n.meta[VAL_OF] = (n.target, n.args, n.kwargs)
            return r

    # (the graph's ATen ops already hold autocast's casts: run again under the caller's
    # autocast, a float32 matmul would get a bfloat16 value)
    with mode, torch.no_grad(), torch._C._DisableAutocast():
        _Prop(gm).run(*fake_inputs)


def complete_subgraph_vals(gm: torch.fx.GraphModule) -> None:
    """Fake values for the nodes of ``gm``'s subgraphs (a higher-order op's branches and
    bodies) that have them on their placeholders only: a graph loaded from an artifact.
    Inductor lowers a subgraph reading its outputs' fake values, which running the parent
    graph does not make. Best effort: a subgraph that cannot run on fakes keeps what it has."""
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        sub = attribute(gm, str(n.target))
        if not is_subgraph(sub):
            continue
        if not all("val" in m.meta for m in sub.graph.nodes if m.op == "call_function"):
            vals = [m.meta.get("val") for m in sub.graph.nodes if m.op == "placeholder"]
            mode = fake_mode_of(vals)
            if mode is not None and all(v is not None for v in vals):
                try:
                    propagate_fake(sub, vals, mode)
                except Exception:
                    pass
        complete_subgraph_vals(sub)


PLAIN_CONSTANTS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _storages(v: Any) -> set:
    if isinstance(v, (tuple, list)):
        return set().union(*[_storages(x) for x in v]) if v else set()
    s = fake_storage(v)
    return set() if s is None else {s}


def _same_call(rec: Any, n: torch.fx.Node) -> bool:
    if rec is None:
        return False
    target, args, kwargs = rec
    return target is n.target and _same_arg(args, n.args) and _same_arg(kwargs, n.kwargs)


def _same_arg(x: Any, y: Any) -> bool:
    """The same argument (a node by its name: graph copies keep them); values other than
    plain constants only as the very same object."""
    if isinstance(x, torch.fx.Node):
        return isinstance(y, torch.fx.Node) and x.name == y.name
    if type(x) is not type(y):
        return False
    if isinstance(x, (tuple, list)):
        return len(x) == len(y) and all(map(_same_arg, x, y))
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same_arg(x[k], y[k]) for k in x)
    if isinstance(x, PLAIN_CONSTANTS):
        return x == y
    return x is y


def _same_meta(a: Any, b: Any) -> bool:
    """Two values a graph would see alike: tensors of one shape, stride, dtype and device;
    equal ints; symbolic sizes of one expression (compared without guarding)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        try:
            return a.dtype == b.dtype and a.device == b.device and a.layout == b.layout and \
                _same_ints(a.shape, b.shape) and _same_ints(a.stride(), b.stride())
        except Exception:       # (a layout without strides)
            return False
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b) and \
            all(map(_same_meta, a, b))
    return _same_ints((a,), (b,))


_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _same_ints(xs, ys) -> bool:
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if isinstance(x, _SYMBOLIC) or isinstance(y, _SYMBOLIC):
            if type(x) is not type(y) or x.node.expr != y.node.expr:
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True
