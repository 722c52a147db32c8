"""Stage 1: ``stage1_graph_capture(state) -> AOTGraphCapture``.

Traces the function prepared by ``create_aot_state`` with ``make_fx`` over fake tensors,
functionalized (FunctionalTensorMode) and decomposed to core ATen:

* inference (nothing requires grad, or grad mode is off): ``primals -> fw outputs``;
* training: the joint graph ``(primals, tangents) -> (fw outputs, grads)``, traced by running
  the function and then ``torch.autograd.grad`` on its differentiable outputs.

The fw outputs are the new values of data-mutated inputs followed by the outputs the graph
computes (see ``runtime.MutationsAndAliases``); inputs the graph writes itself
(``state.mark_mutations_in_graph``) get an ``aten.copy_`` into their placeholder at the end of
the forward instead of an output. The joint then returns one gradient per primal
(``None`` where the primal needs none). ``capture.graph`` is an ordinary ``torch.fx.Graph``: edit
it (``capture.graph_module.recompile()`` is done by stage 2) and hand the capture to stage 2.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from .. import _torch
from ..errors import Unsupported
from . import fake_propagation, fake_tensors, functional_tensors, fx_graphs, graph_bytes, graph_text, trace_context
from . import regions, segments
from . import symbolic
from .partition import partition_capture
from .state import AOTState

# higher-order ops an ATen graph may call: their branches are ATen subgraphs (get_attr)
# higher-order ops whose subgraphs make_fx traces into ATen (the capture's control flow, scans
# and flex_attention), and kiln's repeated blocks (regions.py: traced once per block)
HIGHER_ORDER_OPS = (torch.ops.higher_order.cond, torch.ops.higher_order.while_loop,
                    torch.ops.higher_order.scan, torch.ops.higher_order.associative_scan,
                    torch.ops.higher_order.map_impl, torch.ops.higher_order.flex_attention,
                    torch.ops.higher_order.flex_attention_backward, regions.invoke_region)


@dataclass
class AOTGraphCapture:
    """The stage-1 graph and how to read it.

    ``graph_module``'s placeholders are ``primals_1..N`` then (joint) ``tangents_1..M``; it
    returns ``num_fw_outputs`` forward values, then (joint) one gradient per primal.
    ``tangent_positions[j]`` is the forward output that ``tangents_{j+1}`` is the gradient of.
    """
    graph_module: torch.fx.GraphModule
    kind: str                                   # "joint" | "inference"
    num_primals: int
    num_fw_outputs: int
    tangent_positions: list[int] = field(default_factory=list)
    fw_output_requires_grad: list[bool] = field(default_factory=list)
    primal_requires_grad: list[bool] = field(default_factory=list)
    example_inputs: list = field(default_factory=list)   # fake primals (+ tangents)
    state: Any = None
    # (joint) the primals and forward outputs whose memory eager's autograd saves for the
    # backward: eager checks their version counters at backward time (``saved_by_eager`` in
    # the metadata)
    eager_saved_inputs: list[int] = field(default_factory=list)
    eager_saved_outputs: list[int] = field(default_factory=list)

    @property
    def graph(self) -> torch.fx.Graph:
        return self.graph_module.graph

    @property
    def is_joint(self) -> bool:
        return self.kind == "joint"

    @property
    def num_tangents(self) -> int:
        return len(self.tangent_positions)

    def saved_tensor_bytes(self, partition_fn: Any = "default") -> int:
        """Bytes the backward would keep alive with this partitioner (0 for inference)."""
        if not self.is_joint:
            return 0
        return partition_capture(self, partition_fn).saved_bytes

    def as_text(self) -> str:
        title = ("joint forward+backward graph: (primals, tangents) -> "
                 f"({self.num_fw_outputs} forward outputs, {self.num_primals} gradients)"
                 if self.is_joint else
                 f"inference graph: primals -> {self.num_fw_outputs} outputs")
        lines = [graph_text.graph_text(self.graph_module, title)]
        if self.is_joint:
            lines.append("# tangents_j is the gradient of forward output: "
                         + ", ".join(f"tangents_{j + 1}->out[{k}]" for j, k in enumerate(self.tangent_positions)))
            try:
                d = partition_capture(self, "default")
                m = partition_capture(self, "min_cut")
                lines.append(f"# saved for backward: default partitioner {graph_bytes.format_bytes(d.saved_bytes)} "
                             f"({graph_bytes.count_saved(d.backward, d.saved)}), "
                             f"min-cut {graph_bytes.format_bytes(m.saved_bytes)} "
                             f"({graph_bytes.count_saved(m.backward, m.saved)})")
            except Exception as e:  # an edited graph may not partition until stage 2 checks it
                lines.append(f"# saved for backward: unavailable ({type(e).__name__}: {e})")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<kiln.aot.AOTGraphCapture {self.kind}, {self.num_primals} primals, " \
               f"{self.num_tangents} tangents, {len(self.graph.nodes)} nodes>"


def _reached_by(outs: list, tangent_ids: list, leaves: list) -> list[frozenset]:
    """Per leaf, the tangents (of ``outs``) whose output's autograd graph reaches it: those a
    backward() from which gives the leaf a gradient in eager, zeros included. The traced
    gradient's data flow can say less: a decomposition turns ``zeros_like(grad)`` (the
    derivative of an overwritten ``copy_``) into a constant (fuzz seed 7348). One walk of the
    autograd graph per output, whatever the number of leaves."""
    edges = []
    for leaf in leaves:
        try:
            edges.append(torch.autograd.graph.get_gradient_edge(leaf).node)
        except Exception:   # noqa: BLE001 - no edge to find: the traced data flow decides
            edges.append(None)
    wanted = {e for e in edges if e is not None}
    found: dict = {e: set() for e in wanted}
    for o, j in zip(outs, tangent_ids):
        seen, todo = set(), [o.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if node in wanted:
                found[node].add(j)
            todo.extend(nxt for nxt, _ in node.next_functions)
    return [frozenset(found[e]) if e is not None else frozenset() for e in edges]


def _handed_outputs(seg, values: list, outs: list) -> list:
    """The handed values that are forward outputs of their own (``seg.extra``); each handoff
    that stands for an output must have been handed that very tensor."""
    for j, v in enumerate(values):
        if v is None:
            raise segments.NotSegmentable(f"handoff {j} was not reached in the trace")
        src = seg.layout.sources[j]
        if src < len(outs) and outs[src] is not v:
            raise segments.NotSegmentable(f"handoff {j} stands for output {src}, which the trace returns as another tensor")
    return [values[j] for j in seg.extra]


def stage1_graph_capture(state: AOTState) -> AOTGraphCapture:
    if state.closed:
        raise RuntimeError("stage1_graph_capture: the AOTState is closed")
    with state.tracing():
        return _capture(state)


def _capture(state: AOTState) -> AOTGraphCapture:
    meta = state.meta
    fn = state.flat_fn
    primals = list(state.flat_args)
    n = len(primals)
    nfw = meta.num_fw_outputs
    prior_grad = torch.is_grad_enabled()
    entry_grad = state.grad_enabled

    in_graph = meta.in_graph_mutated_indices

    def write_inputs(p, fp):
        """The graph's own writes into the inputs it mutates (``mark_mutations_in_graph``),
        after everything the function computes: ``aten.copy_(primal, new value)``."""
        for i in in_graph:
            with torch.no_grad():
                p[i].copy_(functional_tensors.from_fun(fp[i]))

    if not state.needs_autograd:
        def inference(*p):
            with functional_tensors.exclude_functionalize_key():
                fp = [functional_tensors.to_fun(x) for x in p]
                try:
                    with torch.no_grad():
                        outs = fn(*fp)
                        write_inputs(p, fp)
                finally:
                    torch._C._set_grad_enabled(prior_grad)
                return [functional_tensors.from_fun(o) for o in outs]

        gm = _trace(state, inference, primals)
        names = [f"primals_{i + 1}" for i in range(n)]
        example = primals
        tangent_positions: list[int] = []
        kind = "inference"
    else:
        diff = meta.fw_output_differentiable()
        tangent_positions = [k for k, d in enumerate(diff) if d]
        tangents = [_tangent_for(state, k) for k in tangent_positions]
        grad_primals = [i for i, p in enumerate(primals) if isinstance(p, torch.Tensor) and p.requires_grad]
        # a graph whose differentiable output feeds another: traced in segments (segments.py),
        # with a primal per handoff and the handed values as forward outputs
        seg = segments.trace_plan(state, nfw)
        zs = seg.primals if seg is not None else []
        if seg is not None:
            tangent_positions += seg.with_tangent
            tangents += seg.tangents
        m = len(zs)

        reach: list = []    # per grad primal: the tangents whose outputs' autograd graph reaches it

        def joint(*pt):
            p, z, t = pt[:n], pt[n:n + m], pt[n + m:]
            with functional_tensors.exclude_functionalize_key():
                fp = [functional_tensors.to_fun(x) for x in p]
                fz = [functional_tensors.to_fun(x) for x in z]
                ft = [functional_tensors.to_fun(x) for x in t]
                try:
                    # the function runs in its own entry mode: a graph that starts under no_grad
                    # and turns grad mode on records autograd only from there
                    torch._C._set_grad_enabled(entry_grad)
                    if seg is not None:
                        with segments.handing_over(fz) as slots:
                            outs = list(fn(*fp))
                        outs += _handed_outputs(seg, slots.values, outs)
                        segments.refuse_writes(fz)
                    else:
                        outs = fn(*fp)
                    write_inputs(p, fp)
                    trace_context.mark_forward_nodes()
                    d_outs, d_tangents, d_js = [], [], []
                    for j, k in enumerate(tangent_positions):
                        o = outs[k]
                        if isinstance(o, torch.Tensor) and o.requires_grad and o.grad_fn is not None:
                            d_outs.append(o)
                            d_tangents.append(ft[j])
                            d_js.append(j)
                    gin = [fp[i] for i in grad_primals] + fz
                    grads: list = [None] * len(gin)
                    if d_outs and gin:
                        reach[:] = _reached_by(d_outs, d_js, [fp[i] for i in grad_primals])
                        # the backward as eager's engine runs it: autocast off (its ops take
                        # the dtypes of the forward ops they differentiate)
                        with torch._C._DisableAutocast():
                            grads = list(torch.autograd.grad(d_outs, gin, d_tangents, allow_unused=True))
                finally:
                    torch._C._set_grad_enabled(prior_grad)
                full: list = [None] * n + grads[len(grad_primals):]
                for i, g in zip(grad_primals, grads):
                    full[i] = g
                return [functional_tensors.from_fun(o) for o in outs] + \
                    [functional_tensors.from_fun(g) if g is not None else None for g in full]

        gm = _trace(state, joint, primals + zs + tangents)
        if len(reach) == len(grad_primals):
            gm.meta["kiln_grad_reach"] = {i: r for i, r in zip(grad_primals, reach)}
        names = [f"primals_{i + 1}" for i in range(n + m)] + [f"tangents_{j + 1}" for j in range(len(tangents))]
        example = primals + zs + tangents
        kind = "joint"
        if seg is not None:
            gm.meta["kiln_segments"] = seg.layout
            primals = primals + zs
            n += m
            nfw += len(seg.extra)
        for node in gm.graph.nodes:
            if node.op not in ("placeholder", "output"):
                node.meta.setdefault("kiln_phase", "backward")

    fx_graphs.rename_placeholders(gm, names)
    phs = [p for p in gm.graph.nodes if p.op == "placeholder"]
    mutated = meta.all_mutated_indices
    n_args = len(state.flat_args)
    for i, p in enumerate(phs):
        if n_args <= i < n:         # a handoff primal (segments.py)
            p.meta.update(kiln_primal=True, kiln_static=False, kiln_mutated=False, kiln_requires_grad=True,
                          kiln_handoff=True)
        elif i < n:
            p.meta["kiln_primal"] = True
            p.meta["kiln_static"] = bool(state.static_mask[i])
            p.meta["kiln_mutated"] = i in mutated
            p.meta["kiln_requires_grad"] = bool(isinstance(primals[i], torch.Tensor) and primals[i].requires_grad)
            src = meta.inputs[i].source
            if src:
                p.meta["kiln_source"] = src
        else:
            p.meta["kiln_tangent"] = True
            p.meta["kiln_phase"] = "backward"
    fx_graphs.remove_aliases(gm)
    with_eager_layouts(gm, meta, reads_storage=_as_strided_of_intermediates(state.fn))
    fx_graphs.dce(gm)
    saved_inputs, saved_outputs = [], []
    if kind == "joint":
        saved_inputs, saved_outputs = meta.eager_saved_inputs(), meta.eager_saved_fw_outputs()
        mark_user_visible(gm, n_args, meta.num_fw_outputs, meta, saved_inputs, saved_outputs)
    gm.graph.lint()
    gm.recompile()
    fake_propagation.record_val_calls(gm.graph)     # (stage 2 then re-runs only what an edit changes)
    return AOTGraphCapture(
        graph_module=gm, kind=kind, num_primals=n, num_fw_outputs=nfw,
        tangent_positions=tangent_positions,
        fw_output_requires_grad=meta.fw_output_requires_grad() + [True] * (nfw - meta.num_fw_outputs),
        primal_requires_grad=[bool(isinstance(p, torch.Tensor) and p.requires_grad) for p in primals],
        example_inputs=example, state=state, eager_saved_inputs=saved_inputs,
        eager_saved_outputs=saved_outputs)


def with_eager_layouts(gm: torch.fx.GraphModule, meta, reads_storage: bool = False) -> None:
    """The outputs the caller gets as the graph returns them, and the intermediate bases of the
    views it takes again, with eager's dtypes and strides (a dtype a decomposition lost is cast
    back: the tangents are made with eager's). The traced
    (decomposed) value of an output can have another layout than eager's (a ``cat`` with an
    empty tensor, say), and the caller may read the strides (``view``, ``is_contiguous``, a
    stride-specialized graph after a break). Such an output is copied to eager's strides
    (``prims.copy_strided``, which a compiler fuses into the kernel that computes it). Static
    layouts only; sizes 0 and 1 do not count."""
    n_mut = len(meta.mutated_data_indices)
    out = fx_graphs.output_node(gm.graph)
    flat = list(out.args[0])
    changed = False
    # the outputs, and the intermediates whose views the runtime takes again with eager's
    # strides and offsets (``as_strided``: a base in another layout gives other elements)
    infos = [meta.outputs[k] for k in meta.graph_output_indices] + list(meta.intermediate_bases)
    for j, info in enumerate(infos):
        node = flat[n_mut + j]
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue
        dtype = fake_tensors.dtype_from_str(info.dtype) if info.dtype else val.dtype
        if dtype != val.dtype:      # (a decomposition that lost eager's type promotion)
            with _right_after(gm.graph, node):
                c = gm.graph.call_function(torch.ops.prims.convert_element_type.default, (node, dtype))
            c.meta = {key: v for key, v in node.meta.items() if key != "val"}
            with fake_tensors.fake_mode_of([val]):
                c.meta["val"] = val = torch.ops.prims.convert_element_type.default(val, dtype)
            node = flat[n_mut + j] = c
            changed = True
        if j >= len(meta.graph_output_indices) and reads_storage:
            # the caller's view of this intermediate is taken again with ``as_strided``, which
            # reads its storage: its elements follow the layout eager's kernel gave the
            # intermediate, which neither the trace nor the fake tensors know for sure
            # (torch.roll of a channels_last tensor: contiguous for both, not for eager)
            raise Unsupported("AOT autograd: a view of an intermediate that the function reads with "
                              "as_strided (the graph runs eagerly)")
        if info.stride is None or len(info.stride) != val.dim():
            continue
        if not all(isinstance(v, int) for v in (*val.shape, *val.stride(), *info.stride)):
            changed |= _symbolic_eager_layout(gm, flat, n_mut + j, node, val, info, j >= len(meta.graph_output_indices))
            continue
        if all(a == b for a, b, size in zip(val.stride(), info.stride, val.shape) if size > 1) \
                or any(size == 0 for size in val.shape):
            continue
        if j >= len(meta.graph_output_indices) and _read_by_storage(node):
            # an ``as_strided`` of this intermediate reads its storage, so its elements follow
            # the layout eager's kernel gave it; the trace and the fake tensors' op disagree
            # on that layout (torch.roll of a channels_last tensor), and neither is eager's
            raise Unsupported("AOT autograd: as_strided of an intermediate whose traced layout differs from "
                              "its op's declared layout (the graph runs eagerly)")
        with _right_after(gm.graph, node):
            c = gm.graph.call_function(torch.ops.prims.copy_strided.default, (node, list(info.stride)))
        c.meta = {key: v for key, v in node.meta.items() if key != "val"}
        with fake_tensors.fake_mode_of([val]):
            c.meta["val"] = torch.ops.prims.copy_strided.default(val, list(info.stride))
        flat[n_mut + j] = c
        changed = True
    if changed:
        out.args = (tuple(flat),)


_AS_STRIDED = (torch.as_strided, torch.Tensor.as_strided, "as_strided", torch.ops.aten.as_strided.default)


def _as_strided_of_intermediates(fn) -> bool:
    """The captured graph takes ``as_strided`` of a value it computed (not of an input): a
    view the runtime may take again of an intermediate, through its storage."""
    if not isinstance(fn, torch.fx.GraphModule):
        return False
    for n in fn.graph.nodes:
        if n.target in _AS_STRIDED and n.op in ("call_function", "call_method") and n.args \
                and isinstance(n.args[0], torch.fx.Node) and n.args[0].op != "placeholder":
            return True
    return False


def _read_by_storage(node: torch.fx.Node) -> bool:
    """``node``'s value is read through its storage (``as_strided`` of it), not its indices."""
    return any(u.op == "call_function" and u.target in (torch.ops.aten.as_strided.default,
                                                         torch.ops.aten.as_strided_copy.default)
               for u in node.users)


