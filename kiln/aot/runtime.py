"""Runtime wrappers.

Each wrapper has a pre-capture step, run by ``create_aot_state`` (it rewrites the function and
its inputs before tracing: ``pre_capture(fn, args, static, sources) -> (fn, args, static,
sources)``), and a post-compile step, run by stage 2 (it wraps the compiled callable so that it
takes the original inputs and returns the original outputs: ``post_compile(compiled) ->
callable``). Stage 2 applies the post-compile steps in reverse order. Wrappers carry only plain
data, so an exported artifact rebuilds them (``to_dict``/``from_dict``).

Pre-capture order: RNG state, non-tensor inputs, duplicate inputs, aliased inputs (synthetic
bases), input mutations and output aliases.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef

from ..errors import Unsupported
from . import functional_tensors, symbolic, trace_context
from .state import InputInfo, OutputInfo, ViewAndMutationMeta
from .symbolic_codec import encode_value
from .versions import attach_late_checks


class RunAsCaptured(Unsupported):
    """Raised by a runtime wrapper, before anything ran, for a call the compiled graphs do not
    fit (an input aliasing or view kind they were not traced for, another grad mode...).
    ``AOTCompiled`` then runs the function as it was given (the captured graph), which gives
    eager's result; without one (a loaded artifact) the user sees this ``kiln.Unsupported``."""


class RuntimeWrapper:
    kind: str = ""

    @classmethod
    def create(cls, args: list, **kw) -> "RuntimeWrapper | None":
        return cls()

    def pre_capture(self, fn: Callable, args: list, static: list, sources: list):
        return fn, args, static, sources

    def post_compile(self, compiled: Callable) -> Callable:
        return compiled

    def describe(self) -> str:
        return self.kind

    def to_dict(self) -> dict:
        return {}

    @classmethod
    def from_dict(cls, d: dict, decoder=None) -> "RuntimeWrapper":
        """``decoder`` (``symbolic_codec.Decoder``): rebuilds a dynamic graph's symbolic sizes,
        for the wrappers that hold any."""
        return cls(**d)


_WRAPPERS: dict[str, type] = {}


def _register(cls):
    _WRAPPERS[cls.kind] = cls
    return cls


def wrapper_to_dict(w: RuntimeWrapper) -> dict:
    return {"kind": w.kind, "data": w.to_dict()}


def wrapper_from_dict(d: dict, decoder=None) -> RuntimeWrapper:
    """``decoder`` (``symbolic_codec.Decoder``): rebuilds a dynamic graph's symbolic sizes."""
    return _WRAPPERS[d["kind"]].from_dict(d["data"], decoder)


# ------------------------------------------------------------------------------------------------

@_register
class RNGStateWrapper(RuntimeWrapper):
    """Random ops (dropout) stay in the forward graph as ATen random ops, in eager's order, and
    draw from the global generator when the graph runs; partitioners never recompute them. The
    pre-capture step makes tracing draw nothing: the generators are restored after every trace,
    so the first compiled call under a seed gives eager's numbers. Post-compile: nothing to do
    on CPU/CUDA without CUDA graphs (a philox offset wrapper goes here for those)."""
    kind = "rng_state"

    def pre_capture(self, fn, args, static, sources):
        def traced_without_drawing(*a):
            with trace_context.preserve_rng_state():
                return fn(*a)
        traced_without_drawing.__wrapped__ = fn
        return traced_without_drawing, args, static, sources

    def describe(self):
        return "rng_state"


