"""Stage 0: ``create_aot_state``: fake inputs, the context managers every stage runs under,
the pre-capture wrappers, and the forward metadata (what is mutated, what aliases what, what
requires grad).

The ExitStack of an ``AOTState`` holds the fake mode, the python dispatcher, single-threaded
autograd (the joint is traced through ``torch.autograd.grad``) and deferred saved-tensor hooks.
It stays open across the stages and closes exactly once: ``state.close()``, or leave the
``with`` block (a state must be closed: its fake mode stays entered until then; close states in
the reverse order of their creation, as with any context manager)::

    with kiln.aot.create_aot_state(fn, example_inputs) as state:
        capture = kiln.aot.stage1_graph_capture(state)
        compiled = kiln.aot.stage2_compile(state, capture)
    compiled(*inputs)
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.multiprocessing.reductions import StorageWeakRef

from ..errors import Unsupported
from . import _utils as U
from . import symbolic as S


@dataclass
class InputInfo:
    """What the function does to one (traced) input."""
    index: int
    requires_grad: bool            # on entry
    is_leaf: bool
    is_static: bool                # an nn.Module parameter or buffer
    mutates_data: bool = False
    mutates_metadata: bool = False
    mutations_hidden_from_autograd: bool = False   # every mutation under no_grad / on a detached alias
    new_requires_grad: bool = False                # the value after the function requires grad
    new_size: tuple = ()
    new_stride: tuple = ()
    new_offset: int = 0            # relative to the storage offset on entry
    source: str | None = None

    @property
    def mutated(self) -> bool:
        return self.mutates_data or self.mutates_metadata

    @property
    def mutation_needs_grad(self) -> bool:
        """The new value is differentiable: the copy_ back is recorded by autograd."""
        return self.mutates_data and self.new_requires_grad and not self.mutations_hidden_from_autograd


@dataclass
class OutputInfo:
    """One leaf of the function's output.

    kind:
      ``graph``           computed by the graph (a fresh tensor, or a view of an intermediate)
      ``is_input``        the input ``base`` itself (returned as the same object)
      ``alias_of_input``  a view of input ``base``: regenerated from it at runtime
      ``alias_of_output`` a view of output ``base``: regenerated from it at runtime
      ``same_as_output``  the same tensor as output ``base``
      ``constant``        a non-tensor value (``value``), fixed at trace time
      ``symbolic``        an int/bool computed from the input sizes (``value`` is its SymInt or
                          SymBool; evaluated from the runtime arguments, dynamic graphs only)
    """
    kind: str
    base: int | None = None
    requires_grad: bool = False
    differentiable: bool = False   # gets a tangent in the backward
    size: tuple = ()
    stride: tuple = ()
    rel_offset: int = 0
    dtype: str | None = None
    device: str | None = None
    value: Any = None


@dataclass
class ViewAndMutationMeta:
    inputs: list[InputInfo]
    outputs: list[OutputInfo]
    out_spec: Any                  # pytree TreeSpec of the function's output

    @property
    def mutated_data_indices(self) -> list[int]:
        return [i.index for i in self.inputs if i.mutates_data]

    @property
    def metadata_only_mutated_indices(self) -> list[int]:
        return [i.index for i in self.inputs if i.mutates_metadata and not i.mutates_data]

    @property
    def graph_output_indices(self) -> list[int]:
        return [k for k, o in enumerate(self.outputs) if o.kind == "graph"]

    @property
    def num_fw_outputs(self) -> int:
        """Outputs of the traced forward: new values of data-mutated inputs, then graph outputs."""
        return len(self.mutated_data_indices) + len(self.graph_output_indices)

    def fw_output_differentiable(self) -> list[bool]:
        mask = [self.inputs[i].mutation_needs_grad for i in self.mutated_data_indices]
        mask += [self.outputs[k].differentiable for k in self.graph_output_indices]
        return mask

    def fw_output_requires_grad(self) -> list[bool]:
        mask = [self.inputs[i].new_requires_grad and not self.inputs[i].mutations_hidden_from_autograd
                for i in self.mutated_data_indices]
        mask += [self.outputs[k].requires_grad for k in self.graph_output_indices]
        return mask

    def as_text(self) -> str:
        lines = ["inputs:"]
        for i in self.inputs:
            flags = []
            if i.is_static:
                flags.append("parameter/buffer")
            if i.requires_grad:
                flags.append("requires_grad")
            if i.mutates_data:
                flags.append("data mutated" + (" (under no_grad)" if i.mutations_hidden_from_autograd else ""))
            if i.mutates_metadata:
                flags.append("metadata mutated")
            src = f" {i.source}" if i.source else ""
            lines.append(f"  [{i.index}]{src}: {', '.join(flags) or '-'}")
        lines.append("outputs:")
        for k, o in enumerate(self.outputs):
            what = o.kind if o.base is None else f"{o.kind} {o.base}"
            if o.kind == "constant":
                what = f"constant {o.value!r}"
            rg = ", requires_grad" if o.requires_grad else ""
            lines.append(f"  [{k}]: {what}{rg}")
        return "\n".join(lines)


class AOTState:
    """Everything the stages share. A context manager; ``close()`` exits its ExitStack once."""

    def __init__(self, *, fn, example_inputs, fake_mode, stack, static_input_indices,
                 decompositions, sources):
        self.fn = fn
        self.example_inputs = list(example_inputs)
        self.fake_mode: FakeTensorMode = fake_mode
        self.shape_env = fake_mode.shape_env   # None: static shapes
        self.stack: contextlib.ExitStack = stack
        self.static_input_indices: list[int] = list(static_input_indices)
        self.decompositions = decompositions
        self.sources = sources
        self.wrappers: list = []          # runtime wrappers, in pre-capture order
        self.flat_fn: Callable | None = None
        self.flat_args: list = []         # fake inputs of flat_fn (after the wrappers)
        self.meta: ViewAndMutationMeta | None = None
        self.grad_enabled = torch.is_grad_enabled()
        self.needs_autograd = False
        self.static_mask: list[bool] = []
        self.closed = False
        self._open = [True]   # shared with the callables stage 2 builds
        # dynamic graphs: traced with symbolic fakes (the function's inputs, before the
        # wrappers), and the ShapeEnv's guard count before tracing added any
        self.symbolic = False
        self.input_fakes: list = []
        self.guard_mark = 0

    # context manager -------------------------------------------------------------------------
    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._open[0] = False
            self.stack.close()

    def __enter__(self) -> "AOTState":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # inspection ------------------------------------------------------------------------------
    @property
    def input_info(self) -> list[InputInfo]:
        return self.meta.inputs

    @property
    def output_info(self) -> list[OutputInfo]:
        return self.meta.outputs

    def as_text(self) -> str:
        lines = [f"# AOTState: {len(self.example_inputs)} inputs, "
                 f"{'training (joint forward+backward)' if self.needs_autograd else 'inference'}"
                 f"{', dynamic (symbolic shapes)' if self.symbolic else ''}"]
        lines.append("wrappers (pre-capture order): " + (", ".join(w.describe() for w in self.wrappers) or "none"))
        lines.append(self.meta.as_text())
        if isinstance(self.fn, torch.fx.GraphModule):
            lines.append("# the function (torch-level FX graph):")
            lines.append(self.fn.code.strip("\n"))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<kiln.aot.AOTState {'training' if self.needs_autograd else 'inference'}, " \
               f"{len(self.flat_args)} traced inputs{', closed' if self.closed else ''}>"


# ------------------------------------------------------------------------------------------------
# Metadata collection
# ------------------------------------------------------------------------------------------------

def _flatten_outputs(out: Any) -> tuple[list, Any]:
    return pytree.tree_flatten(out)


def collect_metadata(flat_fn: Callable, fake_args: list, *, static: Sequence[bool],
                     sources: Sequence[str | None] | None = None) -> ViewAndMutationMeta:
    """Run ``flat_fn`` once, functionalized, on fake inputs and record what it does."""
    prior_grad = torch.is_grad_enabled()
    with U.preserve_rng_state(), U.exclude_functionalize_key(), \
            FunctionalTensorMode(_allow_token_discovery=True):
        f_args = [U.to_fun(a) for a in fake_args]
        try:
            out = flat_fn(*f_args)
        except U_DATA_DEPENDENT as e:
            raise Unsupported(f"AOT autograd: data-dependent operation ({type(e).__name__}: {e})") from e
        finally:
            torch._C._set_grad_enabled(prior_grad)
        outs, spec = _flatten_outputs(out)

        inputs: list[InputInfo] = []
        for i, (a, fa) in enumerate(zip(fake_args, f_args)):
            src = sources[i] if sources else None
            if not isinstance(a, torch.Tensor):
                inputs.append(InputInfo(i, False, True, False, source=src))
                continue
            U.sync(fa)
            elem = fa.elem
            if torch._functionalize_was_storage_changed(elem):
                raise Unsupported(f"AOT autograd: input {i} has its storage replaced (set_()); "
                                  "kiln cannot compile storage swaps of graph inputs")
            if torch._functionalize_was_inductor_storage_resized(elem):
                raise Unsupported(f"AOT autograd: input {i} has its storage resized")
            mutates_data = bool(torch._functionalize_has_data_mutation(elem))
            # compared without guarding: a symbolic size not provably unchanged counts as changed
            meta_changed = not S.known_equal((*fa.shape, *fa.stride(), fa.storage_offset()),
                                             (*a.shape, *a.stride(), a.storage_offset()))
            mutates_metadata = bool(torch._functionalize_has_metadata_mutation(elem)) and meta_changed
            hidden = False
            if mutates_data:
                hidden = bool(torch._functionalize_are_all_mutations_hidden_from_autograd(elem)) or \
                    bool(torch._functionalize_are_all_mutations_under_no_grad_or_inference_mode(elem))
            inputs.append(InputInfo(
                index=i, requires_grad=a.requires_grad, is_leaf=a.is_leaf, is_static=bool(static[i]),
                mutates_data=mutates_data, mutates_metadata=mutates_metadata,
                mutations_hidden_from_autograd=hidden,
                new_requires_grad=bool(fa.requires_grad),
                new_size=tuple(fa.shape), new_stride=tuple(fa.stride()),
                new_offset=fa.storage_offset() - a.storage_offset(), source=src))
            if mutates_metadata and a.requires_grad:
                raise Unsupported(f"AOT autograd: metadata mutation (e.g. t_(), unsqueeze_()) of input {i}, "
                                  "which requires grad, is not supported")

        inp_storage = {}
        for i, fa in enumerate(f_args):
            if isinstance(fa, torch.Tensor):
                inp_storage.setdefault(StorageWeakRef(fa.untyped_storage()), i)
        inp_ids = {id(fa): i for i, fa in enumerate(f_args) if isinstance(fa, torch.Tensor)}

        outputs: list[OutputInfo] = []
        seen: dict[int, int] = {}
        for k, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                S.refuse_unbacked(o, f"output {k}")
                if isinstance(o, (torch.SymInt, torch.SymBool)) and S.has_symbols(o):
                    # computed from the input sizes at runtime (ShapeCode), not by the graph
                    outputs.append(OutputInfo("symbolic", value=o))
                    continue
                if isinstance(o, (torch.SymInt, torch.SymBool)):
                    o = bool(o) if isinstance(o, torch.SymBool) else S.hint(o)   # a constant
                elif isinstance(o, torch.SymFloat):
                    raise S.SymbolicUnsupported("AOT autograd: symbolic float outputs are not supported")
                outputs.append(OutputInfo("constant", value=o))
                continue
            if not isinstance(o, FunctionalTensor):
                raise Unsupported(f"AOT autograd: output {k} is a tensor created outside the traced "
                                  "function (a closed-over constant); return a copy instead")
            rg = bool(o.requires_grad)
            grad_fn = o.grad_fn
            diff = rg and (o._base is None or grad_fn is not None)
            dtype = str(o.dtype).replace("torch.", "")
            if id(o) in seen:
                outputs.append(OutputInfo("same_as_output", base=seen[id(o)], requires_grad=rg, dtype=dtype))
                continue
            seen[id(o)] = k
            st = StorageWeakRef(o.untyped_storage())
            if id(o) in inp_ids:
                outputs.append(OutputInfo("is_input", base=inp_ids[id(o)], requires_grad=rg, dtype=dtype))
            elif st in inp_storage:
                b = inp_storage[st]
                outputs.append(OutputInfo(
                    "alias_of_input", base=b, requires_grad=rg, differentiable=diff,
                    size=tuple(o.shape), stride=tuple(o.stride()),
                    rel_offset=o.storage_offset() - fake_args[b].storage_offset(), dtype=dtype))
                if o.dtype != fake_args[b].dtype:
                    raise Unsupported(f"AOT autograd: output {k} is a view of input {b} with another dtype "
                                      "(view(dtype)); not supported")
            else:
                outputs.append(OutputInfo("graph", requires_grad=rg, differentiable=diff,
                                          size=tuple(o.shape), stride=tuple(o.stride()), dtype=dtype,
                                          device=str(o.device)))
        # Outputs that share memory with another output that is not a view (``y, y.view(-1)``,
        # ``y, y.detach()``): regenerated from that output at runtime, so they alias it as in
        # eager whatever the compiler does, and the graph never returns one tensor twice.
        groups: dict = {}
        for k, (o, info) in enumerate(zip(outs, outputs)):
            if info.kind == "graph":
                groups.setdefault(StorageWeakRef(o.untyped_storage()), []).append(k)
        for ks in groups.values():
            if len(ks) < 2:
                continue
            roots = [k for k in ks if outs[k]._base is None]
            if not roots:
                continue        # views of an intermediate that is not returned: left as they are
            grad_roots = [k for k in roots if outs[k].requires_grad]
            j = (grad_roots or roots)[0]
            for k in ks:
                o = outs[k]
                if k == j or o.dtype != outs[j].dtype:
                    continue
                outputs[k] = OutputInfo("alias_of_output", base=j, requires_grad=outputs[k].requires_grad,
                                        size=tuple(o.shape), stride=tuple(o.stride()),
                                        rel_offset=o.storage_offset() - outs[j].storage_offset(),
                                        dtype=outputs[k].dtype)
        fm = U.fake_mode_of(fake_args)
        if fm is not None:
            fm.epoch += 1   # nothing traced here may be memoized into the real trace
    return ViewAndMutationMeta(inputs, outputs, spec)


U_DATA_DEPENDENT: tuple = ()
try:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    U_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    U_DATA_DEPENDENT += (GuardOnDataDependentSymNode,)
except ImportError:  # pragma: no cover
    pass


# ------------------------------------------------------------------------------------------------
# create_aot_state
# ------------------------------------------------------------------------------------------------

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
                     decompositions: dict | None = None, dynamic: bool | None = None) -> AOTState:
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
    """
    from . import runtime as R

    example_inputs = list(example_inputs)
    for i, t in enumerate(example_inputs):
        if isinstance(t, torch.Tensor) and type(t) not in (torch.Tensor, torch.nn.Parameter) \
                and not isinstance(t, FakeTensor):
            raise Unsupported(f"AOT autograd: input {i} is a tensor subclass ({type(t).__name__}); "
                              "kiln's AOT autograd takes plain tensors")
        if isinstance(t, torch.Tensor) and (t.is_sparse or t.layout != torch.strided):
            raise Unsupported(f"AOT autograd: input {i} has layout {t.layout}; only strided tensors")
    g_static, sources = _static_indices_from_graph(fn, len(example_inputs))
    if static_input_indices is None:
        static_input_indices = g_static
    static_input_indices = sorted(set(int(i) for i in static_input_indices))
    if any(i < 0 or i >= len(example_inputs) for i in static_input_indices):
        raise ValueError("static_input_indices out of range")

    sym_vals = S.symbolic_inputs(fn, example_inputs) if dynamic is not False else None
    if dynamic and sym_vals is None:
        raise ValueError("create_aot_state(dynamic=True): no input is symbolic")
    if sym_vals is not None:
        fake_mode = S.fake_mode_for(sym_vals)
        traced_inputs = S.prepare_inputs(fake_mode, sym_vals, example_inputs)
    else:
        fake_mode = U.fake_mode_of(example_inputs) or U.new_fake_mode()
        traced_inputs = list(example_inputs)
    stack = contextlib.ExitStack()
    try:
        from torch._dispatch.python import enable_python_dispatcher

        if sym_vals is not None and not fake_mode.allow_non_fake_inputs:
            # the capture's mode: constants the graph holds (get_attr) are real tensors
            fake_mode.allow_non_fake_inputs = True
            stack.callback(setattr, fake_mode, "allow_non_fake_inputs", False)
        stack.enter_context(torch.autograd.set_multithreading_enabled(False))
        stack.enter_context(U.saved_tensor_hooks_deferred())
        stack.enter_context(fake_mode)
        stack.enter_context(enable_python_dispatcher())
        state = AOTState(fn=fn, example_inputs=example_inputs, fake_mode=fake_mode, stack=stack,
                         static_input_indices=static_input_indices,
                         decompositions=U.default_decompositions() if decompositions is None else dict(decompositions),
                         sources=sources)
        static = [i in set(static_input_indices) for i in range(len(example_inputs))]
        state.symbolic = sym_vals is not None
        if state.symbolic:
            state.input_fakes = list(traced_inputs)
            state.guard_mark = len(fake_mode.shape_env.guards)

        # Pre-capture steps: each wrapper rewrites (flat_fn, args) and remembers how to undo it
        # around the compiled function. Dynamic graphs go through them with their fakes.
        flat_fn: Callable = fn
        args = list(traced_inputs)
        srcs = list(sources)
        for wrapper_cls in (R.RNGStateWrapper, R.SpecializeNonTensorInputs, R.DedupInputs):
            w = wrapper_cls.create(args, static=static)
            if w is not None:
                flat_fn, args, static, srcs = w.pre_capture(flat_fn, args, static, srcs)
                state.wrappers.append(w)
        fake_args = [U.to_fake(fake_mode, a) for a in args]

        meta = collect_metadata(flat_fn, fake_args, static=static, sources=srcs)
        w = R.SyntheticBases.create(args, meta=meta, static=static)
        if w is not None and state.symbolic:
            raise S.SymbolicUnsupported("AOT autograd: inputs that share memory, one of them mutated, in a "
                                        "dynamic graph (synthetic bases are static only)")
        if w is not None:
            flat_fn, args, static, srcs = w.pre_capture(flat_fn, args, static, srcs)
            state.wrappers.append(w)
            fake_args = [U.to_fake(fake_mode, a) for a in args]
            meta = collect_metadata(flat_fn, fake_args, static=static, sources=srcs)
        w = R.MutationsAndAliases(meta, fakes=fake_args if state.symbolic else None)
        flat_fn, args, static, srcs = w.pre_capture(flat_fn, args, static, srcs)
        state.wrappers.append(w)

        state.flat_fn = flat_fn
        state.flat_args = fake_args
        state.meta = meta
        state.static_mask = static
        any_grad_input = any(isinstance(a, torch.Tensor) and a.requires_grad for a in fake_args)
        state.needs_autograd = bool(state.grad_enabled and any_grad_input and (
            any(meta.fw_output_requires_grad())))
        return state
    except BaseException:
        stack.close()
        raise