def _dense_order(shape, stride) -> list | None:
    """The dims of a dense layout (no gaps, no overlap) from outermost to innermost, read from
    the traced sizes' hints (a permutation of dims does not depend on the sizes); None when
    the layout is not dense."""
    sizes = [symbolic.hint(n) for n in shape]
    strides = [symbolic.hint(s) for s in stride]
    order = sorted(range(len(sizes)), key=lambda d: (-strides[d], -sizes[d], d))
    expected = 1
    for d in reversed(order):
        if sizes[d] > 1 and strides[d] != expected:
            return None
        expected *= max(sizes[d], 1)
    return order


def _symbolic_eager_layout(gm: torch.fx.GraphModule, flat: list, at: int, node: torch.fx.Node, val, info,
                           is_base: bool) -> bool:
    """``with_eager_layouts`` for symbolic sizes: a traced value whose dense layout orders its
    dims otherwise than eager's is copied into eager's order (permute, contiguous clone, permute
    back: no size enters the graph as an argument). An intermediate base must have eager's
    layout (its views are taken again with ``as_strided``, which reads the storage as eager's
    base laid it out); one whose eager layout is not dense cannot be rebuilt so, and the graph
    is compiled per shape instead."""
    want = _dense_order(val.shape, info.stride)
    if want is None:
        if is_base:
            raise Unsupported("AOT autograd: a dynamic graph returns a view of an intermediate whose "
                              "layout is not dense (compiled per shape)")
        return False
    if _dense_order(val.shape, val.stride()) == want:
        return False
    back = [want.index(d) for d in range(len(want))]
    steps = [(torch.ops.aten.permute.default, (want,), {}),
             (torch.ops.aten.clone.default, (), {"memory_format": torch.contiguous_format}),
             (torch.ops.aten.permute.default, (back,), {})]
    r, v = node, val
    with fake_tensors.fake_mode_of([val]):
        for i, (op, args, kwargs) in enumerate(steps):
            with _right_after(gm.graph, node) if i == 0 else gm.graph.inserting_after(r):
                r = gm.graph.call_function(op, (r, *args), kwargs)
            r.meta = {key: x for key, x in node.meta.items() if key != "val"}
            r.meta["val"] = v = op(v, *args, **kwargs)
    flat[at] = r
    return True


