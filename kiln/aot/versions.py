"""Eager's version-counter checks, for the one autograd.Function kiln compiles a graph into.

Eager's autograd saves tensors per op and, at backward time, refuses a saved tensor that was
changed in place since ("one of the variables needed for gradient computation has been
modified by an inplace operation"), and only for the ops backward() actually goes through. A
compiled graph saves what its partitioner chose, in one node for all its outputs. A user who
changes an input or an output in place between the call and backward() must see eager's
outcome:

* what eager saves is recorded while the metadata is collected (``recording_saves``);
* a primal or forward output whose memory eager saves (``InputInfo.saved_by_eager``) and that
  the partition does not save as is is saved again, only to be checked (``check_inputs``,
  ``check_outputs``); a mutated input eager saved is checked against its version after the
  copy-back (``late``, attached by the runtime wrapper);
* a saved value that aliases an input or output eager does not save is copied at forward time
  (``copy_saved``): the user may change the original, eager allows it; so is a saved value
  that aliases a mutated input, which the runtime overwrites right after the forward. A
  parameter or buffer is the exception (unless ``kiln.config.copy_saved_parameters``): it is
  saved as it is, and changing it in place before backward() raises autograd's error where
  eager, which saved a cast of it under autocast, would not;
* a user-visible saved value needed only for the gradients of some outputs (``watch``) is not
  checked when backward() does not go through those outputs.
"""
from __future__ import annotations

import contextlib
import weakref

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.multiprocessing.reductions import StorageWeakRef

from . import fx_graphs


def tangent_uses(graph: torch.fx.Graph, tangents: list, backward_phase_only: bool = False) -> dict:
    """For each node that depends on no tangent: the tangent sets (indices into ``tangents``)
    of the backward ops that consume it, directly or through other tangent-free nodes (one
    set per op: what flows into the eager node that op comes from). ``backward_phase_only``
    (the joint graph): only through backward-phase nodes, so that a primal counts for what
    eager's formulas read from it, not for the forward values computed from it."""
    deps: dict = {t: frozenset((j,)) for j, t in enumerate(tangents)}
    nodes = list(graph.nodes)
    for n in nodes:
        if n not in deps:
            deps[n] = frozenset().union(*[deps.get(a, frozenset()) for a in n.all_input_nodes])
    uses: dict = {}
    for n in reversed(nodes):
        if deps[n]:
            continue
        u: set = set()
        for user in n.users:
            if user.op == "output":
                continue
            if deps[user]:
                u.add(deps[user])
            elif not backward_phase_only or user.meta.get("kiln_phase") == "backward":
                u |= uses.get(user, frozenset())
        uses[n] = frozenset(u)
    return uses