@_register
class SpecializeNonTensorInputs(RuntimeWrapper):
    """Non-tensor inputs (ints, floats, bools, None) are burned into the graph; the runtime
    checks that they are unchanged. SymInt inputs of a dynamic graph stay graph inputs."""
    kind = "non_tensor_inputs"

    def __init__(self, constants: dict, n: int):
        self.constants = {int(k): v for k, v in constants.items()}
        self.n = n

    @classmethod
    def create(cls, args, **kw):
        consts = {}
        for i, a in enumerate(args):
            if isinstance(a, (torch.Tensor, torch.SymInt)):
                continue
            if a is None or isinstance(a, (bool, int, float, str)):
                consts[i] = a
            else:
                raise Unsupported(f"AOT autograd: graph input {i} is a {type(a).__name__}; only tensors and "
                                  "int/float/bool/str/None inputs are supported")
        return cls(consts, len(args)) if consts else None

    def pre_capture(self, fn, args, static, sources):
        consts, n = self.constants, self.n
        keep = [i for i in range(n) if i not in consts]

        def with_constants(*tensors):
            full = [None] * n
            for i, t in zip(keep, tensors):
                full[i] = t
            for i, v in consts.items():
                full[i] = v
            return fn(*full)
        return with_constants, [args[i] for i in keep], [static[i] for i in keep], [sources[i] for i in keep]

    def post_compile(self, compiled):
        consts, n = self.constants, self.n
        keep = [i for i in range(n) if i not in consts]
        items = list(consts.items())

        def check_constants(*args):
            for i, v in items:
                a = args[i]
                if type(a) is not type(v) or a != v:
                    raise RunAsCaptured(f"AOT autograd: non-tensor input {i} was {v!r} at compile time, "
                                        f"now {a!r}; recompile")
            return compiled(*[args[i] for i in keep])
        return check_constants

    def describe(self):
        return f"non_tensor_inputs({sorted(self.constants)})"

    def to_dict(self):
        return {"constants": {str(k): v for k, v in self.constants.items()}, "n": self.n}


@_register
class DedupInputs(RuntimeWrapper):
    """``f(x, x)``: the same tensor passed twice is traced as one input."""
    kind = "dedup_inputs"

    def __init__(self, first: list[int]):
        self.first = [int(i) for i in first]     # position -> position of its first occurrence

    @classmethod
    def create(cls, args, **kw):
        seen: dict[int, int] = {}
        first = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                first.append(seen.setdefault(id(a), i))
            else:
                first.append(i)
        return cls(first) if any(f != i for i, f in enumerate(first)) else None

    def _keep(self):
        return [i for i, f in enumerate(self.first) if f == i]

    def pre_capture(self, fn, args, static, sources):
        keep = self._keep()
        pos = {i: k for k, i in enumerate(keep)}
        first = self.first

        def deduped(*unique):
            return fn(*[unique[pos[first[i]]] for i in range(len(first))])
        return deduped, [args[i] for i in keep], [static[i] for i in keep], [sources[i] for i in keep]

    def post_compile(self, compiled):
        keep = self._keep()
        dups = [(i, f) for i, f in enumerate(self.first) if f != i]

        def dedup(*args):
            for i, f in dups:
                if args[i] is not args[f]:
                    raise RunAsCaptured(f"AOT autograd: inputs {f} and {i} were the same tensor at compile "
                                        "time and are not now; recompile")
            return compiled(*[args[i] for i in keep])
        return dedup

    def describe(self):
        return "dedup_inputs(" + ", ".join(f"{i}->{f}" for i, f in enumerate(self.first) if f != i) + ")"

    def to_dict(self):
        return {"first": self.first}


def _storage_key(t: torch.Tensor):
    return StorageWeakRef(t.untyped_storage())