def _right_after(graph: torch.fx.Graph, node: torch.fx.Node):
    """Where a node that converts ``node`` goes: right after it (after the placeholders for an
    input), so that a later segment that reads the converted value in the fused forward comes
    after it, as a reader of ``node`` does."""
    if node.op != "placeholder":
        return graph.inserting_after(node)
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    return graph.inserting_before(first)


def mark_user_visible(gm: torch.fx.GraphModule, n: int, nfw: int, meta, saved_inputs, saved_outputs) -> None:
    """Mark the joint's primals and forward outputs the user sees (``kiln_user_visible``) and
    whether eager saves their memory (``kiln_eager_saved``): a partitioner that saves one eager
    does not would make backward() fail after the user changes it in place (the min-cut
    partitioner never does; stage 2 copies such a value when a partitioner does)."""
    mutated = set(meta.mutated_data_indices) | set(meta.metadata_only_mutated_indices)
    phs = [p for p in gm.graph.nodes if p.op == "placeholder"][:n]
    for i, p in enumerate(phs):
        if i not in mutated:
            p.meta["kiln_user_visible"] = True
            p.meta["kiln_eager_saved"] = i in saved_inputs
    n_mut = len(meta.mutated_data_indices)
    for k, o in enumerate(fx_graphs.flat_outputs(gm.graph)[:nfw]):
        if k >= n_mut and isinstance(o, torch.fx.Node):
            o.meta["kiln_user_visible"] = True
            o.meta["kiln_eager_saved"] = o.meta.get("kiln_eager_saved", False) or k in saved_outputs


