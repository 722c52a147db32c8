"""Saved-tensor hooks inlined into the compiled graphs.

``torch.autograd.graph.saved_tensors_hooks(pack, unpack)`` active around a compiled call runs
as in eager: the compiled autograd.Function saves its tensors through the hooks, pack when the
forward saves them and unpack in the backward. Hooks the user marks inlineable
(``@kiln.inline_saved_tensors_hooks`` on both functions, or ``kiln.saved_tensors_hooks(pack,
unpack)``) go further: after the partitioner has decided what is saved, stage 2 traces ``pack``
for each saved activation (its own dtype and size: hooks may branch on them) and inlines it
into the forward graph, which then returns the packed values instead; ``unpack`` is traced on
the packed values and inlined into the backward graph just before the first use of the saved
tensor. The user's hooks are then paused around the compiled autograd.Function (they already
ran, in the graph).

Which saved tensors are packed: the activations, i.e. saved values that share memory with no
input, no output the user sees and no gradient (torch's default, "donated"): packing a
parameter or an output would add a copy instead of freeing one.

Hooks that cannot be traced (data-dependent code, ops outside ATen, an unpack that does not
give back the saved tensor's dtype and size) stay eager hooks, with the reason logged under
``KILN_LOGS=aot,activations``. The frontend guards the active inlineable hooks by identity,
and the values they read (``SAVED_TENSOR_HOOKS``, saved_hooks/guard.py): other hooks
recompile. The compile cache keys them by their code (saved_hooks/key.py). A hook's Python
side effects run when it is traced, not on every call.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

from ... import _torch, logs
from ...process_state import saved_hook_wrappers as _wrappers
from .. import fake_propagation, fake_tensors, functional_tensors, fx_graphs, graph_bytes
from .. import trace_context
from .schedule import schedule
from ..symbolic import has_symbols, is_sym_function, known_equal

INLINE_MARK = "_kiln_inline_saved_tensors_hook"


# ------------------------------------------------------------------------------------------------
# Marking and finding the hooks
# ------------------------------------------------------------------------------------------------

# (_wrappers: key of a callable that takes no attributes -> (callable, marked wrapper))


def _callable_key(fn: Any) -> Any:
    if isinstance(fn, types.MethodType):
        return ("method", id(fn.__self__), id(fn.__func__))
    return ("object", id(fn))


def mark_inline(fn: Callable) -> Callable:
    """``fn`` marked as an inlineable hook: itself when it takes attributes, else one wrapper
    per callable (bound methods, builtins), the same on every call, so that the hooks' identity
    (which is guarded) stays stable."""
    if not callable(fn):
        raise TypeError(f"a saved-tensor hook must be callable, got {type(fn).__name__}")
    if getattr(fn, INLINE_MARK, False):
        return fn
    if isinstance(fn, types.FunctionType):
        setattr(fn, INLINE_MARK, True)
        return fn
    key = _callable_key(fn)
    held = _wrappers.get(key)
    if held is not None and (held[0] is fn or held[0] == fn):
        return held[1]

    def hook(x):
        return fn(x)
    hook.__name__ = hook.__qualname__ = getattr(fn, "__qualname__", getattr(fn, "__name__", "hook"))
    hook.__wrapped__ = fn
    setattr(hook, INLINE_MARK, True)
    _wrappers[key] = (fn, hook)
    return hook


def is_inline(fn: Any) -> bool:
    return bool(getattr(fn, INLINE_MARK, False))


def active() -> tuple | None:
    """The innermost saved-tensor hooks when both are marked inlineable, else None."""
    top = _torch.top_saved_tensors_hooks()
    if top is None:
        return None
    pack, unpack = top
    if is_inline(pack) and is_inline(unpack):
        return (pack, unpack)
    return None

def _name(fn: Any) -> str:
    fn = getattr(fn, "__wrapped__", fn)
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


# ------------------------------------------------------------------------------------------------
# Tracing a hook
# ------------------------------------------------------------------------------------------------

class HookNotTraceable(Exception):
    """The hook stays an eager hook (the message says why)."""


_CONSTANT_TYPES = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout,
                   torch.memory_format)


@dataclass
class TracedHook:
    graph: torch.fx.GraphModule           # tensor leaves of the input -> tensor leaves of the output
    out_spec: Any                         # pytree spec of the hook's output
    out_constants: dict                   # output leaf position -> constant (dtype, int...)
    n_out_leaves: int

    def rebuild(self, tensors: list) -> Any:
        """The hook's output with ``tensors`` (its tensor leaves, in order) put back."""
        it = iter(tensors)
        leaves = [self.out_constants[i] if i in self.out_constants else next(it)
                  for i in range(self.n_out_leaves)]
        return pytree.tree_unflatten(leaves, self.out_spec)