@_register
class SyntheticBases(RuntimeWrapper):
    """Inputs that share memory (views of one another) where one of them is mutated: the graph
    takes their common base instead and re-creates each input as a view of it, so a mutation
    through one is seen through the others (functionalization tracks it). The runtime finds the
    base again (``t._base``, or the whole storage when nothing requires grad) and checks that
    each input is still the same view of it."""
    kind = "synthetic_bases"

    def __init__(self, n: int, groups: list[dict]):
        self.n = n
        # each group: {"members": [i...], "strategy": "common_base"|"storage",
        #              "views": [[size, stride, rel_offset], ...], "numel": int}
        self.groups = groups

    @classmethod
    def create(cls, args, *, meta=None, static=None, **kw):
        by_storage: dict = {}
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                by_storage.setdefault(_storage_key(a), []).append(i)
        groups = []
        for members in by_storage.values():
            if len(members) < 2 or not any(meta.inputs[i].mutated for i in members):
                continue
            ts = [args[i] for i in members]
            where = f"inputs {members} share memory and one is mutated"
            if any(meta.inputs[i].mutates_metadata for i in members):
                raise Unsupported(f"AOT autograd: {where} with a metadata mutation (t_(), as_strided_()...): "
                                  "not supported")
            if len({t.dtype for t in ts}) != 1 or len({t.device for t in ts}) != 1:
                raise Unsupported(f"AOT autograd: {where}, with different dtypes/devices: not supported")
            base, strategy = cls._find_base(ts)
            if base is None:
                raise Unsupported(f"AOT autograd: {where}; they have no common base tensor and some "
                                  "require grad, so kiln cannot rebuild them as views of one base")
            if any(t.requires_grad != base.requires_grad for t in ts):
                raise Unsupported(f"AOT autograd: {where}, and some of them require grad while "
                                  "others do not: not supported")
            views = [[list(t.shape), list(t.stride()), t.storage_offset() - base.storage_offset()] for t in ts]
            groups.append({"members": members, "strategy": strategy, "views": views,
                           "numel": base.numel() if strategy == "storage" else None})
        return cls(len(args), groups) if groups else None

    @staticmethod
    def _find_base(ts):
        bases = [t._base if t._base is not None else t for t in ts]
        if all(b is bases[0] for b in bases):
            return bases[0], "common_base"
        if any(t.requires_grad for t in ts):
            return None, None
        t0 = ts[0]
        numel = t0.untyped_storage().nbytes() // t0.element_size()
        with torch.no_grad():
            return t0.as_strided((numel,), (1,), 0), "storage"

    def _layout(self):
        """New argument list: each group's base replaces its first member; other members go."""
        drop = set()
        at = {}
        for g, grp in enumerate(self.groups):
            at[grp["members"][0]] = g
            drop.update(grp["members"][1:])
        order = [i for i in range(self.n) if i not in drop]
        return order, at

    def pre_capture(self, fn, args, static, sources):
        order, at = self._layout()
        groups = self.groups
        new_args, new_static, new_src = [], [], []
        for i in order:
            if i in at:
                grp = groups[at[i]]
                base, _ = self._find_base([args[m] for m in grp["members"]])
                new_args.append(base)
                new_static.append(all(static[m] for m in grp["members"]))
                new_src.append("base of " + ", ".join(str(sources[m] or m) for m in grp["members"]))
            else:
                new_args.append(args[i])
                new_static.append(static[i])
                new_src.append(sources[i])
        n = self.n

        def from_bases(*new):
            full = [None] * n
            for k, i in enumerate(order):
                if i in at:
                    grp = groups[at[i]]
                    base = new[k]
                    for m, (size, stride, off) in zip(grp["members"], grp["views"]):
                        full[m] = base.as_strided(size, stride, base.storage_offset() + off)
                else:
                    full[i] = new[k]
            return fn(*full)
        return from_bases, new_args, new_static, new_src

    def post_compile(self, compiled):
        order, at = self._layout()
        groups = self.groups

        def base_of(args, grp):
            ts = [args[m] for m in grp["members"]]
            if any(t._is_view() and _creation_meta_name(t) != "DEFAULT" for t in ts):
                # eager refuses to use such a view once its base changed in place
                # (unbind/split outputs, views taken under no_grad): its checks run as captured
                raise RunAsCaptured(f"AOT autograd: inputs {grp['members']} share memory, one is written "
                                    "to, and one is a view autograd restricts")
            if grp["strategy"] == "common_base":
                b0 = ts[0]._base if ts[0]._base is not None else ts[0]
                if not all((t._base if t._base is not None else t) is b0 for t in ts):
                    b0 = None
            else:
                b0 = None
                if not any(t.requires_grad for t in ts):
                    key = ts[0].untyped_storage().data_ptr()
                    if all(t.untyped_storage().data_ptr() == key for t in ts):
                        with torch.no_grad():
                            b0 = ts[0].as_strided((grp["numel"],), (1,), 0)
            if b0 is not None:
                for t, (size, stride, off) in zip(ts, grp["views"]):
                    if list(t.shape) != size or list(t.stride()) != stride or \
                            t.storage_offset() - b0.storage_offset() != off or \
                            t.untyped_storage().data_ptr() != b0.untyped_storage().data_ptr():
                        b0 = None
                        break
            if b0 is None:
                raise RunAsCaptured(f"AOT autograd: inputs {grp['members']} were views of one base at compile "
                                    "time and are not the same views now; recompile")
            return b0

        def with_bases(*args):
            new = []
            for i in order:
                if i in at:
                    new.append(base_of(args, groups[at[i]]))
                else:
                    new.append(args[i])
            return compiled(*new)
        return with_bases

    def describe(self):
        return "synthetic_bases(" + "; ".join(f"{g['members']} {g['strategy']}" for g in self.groups) + ")"

    def to_dict(self):
        return {"n": self.n, "groups": self.groups}


