"""Small helpers shared by the AOT stages: fake tensors, functional tensors, decompositions,
FX graph utilities (sizes, liveness, extraction, readable text).

Everything here is built from torch's public-ish building blocks (FakeTensorMode,
FunctionalTensor, make_fx's decomposition tables, torch.fx). Nothing comes from torch's
aot_autograd or its partitioners.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor

from .. import _torch
from .symbolic import nbytes_hint

aten = torch.ops.aten


# --------------------------------------------------------------------------------------------
# Fake tensors
# --------------------------------------------------------------------------------------------

def new_fake_mode() -> FakeTensorMode:
    """A fake mode for AOT tracing of static graphs: no ShapeEnv (a dynamic graph is traced in
    its capture's mode, see ``symbolic.py``). Real tensors that the traced code closes over
    (constants) are allowed and become graph constants."""
    return FakeTensorMode(allow_non_fake_inputs=True)


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
    for n in gm.graph.nodes:
        m = n.meta.pop(LAZY_VAL, None) if n.op == "placeholder" else None
        if m is not None and "val" not in n.meta:
            n.meta["val"] = fake_like(mode, m["shape"], m["stride"], dtype_from_str(m["dtype"]),
                                      torch.device(m["device"]), m.get("requires_grad", False))
    del gm.meta[LAZY_MODE]


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
    return mode.from_tensor(t, static_shapes=True)


def fake_like(mode: FakeTensorMode, shape, stride, dtype, device, requires_grad=False) -> torch.Tensor:
    with mode:
        t = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device=device)
    if requires_grad:
        t.requires_grad_(True)
    return t


@contextlib.contextmanager
def no_mkldnn_decompositions():
    """While tracing: torch's ``aten.lstm`` decomposition picks ``mkldnn_rnn_layer`` on CPU
    in inference mode (``train=False``: no workspace) when the input does not require grad,
    even where the weights do; its backward then fails on the missing workspace. With mkldnn
    off it decomposes into differentiable ATen ops. (Only the trace: kernels at run time are
    unaffected.)"""
    prior = torch._C._get_mkldnn_enabled()   # (torch.backends.mkldnn.flags warns about TF32)
    torch._C._set_mkldnn_enabled(False)
    try:
        if lstm_hidden_defect():
            with _lstm_hidden_shaped_as_given():
                yield
        else:
            yield
    finally:
        torch._C._set_mkldnn_enabled(prior)


# aten.lstm's Python kernels (torch._decomp, run by the Python dispatcher while tracing), and
# where their hidden-state argument is
_LSTM_OVERLOADS = (("input", 1), ("data", 2))
_LSTM_KEYS = ("Autograd", "CompositeImplicitAutograd")


@functools.lru_cache(None)
def lstm_hidden_defect() -> bool:
    """Whether torch's ``aten.lstm`` decomposition, on the path ``no_mkldnn_decompositions``
    takes, returns h_n and c_n with an extra dimension: torch 2.11's ``one_layer_lstm``
    squeezes dimension 1 instead of 0, so they came out ``(layers, 1, batch, hidden)`` for
    ``(layers, batch, hidden)``, a wrong answer. Probed once, on a tiny LSTM."""
    kernel = torch.ops.aten.lstm.input.py_kernels.get(torch._C.DispatchKey.Autograd)
    if kernel is None:
        return False
    x, h = torch.zeros(3, 2, 4), torch.zeros(1, 2, 5)
    params = [torch.zeros(20, 4), torch.zeros(20, 5), torch.zeros(20), torch.zeros(20)]
    prior = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        with torch.no_grad():
            _, hn, _ = kernel(x, (h, h), params, True, 1, 0.0, False, False, False)
    except Exception:
        return False
    finally:
        torch._C._set_mkldnn_enabled(prior)
    return hn.dim() != h.dim()


@contextlib.contextmanager
def _lstm_hidden_shaped_as_given():
    """While tracing: torch's Python ``aten.lstm`` kernels, with h_n and c_n reshaped to the
    hidden states passed in (the same elements, layer-major: only the shape was wrong)."""
    ops = [(getattr(torch.ops.aten.lstm, overload), hx_at) for overload, hx_at in _LSTM_OVERLOADS]
    replaced = []
    for op, hx_at in ops:
        for name in _LSTM_KEYS:
            key = getattr(torch._C.DispatchKey, name)
            kernel = op.py_kernels.get(key)
            if kernel is not None:
                replaced.append((op, key, kernel))
                op.py_kernels[key] = _hidden_shaped_as_given(kernel, hx_at)
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, key, kernel in replaced:
            op.py_kernels[key] = kernel
        for op, _ in ops:
            op._dispatch_cache.clear()


def _hidden_shaped_as_given(kernel: Callable, hx_at: int) -> Callable:
    def lstm(*args, **kwargs):
        out, h, c = kernel(*args, **kwargs)
        h0, c0 = args[hx_at]
        if h.dim() != h0.dim():
            h = h.reshape(h0.shape)
        if c.dim() != c0.dim():
            c = c.reshape(c0.shape)
        return out, h, c
    return lstm


@contextlib.contextmanager
def preserve_rng_state():
    """Tracing must not consume random numbers: restore the CPU (and CUDA) generators after."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        cpu = torch.random.get_rng_state().clone()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        with _disable_current_modes():
            torch.random.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def saved_tensor_hooks_deferred():
    """Saved-tensor hooks are not traced into the graphs: they run at runtime around the
    compiled autograd.Function (the backward's saved tensors are packed there)."""
    setter = getattr(torch._C._autograd, "_saved_tensors_hooks_set_tracing", None)
    if setter is None:  # pragma: no cover
        yield
        return
    prior = setter(True)
    try:
        yield
    finally:
        setter(prior)


# --------------------------------------------------------------------------------------------
# Functional tensors (python functionalization: torch._subclasses.functional_tensor)
# --------------------------------------------------------------------------------------------

def exclude_functionalize_key():
    """Functionalization runs as a Python mode; keep the C++ Functionalize key out of the way
    above it (as every user of FunctionalTensorMode must)."""
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize))


