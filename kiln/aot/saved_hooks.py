"""Saved-tensor hooks inlined into the compiled graphs (seed 002).

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
``KILN_LOGS=aot,activations``. The frontend guards the active inlineable hooks by identity
(``SAVED_TENSOR_HOOKS``): other hooks recompile. A hook's Python side effects run when it is
traced, not on every call.
"""
from __future__ import annotations

import hashlib
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx
import torch.utils._pytree as pytree

from .. import _torch, logs
from . import _utils as U

INLINE_MARK = "_kiln_inline_saved_tensors_hook"


# ------------------------------------------------------------------------------------------------
# Marking and finding the hooks
# ------------------------------------------------------------------------------------------------

_wrappers: dict = {}      # key of a callable that takes no attributes -> (callable, marked wrapper)


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


def guard_value(hooks: tuple | None) -> tuple | None:
    """What the frontend's SAVED_TENSOR_HOOKS guard expects: the hooks, and every value their
    traced graphs bake in (the globals and closure cells their code reads, their defaults, a
    bound method's instance attributes), each checked by identity on every call."""
    if hooks is None:
        return None
    reads: list = []
    seen: set = set()
    for fn in hooks:
        _reads(fn, reads, seen, 0)
    written = frozenset(name for kind, where, key, _ in reads if kind == "attr" and key == "__code__"
                        for name in _assigned_attrs(getattr(where, "__code__", None)))
    final = []
    for kind, where, key, value in reads:
        if kind == "contents":
            if written:
                value = _contents(where, written)
            key = written
        if kind == "item" and isinstance(where, dict) and key in written and not _is_globals(where):
            continue          # an attribute the hooks assign, read through a method's instance
        final.append((kind, where, key, value))
    return (hooks[0], hooks[1], tuple(final))


def _is_globals(d: dict) -> bool:
    return "__name__" in d and "__builtins__" in d


def _assigned_attrs(code) -> set:
    """Attribute names the code (and the functions it defines) assigns (``x.name = ...``), and
    the string keys of a code that assigns items."""
    import dis

    if not isinstance(code, types.CodeType):
        return set()
    ins = list(dis.get_instructions(code))
    names = {i.argval for i in ins if i.opname in ("STORE_ATTR", "DELETE_ATTR")}
    if any(i.opname in ("STORE_SUBSCR", "DELETE_SUBSCR") for i in ins):
        # ``counts["pack"] += 1``: string keys the code may assign (bookkeeping)
        names |= {c for c in code.co_consts if isinstance(c, str)}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _assigned_attrs(c)
    return names


def hooks_are(expected: tuple | None) -> bool:
    """The guard's check: the active inlineable hooks are ``expected`` (the same objects, reading
    the same values)."""
    now = active()
    if expected is None:
        return now is None
    if now is None or now[0] is not expected[0] or now[1] is not expected[1]:
        return False
    for kind, where, key, value in expected[2]:
        if kind == "item":
            if where.get(key, _MISSING) is not value:
                return False
        elif kind == "contents":
            if _contents(where, key) != value:
                return False
        elif kind == "cell":
            try:
                if where.cell_contents is not value:
                    return False
            except ValueError:
                return False
        elif getattr(where, key, _MISSING) is not value:
            return False
    return True


_MISSING = object()


def _contents(obj: Any, skip: frozenset = frozenset()) -> tuple | None:
    """One level of an object's contents, by identity: a dict's or list's items, an instance's
    attributes (a hook reading ``cfg.scale`` or ``state["scale"]`` bakes that value in), but
    not the attributes the hooks themselves assign (``self.calls += 1``: bookkeeping)."""
    if type(obj) is dict:
        return tuple((k, id(v)) for k, v in obj.items() if k not in skip)
    if isinstance(obj, (types.ModuleType, type, types.FunctionType, types.MethodType, torch.Tensor,
                        torch.dtype, torch.device)) or callable(obj):
        return None
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        return tuple((k, id(v)) for k, v in attrs.items() if k not in skip)
    return None