def version_checks(forward: torch.fx.GraphModule, backward: torch.fx.GraphModule, capture, meta,
                   copy_parameters: bool = False) -> dict:
    """The ``check_inputs``/``check_outputs``/``copy_saved``/``watch`` fields of
    CompiledParts (see the module's docstring). ``watch``: ``[position among the tensors the
    Function saves, tangents that need it]``. ``copy_parameters``: copy a saved parameter or
    buffer that eager does not save, as any other input (else it is saved as it is)."""
    mutated = meta.all_mutated_indices
    n_mut = len(meta.mutated_data_indices)
    nfw = capture.num_fw_outputs
    n_tangents = capture.num_tangents
    everything = frozenset(range(n_tangents))
    outs = fx_graphs.flat_outputs(forward.graph)
    saved = outs[nfw:]
    primal_of = {ph: i for i, ph in enumerate(n for n in forward.graph.nodes if n.op == "placeholder")}
    output_of: dict = {}
    for k, o in enumerate(outs[:nfw]):
        if k >= n_mut and isinstance(o, torch.fx.Node):
            output_of.setdefault(o, k)
    bw_phs = [n for n in backward.graph.nodes if n.op == "placeholder"]
    bw_uses = tangent_uses(backward.graph, bw_phs[len(saved):])
    bw_demand = {n: frozenset().union(*u) for n, u in bw_uses.items()}
    # what eager's formulas read from each primal and forward output, per tangent
    joint = capture.graph_module.graph
    j_phs = [n for n in joint.nodes if n.op == "placeholder"]
    j_outs = fx_graphs.flat_outputs(joint)
    j_uses = tangent_uses(joint, [p for p in j_phs if p.meta.get("kiln_tangent")], backward_phase_only=True)

    def eager_need(node) -> frozenset:
        """The tangents whose eager backward reads ``node`` (empty: unknown)."""
        return frozenset().union(*j_uses.get(node, ())) if isinstance(node, torch.fx.Node) else frozenset()

    eager_in, eager_out = set(capture.eager_saved_inputs), set(capture.eager_saved_outputs)
    direct_in, direct_out, copy, watch, demand = set(), set(), [], [], []
    position = 0                       # among the saved values that are tensors
    for j, s in enumerate(saved):
        is_tensor = isinstance(s, torch.fx.Node) and isinstance(s.meta.get("val"), torch.Tensor)
        if not is_tensor:
            continue
        pos, position = position, position + 1
        demand.append(sorted(sorted(u) for u in bw_uses.get(bw_phs[j], ())) if j < len(bw_phs)
                      else [sorted(everything)])
        root = s
        while fx_graphs.is_view(root) and len(root.all_input_nodes) == 1 and isinstance(root.args[0], torch.fx.Node):
            root = root.args[0]
        if root in primal_of and primal_of[root] in mutated:
            # the runtime copies the input's new value (or metadata) into it after the forward:
            # the backward needs the value the forward read, so it keeps its own copy (a
            # partitioner saves a mutated input when the backward reads it directly; fuzz seed
            # 3826). Eager's errors for it come from the late checks below.
            copy.append(j)
            continue
        visible = None
        if root in primal_of:
            visible, eager = ("in", primal_of[root]), primal_of[root] in eager_in
        elif root in output_of:
            visible, eager = ("out", output_of[root]), output_of[root] in eager_out
        if visible is None:
            continue                   # an intermediate: the user cannot change it
        need = bw_demand.get(bw_phs[j], everything) if j < len(bw_phs) else everything
        eager_needs = eager_need(j_phs[visible[1]] if visible[0] == "in" else j_outs[visible[1]])
        if (not eager or (eager_needs and not need <= eager_needs)) and \
                not (visible[0] == "in" and meta.inputs[visible[1]].is_static and not copy_parameters):
            # eager does not keep it (for these gradients): the user may change it before
            # backward(), eager allows it. A parameter is saved as it is (under autocast eager
            # keeps a cast of each weight instead, and a copy of every weight on every step
            # costs more than a whole step's kernels): changing it in place before backward()
            # raises autograd's error, never a wrong gradient (``copy_saved_parameters``).
            copy.append(j)
            continue
        if s is root:
            (direct_in if visible[0] == "in" else direct_out).add(visible[1])
        if need != everything:
            watch.append([pos, sorted(need)])

    check_inputs = sorted(eager_in - direct_in)
    check_outputs = sorted(eager_out - direct_out)
    # the extra tensors follow the saved ones; what needs them, read from the joint graph
    extras = [j_phs[i] for i in check_inputs] + [j_outs[k] for k in check_outputs]
    for e, node in enumerate(extras):
        need = eager_need(node) or everything   # (none: eager's node saved it but reads nothing)
        demand.append([sorted(need)])
        if need != everything:
            watch.append([position + e, sorted(need)])
    # mutated inputs, by input index: those copied back have their new values as the first
    # forward outputs; eager's backward reads the inputs the graph writes as they were
    late = [[i, sorted(eager_need(j_outs[j]) or everything)] for j, i in enumerate(meta.mutated_data_indices)]
    late += [[i, sorted(eager_need(j_phs[i]) or everything)] for i in meta.in_graph_mutated_indices]
    return {"check_inputs": check_inputs, "check_outputs": check_outputs, "copy_saved": copy,
            "watch": watch, "late_demand": late, "saved_demand": demand,
            "eager_saves": bool(getattr(meta, "eager_saves_any", False)),
            "eager_saving_outputs": meta.eager_saving_fw_outputs()}


class _Saved:
    """What the recording pack hook stores in place of a saved tensor: it lives exactly as
    long as the autograd node that saved it (the nodes of dead values die with them). It
    holds the tensor detached (no reference back to the node): a backward run inside the
    function itself (torch's scan builds its joint graph with autograd as it runs) unpacks
    it."""
    __slots__ = ("storage", "tensor", "__weakref__")

    def __init__(self, storage, tensor):
        self.storage = storage
        self.tensor = tensor


