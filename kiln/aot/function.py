"""The autograd.Function nodes around a compiled forward and backward (the training callable).

One forward call computes every output. Autograd sees one node per *component*: outputs whose
gradients reach disjoint sets of inputs get separate nodes (``partial.components``), because
eager's autograd runs and frees its nodes one by one: backward() through one output must not
run, or free, what another output's backward needs. Most graphs are one component. (Within
one, a backward() through some outputs runs the nodes of all the component's inputs, with no
gradient: a non-leaf input whose own node saved tensors then cannot be backpropagated through
a second time without retain_graph=True, where eager may allow it.)

A graph whose differentiable output feeds another (segments.py) gets one node per segment;
its backward runs as one fused graph or node by node (``_Backward``).

Each node's backward gets None for the outputs backward() did not go through
(``set_materialize_grads(False)``): it passes zeros for them to the backward graph compiled
for the given tangents only (``partial.without_tangents``), leaves ``.grad`` None where eager's
autograd would not reach, and checks saved tensors as eager would (``versions.py``).
"""
from __future__ import annotations

import collections
import logging
import warnings
import weakref
from typing import Any, Callable

import torch
import torch.fx

from .._torch import (applied_saved_tensors_hooks, global_module_hooks_paused, inductor_view_to_reshape, is_symbolic,
                      saved_tensors_from_user_hooks, saved_tensors_hooks_paused)
from . import fx_graphs
from . import fake_tensors, fused_backward
from .double_backward import refusing_double_backward
from .grad_aliasing import distinct, outputs_may_share_memory
from . import partial as partial_backward
from . import versions
from .runtime import OutputsWithViews, _regenerate_view
from .symbolic import has_symbols

log = logging.getLogger("kiln.aot")


def caller(fn: Callable) -> Callable[[list], Any]:
    """Call a compiled graph with a list of arguments, boxed (the list is consumed) or not,
    with autocast off: the graph was traced under the caller's autocast, its casts are ops of
    the graph, and autocast applied again to its ATen ops would change their dtypes (a
    ``_safe_softmax`` traced in float32 returns bfloat16 under CPU autocast)."""
    call = fn if getattr(fn, "_boxed_call", False) else (lambda args: fn(*args))
    autocast_on, no_autocast = torch._C._is_any_autocast_enabled, torch._C._DisableAutocast

    def graph_call(args):
        if autocast_on():
            with no_autocast():
                return call(args)
        return call(args)
    return graph_call


def layout_checked(call: Callable[[list], Any], gm: torch.fx.GraphModule | Callable[[], torch.fx.GraphModule],
                   what: str, symbolic: bool | None = None, tangents: int = 0) -> Callable[[list], Any]:
    """``call`` (a compiled backward), or the graph run as ATen ops where the compiled code
    cannot take its inputs:

    - once a saved value comes in another layout than the one it was compiled for. Inductor
      checks its inputs' strides before it runs anything, so nothing ran; the graph with its
      views as reshapes reads any layout. Better a slower backward than kiln's layout
      assumption reaching the user (a dynamic graph whose forward laid a saved value out
      otherwise). A static graph is compiled for the layouts its forward really returns
      (``_restride_saved``) and is called as it is;
    - for a call whose gradient is a tensor subclass (among the last ``tangents`` inputs): an
      output of the graph met a subclass in eager code (a DTensor, a wrapper tensor). The graph
      was compiled for plain tensors, whose memory the compiled code reads directly; its ATen
      ops dispatch to the subclass as eager's do.

    ``gm``: the graph, or (a backward loaded from a cache entry) what builds it when needed,
    with ``symbolic`` saying whether its inputs have symbolic sizes."""
    if symbolic is None:
        symbolic = any(is_symbolic(d) for p in gm.graph.find_nodes(op="placeholder")
                       if isinstance(v := p.meta.get("val"), torch.Tensor) for d in (*v.shape, *v.stride()))
    if not symbolic and not tangents:
        return call
    as_aten: list = []

    def aten() -> Callable[[list], Any]:
        if not as_aten:
            g = fx_graphs.copy_graph_module(gm if isinstance(gm, torch.fx.GraphModule) else gm())
            inductor_view_to_reshape(g)
            as_aten.append(caller(g))
        return as_aten[0]

    layout_fallback = False

    def run(args):
        nonlocal layout_fallback
        if tangents and _has_subclass(args, len(args) - tangents):
            return aten()(args)
        if layout_fallback:
            return aten()(args)
        if not symbolic:
            return call(args)
        kept = list(args)        # (a boxed call empties the list it is given)
        try:
            return call(args)
        except AssertionError as e:
            if "stride" not in str(e):
                raise
            layout_fallback = True
            warnings.warn(f"kiln: {what} got a saved value in another layout than it was compiled "
                          f"for ({str(e).splitlines()[0][:200]}); it runs as ATen ops from now on.",
                          RuntimeWarning, stacklevel=2)
            return aten()(kept)
    return run