def trace_hook(fn: Callable, arg: Any, decompositions: dict | None, what: str) -> TracedHook:
    """``fn(arg)`` traced to a functional ATen graph; ``arg`` is a pytree whose tensor leaves are
    fake tensors of the stage's fake mode (entered by the caller)."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    leaves, spec = pytree.tree_flatten(arg)
    tensor_at = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    holder: dict = {}

    def flat(*tensors):
        with functional_tensors.exclude_functionalize_key():
            full = list(leaves)
            for i, t in zip(tensor_at, tensors):
                full[i] = functional_tensors.to_fun(t)
            out = fn(pytree.tree_unflatten(full, spec))
            for i in tensor_at:
                # eager would change the saved tensor itself (a value the graphs also use)
                functional_tensors.sync(full[i])
                elem = full[i].elem
                if torch._functionalize_has_data_mutation(elem) or \
                        torch._functionalize_has_metadata_mutation(elem):
                    raise HookNotTraceable(f"the {what} hook {_name(fn)} changes its input in place")
            out_leaves, out_spec = pytree.tree_flatten(out)
            consts = {}
            result = []
            for i, o in enumerate(out_leaves):
                if isinstance(o, torch.Tensor):
                    functional_tensors.sync(o)
                    result.append(functional_tensors.from_fun(o))
                elif isinstance(o, _CONSTANT_TYPES):
                    consts[i] = o
                else:
                    raise HookNotTraceable(f"the {what} hook returns a {type(o).__name__} (only tensors and "
                                           "constants such as dtypes and numbers can be inlined)")
            holder.update(spec=out_spec, consts=consts, n=len(out_leaves))
            return result

    try:
        with trace_context.preserve_rng_state(), FunctionalTensorMode(_allow_token_discovery=True):
            gm = make_fx(flat, decomposition_table=decompositions or {})(*[leaves[i] for i in tensor_at])
    except HookNotTraceable:
        raise
    except Exception as e:
        raise HookNotTraceable(f"tracing the {what} hook {_name(fn)} failed ({type(e).__name__}: {e})") from e
    for node in gm.graph.nodes:
        if node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload):
            if not is_sym_function(node.target):
                raise HookNotTraceable(f"the {what} hook {_name(fn)} calls {node.target}, which is not an ATen op")
        if node.op == "get_attr":
            raise HookNotTraceable(f"the {what} hook {_name(fn)} uses a tensor constant (create it inside the hook)")
    return TracedHook(gm, holder["spec"], holder["consts"], holder["n"])


# ------------------------------------------------------------------------------------------------
# Inlining (stage 2, after the partitioner)
# ------------------------------------------------------------------------------------------------

@dataclass
class InlinedHooks:
    """What stage 2 did with the hooks (``CompiledParts.hooks``; plain data)."""
    pack: str
    unpack: str
    packed: list = field(default_factory=list)       # [saved name, [packed names]]
    kept: list = field(default_factory=list)         # saved tensors left as they are (inputs, outputs)
    bytes_before: int = 0                            # saved bytes without the hooks
    bytes_after: int = 0
    offloaded_bytes: int = 0                         # packed into another device's memory
    policy: str | None = None                        # kiln.activations policy name
    graphs: Any = None                               # (forward, backward) while stage 2 builds them

    def to_dict(self) -> dict:
        return dict(pack=self.pack, unpack=self.unpack, packed=self.packed, kept=self.kept,
                    bytes_before=self.bytes_before, bytes_after=self.bytes_after, policy=self.policy,
                    offloaded_bytes=self.offloaded_bytes)

    @classmethod
    def from_dict(cls, d: dict) -> "InlinedHooks":
        return cls(**{k: d[k] for k in ("pack", "unpack", "packed", "kept", "bytes_before", "bytes_after")},
                   policy=d.get("policy"), offloaded_bytes=d.get("offloaded_bytes", 0))

    def describe(self) -> str:
        return (f"saved-tensor hooks inlined: pack={self.pack}, unpack={self.unpack}; "
                f"{len(self.packed)} packed ({', '.join(s for s, _ in self.packed) or '-'}), "
                f"{len(self.kept)} kept as they are ({', '.join(self.kept) or '-'}); saved activations "
                f"{graph_bytes.format_bytes(self.bytes_before)} -> {graph_bytes.format_bytes(self.bytes_after)}"
                + (f" (+{graph_bytes.format_bytes(self.offloaded_bytes)} offloaded)" if self.offloaded_bytes else ""))


def activations(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, nfw: int) -> set:
    """The saved values (forward-graph nodes) that are activations: tensors sharing memory with
    no forward input, no forward output the user sees and no gradient."""
    fw_outs = fx_graphs.flat_outputs(fw.graph)
    visible = [n for n in fw.graph.nodes if n.op == "placeholder"] + list(fw_outs[:nfw]) + \
        list(fx_graphs.flat_outputs(bw.graph))
    kept = {fake_tensors.fake_storage(n.meta.get("val")) for n in visible if isinstance(n, torch.fx.Node)} - {None}
    acts = set()
    for n in fw_outs[nfw:]:
        if not isinstance(n, torch.fx.Node) or n.op == "placeholder":
            continue
        s = fake_tensors.fake_storage(n.meta.get("val"))
        if s is not None and s not in kept:
            acts.add(n)
    return acts


def _tag(graph: torch.fx.Graph, before: set, tag: tuple) -> None:
    for n in graph.nodes:
        if n not in before:
            n.meta["kiln_saved_hook"] = tag


def hook_code(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule) -> list[str]:
    """The inlined hook nodes, per saved activation, as FX IR lines (for ``as_text``)."""
    lines = []
    for gm, where in ((fw, "forward"), (bw, "backward")):
        if gm is None:
            continue
        for n in gm.graph.nodes:
            tag = n.meta.get("kiln_saved_hook")
            if tag is not None:
                lines.append(f"#   {tag[0]} of {tag[1]} ({where}): {n.format_node()}")
    return lines


def _refresh_values(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, fake_mode) -> None:
    """Recompute every node's fake value (the backward's placeholders take the forward's
    saved values), so that values copied from one traced hook are distinct tensors."""
    fw_phs = [n for n in fw.graph.nodes if n.op == "placeholder"]
    fake_propagation.propagate_fake(fw, [n.meta.get("val") for n in fw_phs], fake_mode)
    bw_phs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    by_name = {n.name: n for n in fw.graph.nodes}
    vals = []
    for ph in bw_phs:
        src = ph.meta.get("kiln_packed_from")
        if src is not None and src in by_name:
            ph.meta["val"] = by_name[src].meta.get("val")
        vals.append(ph.meta.get("val"))
    fake_propagation.propagate_fake(bw, vals, fake_mode)


def _meta_key(v: torch.Tensor):
    """What a hook's trace may depend on, for tensors of static shape (None: symbolic)."""
    if any(has_symbols(d) for d in (*v.shape, *v.stride(), v.storage_offset())):
        return None
    return (tuple(int(d) for d in v.shape), tuple(int(d) for d in v.stride()), int(v.storage_offset()),
            v.dtype, v.device, v.requires_grad)