class Recording:
    """What ``recording_saves`` learned of the function's autograd graph."""

    def __init__(self):
        self.tokens: list = []
        self.probing = False

    def storages(self) -> set:
        """The memory saved by nodes still alive, i.e. reachable from the function's live values
        (as ``StorageWeakRef``)."""
        return {tok.storage for tok in (r() for r in self.tokens) if tok is not None and tok.storage is not None}

    def saves_below(self, roots: list, stop: set) -> list[bool]:
        """Per root (a grad_fn or None): whether a node of this call on the way from it to the
        inputs (``stop``: their grad_fns, not this call's) saved a tensor. Its backward frees
        them: a second backward() through that root raises in eager."""
        memo: dict = {}

        def saves(node) -> bool:
            if node is None or node in stop or type(node).__name__ == "AccumulateGrad":
                return False
            if node not in memo:
                memo[node] = False          # (a node is reached once per walk)
                memo[node] = self._saved_by(node) or any(saves(n) for n, _ in node.next_functions)
            return memo[node]

        self.probing = True
        try:
            return [saves(r) for r in roots]
        finally:
            self.probing = False

    @staticmethod
    def _saved_by(node) -> bool:
        names = [a for a in dir(node) if a.startswith("_saved_")] or \
            (["saved_tensors"] if hasattr(node, "saved_tensors") else [])
        for a in names:
            try:
                v = getattr(node, a)
            except RuntimeError:
                return True     # (already freed: it saved something)
            if isinstance(v, torch.Tensor) or \
                    (isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v)):
                return True
        return False


@contextlib.contextmanager
def recording_saves():
    """Record the tensors autograd saves while the function runs (eager's autograd formulas
    run on the functional tensors: the same ops save the same tensors). Yields a ``Recording``.
    Nothing here runs a backward (the hooks skip version checks)."""
    rec = Recording()

    def pack(t):
        if isinstance(t, FakeTensor):
            # a plain fake tensor, outside functionalization: a higher-order op's own
            # implementation tracing its subgraph's backward (flex_attention's score_mod joint
            # graph), which unpacks what it saves. Not the function's autograd graph.
            return t
        is_tensor = isinstance(t, torch.Tensor)
        tok = _Saved(StorageWeakRef(t.untyped_storage()) if is_tensor else None,
                     t.detach() if is_tensor else t)
        rec.tokens.append(weakref.ref(tok))
        return tok

    def unpack(tok):
        if isinstance(tok, torch.Tensor):
            return tok
        if rec.probing:
            return torch.empty(0)   # (``saves_below`` asks only whether something is saved)
        return tok.tensor

    set_tracing = getattr(torch._C._autograd, "_saved_tensors_hooks_set_tracing", None)
    prior = set_tracing(False) if set_tracing is not None else None
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield rec
    finally:
        if set_tracing is not None:
            set_tracing(prior)


# ------------------------------------------------------------------------------------------------
# Runtime
# ------------------------------------------------------------------------------------------------

def record(tensors: list, watch: list, aliases: bool = False) -> list:
    """At forward time: (alias, version) of each watched saved tensor. The alias (``detach``)
    shares the tensor's version counter and memory (which the saved tensor keeps alive anyway)
    and outlives the Python object the user may drop. ``aliases``: the tensors are such
    aliases already (none holds its node)."""
    if aliases:
        return [(tensors[pos], tensors[pos]._version) if tensors[pos] is not None else (None, 0)
                for pos, _ in watch]
    return [(tensors[pos].detach(), tensors[pos]._version) if tensors[pos] is not None else (None, 0)
            for pos, _ in watch]


def relax(recorded: list, watch: list, given: set) -> list:
    """Before unpacking in a backward that some outputs' gradients do not reach: a watched
    tensor changed in place since the forward, but needed only for those outputs, gets its
    saved version back for the unpack (eager never unpacks it). Returns what ``restore`` puts
    back: (tensor, version now, position, version saved)."""
    undo = []
    for (t, version), (pos, need) in zip(recorded, watch):
        if t is not None and given.isdisjoint(need) and t._version != version:
            undo.append((t, t._version, pos, version))
            torch._C._autograd._unsafe_set_version_counter((t,), (version,))
    return undo


def restore(undo: list) -> None:
    for t, version, _, _ in undo:
        torch._C._autograd._unsafe_set_version_counter((t,), (version,))


_SECOND_TIME = ("Trying to backward through the graph a second time (or directly access saved tensors after "
                "they have already been freed). Saved intermediate values of the graph are freed when you call "
                ".backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the "
                "graph a second time or if you need to access saved tensors after calling backward.")


def _modified(t: torch.Tensor, version: int) -> RuntimeError:
    return RuntimeError(
        "one of the variables needed for gradient computation has been modified by an inplace "
        f"operation: [{t.type()} {list(t.shape)}] is at version {t._version}; expected version "
        f"{version} instead.")


_SAVED_PARAMETER_HINT = (
    "kiln: a compiled backward reads the parameters and buffers it needs as they are. If the tensor "
    "changed in place is one (an optimizer step or a weight update before backward()), eager may "
    "have allowed it (under autocast it saves a cast of each weight): call backward() first, or set "
    "kiln.config.copy_saved_parameters = True (KILN_COPY_SAVED_PARAMETERS=1) to save copies, as eager does.")