def _has_subclass(args: list, start: int) -> bool:
    """Whether an argument from ``start`` on is an instance of a tensor subclass."""
    for a in args[max(start, 0):]:
        t = type(a)
        if t is not torch.Tensor and t is not torch.nn.Parameter and isinstance(a, torch.Tensor):
            return True
    return False


def view_outputs(fw: Callable, parts) -> list[int]:
    """Forward outputs that may come out as views of tensors internal to the graph (a
    functional graph returns ``view(buffer)`` for a value eager changed through a view). Such
    an output of the autograd.Function would be a view "created inside a custom Function" (or
    under no_grad, for the inference graph) and autograd would refuse in-place writes to it
    that eager allows: the runtime returns it detached from that base (same memory). Views
    eager makes are re-taken outside (``alias_of_*`` outputs). For graphs run as FX, only the
    outputs that are view ops; for other compilers, any."""
    outs = fx_graphs.flat_outputs(parts.forward.graph)[:parts.num_fw_outputs]
    if getattr(fw, "graph_module", None) is None:
        return list(range(len(outs)))
    return [k for k, o in enumerate(outs) if isinstance(o, torch.fx.Node) and fx_graphs.is_view(o)]


def detach_views(outs, view_outs: list[int]):
    for k in view_outs:
        o = outs[k]
        if isinstance(o, torch.Tensor) and o._base is not None:
            if not isinstance(outs, list):
                outs = list(outs)
            outs[k] = o.detach()
    return outs


def _static_zeros(parts) -> dict | None:
    """(shape, dtype, device) of each forward output that gets a tangent, when static."""
    outs = fx_graphs.flat_outputs(parts.forward.graph)
    metas = {}
    for k in parts.tangent_positions:
        v = outs[k].meta.get("val") if isinstance(outs[k], torch.fx.Node) else None
        if not isinstance(v, torch.Tensor) or any(has_symbols(d) for d in v.shape):
            return None
        metas[k] = (tuple(int(d) for d in v.shape), v.dtype, v.device)
    return metas


class _Call:
    """One call's forward results, computed by the first node's forward, read by the others."""
    __slots__ = ("args", "result", "backward")

    def __init__(self, args, backward=None):
        self.args = args
        self.result = None
        self.backward = backward


class _Selection:
    """(segments) The saved tensors one node keeps of a call's ``n``: ``kept``, their indices
    among the call's; ``watch`` and ``demand``, the version-check fields for them, by their
    place in the node's own list; ``saved_positions``, the position among the graph's saved
    values of each kept one that is not a checked extra (those come last)."""
    __slots__ = ("kept", "n", "watch", "demand", "saved_positions")

    def __init__(self, kept: list, n: int, positions: list, watch: list, demand: list, everything: frozenset):
        self.kept, self.n = kept, n
        place = {i: k for k, i in enumerate(kept)}
        self.watch = [(place[pos], need) for pos, need in watch if pos in place]
        self.demand = [demand[i] if i < len(demand) else (everything,) for i in kept]
        self.saved_positions = [positions[i] for i in kept if i < len(positions)]

    def spread(self, values: list) -> list:
        """The node's values laid out as the call's: None where another node keeps one."""
        out = [None] * self.n
        for i, v in zip(self.kept, values):
            out[i] = v
        return out


class _Backward:
    """(segments) One call's backward across its nodes. The node that runs first (the last
    segment's) decides how: ``fused``, one graph for every segment, run by the first segment's
    node, which takes all of the function's inputs (the nodes before it hand it their saved
    values and their outputs' gradients, and pass None on to the values handed to them); or
    one piece per node, eager's order, whose gradients for the function's inputs the first
    segment's node returns. Holds no output (a reference cycle through autograd's C++ nodes):
    weak references to the handed outputs the user has."""
    __slots__ = ("task", "fused", "observed", "handed", "tangents", "saved", "grads")

    def __init__(self):
        self.task = None
        self.fused = False
        self.observed = False    # a hook on a handed output's node (``_observed_by_hooks``)
        self.handed: list = []
        self.tangents: dict = {}
        self.saved: dict = {}
        self.grads: dict = {}

    def begin(self, task: int, fused: bool) -> None:
        self.task, self.fused = task, fused
        self.tangents.clear()
        self.saved.clear()
        self.grads.clear()

    def retained(self) -> bool:
        return any(t is not None and t.retains_grad for t in (r() for r in self.handed))


class _WatchedHooks(collections.OrderedDict):
    """The hook dict of a handed output that is a rebuilt view: a hook put in it (the user's
    ``register_hook``) makes the call's backward run node by node."""

    def __init__(self, state: _Backward):
        super().__init__()
        self.state = state

    def __setitem__(self, key, value):
        self.state.observed = True
        super().__setitem__(key, value)