def _same_meta(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The backward was traced for ``b``: the unpacked ``a`` must be like it, strides included
    (a view in the backward may need them)."""
    return a.dtype == b.dtype and a.device == b.device and \
        known_equal((*a.shape, *a.stride()), (*b.shape, *b.stride()))


def inline(hooks: tuple, fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, nfw: int,
           decompositions: dict | None, fake_mode=None) -> InlinedHooks:
    """Inline ``pack`` after the last forward use of each saved activation of ``fw`` and
    ``unpack`` before its first use in ``bw``, in place. A pack with a ``kiln_hooks_for(node,
    backward_users)`` attribute (kiln's lossy policies) chooses per saved value: other hooks
    (a pair), or None to leave it as it is. Raises HookNotTraceable when a hook cannot be inlined for one of
    them (then none is; the graphs may be half-edited: pass copies). A hook is traced once per
    static tensor metadata; with ``fake_mode``, the graphs' values are then recomputed so that
    no two nodes share one fake tensor."""
    pack, unpack = hooks
    fw_outs = fx_graphs.flat_outputs(fw.graph)
    saved = list(fw_outs[nfw:])
    bw_phs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    acts = activations(fw, bw, nfw)
    before = _activation_bytes([s for s in saved if isinstance(s, torch.fx.Node)])
    info = InlinedHooks(_name(pack), _name(unpack), bytes_before=before, policy=getattr(pack, "kiln_policy", None))
    # trace every hook first: the graphs change only when all of them trace
    plans = []
    memo: dict = {}       # static metadata -> (pack, unpack) traced for it
    reused = False
    hooks_for = getattr(pack, "kiln_hooks_for", None)
    for j, s in enumerate(saved):
        mine = (pack, unpack)
        if s in acts and hooks_for is not None:
            mine = hooks_for(s, list(bw_phs[j].users))
        if s not in acts or mine is None:
            if isinstance(s, torch.fx.Node) and isinstance(s.meta.get("val"), torch.Tensor):
                info.kept.append(s.name)
            continue
        val = s.meta["val"]
        key = _meta_key(val)
        if key is not None:
            key = (key, id(mine[0]), id(mine[1]))
        if key is not None and key in memo:
            p, u = memo[key]
            reused = True
        else:
            p = trace_hook(mine[0], val, decompositions, "pack")
            packed_vals = [n.meta.get("val") for n in fx_graphs.flat_outputs(p.graph.graph)]
            u = trace_hook(mine[1], p.rebuild(packed_vals), decompositions, "unpack")
            if key is not None:
                memo[key] = (p, u)
        outs = [n.meta.get("val") for n in fx_graphs.flat_outputs(u.graph.graph)]
        if len(outs) != 1 or u.out_constants or not isinstance(outs[0], torch.Tensor) \
                or not _same_meta(outs[0], val):
            got = ", ".join(f"{tuple(o.shape)} {o.dtype}" if isinstance(o, torch.Tensor) else type(o).__name__
                            for o in outs) or "nothing"
            raise HookNotTraceable(f"unpack({_name(pack)}(t)) must give back a tensor like t ({tuple(val.shape)} "
                                   f"{val.dtype} on {val.device}, strides {tuple(val.stride())}); for saved "
                                   f"{s.name} it gives {got}")
        plans.append((j, s, p, u))
    new_saved = list(saved)
    out_node = next(n for n in reversed(fw.graph.nodes) if n.op == "output")
    order = {n: i for i, n in enumerate(fw.graph.nodes)}
    for j, s, p, u in plans:
        # forward: pack(s) right after the last use of s in the forward, so that the graph
        # frees s there (an offloaded or narrowed copy replaces it from that point on)
        p_phs = [n for n in p.graph.graph.nodes if n.op == "placeholder"]
        before_fw = set(fw.graph.nodes)
        last = max((n for n in s.users if n.op != "output" and n in order), key=order.__getitem__, default=s)
        with fw.graph.inserting_before(last.next):
            packed = fw.graph.graph_copy(p.graph.graph, {p_phs[0]: s})
        _tag(fw.graph, before_fw, ("pack", s.name))
        packed = list(packed) if isinstance(packed, (list, tuple)) else [packed]
        new_saved[j] = packed
        # backward: the saved placeholder becomes one placeholder per packed tensor; unpack
        # runs before the first use of the saved value
        old = bw_phs[j]
        new_phs = []
        with bw.graph.inserting_before(old):
            for k, pk in enumerate(packed):
                ph = bw.graph.placeholder(f"{s.name}_packed_{k}")
                ph.meta = dict(pk.meta)
                ph.meta.pop("kiln_user_visible", None)
                ph.meta.pop("kiln_saved_hook", None)
                ph.meta["kiln_packed_from"] = pk.name
                new_phs.append(ph)
        users = [n for n in bw.graph.nodes if n in old.users]
        first = users[0] if users else None
        u_phs = [n for n in u.graph.graph.nodes if n.op == "placeholder"]
        if first is not None:
            before_bw = set(bw.graph.nodes)
            with bw.graph.inserting_before(first):
                unpacked = bw.graph.graph_copy(u.graph.graph, dict(zip(u_phs, new_phs)))
            _tag(bw.graph, before_bw, ("unpack", s.name))
            unpacked = unpacked[0] if isinstance(unpacked, (list, tuple)) else unpacked
            old.replace_all_uses_with(unpacked)
        bw.graph.erase_node(old)
        info.packed.append([s.name, [ph.name for ph in new_phs]])
    flat_saved: list = []
    for x in new_saved:
        flat_saved.extend(x if isinstance(x, list) else [x])
    out_node.args = (tuple(list(fw_outs[:nfw]) + flat_saved),)
    # offload copies (kiln::offload_start...): finish and prefetch where they overlap compute
    schedule(fw, bw)
    fw.graph.lint()
    bw.graph.lint()
    fw.recompile()
    bw.recompile()
    if reused and fake_mode is not None:
        _refresh_values(fw, bw, fake_mode)
    # the packed names in the forward and the backward differ; the backward's placeholders
    # are matched by position, as for every saved value
    moved = set()         # packed values on another device than their tensor (offloaded)
    for (_, s, _, _), x in zip(plans, [new_saved[j] for j, _, _, _ in plans]):
        for n in x:
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and v.device != s.meta["val"].device:
                moved.add(n)
    nodes = [x for x in flat_saved if isinstance(x, torch.fx.Node)]
    info.bytes_after = _activation_bytes([n for n in nodes if n not in moved])
    info.offloaded_bytes = _activation_bytes([n for n in nodes if n in moved])
    info.graphs = (fw, bw)
    return info


def _activation_bytes(nodes: list) -> int:
    """Bytes of the saved values that are not graph inputs (one count per storage)."""
    total, inputs = graph_bytes.saved_bytes(nodes)
    return total - inputs


def log_not_inlined(hooks: tuple, reason: str) -> None:
    msg = (f"saved-tensor hooks pack={_name(hooks[0])}, unpack={_name(hooks[1])} stay eager hooks "
           f"(they run around the compiled graph, not in it): {reason}")
    for topic in ("aot", "activations"):
        if getattr(logs.enabled, topic):
            logs.log(topic, msg)


def _global_names(code: types.CodeType) -> list:
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names += _global_names(c)
    return sorted(set(names))