def to_fun(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and not isinstance(t, FunctionalTensor):
        return FunctionalTensor.to_functional(t)
    return t


def from_fun(t: Any) -> Any:
    if not isinstance(t, FunctionalTensor):
        return t
    torch._sync(t)
    return torch._from_functional_tensor(t.elem)


def sync(t: Any) -> None:
    if isinstance(t, FunctionalTensor):
        torch._sync(t)


# --------------------------------------------------------------------------------------------
# Decompositions
# --------------------------------------------------------------------------------------------

@functools.lru_cache(None)
def _default_decompositions() -> dict:
    """torch's core ATen decomposition table, post-autograd part.

    ``core_aten_decompositions()`` also lists CompositeImplicitAutograd ops (for export's
    pre-dispatch tracing); those never reach a post-autograd trace and are dropped. Random ops
    keep their own kernels: a decomposition (``bernoulli`` -> ``rand_like < p``) would draw
    random numbers differently from eager, and the same seed must give the same dropout mask
    (this also keeps CPU flash attention whole: its decomposition returns the attention weights
    where its backward, which autograd takes from the undecomposed op, expects the logsumexp).
    """
    from torch._decomp import core_aten_decompositions

    table = {}
    for op, fn in core_aten_decompositions().items():
        if isinstance(fn, functools.partial) and getattr(fn.func, "__name__", "") == "_special_op_to_decompose_cia":
            continue
        if isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags:
            continue
        table[op] = fn
    return table


def default_decompositions() -> dict:
    return dict(_default_decompositions())


# --------------------------------------------------------------------------------------------
# FX helpers
# --------------------------------------------------------------------------------------------

def is_random(node: torch.fx.Node) -> bool:
    t = node.target
    return node.op == "call_function" and isinstance(t, torch._ops.OpOverload) and \
        torch.Tag.nondeterministic_seeded in t.tags


def is_view(node: torch.fx.Node) -> bool:
    t = node.target
    return node.op == "call_function" and isinstance(t, torch._ops.OpOverload) and t.is_view


def tensor_nbytes(t: Any) -> int:
    """Bytes of a tensor's elements; for symbolic sizes, at the traced sizes (a hint: byte
    counts only rank partitions and are reported, they never decide what a graph computes)."""
    if isinstance(t, torch.Tensor):
        return nbytes_hint(t)
    if isinstance(t, (tuple, list)):
        return sum(tensor_nbytes(x) for x in t)
    return 0


def node_nbytes(node: torch.fx.Node) -> int:
    return tensor_nbytes(node.meta.get("val"))


def storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """Follow view ops back to the node whose output owns the storage."""
    while is_view(node) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def saved_bytes(nodes: Iterable[torch.fx.Node]) -> tuple[int, int]:
    """(bytes held by the saved tensors, of which graph inputs): one count per storage."""
    roots = {}
    for n in nodes:
        r = storage_root(n)
        roots[r] = node_nbytes(r)
    total = sum(roots.values())
    inputs = sum(b for r, b in roots.items() if r.op == "placeholder")
    return total, inputs


def count_saved(backward: torch.fx.GraphModule, saved: list[str]) -> str:
    """``"3 tensors"``, or ``"3 tensors + 1 int"`` when symbolic sizes cross too."""
    names = set(saved)
    ints = sum(1 for n in backward.graph.nodes if n.op == "placeholder" and n.name in names
               and isinstance(n.meta.get("val"), (torch.SymInt, torch.SymBool, int)))
    text = f"{len(saved) - ints} tensors"
    return text + (f" + {ints} int{'s' if ints > 1 else ''}" if ints else "")


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def describe_val(v: Any) -> str:
    if isinstance(v, (torch.SymInt, torch.SymBool)):
        return f"{type(v).__name__[3:].lower()} {v}"      # "int s6377"
    if isinstance(v, torch.Tensor):
        dt = str(v.dtype).replace("torch.", "")
        shape = "x".join(str(s) for s in v.shape) or "scalar"
        return f"{dt}[{shape}]"
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(describe_val(x) for x in v) + ")"
    return type(v).__name__ if v is not None else "None"


def graph_text(gm: torch.fx.GraphModule, title: str) -> str:
    """Readable code of a graph, with the type of each placeholder."""
    lines = [f"# {title}"]
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            tags = []
            if n.meta.get("kiln_static"):
                tags.append("parameter/buffer")
            if n.meta.get("kiln_mutated"):
                tags.append("mutated")
            if n.meta.get("kiln_requires_grad"):
                tags.append("requires_grad")
            extra = f"  ({', '.join(tags)})" if tags else ""
            lines.append(f"#   {n.name}: {describe_val(n.meta.get('val'))}{extra}")
    code = gm.code.strip("\n")
    lines.append(code)
    return "\n".join(lines)


def rename_placeholders(gm: torch.fx.GraphModule, names: list[str]) -> None:
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(phs) == len(names), (len(phs), len(names))
    taken = {n.name for n in gm.graph.nodes if n.op != "placeholder"}
    for n, name in zip(phs, names):
        assert name not in taken, name
        n.target = name
        n.name = name
    gm.recompile()


def remove_aliases(gm: torch.fx.GraphModule) -> None:
    """``aten.alias``/``aten.detach`` are identities in a functional graph: drop them."""
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target in (aten.alias.default, aten.detach.default, aten.lift_fresh.default):
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)