def _add(out: list, kind: str, where: Any, key: Any, value: Any) -> None:
    out.append((kind, where, key, value))
    c = _contents(value)
    if c is not None:
        out.append(("contents", value, None, c))


def _reads(fn: Any, out: list, seen: set, depth: int) -> None:
    if depth > 4 or id(fn) in seen:
        return
    seen.add(id(fn))
    if isinstance(fn, types.MethodType):
        attrs = getattr(fn.__self__, "__dict__", None)
        if isinstance(attrs, dict):
            for k, v in attrs.items():
                _add(out, "item", attrs, k, v)
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        return
    if (fn.__module__ or "").split(".")[0] == "torch":
        return
    out.append(("attr", fn, "__defaults__", fn.__defaults__))
    out.append(("attr", fn, "__code__", fn.__code__))
    g = fn.__globals__
    for name in _global_names(fn.__code__):
        if name in g:
            v = g[name]
            _add(out, "item", g, name, v)
            if isinstance(v, (types.FunctionType, types.MethodType)):
                _reads(v, out, seen, depth + 1)
    for cell in fn.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        _add(out, "cell", cell, None, v)
        if isinstance(v, (types.FunctionType, types.MethodType)):
            _reads(v, out, seen, depth + 1)


def describe(expected: tuple | None) -> str:
    if expected is None:
        return "no inlineable saved-tensor hooks are active"
    return (f"saved-tensor hooks are pack={_name(expected[0])}, unpack={_name(expected[1])} (by identity, "
            f"and the {len(expected[2]) if len(expected) > 2 else 0} values their code reads)")


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
        with U.exclude_functionalize_key():
            full = list(leaves)
            for i, t in zip(tensor_at, tensors):
                full[i] = U.to_fun(t)
            out = fn(pytree.tree_unflatten(full, spec))
            for i in tensor_at:
                # eager would change the saved tensor itself (a value the graphs also use)
                U.sync(full[i])
                elem = full[i].elem
                if torch._functionalize_has_data_mutation(elem) or \
                        torch._functionalize_has_metadata_mutation(elem):
                    raise HookNotTraceable(f"the {what} hook {_name(fn)} changes its input in place")
            out_leaves, out_spec = pytree.tree_flatten(out)
            consts = {}
            result = []
            for i, o in enumerate(out_leaves):
                if isinstance(o, torch.Tensor):
                    U.sync(o)
                    result.append(U.from_fun(o))
                elif isinstance(o, _CONSTANT_TYPES):
                    consts[i] = o
                else:
                    raise HookNotTraceable(f"the {what} hook returns a {type(o).__name__} (only tensors and "
                                           "constants such as dtypes and numbers can be inlined)")
            holder.update(spec=out_spec, consts=consts, n=len(out_leaves))
            return result

    try:
        with U.preserve_rng_state(), FunctionalTensorMode(_allow_token_discovery=True):
            gm = make_fx(flat, decomposition_table=decompositions or {})(*[leaves[i] for i in tensor_at])
    except HookNotTraceable:
        raise
    except Exception as e:
        raise HookNotTraceable(f"tracing the {what} hook {_name(fn)} failed ({type(e).__name__}: {e})") from e
    for node in gm.graph.nodes:
        if node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload):
            from .symbolic import is_sym_function

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
                f"{U.format_bytes(self.bytes_before)} -> {U.format_bytes(self.bytes_after)}"
                + (f" (+{U.format_bytes(self.offloaded_bytes)} offloaded)" if self.offloaded_bytes else ""))


def _storage(v: Any):
    from torch.multiprocessing.reductions import StorageWeakRef

    if isinstance(v, torch.Tensor) and _torch.is_fake(v):
        return StorageWeakRef(v.untyped_storage())
    return None