def _plain_backward_probe():
    """A leaf the first segment's node also takes (its gradient is always None), and its
    gradient node. Autograd runs that node in a backward() without ``inputs=`` only: in
    ``autograd.grad`` or ``backward(inputs=...)`` a handed output may be one of the inputs,
    whose gradient autograd captures at its node, so the nodes must each run their own piece."""
    leaf = torch.zeros((), requires_grad=True)
    with torch.enable_grad():         # the module may first be imported under no_grad (kiln loads lazily)
        return leaf, leaf.view(()).grad_fn.next_functions[0][0]


_PROBE, _PROBE_NODE = _plain_backward_probe()


def _handed_back(parts, n_args: int) -> dict[int, frozenset]:
    """(segments) Per tangent, the tangents whose gradient flows back into its output: those of
    the segments that read the output as a handoff, and of the segments reading theirs."""
    readers: dict = {}              # forward output -> segments reading it
    for c, (_, _, ins) in enumerate(parts.segments):
        for i in ins:
            if i >= n_args:
                readers.setdefault(parts.handoffs[i - n_args][1], set()).add(c)
    below: dict = {}

    def downstream(c: int) -> frozenset:
        """Tangents of segment ``c`` and of every segment that reads from it."""
        if c not in below:
            below[c] = frozenset()     # (segments form a chain: no cycle, but stay finite)
            tangents, outputs, _ = parts.segments[c]
            found = set(tangents)
            for p in outputs:
                for d in readers.get(p, ()):
                    found |= downstream(d)
            below[c] = frozenset(found)
        return below[c]

    out = {}
    for tangents, _, _ in parts.segments:
        for j in tangents:
            p = parts.tangent_positions[j]
            out[j] = frozenset().union(*[downstream(d) for d in readers.get(p, ())])
    return out


def _node_by_node_reason(ctx, state: _Backward) -> str | None:
    """Why a segmented call's backward cannot run as one graph (None: it can)."""
    if state.observed:
        return "a hook on a handed output or its node"
    if ctx.kiln_user_hooks:
        return "saved-tensor hooks were active in the forward"
    if not torch._C._will_engine_execute_node(_PROBE_NODE):
        return "autograd.grad or backward(inputs=...), which may name a handed output"
    if state.retained():
        return "retain_grad() on a handed output"
    return None


def _observed_by_hooks(node_cls) -> None:
    """A hook on a node's output (``Tensor.register_hook``, a module's or a multi-grad hook)
    or on the node must see the gradient the later segments give it: the call's backward then
    runs node by node."""
    bw_cls = node_cls._backward_cls

    def _register_hook_dict(self, tensor):
        self.kiln_backward.observed = True
        return super(bw_cls, self)._register_hook_dict(tensor)

    def register_hook(self, fn):
        self.kiln_backward.observed = True
        return super(bw_cls, self).register_hook(fn)

    def register_prehook(self, fn):
        self.kiln_backward.observed = True
        return super(bw_cls, self).register_prehook(fn)
    bw_cls._register_hook_dict = _register_hook_dict
    bw_cls.register_hook = register_hook
    bw_cls.register_prehook = register_prehook


def _copies(tensors: list) -> list:
    """Copies of ``tensors`` (same strides): one multi-tensor copy per device and dtype (a
    kernel launch, not one per tensor: a ResNet copies a BatchNorm bias per layer), a strided
    copy for the rest (layouts other than contiguous; ``clone`` would lay a view with gaps,
    a key split from a fused projection, out contiguously, and the backward compiled for the
    view's strides would refuse it)."""
    out = [None] * len(tensors)
    groups: dict = {}
    for i, t in enumerate(tensors):
        if t.is_contiguous():
            groups.setdefault((t.device, t.dtype), []).append(i)
        else:
            out[i] = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)
    for idx in groups.values():
        dst = [torch.empty_like(tensors[i]) for i in idx]
        torch._foreach_copy_(dst, [tensors[i] for i in idx])
        for i, d in zip(idx, dst):
            out[i] = d
    return out


def backward_key(kind: str, given: frozenset) -> str:
    """The name of a backward graph made at run time for the tangents ``given`` (``partial``:
    one node's backward without some tangents; ``node``: a segment's own; ``fused``: a
    segmented graph's as one), the same in every process: a cache entry stores each compiled
    one under it (``gm.meta["kiln_backward_key"]``)."""
    return f"{kind}:{','.join(str(j) for j in sorted(given))}"


class BackwardTable:
    """The backward graphs a training graph made and compiled at run time, by
    ``backward_key``: ``(compiled, kept inputs or None: all)``. Graphs of one cache entry
    share one table (``share_with``): the layers of a model compiled one by one each hold the
    same entry, and each compiled the same backwards again."""

    def __init__(self) -> None:
        self.made: dict = {}

    def share_with(self, other: "BackwardTable") -> None:
        other.made.update((k, v) for k, v in self.made.items() if k not in other.made)
        self.made = other.made


