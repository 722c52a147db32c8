"""``create_aot_state``: a function prepared for AOT tracing. Its inputs go through the
pre-capture runtime wrappers (``runtime.py``: RNG state, non-tensor inputs, duplicates,
synthetic bases, mutations and aliases), and what it does to them becomes the state's
metadata (``state.py``)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import Unsupported
from . import fake_tensors, recompute, runtime, symbolic
from .saved_hooks import inlining as saved_hooks
from .decompositions import default_decompositions
from .overlap import overlapping_write
from .state import AOTState, collect_metadata, mark_mutations_in_graph


def _static_indices_from_graph(fn: Any, n: int) -> tuple[list[int], list[str | None]]:
    if not isinstance(fn, torch.fx.GraphModule):
        return [], [None] * n
    phs = [p for p in fn.graph.nodes if p.op == "placeholder"]
    static = [i for i, p in enumerate(phs) if p.meta.get("kiln_static")]
    sources = [p.meta.get("kiln_source") or p.name for p in phs]
    if len(sources) != n:
        sources = (sources + [None] * n)[:n]
    return static, sources


def create_aot_state(fn: Callable, example_inputs: Sequence[Any], *,
                     static_input_indices: Sequence[int] | None = None,
                     decompositions: dict | None = None, dynamic: bool | None = None,
                     keep_input_mutations: bool = False) -> AOTState:
    """Prepare ``fn`` (a GraphModule or any function of flat tensor inputs) for AOT tracing.

    ``example_inputs`` are real tensors (or fake tensors of one FakeTensorMode); their
    ``requires_grad`` and the current grad mode decide between an inference and a training
    (joint) capture. ``static_input_indices`` marks parameters/buffers (read from the
    placeholders' ``kiln_static`` meta when ``fn`` is a GraphModule). ``decompositions``
    defaults to torch's core ATen table (random ops kept whole).

    Dynamic graphs: when ``fn``'s placeholders carry symbolic example values (fake tensors with
    SymInt sizes, SymInt inputs) or the example inputs are symbolic, the stages trace with
    those, in their FakeTensorMode and ShapeEnv, and the SymInt inputs stay graph inputs
    (``state.symbolic``). ``dynamic=False`` traces the real example inputs with static shapes
    instead (the per-shape fallback); ``dynamic=True`` requires symbolic inputs.

    ``keep_input_mutations``: the graph writes the inputs it mutates where it can
    (``mark_mutations_in_graph``; the forward and inference graphs then contain
    ``aten.copy_`` into placeholders, which the compilers must run); otherwise every new value
    is a graph output that the runtime copies back.
    """
    example_inputs = list(example_inputs)
    for i, t in enumerate(example_inputs):
        if isinstance(t, torch.Tensor) and type(t) not in (torch.Tensor, torch.nn.Parameter) \
                and not isinstance(t, FakeTensor):
            raise Unsupported(f"AOT autograd: input {i} is a tensor subclass ({type(t).__name__}); "
                              "kiln's AOT autograd takes plain tensors")
        if isinstance(t, torch.Tensor) and (t.is_sparse or t.layout != torch.strided):
            raise Unsupported(f"AOT autograd: input {i} has layout {t.layout}; only strided tensors")
    if isinstance(fn, torch.fx.GraphModule):
        why = overlapping_write(fn)
        if why is not None:
            raise Unsupported(f"AOT autograd: {why}; eager raises there, and a functional graph would not")
    g_static, sources = _static_indices_from_graph(fn, len(example_inputs))
    if static_input_indices is None:
        static_input_indices = g_static
    static_input_indices = sorted(set(int(i) for i in static_input_indices))
    if any(i < 0 or i >= len(example_inputs) for i in static_input_indices):
        raise ValueError("static_input_indices out of range")

    sym_vals = symbolic.symbolic_inputs(fn, example_inputs) if dynamic is not False else None
    if dynamic and sym_vals is None:
        raise ValueError("create_aot_state(dynamic=True): no input is symbolic")
    if sym_vals is not None:
        fake_mode = symbolic.fake_mode_for(sym_vals)
        traced_inputs = symbolic.prepare_inputs(fake_mode, sym_vals, example_inputs)
    else:
        fake_mode = fake_tensors.fake_mode_of(example_inputs) or fake_tensors.new_fake_mode(fn)
        traced_inputs = list(example_inputs)
    state = AOTState(fn=fn, example_inputs=example_inputs, fake_mode=fake_mode,
                     static_input_indices=static_input_indices,
                     decompositions=default_decompositions() if decompositions is None
                     else dict(decompositions),
                     sources=sources)
    state.symbolic = sym_vals is not None
    # inlineable saved-tensor hooks active now are inlined by stage 2 (saved_hooks.py); the
    # frontend guards that the same hooks are active when the compiled graph runs
    state.saved_hooks = saved_hooks.active()
    if state.symbolic:
        state.input_fakes = list(traced_inputs)
        state.guard_mark = len(fake_mode.shape_env.guards)
    with state.tracing():
        static = [i in set(static_input_indices) for i in range(len(example_inputs))]

        # Pre-capture steps: each wrapper rewrites (flat_fn, args) and remembers how to undo it
        # around the compiled function. Dynamic graphs go through them with their fakes.
        flat_fn: Callable = recompute.traced_with_regions(fn)   # (checkpointed regions' tags)
        args = list(traced_inputs)
        srcs = list(sources)
        for wrapper_cls in (runtime.RNGStateWrapper, runtime.SpecializeNonTensorInputs, runtime.DedupInputs):
            w = wrapper_cls.create(args, static=static)
            if w is not None:
                flat_fn, args, static, srcs = w.pre_capture(flat_fn, args, static, srcs)
                state.wrappers.append(w)
        fake_args = [fake_tensors.to_fake(fake_mode, a) for a in args]

        meta = collect_metadata(flat_fn, fake_args, static=static, sources=srcs)
        w = runtime.SyntheticBases.create(args, meta=meta, static=static)
        if w is not None and state.symbolic:
            raise symbolic.SymbolicUnsupported("AOT autograd: inputs that share memory, one of them mutated, in a "
                                        "dynamic graph (synthetic bases are static only)")
        if w is not None:
            flat_fn, args, static, srcs = w.pre_capture(flat_fn, args, static, srcs)
            state.wrappers.append(w)
            fake_args = [fake_tensors.to_fake(fake_mode, a) for a in args]
            meta = collect_metadata(flat_fn, fake_args, static=static, sources=srcs)
        elif keep_input_mutations:
            # (not with synthetic bases: the traced inputs are then bases the runtime builds)
            mark_mutations_in_graph(meta)
        w = runtime.MutationsAndAliases(meta, fakes=fake_args if state.symbolic else None)
        flat_fn, args, static, srcs = w.pre_capture(flat_fn, args, static, srcs)
        state.wrappers.append(w)

        state.flat_fn = flat_fn
        state.flat_args = fake_args
        state.meta = meta
        state.static_mask = static
        any_grad_input = any(isinstance(a, torch.Tensor) and a.requires_grad for a in fake_args)
        # The graph's own grad-mode changes are part of the metadata: an input may need a
        # gradient through a region where the graph turns grad mode on.
        state.needs_autograd = bool(any_grad_input and any(meta.fw_output_requires_grad()))
    return state