def activations(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, nfw: int) -> set:
    """The saved values (forward-graph nodes) that are activations: tensors sharing memory with
    no forward input, no forward output the user sees and no gradient."""
    fw_outs = U.flat_outputs(fw.graph)
    visible = [n for n in fw.graph.nodes if n.op == "placeholder"] + list(fw_outs[:nfw]) + \
        list(U.flat_outputs(bw.graph))
    kept = {_storage(n.meta.get("val")) for n in visible if isinstance(n, torch.fx.Node)} - {None}
    acts = set()
    for n in fw_outs[nfw:]:
        if not isinstance(n, torch.fx.Node) or n.op == "placeholder":
            continue
        s = _storage(n.meta.get("val"))
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
    U.propagate_fake(fw, [n.meta.get("val") for n in fw_phs], fake_mode)
    bw_phs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    by_name = {n.name: n for n in fw.graph.nodes}
    vals = []
    for ph in bw_phs:
        src = ph.meta.get("kiln_packed_from")
        if src is not None and src in by_name:
            ph.meta["val"] = by_name[src].meta.get("val")
        vals.append(ph.meta.get("val"))
    U.propagate_fake(bw, vals, fake_mode)


def _meta_key(v: torch.Tensor):
    """What a hook's trace may depend on, for tensors of static shape (None: symbolic)."""
    from .symbolic import has_symbols

    if any(has_symbols(d) for d in (*v.shape, *v.stride(), v.storage_offset())):
        return None
    return (tuple(int(d) for d in v.shape), tuple(int(d) for d in v.stride()), int(v.storage_offset()),
            v.dtype, v.device, v.requires_grad)