def make_training_core(fw: Callable, bw: Callable, parts, compile_bw: Callable[[torch.fx.GraphModule], Callable],
                       check: Callable[[tuple, bool], None], stored: dict | None = None) -> Callable:
    """``stored``: backward graphs made at run time that a cache entry holds compiled,
    ``backward_key`` -> a function that loads ``(compiled, kept inputs)``: used instead of
    building and compiling the graph."""
    view_outs = view_outputs(fw, parts)
    n_tangents = len(parts.tangent_positions)
    fw, bw = caller(fw), (None if bw is None else
                          layout_checked(caller(bw), parts.backward, "the backward", tangents=n_tangents))
    # (whether the backward's gradients can share memory: checked per call only then)
    bw_may_alias = parts.backward is None or outputs_may_share_memory(parts.backward.graph)
    nfw = parts.num_fw_outputs
    tangent_positions = list(parts.tangent_positions)
    nondiff = {k for k, rg in enumerate(parts.fw_output_requires_grad) if not rg}
    deps = [frozenset(d) for d in parts.grad_dependencies] if parts.grad_dependencies is not None else None
    static_zeros = _static_zeros(parts)
    # (static shapes) a backward through some outputs frees what only the ops it ran read
    drop_spent = not parts.symbolic
    check_inputs, check_outputs = list(parts.check_inputs), list(parts.check_outputs)
    copy_saved = list(parts.copy_saved)
    saving_outputs = frozenset(parts.eager_saving_outputs)
    watch = [(pos, frozenset(need)) for pos, need in parts.watch]
    late_demand = {j: frozenset(need) for j, need in parts.late_demand}
    saved_demand = [[frozenset(u) for u in uses] for uses in parts.saved_demand]
    n_checked = len(check_inputs) + len(check_outputs)
    table = BackwardTable()
    stored = stored or {}
    segmented = parts.segments is not None
    n_saved = len(fx_graphs.flat_outputs(parts.forward.graph)) - nfw
    n_args = len(parts.primal_requires_grad) - len(parts.handoffs)
    fused_graph: list = []      # (segments) built when first needed: None where it cannot be
    # (segments) the saved values some node keeps (every one, where that is not known)
    kept_by_nodes = frozenset(range(n_saved)) if parts.segment_reads is None else \
        frozenset().union(*parts.segment_reads)
    can_fuse: list = []         # (segments) whether the backward can run as one graph, once known
    logged: set = set()
    last_positions: list = [None]   # (segments) the saved tensors' positions of the last call

    def compiled_backward(key: str, build: Callable[[], tuple], what: str) -> tuple:
        """The backward named ``key``: loaded from the cache entry, or ``build()`` (its graph
        and kept inputs) compiled."""
        made = table.made
        got = made.get(key)
        if got is None:
            load = stored.get(key)
            if load is not None:
                call, kept = load()
                got = (layout_checked(caller(call), lambda: build()[0], what, parts.symbolic, n_tangents), kept)
            else:
                with global_module_hooks_paused():
                    gm, kept = build()
                    gm.meta["kiln_backward_key"] = key
                    gm.meta["kiln_kept_inputs"] = kept
                    got = (layout_checked(caller(compile_bw(gm)), gm, what, tangents=n_tangents), kept)
            made[key] = got
        return got

    def backward_for(given: frozenset):
        # (without the inputs it does not read: a saved value freed by an earlier backward is
        # None, which a compiled graph must not be handed even where it does not read it)
        return compiled_backward(
            backward_key("partial", given),
            lambda: partial_backward.reading_only(
                partial_backward.without_tangents(parts.backward, n_tangents, given), n_saved),
            "a partial backward")

    def node_backward_for(given: frozenset):
        return compiled_backward(
            backward_key("node", given),
            lambda: partial_backward.reading_only(
                partial_backward.without_tangents(parts.backward, n_tangents, given), n_saved),
            "a segment's backward")

    def fused_backward_for(given: frozenset):
        """(segments) The whole backward as one graph, for the tangents ``given``."""
        return compiled_backward(
            backward_key("fused", given),
            lambda: partial_backward.reading_only(
                partial_backward.without_tangents(fused(), n_tangents, given), n_saved),
            "the backward")

    def fused():
        if not fused_graph:
            fused_graph.append(_fused_graph(parts, n_saved, n_args))
        return fused_graph[0]

    def fusable() -> bool:
        if not can_fuse:      # (a stored or shared fused backward says so without building the graph)
            can_fuse.append(any(k.startswith("fused:") for k in (*stored, *table.made)) or fused() is not None)
        return can_fuse[0]

    def run_forward(call: _Call):
        args = call.args
        outs = fw(list(args))
        saved = outs[nfw:]
        fw_outs = tuple(detach_views(outs[:nfw], view_outs) if view_outs else outs[:nfw])
        if copy_saved:
            saved = list(saved)
            saved_copies = _copies([saved[j] for j in copy_saved])
            for j, c in zip(copy_saved, saved_copies):
                saved[j] = c
        tensors = [s for s in saved if isinstance(s, torch.Tensor)]
        other = None if len(tensors) == len(saved) else \
            [(i, s) for i, s in enumerate(saved) if not isinstance(s, torch.Tensor)]
        # (segments) the saved position of each tensor, for the nodes that save some only
        positions = None
        if segmented:
            positions = [i for i, s in enumerate(saved) if isinstance(s, torch.Tensor)]
            if positions == last_positions[0]:
                positions = last_positions[0]   # (the nodes find their selection by its identity)
            else:
                last_positions[0] = positions
        # saved only so that backward() checks their version counters, as eager's does
        tensors += [args[i] for i in check_inputs] + [fw_outs[k] for k in check_outputs]
        if several_nodes:
            # a node that saves another node's output (or a view of it) keeps that node alive:
            # autograd saves a tensor that is not the node's own output with its grad_fn, which
            # the other node's apply sets later. Two nodes that save each other's outputs are a
            # cycle through C++ that the gc never frees, and with them the call's inputs (fuzz
            # seed 3629). An alias shares the memory and the version counter (the checks stay)
            # but not the autograd history. The call's inputs stay as they are (their history
            # is older than these nodes). A value the graph made that is neither an output nor a
            # view gets no history: kept as it is.
            arg_ids = {id(a) for a in args}
            out_ids = {id(o) for o in fw_outs}
            tensors = [t.detach() if (id(t) in out_ids or t._is_view()) and id(t) not in arg_ids else t
                       for t in tensors]
        sizes = None if static_zeros is not None else \
            {k: (fw_outs[k].shape, fw_outs[k].dtype, fw_outs[k].device) for k in tangent_positions}
        call.result = (fw_outs, tensors, other, sizes, positions)

    def zeros_for(ctx, k):
        shape, dtype, device = (static_zeros or ctx.kiln_sizes)[k]
        return torch.zeros(shape, dtype=dtype, device=device)

    def _missing(ctx, i: int, n_saved_args: int):
        """(segments) A backward input that is None: a tangent backward() did not give is zeros;
        a saved value the node did not keep is kiln's error."""
        if i >= n_saved_args:
            return zeros_for(ctx, tangent_positions[i - n_saved_args])
        raise RuntimeError(f"kiln: a segment's backward reads saved value {i}, which its node did not keep")

    def node_class(tangents: list[int], outputs: list[int], primals: list[int], first: bool = True,
                   last: bool = True, node_index: int = 0):
        """The autograd.Function of one component: ``tangents`` (indices of tangents), the
        forward ``outputs`` it returns, the ``primals`` it takes. (segments: ``first`` and
        ``last``, the node of the first and of the last segment.)"""
        mine = frozenset(tangents)
        whole = len(mine) == n_tangents
        eager_saves = parts.eager_saves if not several_nodes else \
            not saving_outputs.isdisjoint(outputs)
        position_of = {k: p for p, k in enumerate(outputs)}
        my_tangents = [(j, tangent_positions[j]) for j in tangents]
        out_nondiff = [k for k in outputs if k in nondiff]
        # (segments) the saved values this node's backward reads
        reads = None
        if segmented:
            kept = parts.segment_reads[node_index] if parts.segment_reads is not None else \
                partial_backward.inputs_read(parts.backward, n_tangents, mine, n_saved)
            reads = frozenset(i for i in kept if i < n_saved)
            # the inputs eager saved that this node takes (their versions are checked at its
            # backward), and the outputs eager saved (every node)
            my_checks = [i in primals for i in check_inputs] + [True] * len(check_outputs)
            selections: dict = {}

            def selection(positions: list, n: int) -> _Selection:
                """What this node saves of the call's ``n`` tensors, laid out as ``positions``
                (the same list object for every node of a call, and across calls while the
                layout holds): found once, so that a node costs its own values, not all."""
                got = selections.get(id(positions))
                if got is not None and got[0] is positions:
                    return got[1]
                n_sv = len(positions)
                kept = [i for i in range(n) if (positions[i] in reads if i < n_sv else my_checks[i - n_sv])]
                sel = _Selection(kept, n, positions, watch, saved_demand, mine)
                selections.clear()
                selections[id(positions)] = (positions, sel)
                return sel

        class KilnAOTFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, call, *primals_):
                # None for the gradient of an output backward() did not go through
                ctx.set_materialize_grads(False)
                if call.result is None:
                    run_forward(call)
                fw_outs, tensors, other, sizes, positions = call.result
                ctx.kiln_other = other
                ctx.kiln_sizes = sizes
                ctx.kiln_backward = call.backward
                ctx.kiln_mine = mine
                # the user's eager saved-tensor hooks pack what this node saves (not inlined)
                ctx.kiln_user_hooks = applied_saved_tensors_hooks() is not None
                node_watch = watch
                if reads is not None:       # (segments) only what this node's backward reads
                    sel = selection(positions, len(tensors))
                    tensors = [tensors[i] for i in sel.kept]
                    ctx.kiln_selection = sel
                    node_watch = sel.watch
                ctx.save_for_backward(*tensors)
                ctx.kiln_saved_count = len(tensors)
                # (eager's nodes behind this node's outputs saved tensors)
                ctx.kiln_eager_saves = eager_saves
                ctx.kiln_slots = len(tensors)
                if node_watch:
                    # (several nodes: the saved tensors that could hold a node are aliases already)
                    ctx.kiln_watch = versions.record(tensors, node_watch, aliases=several_nodes)
                mine_out = tuple(fw_outs[k] for k in outputs)
                if out_nondiff:
                    ctx.mark_non_differentiable(*[fw_outs[k] for k in out_nondiff
                                                  if isinstance(fw_outs[k], torch.Tensor)])
                return mine_out

            @staticmethod
            def backward(ctx, *grad_outs):
                if torch.is_grad_enabled():
                    if parts.create_graph_refused:
                        raise RuntimeError(
                            "kiln: create_graph=True through a compiled graph whose custom "
                            "autograd.Function's backward reads torch.is_grad_enabled() or its gradients' "
                            "requires_grad (it was compiled as it runs without create_graph). Call the "
                            "Function from a function decorated with torch.compiler.disable.")
                    # create_graph=True: the gradients are right, but the backward graph is not
                    # differentiable: they carry a node that refuses a second differentiation
                    with torch.no_grad():
                        grads = KilnAOTFunction.backward(ctx, *grad_outs)
                    return refusing_double_backward(ctx, grads)
                given = set()
                tangents_ = [None] * n_tangents
                for j, k in my_tangents:
                    g = grad_outs[position_of[k]]
                    if g is not None:
                        given.add(j)
                        tangents_[j] = g if g.is_contiguous() else g.contiguous()
                if segmented:
                    state = ctx.kiln_backward
                    task = torch._C._current_graph_task_id()
                    if state.task != task:      # the first node this backward runs
                        why = _node_by_node_reason(ctx, state) if last else None
                        state.begin(task, last and why is None and fusable())
                        if why is not None and why not in logged:
                            logged.add(why)
                            log.info("kiln AOT: a segmented backward runs node by node: %s", why)
                    if state.fused:
                        return hand_to_first(ctx, state, tangents_, given, primals) if not first else \
                            run_fused(ctx, state, tangents_, given, primals)
                if not segmented:       # (a node's own backward reads the given tangents only)
                    for j in range(n_tangents):
                        if tangents_[j] is None:
                            tangents_[j] = zeros_for(ctx, tangent_positions[j])
                partial = None if whole and len(given) == n_tangents else frozenset(given)
                versions.run_late_checks(ctx, partial, late_demand)
                sel = getattr(ctx, "kiln_selection", None)
                if sel is None:
                    args = versions.unpack(ctx, partial, watch, saved_demand, mine, drop_spent)
                else:
                    args = sel.spread(versions.unpack(ctx, partial, sel.watch, sel.demand, mine, drop_spent))
                if len(args) < ctx.kiln_slots:      # (a node that saved nothing, unpacked again)
                    args = [None] * ctx.kiln_slots    # (a node's own selection is spread already)
                ctx.maybe_clear_saved_tensors()     # the graph frees each after its last use
                if n_checked:
                    del args[len(args) - n_checked:]
                if ctx.kiln_other is not None:
                    for i, s in ctx.kiln_other:
                        args.insert(i, s)
                n_saved_args = len(args)
                args += tangents_
                del tangents_
                if segmented:
                    fn, kept = node_backward_for(mine if partial is None else partial)
                    if partial is not None and any(i < n_saved_args and i not in reads for i in kept):
                        # (a dynamic graph: the backward without some tangents sizes their zeros
                        # from saved sizes this node did not keep) its whole backward instead, with
                        # zeros for the tangents not given: the same gradients
                        fn, kept = node_backward_for(mine)
                    args = [args[i] if args[i] is not None else _missing(ctx, i, n_saved_args) for i in kept]
                elif partial is None:
                    fn = bw
                else:
                    fn, kept = backward_for(partial)
                    if kept is not None:
                        args = [args[i] for i in kept]
                if ctx.kiln_user_hooks:
                    with saved_tensors_from_user_hooks():
                        grads = fn(args)
                else:
                    grads = fn(args)
                if partial is not None and deps is not None:
                    # eager's autograd never reaches a leaf from an output backward() skipped
                    grads = [None if deps[i].isdisjoint(partial) else g for i, g in enumerate(grads)]
                if segmented:
                    return segment_grads(ctx.kiln_backward, grads, primals, first)
                mine_grads = [grads[i] for i in primals]
                return (None, *(distinct(mine_grads) if partial is not None or bw_may_alias else mine_grads))

        KilnAOTFunction.__name__ = "KilnAOTFunction"
        KilnAOTFunction.kiln_aot = True      # (versions.attach_late_checks finds its nodes by it)
        if segmented:
            _observed_by_hooks(KilnAOTFunction)
        return KilnAOTFunction

    def saved_values(ctx, state, given: set) -> None:
        """(segments, fused) This node's saved values, checked as eager would, into ``state``
        (``given``: the tangents backward() brought to this node; a value only the others need
        may have changed in place since the forward, as eager allows). A gradient handed back
        from a later segment reaches this node's outputs too: eager runs (and frees) their
        nodes then, as for a tangent."""
        given = set(given) | {j for j in ctx.kiln_mine if not handed_back[j].isdisjoint(state.tangents)}
        partial = None if ctx.kiln_mine <= given else frozenset(given)
        versions.run_late_checks(ctx, partial, late_demand)
        sel = ctx.kiln_selection
        args = versions.unpack(ctx, partial, sel.watch, sel.demand, ctx.kiln_mine, drop_spent)
        ctx.maybe_clear_saved_tensors()
        if ctx.kiln_other is not None:
            for i, s in ctx.kiln_other:
                state.saved[i] = s
        # (the node's own values only: the checked ones, after the saved, are not the graph's)
        for i, v in zip(sel.saved_positions, args):
            if v is not None:
                # (a saved output would hold its node, and that node this state: a cycle)
                state.saved[i] = v.detach() if v.grad_fn is not None else v

    def hand_to_first(ctx, state, tangents_: list, given: set, primals: list) -> tuple:
        for j in given:
            state.tangents[j] = tangents_[j]
        saved_values(ctx, state, given)
        return (None,) + (None,) * len(primals)

    def run_fused(ctx, state, tangents_: list, given: set, primals: list) -> tuple:
        for j in given:
            state.tangents[j] = tangents_[j]
        saved_values(ctx, state, given)
        todo = frozenset(state.tangents)
        if not todo:
            state.begin(None, False)
            return (None,) + (None,) * len(primals)
        fn, kept = fused_backward_for(todo)
        if any(i < n_saved and i not in kept_by_nodes for i in kept):
            # (as for one node: a backward without some tangents may read saved sizes that no
            # node kept) the whole backward, with zeros for the tangents not given
            fn, kept = fused_backward_for(frozenset(range(n_tangents)))
        values = [state.saved.get(i) for i in range(n_saved)] + [state.tangents.get(j) for j in range(n_tangents)]
        state.begin(None, False)
        args = [values[i] if values[i] is not None else _missing(ctx, i, n_saved) for i in kept]
        del values
        grads = fn(args)
        return (None, *distinct([grads[i] if i < n_args else None for i in primals]))

    def segment_grads(state, grads: list, primals: list, first: bool) -> tuple:
        """(segments, node by node) A later node's gradients for the function's inputs wait for
        the first node, which takes those inputs."""
        if not first:
            for i, g in enumerate(grads[:n_args]):
                if g is not None:
                    have = state.grads.get(i)
                    state.grads[i] = g if have is None else have + g
            return (None, *distinct([grads[i] for i in primals]))
        out = []
        for i in primals:
            g = grads[i] if i < len(grads) else None
            more = state.grads.pop(i, None)
            out.append(g if more is None else more if g is None else g + more)
        return (None, *distinct(out))

    # (segments) per tangent: the tangents of later segments whose gradient comes back
    # through its output (the segments reading that output, and theirs in turn)
    handed_back = _handed_back(parts, n_args) if segmented else {}
    groups = parts.segments if segmented else \
        partial_backward.components(parts, fx_graphs.flat_outputs(parts.forward.graph)[:nfw])
    if segmented:
        # the first segment's node takes every input of the function (and the probe, last);
        # a later one the values handed to it only
        owned = sorted({i for _, _, ins in groups for i in ins if i < n_args})
        groups = [(t, o, owned + [len(parts.primal_requires_grad)] if c == 0 else [i for i in ins if i >= n_args])
                  for c, (t, o, ins) in enumerate(groups)]
    several_nodes = len(groups) > 1
    nodes = [node_class(t, o, p, first=c == 0, last=c == len(groups) - 1, node_index=c).apply
             for c, (t, o, p) in enumerate(groups)]
    if segmented:
        run_nodes = _segment_runner(parts, nodes, groups, nfw)
    elif len(groups) == 1:
        apply, (_, _, primals) = nodes[0], groups[0]

        def run_nodes(args):
            return apply(_Call(args), *[args[i] for i in primals])
    else:
        def run_nodes(args):
            call = _Call(args)
            results: list = [None] * nfw
            for apply, (_, outputs, primals) in zip(nodes, groups):
                for k, o in zip(outputs, apply(call, *[args[i] for i in primals])):
                    results[k] = o
            return tuple(results)

    entry_grad = parts.grad_enabled
    if parts.hooks is not None:
        # the saved-tensor hooks ran in the graphs (saved_hooks.py): autograd must not run
        # them again on what the Function saves
        plain_nodes = run_nodes

        def run_nodes(args):
            with saved_tensors_hooks_paused():
                return plain_nodes(args)

    grad_enabled = torch.is_grad_enabled

    def training_core(*args):
        check(args, grad_enabled())
        if entry_grad:
            return run_nodes(args)
        with torch.enable_grad():     # entered under no_grad; the graph turns grad mode on
            return run_nodes(args)
    training_core.autograd_functions = nodes
    training_core.backward_table = table
    return training_core