def _trace(state: AOTState, f, args) -> torch.fx.GraphModule:
    try:
        # preserve_node_meta: each node records the ATen op it was decomposed from
        # (meta "original_aten"), which the activation policies read (saved_hooks.py)
        with trace_context.preserve_rng_state(), trace_context.no_mkldnn_decompositions(), \
                FunctionalTensorMode(_allow_token_discovery=True), fx_traceback.preserve_node_meta(), \
                _torch.lazy_graph_modules():      # (renamed and rewritten next: no code made yet)
            gm = make_fx(f, decomposition_table=state.decompositions)(*args)
    except _torch.DATA_DEPENDENT_ERRORS as e:
        raise Unsupported(f"AOT autograd: data-dependent operation ({type(e).__name__}: {e})") from e
    for node in gm.graph.nodes:
        # (a higher-order op, torch.cond, while_loop, a scan or map: make_fx traced its subgraphs into ATen)
        if node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload) \
                and node.target not in HIGHER_ORDER_OPS and not symbolic.is_sym_function(node.target):
            raise Unsupported(f"AOT autograd: the traced graph calls {node.target}, which is not an ATen op")
        if state.symbolic:
            symbolic.refuse_unbacked(node.meta.get("val"), f"{node.name} ({node.target})")
    return gm


def _tangent_for(state: AOTState, k: int) -> torch.Tensor:
    """A contiguous fake tangent for forward output ``k`` (the runtime makes grads contiguous)."""
    meta = state.meta
    mutated = meta.mutated_data_indices
    if k < len(mutated):
        p = state.flat_args[mutated[k]]
        shape, dtype, device = meta.inputs[mutated[k]].new_size, p.dtype, p.device
    else:
        o = meta.fw_output_info(k)
        shape, dtype, device = o.size, fake_tensors.dtype_from_str(o.dtype), torch.device(o.device)
    with state.fake_mode:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