def _same_meta(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The backward was traced for ``b``: the unpacked ``a`` must be like it, strides included
    (a view in the backward may need them)."""
    from .symbolic import known_equal

    return a.dtype == b.dtype and a.device == b.device and \
        known_equal((*a.shape, *a.stride()), (*b.shape, *b.stride()))


def inline(hooks: tuple, fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, nfw: int,
           decompositions: dict | None, fake_mode=None) -> InlinedHooks:
    """Inline ``pack`` after each saved activation of ``fw`` and ``unpack`` before its first
    use in ``bw``, in place. Raises HookNotTraceable when a hook cannot be inlined for one of
    them (then none is; the graphs may be half-edited: pass copies). A hook is traced once per
    static tensor metadata; with ``fake_mode``, the graphs' values are then recomputed so that
    no two nodes share one fake tensor."""
    pack, unpack = hooks
    fw_outs = U.flat_outputs(fw.graph)
    saved = list(fw_outs[nfw:])
    bw_phs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    acts = activations(fw, bw, nfw)
    before = _activation_bytes([s for s in saved if isinstance(s, torch.fx.Node)])
    info = InlinedHooks(_name(pack), _name(unpack), bytes_before=before, policy=getattr(pack, "kiln_policy", None))
    # trace every hook first: the graphs change only when all of them trace
    plans = []
    memo: dict = {}       # static metadata -> (pack, unpack) traced for it
    reused = False
    for j, s in enumerate(saved):
        if s not in acts:
            if isinstance(s, torch.fx.Node) and isinstance(s.meta.get("val"), torch.Tensor):
                info.kept.append(s.name)
            continue
        val = s.meta["val"]
        key = _meta_key(val)
        if key is not None and key in memo:
            p, u = memo[key]
            reused = True
        else:
            p = trace_hook(pack, val, decompositions, "pack")
            packed_vals = [n.meta.get("val") for n in U.flat_outputs(p.graph.graph)]
            u = trace_hook(unpack, p.rebuild(packed_vals), decompositions, "unpack")
            if key is not None:
                memo[key] = (p, u)
        outs = [n.meta.get("val") for n in U.flat_outputs(u.graph.graph)]
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
    for j, s, p, u in plans:
        # forward: pack(s) just before the output
        p_phs = [n for n in p.graph.graph.nodes if n.op == "placeholder"]
        before_fw = set(fw.graph.nodes)
        with fw.graph.inserting_before(out_node):
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
    total, inputs = U.saved_bytes(nodes)
    return total - inputs


def log_not_inlined(hooks: tuple, reason: str) -> None:
    msg = (f"saved-tensor hooks pack={_name(hooks[0])}, unpack={_name(hooks[1])} stay eager hooks "
           f"(they run around the compiled graph, not in it): {reason}")
    for topic in ("aot", "activations"):
        if getattr(logs.enabled, topic):
            logs.log(topic, msg)


# ------------------------------------------------------------------------------------------------
# Cache key (seed 002: hooks that cannot be hashed need a user_cache_hash, else no caching)
# ------------------------------------------------------------------------------------------------

def cache_key(hooks: tuple | None) -> Any:
    """The part of the AOT cache key for the active inlineable hooks: each hook's
    ``user_cache_hash`` attribute when it has one, else a digest of its code and of every value
    it reads (closure cells, globals, defaults). Raises ValueError for a hook that reads
    something that cannot be hashed (the cache is then bypassed, with the reason logged)."""
    if hooks is None:
        return None
    return [_hook_key(fn, "pack" if i == 0 else "unpack") for i, fn in enumerate(hooks)]


def _hook_key(fn: Any, what: str) -> str:
    explicit = getattr(fn, "user_cache_hash", None)
    if explicit is None and hasattr(fn, "__wrapped__"):
        explicit = getattr(fn.__wrapped__, "user_cache_hash", None)
    if explicit is not None:
        return f"user_cache_hash:{explicit}"
    h = hashlib.sha256()
    try:
        _digest(getattr(fn, "__wrapped__", fn), h, set(), 0)
    except ValueError as e:
        raise ValueError(f"the {what} saved-tensor hook {_name(fn)} cannot be hashed ({e}); "
                         "set its user_cache_hash attribute (a string naming what it computes)") from e
    return "code:" + h.hexdigest()


def _digest(x: Any, h, seen: set, depth: int) -> None:
    if depth > 20:
        raise ValueError("its code reaches too deep")
    if isinstance(x, _CONSTANT_TYPES) or isinstance(x, (complex, bytes)):
        h.update(f"{type(x).__name__}:{x!r};".encode())
        return
    if isinstance(x, (tuple, list, frozenset)):
        h.update(f"{type(x).__name__}[".encode())
        for v in (sorted(x, key=repr) if isinstance(x, frozenset) else x):
            _digest(v, h, seen, depth + 1)
        h.update(b"];")
        return
    if isinstance(x, types.ModuleType):
        h.update(f"module:{x.__name__};".encode())
        return
    if isinstance(x, types.CodeType):
        h.update(x.co_code)
        h.update(repr(x.co_names).encode())
        h.update(repr(x.co_varnames).encode())
        for c in x.co_consts:
            _digest(c, h, seen, depth + 1)
        return
    if isinstance(x, types.MethodType):
        _digest(x.__func__, h, seen, depth + 1)
        _digest(x.__self__, h, seen, depth + 1)
        return
    if isinstance(x, types.FunctionType):
        mod = x.__module__ or ""
        if mod.split(".")[0] in ("torch", "kiln"):     # versions are in the key
            h.update(f"fn:{mod}.{x.__qualname__};".encode())
            return
        if id(x) in seen:
            h.update(b"recursion;")
            return
        seen.add(id(x))
        _digest(x.__code__, h, seen, depth + 1)
        _digest(x.__defaults__, h, seen, depth + 1)
        for cell in x.__closure__ or ():
            try:
                _digest(cell.cell_contents, h, seen, depth + 1)
            except ValueError as e:
                if "empty" in str(e):
                    continue
                raise
        for name in _global_names(x.__code__):
            if name in x.__globals__:
                h.update(f"global {name}=".encode())
                _digest(x.__globals__[name], h, seen, depth + 1)
        return
    if isinstance(x, (types.BuiltinFunctionType, types.BuiltinMethodType)) or \
            (callable(x) and (getattr(x, "__module__", "") or "").split(".")[0] in ("torch", "builtins", "math")):
        h.update(f"builtin:{getattr(x, '__module__', '')}.{getattr(x, '__qualname__', repr(x))};".encode())
        return
    if isinstance(x, torch._ops.OpOverload) or isinstance(x, torch._ops.OpOverloadPacket):
        h.update(f"op:{x};".encode())
        return
    raise ValueError(f"it reads a {type(x).__name__}")


def _global_names(code: types.CodeType) -> list:
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names += _global_names(c)
    return sorted(set(names))