def is_input_write(n: torch.fx.Node) -> bool:
    """An ``aten.copy_`` into a placeholder: the graph's write of a mutated input's new value
    (a functional graph has no other mutation; ``state.mark_mutations_in_graph``)."""
    return n.op == "call_function" and n.target is aten.copy_.default and \
        isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder"


def is_effect(n: torch.fx.Node) -> bool:
    """Nodes a graph runs for more than their value: random ops (eager draws their numbers)
    and writes into inputs."""
    return is_random(n) or is_input_write(n)


def dce(gm: torch.fx.GraphModule, keep: Callable[[torch.fx.Node], bool] = is_effect) -> None:
    """Dead code elimination that never drops random ops (eager draws their numbers) or the
    graph's writes into its inputs."""
    for n in reversed(list(gm.graph.nodes)):
        if n.op in ("placeholder", "output") or n.users or keep(n):
            continue
        gm.graph.erase_node(n)


def output_node(graph: torch.fx.Graph) -> torch.fx.Node:
    for n in reversed(graph.nodes):
        if n.op == "output":
            return n
    raise ValueError("graph has no output node")


def ancestors(nodes: Iterable[Any]) -> set:
    """``nodes`` and every node they are computed from (non-nodes are skipped)."""
    seen: set = set()
    todo = [n for n in nodes if isinstance(n, torch.fx.Node)]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return seen