def _segment_runner(parts, nodes: list, groups: list, nfw: int) -> Callable:
    """(segments) Apply the nodes in order over one call: a later node takes the handed values,
    as the earlier node returned them, as inputs; a handed output that is a view of an
    intermediate is rebuilt here, and that very view is what the caller gets
    (``runtime.OutputsWithViews``), so that its hooks see the later nodes' gradient."""
    n_in = len(parts.primal_requires_grad)
    n_args = n_in - len(parts.handoffs)
    feeds = [tuple(f) for f in parts.handoffs]
    n_user = nfw - parts.num_handed_outputs
    views = [f for f in feeds if f[0] == "view"]
    infos, shapes = {}, None
    if views:
        w = next(w for w in parts.wrappers if w.kind == "mutations_and_aliases")
        infos = {f[2]: w.meta.outputs[f[2]] for f in views}
        shapes = w._runtime_shapes()

    handed = sorted({f[1] for f in feeds if f[0] == "out" and f[1] < n_user})

    def run_nodes(args):
        state = _Backward()
        call = _Call(args, state)
        results: list = [None] * nfw
        rebuilt: dict = {}
        geo = shapes(args) if shapes is not None else {}

        def fed(f):
            if f[0] == "out":
                return results[f[1]]
            v = rebuilt.get(f[2])
            if v is None:
                v = rebuilt[f[2]] = _regenerate_view(results[f[1]], infos[f[2]], geo.get(("out", f[2])))
            return v
        for apply, (_, outputs, inputs) in zip(nodes, groups):
            values = [args[i] if i < n_args else fed(feeds[i - n_args]) if i < n_in else _PROBE for i in inputs]
            for k, o in zip(outputs, apply(call, *values)):
                results[k] = o
        state.handed = [weakref.ref(results[k]) for k in handed if isinstance(results[k], torch.Tensor)]
        for k, v in rebuilt.items():
            if k < n_user and v.requires_grad:
                state.handed.append(weakref.ref(v))
                # (its node is autograd's view node: a hook on it is seen by this dict)
                v._backward_hooks = _WatchedHooks(state)
                v.grad_fn._register_hook_dict(v)
        out = results[:n_user]
        return OutputsWithViews(out, rebuilt) if rebuilt else tuple(out)
    return run_nodes