@_register
class MutationsAndAliases(RuntimeWrapper):
    """Input mutations and outputs that alias inputs.

    Pre-capture: the traced function returns, in this order, the new value of every input
    whose data it mutates, then its outputs that the graph computes; outputs that are inputs,
    views of inputs, repeats of other outputs or constants are not graph outputs.
    Inputs the graph writes itself (``InputInfo.mutation_in_graph``) are neither: the runtime
    only bumps their version counters.
    Post-compile: ``copy_`` each new value back into its input (under no_grad when every
    mutation was hidden from autograd), replay metadata mutations with ``as_strided_``, then
    regenerate the aliased outputs from the (updated) inputs and rebuild the output structure.
    """
    kind = "mutations_and_aliases"

    def __init__(self, meta, fakes: list | None = None):
        self.meta = meta
        # dynamic graphs: the traced inputs at this level, to read the symbols of the recorded
        # sizes from the runtime arguments (plain data only when None)
        self.fakes = fakes

    def _runtime_shapes(self) -> Callable[[Sequence], dict] | None:
        """For a dynamic graph, ``f(args) -> {("out", k) | ("in", i): value}``: the size, stride
        and offset of each output view and metadata-mutated input, and the value of each
        symbolic output, evaluated for the runtime arguments. None when all are static."""
        if self.fakes is None:
            return None
        meta = self.meta
        items: list = []    # (key, expressions, ndim or None for a scalar)
        for k, o in enumerate(meta.outputs):
            if o.kind in ("alias_of_input", "alias_of_output", "alias_of_intermediate"):
                items.append((("out", k), [*o.size, *o.stride, o.rel_offset], len(o.size)))
            elif o.kind == "symbolic":
                items.append((("out", k), [o.value], None))
        for i in meta.mutated_data_indices + meta.metadata_only_mutated_indices:
            info = meta.inputs[i]
            if info.mutates_metadata:
                items.append((("in", i), [*info.new_size, *info.new_stride, info.new_offset], len(info.new_size)))
        if not any(symbolic.has_symbols(e) for _, es, _ in items for e in es):
            if not any(symbolic.is_sym(e) for _, es, _ in items for e in es):
                return None
            # SymInts the shape environment specialized to a number (the graph guards on it):
            # ATen takes only plain integers for a view's geometry
            fixed = {key: int(es[0]) if nd is None else
                     (tuple(int(e) for e in es[:nd]), tuple(int(e) for e in es[nd:2 * nd]), int(es[2 * nd]))
                     for key, es, nd in items}
            return lambda args: fixed
        values = symbolic.ShapeCode(self.fakes).values([e for _, es, _ in items for e in es])
        layout, pos = [], 0
        for key, es, nd in items:
            layout.append((key, pos, nd))
            pos += len(es)

        def shapes(args) -> dict:
            v = values(args)
            return {key: v[p] if nd is None else (v[p:p + nd], v[p + nd:p + 2 * nd], v[p + 2 * nd])
                    for key, p, nd in layout}
        return shapes

    def pre_capture(self, fn, args, static, sources):
        meta = self.meta
        mutated = meta.mutated_data_indices
        graph_outs = meta.graph_output_indices
        clone_first = [i for i in mutated if meta.inputs[i].requires_grad]
        base_of = [b.base for b in meta.intermediate_bases]

        def functional_outputs(*a):
            a = list(a)
            # autograd.grad() must see the inputs as they were before the mutation. The clone
            # stands for the input itself, whose history eager's in-place op extends whatever
            # the grad mode the graph starts in (a graph entered under no_grad that turns it on
            # before the write): made with grad on, it never cuts that history.
            with torch.enable_grad():
                for i in clone_first:
                    a[i] = a[i].clone()
            out = fn(*a)
            outs, _ = pytree.tree_flatten(out)
            for t in a:
                functional_tensors.sync(t)
            res = [a[i] for i in mutated] + [outs[k] for k in graph_outs] + [outs[k]._base for k in base_of]
            for t in res:
                functional_tensors.sync(t)
            return res
        return functional_outputs, args, static, sources

    def post_compile(self, compiled):
        meta = self.meta
        mutated = meta.mutated_data_indices
        infos = meta.inputs
        meta_only = meta.metadata_only_mutated_indices
        n_mut = len(mutated)
        outputs = meta.outputs
        spec = meta.out_spec
        simple_outputs = all(o.kind == "graph" and o.creation_meta in (None, "DEFAULT") for o in outputs)
        n_graph = n_mut + len(meta.graph_output_indices)
        grad_after = meta.grad_enabled_after
        # A mutated input that is a view eager forbids writing to (taken under no_grad, one of
        # several outputs of unbind/split...): eager raises at the write, after the ops before
        # it ran; the graph as captured does exactly that.
        check_views = [i for i in mutated + meta_only if infos[i].requires_grad or infos[i].mutation_needs_grad]
        # inputs the graph writes itself: eager's in-place op bumps their version counters
        written = meta.in_graph_mutated_indices
        # mutated inputs whose memory eager saves: backward() checks their version after the
        # write (versions.py)
        late_checks = [i for i in mutated + written if infos[i].saved_by_eager]
        # Mutated inputs that are not parameters/buffers must not share memory with another
        # input: the graph was traced with them independent (a frontend guard should prevent
        # it; this check turns a silent wrong answer into an error).
        check_alias = [i for i in mutated + meta_only + written if not infos[i].is_static]
        check_against = [i.index for i in infos if not i.is_static]
        do_check = bool(check_alias) and len(check_against) > 1
        runtime_shapes = self._runtime_shapes()
        if runtime_shapes is not None:
            simple_outputs = False

        unflatten = _unflattener(spec)
        if simple_outputs and not mutated and not meta_only and not check_views and not do_check \
                and not late_checks and grad_after is None and not written:
            # nothing to write back, check or regenerate: only the output structure (this runs
            # on every call; a CUDA-graph replay is a few microseconds)
            def outputs_only(*args):
                return unflatten(compiled(*args))
            return outputs_only

        def epilogue(*args):
            for i in check_views:
                a = args[i]
                if a._is_view() and _creation_meta_name(a) != "DEFAULT":
                    raise RunAsCaptured(f"AOT autograd: input {i} is a view made under no_grad or by a "
                                        "multi-output op, and the graph writes to it")
            # symbolic sizes are bound from the arguments as they are on entry
            geo = runtime_shapes(args) if runtime_shapes is not None else {}
            if do_check:
                ptrs = {}
                for i in check_against:
                    a = args[i]
                    if isinstance(a, torch.Tensor):
                        ptrs.setdefault(StorageWeakRef(a.untyped_storage()), []).append(i)
                for i in check_alias:
                    if len(ptrs.get(StorageWeakRef(args[i].untyped_storage()), ())) > 1:
                        raise RunAsCaptured(f"AOT autograd: input {i} is mutated and shares memory with another "
                                            "input, which it did not at compile time; recompile")
            if written:
                # (before the graph: a value saved for the backward after the write may be the
                # input itself, whose version eager's autograd records after the write)
                torch.autograd.graph.increment_version([args[i] for i in written])
            outs = compiled(*args)
            for j, i in enumerate(mutated):
                inp, new, info = args[i], outs[j], infos[i]
                if info.mutates_metadata:
                    _restride(inp, info, geo.get(("in", i)))
                # recorded by autograd when eager's write was (whatever mode the call is in now)
                with torch.set_grad_enabled(info.mutation_needs_grad):
                    inp.copy_(new)
            for i in meta_only:
                _restride(args[i], infos[i], geo.get(("in", i)))
            if late_checks:
                attach_late_checks(outs, [(i, args[i]) for i in late_checks])
            if grad_after is not None:
                torch._C._set_grad_enabled(grad_after)
            if simple_outputs:
                return unflatten(outs[n_mut:])
            # (segments: views of intermediates the core already rebuilt for later nodes)
            rebuilt = getattr(outs, "views", None) or {}
            res: list = [None] * len(outputs)
            g = n_mut
            for k, o in enumerate(outputs):
                kind = o.kind
                if kind == "graph":
                    res[k] = _with_creation_meta(outs[g], o.creation_meta)
                    g += 1
                elif kind == "alias_of_intermediate":
                    res[k] = rebuilt[k] if k in rebuilt else \
                        _regenerate_view(outs[n_graph + o.base], o, geo.get(("out", k)))
                elif kind == "is_input":
                    res[k] = args[o.base]
                elif kind == "alias_of_input":
                    res[k] = _regenerate_view(args[o.base], o, geo.get(("out", k)))
                elif kind == "constant":
                    res[k] = o.value
                elif kind == "symbolic":
                    res[k] = geo[("out", k)]
            for k, o in enumerate(outputs):
                if o.kind == "alias_of_output":
                    res[k] = _regenerate_view(res[o.base], o, geo.get(("out", k)))
                elif o.kind == "same_as_output":
                    res[k] = res[o.base]
            return pytree.tree_unflatten(res, spec)
        return epilogue

    def describe(self):
        m = self.meta
        parts = []
        if m.mutated_data_indices:
            parts.append(f"copy_ back {m.mutated_data_indices}")
        if m.in_graph_mutated_indices:
            parts.append(f"written by the graph {m.in_graph_mutated_indices}")
        if m.metadata_only_mutated_indices:
            parts.append(f"as_strided_ {m.metadata_only_mutated_indices}")
        al = [k for k, o in enumerate(m.outputs) if o.kind != "graph"]
        if al:
            parts.append(f"regenerate outputs {al}")
        if m.grad_enabled_after is not None:
            parts.append(f"grad mode {'on' if m.grad_enabled_after else 'off'} after")
        return "mutations_and_aliases(" + ("; ".join(parts) or "none") + ")"

    def to_dict(self):
        import dataclasses

        m = self.meta

        def plain(info):
            return _plain({f.name: getattr(info, f.name) for f in dataclasses.fields(info)})
        d = {"inputs": [plain(i) for i in m.inputs],
             "outputs": [plain(o) for o in m.outputs],
             "intermediate_bases": [plain(o) for o in m.intermediate_bases],
             "grad_enabled_after": m.grad_enabled_after,
             "out_spec": pytree.treespec_dumps(m.out_spec)}
        if self.fakes is not None:
            # a dynamic graph: its sizes are expressions over the symbols of ``fakes``
            d = encode_value(d)
            d["fakes"] = encode_value(list(self.fakes))
        return d

    @classmethod
    def from_dict(cls, d, decoder=None):
        fakes = None
        if "fakes" in d:
            if decoder is None:
                raise ValueError("a dynamic graph's metadata loads into a capture's FakeTensorMode (none given)")
            d = decoder.value(d)
            fakes = d["fakes"]

        def info(kind, x):
            return kind(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in x.items()})
        return cls(ViewAndMutationMeta([info(InputInfo, i) for i in d["inputs"]],
                                       [info(OutputInfo, o) for o in d["outputs"]],
                                       pytree.treespec_loads(d["out_spec"]),
                                       [info(OutputInfo, o) for o in d.get("intermediate_bases", [])],
                                       d.get("grad_enabled_after")), fakes=fakes)