def emit_inputs_first(root: torch.fx.Node, done: set, order: list) -> None:
    """Append ``root`` to ``order`` after those of its inputs not ``done`` yet, inputs first
    (iteratively: a long chain would exceed Python's recursion limit). A node reached again from
    its own inputs is a cycle: RuntimeError."""
    entered: set = set()
    stack = [(root, False)]
    while stack:
        n, ready = stack.pop()
        if n in done:
            continue
        if ready:
            done.add(n)
            order.append(n)
            continue
        if n in entered:
            raise RuntimeError(f"the graph has a cycle through {n.name}")
        entered.add(n)
        stack.append((n, True))
        stack.extend((a, False) for a in reversed(n.all_input_nodes) if a not in done)


def flat_outputs(graph: torch.fx.Graph) -> list:
    out = output_node(graph).args[0]
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def extract_graph(joint: torch.fx.Graph, inputs: list[torch.fx.Node], outputs: list[Any],
                  *, keep: Callable[[torch.fx.Node], bool] | None = None,
                  input_names: list[str] | None = None) -> torch.fx.Graph:
    """A new graph computing ``outputs`` from ``inputs`` (nodes of ``joint``), copying the nodes
    needed in their original order. ``keep(node)`` forces nodes in (random ops that eager runs).
    Reaching a placeholder that is not an input is an error."""
    inputs_set = set(inputs)
    needed: set = set()
    stack = [o for o in outputs if isinstance(o, torch.fx.Node)]
    if keep is not None:
        stack += [n for n in joint.nodes if n.op == "call_function" and keep(n)]
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        if n in inputs_set:
            continue
        if n.op == "placeholder":
            raise RuntimeError(f"partition: {n.name} is needed but is not an input of this graph")
        stack.extend(n.all_input_nodes)
    g = torch.fx.Graph()
    env: dict = {}
    for i, n in enumerate(inputs):
        name = input_names[i] if input_names else n.name
        p = g.placeholder(name)
        p.meta = dict(n.meta)
        env[n] = p
    for n in joint.nodes:
        if n in env or n not in needed or n.op == "output":
            continue
        if n.op == "placeholder":  # pragma: no cover (rejected above)
            continue
        new = g.node_copy(n, lambda a: env[a])
        env[n] = new
    g.output(tuple(env[o] if isinstance(o, torch.fx.Node) else o for o in outputs))
    return g


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


PLAIN_CONSTANTS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def fake_storage(v: Any):
    """The storage of a fake value (equal for values that share memory); None otherwise."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(v.untyped_storage()) if isinstance(v, FakeTensor) else None


def _storages(v: Any) -> set:
    if isinstance(v, (tuple, list)):
        return set().union(*[_storages(x) for x in v]) if v else set()
    s = fake_storage(v)
    return set() if s is None else {s}


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule over a copy of ``gm``'s graph (nodes' meta shallow-copied), same attributes."""
    g = torch.fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    new = _torch.lazy_graph_module(gm, g, class_name=type(gm).__name__)
    new.meta.update(gm.meta)
    return new


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


def meta_of_tensor(t: torch.Tensor) -> dict:
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).replace("torch.", ""),
            "device": str(t.device), "requires_grad": bool(t.requires_grad)}


def dtype_from_str(s: str) -> torch.dtype:
    d = getattr(torch, s, None)
    if not isinstance(d, torch.dtype):
        raise ValueError(f"unknown dtype {s!r}")
    return d


def op_name(n) -> str | None:
    """The schema name of a graph node's op (``kiln::prefetch``, ``aten::mm``...); None for a
    node that calls no op with a schema."""
    if n.op != "call_function":
        return None
    schema = getattr(n.target, "_schema", None)
    return schema.name if schema is not None else None