def unpack(ctx, given: set | None, watch: list, demand: list, everything: frozenset,
           drop_spent: bool = False) -> list:
    """The saved tensors for this backward call, with eager's checks.

    Eager's autograd frees each node's saved tensors once backward() went through it, node by
    node: a later backward() through outputs the first did not reach still works. The compiled
    graph is one node: after a backward() through some of its outputs only, the saved tensors
    are kept (``ctx.kiln_stash``, with their versions) for a later backward() through the
    others, which raises eager's errors itself: a tensor changed in place since the forward, or
    used by a backward op that an earlier backward() ran (its eager node is freed). ``demand``:
    per saved tensor, the tangent sets of the ops that use it. ``drop_spent`` (graphs of static
    shapes): the stash keeps only the tensors an op that has not run yet reads; the others go
    now, as eager's freed nodes' do (a later backward that needs one raises eager's error before
    reading it). A graph of symbolic shapes keeps them all: its later partial backward may read
    a symbolic size from any of them."""
    now = everything if given is None else frozenset(given)
    done = getattr(ctx, "kiln_done", None)
    if done is None:                       # the first backward through this call
        undo = relax(ctx.kiln_watch, watch, given) if given is not None and watch else ()
        try:
            saved = list(ctx.saved_tensors)  # raises if one was changed in place since
        except RuntimeError as e:
            if "modified by an inplace operation" in str(e):
                raise RuntimeError(f"{e}\n{_SAVED_PARAMETER_HINT}") from None
            raise
        finally:
            restore(undo)
        # (the watched aliases would keep each saved tensor's memory alive until the graph
        # dies, after this backward frees the saved tensors themselves)
        ctx.kiln_watch = None
        ctx.kiln_done = now
        if now != everything:
            # detached: same memory and version counter, no grad_fn (a saved output's grad_fn is
            # this node: a reference cycle through C++ the garbage collector cannot see)
            stash = [(None, 0) if t is None or drop_spent and _spent(
                demand[pos] if pos < len(demand) else (everything,), now) else (t.detach(), t._version)
                for pos, t in enumerate(saved)]
            for t, _, pos, version in undo:
                stash[pos] = (stash[pos][0], version)    # stale: refused if a later call needs it
            ctx.kiln_stash = stash
        return saved
    try:
        saved = list(ctx.saved_tensors)      # still there: retain_graph=True
    except RuntimeError:
        stash = getattr(ctx, "kiln_stash", None)
        if stash is None and getattr(ctx, "kiln_saved_count", None) == 0:
            if getattr(ctx, "kiln_eager_saves", False):
                # the compiled backward needs nothing, eager's nodes saved tensors: a second
                # backward() raises as eager's does
                raise RuntimeError(_SECOND_TIME) from None
            return []    # nothing was saved (``x - y``): eager's nodes backward any number of times
        if stash is None:
            raise
        saved = []
        for pos, (t, version) in enumerate(stash):
            uses = demand[pos] if pos < len(demand) else (everything,)
            if all(now.isdisjoint(u) for u in uses):
                saved.append(t)
                continue
            # the eager node that uses it ran in an earlier backward() and freed it
            if any(not u.isdisjoint(done) and not u.isdisjoint(now) for u in uses):
                raise RuntimeError(_SECOND_TIME) from None
            if t is not None and t._version != version:
                raise _modified(t, version) from None
            saved.append(t)
    ctx.kiln_done = done | now
    if ctx.kiln_done == everything:
        ctx.kiln_stash = None
    return saved


def _spent(uses, done: frozenset) -> bool:
    """Every op that reads a saved tensor (``uses``: their tangent sets) ran in a backward
    through ``done``: eager freed its node's saved tensors then."""
    return all(not u.isdisjoint(done) for u in uses)


def attach_late_checks(outputs, mutated: list) -> None:
    """After the writes into mutated inputs whose memory eager saved (``mutated``: (input
    index, tensor)): their versions now, checked when the compiled backward runs (found
    through the outputs' grad_fn: every node of the call)."""
    checks = None
    for o in outputs:
        node = o.grad_fn if isinstance(o, torch.Tensor) else None
        if node is not None and getattr(getattr(node, "_forward_cls", None), "kiln_aot", False) \
                and getattr(node, "kiln_late_checks", None) is None:
            if checks is None:
                checks = [(j, t.detach(), t._version) for j, t in mutated]
            node.kiln_late_checks = checks


def run_late_checks(ctx, given: set | None, late_demand: dict) -> None:
    """Raise eager's error when a mutated input whose memory eager saved changed since the
    call, and backward() goes through an output whose gradient eager computes from it."""
    for j, t, version in getattr(ctx, "kiln_late_checks", ()):
        if t._version == version:
            continue
        need = late_demand.get(j)
        if given is not None and need is not None and given.isdisjoint(need):
            continue
        raise _modified(t, version)