class OutputsWithViews(tuple):
    """A training core's outputs, with ``views``: output index -> the view of an intermediate it
    rebuilt already (segments: a later node took it as an input), which the caller must get."""

    def __new__(cls, outs, views: dict):
        self = super().__new__(cls, outs)
        self.views = views
        return self


def _regenerate_view(base: torch.Tensor, o, geometry: tuple | None = None) -> torch.Tensor:
    """Take output ``o`` again as a view of ``base``, as eager made it: differentiable unless
    eager's was not, under no_grad when eager's was (autograd then refuses in-place writes
    with grad mode on, as for eager's), flagged as one of several outputs (unbind, split...)
    when eager's was. ``geometry``: (size, stride, rel_offset) evaluated for this call
    (dynamic graphs)."""
    size, stride, off = geometry if geometry is not None else (o.size, o.stride, o.rel_offset)
    cm = o.creation_meta
    if not o.requires_grad and (base.requires_grad or cm is None):
        base = base.detach()
        if cm is None and off == 0 and tuple(base.shape) == tuple(size) and base.stride() == tuple(stride) \
                and not o.conj and not o.neg:
            return base             # ``x.detach()``: an alias that is not a view, as eager's
    want = cm != "NO_GRAD_MODE"
    prior = torch.is_grad_enabled()
    if prior != want:
        torch._C._set_grad_enabled(want)
    try:
        view = base.as_strided(size, stride, base.storage_offset() + off)
        if o.conj:
            view = view.conj()
        if o.neg:
            view = torch._neg_view(view)
    finally:
        if prior != want:
            torch._C._set_grad_enabled(prior)
    return _with_creation_meta(view, cm)