def _fused_graph(parts, n_saved: int, n_args: int) -> torch.fx.GraphModule | None:
    """(segments) The backward as one graph (``fused_backward.fuse``); None where it cannot be
    one, and the nodes always run one piece each."""
    views = {}
    feeds = [tuple(f) for f in parts.handoffs]
    if any(f[0] == "view" for f in feeds):
        w = next(w for w in parts.wrappers if w.kind == "mutations_and_aliases")
        for f in feeds:
            if f[0] == "view":
                o = w.meta.outputs[f[2]]
                views[f[2]] = (tuple(o.size), tuple(o.stride), o.rel_offset)
    # (a loaded artifact's graph has fake values on its placeholders only, made on first need:
    # without them on its nodes, the fusion cannot add the gradients and its nodes ran one
    # piece each, each compiled on its own)
    fake_tensors.ensure_vals(parts.backward)
    partial_backward.ensure_node_vals(parts.backward)
    try:
        return fused_backward.fuse(parts.backward, num_saved=n_saved, num_args=n_args, feeds=feeds,
                       tangent_positions=list(parts.tangent_positions), views=views)
    except Exception as e:      # (kiln's own failure: the pieces are exact without it)
        warnings.warn(f"kiln: the segmented backward could not be fused ({type(e).__name__}: {e}); its nodes "
                      f"run one piece each", RuntimeWarning, stacklevel=2)
        return None