def _with_creation_meta(t: torch.Tensor, cm: str | None) -> torch.Tensor:
    """Flag the view ``t`` as made by a multi-output op (or in a custom Function...) when
    eager's was: autograd then refuses the in-place writes eager refuses."""
    if cm is not None and cm not in ("DEFAULT", "NO_GRAD_MODE") and t._is_view():
        torch._C._autograd._set_creation_meta(t, getattr(torch._C._autograd.CreationMeta, cm))
    return t


def _creation_meta_name(t: torch.Tensor) -> str:
    try:
        return torch._C._autograd._get_creation_meta(t).name
    except RuntimeError:       # a view without autograd view metadata
        return "DEFAULT"


def _restride(t: torch.Tensor, info, geometry: tuple | None = None) -> None:
    """Replay a metadata mutation (t_(), unsqueeze_()...) on the input. It changes no data, so
    the version counter is put back: tensors the forward saved (views of the input) stay valid."""
    size, stride, off = geometry if geometry is not None else (info.new_size, info.new_stride, info.new_offset)
    v = t._version
    with torch.no_grad():
        t.as_strided_(size, stride, t.storage_offset() + off)
    torch._C._autograd._unsafe_set_version_counter((t,), (v,))


def _plain(x: Any) -> Any:
    if isinstance(x, tuple):
        return [_plain(v) for v in x]
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def apply_post_compile(wrappers: Sequence[RuntimeWrapper], compiled: Callable) -> Callable:
    """Wrap ``compiled`` with each wrapper's post-compile step, last pre-capture step first."""
    for w in reversed(list(wrappers)):
        compiled = w.post_compile(compiled)
    return compiled


def _unflattener(spec) -> Callable:
    """``pytree.tree_unflatten(values, spec)`` for the output structure of a graph, with the
    usual structures (one tensor, a plain tuple or list of them) built directly: it runs on
    every call."""
    if spec.is_leaf():
        return lambda values: values[0]
    children = spec.children() if callable(getattr(spec, "children", None)) else getattr(spec, "children_specs", None)
    if children is not None and all(c.is_leaf() for c in children):
        if spec.type is tuple:
            return tuple
        if spec.type is list:
            return list
    return lambda values: pytree.tree_unflatten(list(values), spec)
