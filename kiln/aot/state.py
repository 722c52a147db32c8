"""Stage 0's state (made by ``create_aot_state``, ``prepare.py``): fake inputs, the contexts
every stage traces under, the pre-capture wrappers, and the forward metadata (what is mutated,
what aliases what, what requires grad, the grad mode the function leaves behind).

No mode stays active between stage calls: each stage enters what it needs (the fake mode, the
python dispatcher, single-threaded autograd for tracing the joint through
``torch.autograd.grad``, deferred saved-tensor hooks, the grad mode the state was created in:
``state.tracing()``) and exits it before it returns, like JAX's ``lowered.compile()`` chain. A
state can be used as a plain value or as a context manager; ``close()`` (or leaving the
``with`` block) only marks it finished, after which the stages refuse it::

    state = kiln.aot.create_aot_state(fn, example_inputs)
    capture = kiln.aot.stage1_graph_capture(state)
    compiled = kiln.aot.stage2_compile(state, capture)
    compiled(*inputs)
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.multiprocessing.reductions import StorageWeakRef

from .. import _torch
from ..errors import Unsupported
from . import fake_tensors, functional_tensors, trace_context
from . import symbolic
from . import versions


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
    # eager's autograd saves this memory for the backward of the live outputs: backward()
    # after the user changes it in place raises "modified by an inplace operation"
    saved_by_eager: bool = False
    # (a mutated input) a node of the call on its new value's gradient way saved a tensor
    saves_below: bool = False
    # the graph itself writes the new value (``aten.copy_`` into the placeholder at the end of
    # the forward) instead of returning it for the runtime to copy back: see
    # ``mark_mutations_in_graph``
    mutation_in_graph: bool = False

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
      ``alias_of_intermediate`` a view of an intermediate the function does not return: the
                          graph returns that intermediate (``meta.intermediate_bases[base]``)
                          and the view is regenerated from it at runtime, outside the
                          autograd.Function, so it is an ordinary view as in eager
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
    # for a view: how eager made it (torch's CreationMeta name: DEFAULT, NO_GRAD_MODE,
    # MULTI_OUTPUT_NODE...), which decides what autograd allows on it (in-place ops)
    creation_meta: str | None = None
    # for a view: whether its conjugate / negative bit differs from its base's (``x.conj()``,
    # ``x.mH``, ``torch._neg_view(x)``): re-taken with the same bits
    conj: bool = False
    neg: bool = False
    saved_by_eager: bool = False   # (graph outputs, intermediate bases) see InputInfo
    # (graph outputs, intermediate bases) a node of the call on its gradient's way saved a
    # tensor: eager's second backward() through it raises
    saves_below: bool = False


@dataclass
class ViewAndMutationMeta:
    inputs: list[InputInfo]
    outputs: list[OutputInfo]
    out_spec: Any                  # pytree TreeSpec of the function's output
    # intermediates the graph also returns, as the bases of ``alias_of_intermediate`` outputs
    # (kind ``intermediate_base``: size, stride, dtype, device, requires_grad; ``base`` is
    # the first output that is a view of it)
    intermediate_bases: list[OutputInfo] = field(default_factory=list)
    # the grad mode the function leaves behind when it differs from the mode it was traced in
    # (it calls torch._C._set_grad_enabled: a graph broken inside ``with torch.no_grad()``)
    grad_enabled_after: bool | None = None
    # whether eager's autograd graph of the outputs saves any tensor (a second backward()
    # through it then raises "backward through the graph a second time")
    eager_saves_any: bool = False

    @property
    def mutated_data_indices(self) -> list[int]:
        """Inputs whose new value the graph returns and the runtime copies back."""
        return [i.index for i in self.inputs if i.mutates_data and not i.mutation_in_graph]

    @property
    def in_graph_mutated_indices(self) -> list[int]:
        """Inputs the graph writes itself (their new value is not a graph output)."""
        return [i.index for i in self.inputs if i.mutation_in_graph]

    @property
    def all_mutated_indices(self) -> set[int]:
        return {i.index for i in self.inputs if i.mutated}

    @property
    def metadata_only_mutated_indices(self) -> list[int]:
        return [i.index for i in self.inputs if i.mutates_metadata and not i.mutates_data]

    @property
    def graph_output_indices(self) -> list[int]:
        return [k for k, o in enumerate(self.outputs) if o.kind == "graph"]

    @property
    def num_fw_outputs(self) -> int:
        """Outputs of the traced forward: new values of data-mutated inputs, then graph outputs,
        then intermediate bases."""
        return len(self.mutated_data_indices) + len(self.graph_output_indices) + len(self.intermediate_bases)

    def fw_output_info(self, k: int) -> OutputInfo | None:
        """The OutputInfo of forward output ``k`` (None for a mutated input's new value)."""
        n_mut = len(self.mutated_data_indices)
        graph = self.graph_output_indices
        if k < n_mut:
            return None
        if k < n_mut + len(graph):
            return self.outputs[graph[k - n_mut]]
        return self.intermediate_bases[k - n_mut - len(graph)]

    def eager_saved_inputs(self) -> list[int]:
        """Inputs whose memory eager's autograd keeps for the backward (not those the function
        mutates: their copy-back is kiln's, and the saved value is the graph's)."""
        return [i.index for i in self.inputs if i.saved_by_eager and not i.mutated]

    def eager_saved_fw_outputs(self) -> list[int]:
        """Forward outputs (graph outputs, intermediate bases) whose memory eager keeps."""
        n_mut = len(self.mutated_data_indices)
        infos = [self.outputs[k] for k in self.graph_output_indices] + list(self.intermediate_bases)
        return [n_mut + j for j, o in enumerate(infos) if o.saved_by_eager]

    def eager_saving_fw_outputs(self) -> list[int]:
        """Forward outputs whose gradient goes through a node of the call that saved a tensor
        in eager (a new value of a mutated input: its input's ``saves_below``)."""
        infos = [self.inputs[i] for i in self.mutated_data_indices] + \
            [self.outputs[k] for k in self.graph_output_indices] + list(self.intermediate_bases)
        return [j for j, o in enumerate(infos) if o.saves_below]

    def fw_output_differentiable(self) -> list[bool]:
        mask = [self.inputs[i].mutation_needs_grad for i in self.mutated_data_indices]
        mask += [self.outputs[k].differentiable for k in self.graph_output_indices]
        mask += [b.differentiable for b in self.intermediate_bases]
        return mask

    def fw_output_requires_grad(self) -> list[bool]:
        mask = [self.inputs[i].new_requires_grad and not self.inputs[i].mutations_hidden_from_autograd
                for i in self.mutated_data_indices]
        mask += [self.outputs[k].requires_grad for k in self.graph_output_indices]
        mask += [b.requires_grad for b in self.intermediate_bases]
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
                flags.append("data mutated" + (" (under no_grad)" if i.mutations_hidden_from_autograd else "")
                             + (", written by the graph" if i.mutation_in_graph else ""))
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
            cm = f", {o.creation_meta.lower().replace('_', ' ')} view" \
                if o.creation_meta not in (None, "DEFAULT") else ""
            lines.append(f"  [{k}]: {what}{rg}{cm}")
        if self.intermediate_bases:
            lines.append(f"intermediate bases returned by the graph: {len(self.intermediate_bases)}")
        if self.grad_enabled_after is not None:
            lines.append(f"leaves grad mode {'on' if self.grad_enabled_after else 'off'}")
        return "\n".join(lines)


class AOTState:
    """Everything the stages share. Usable as a context manager; ``close()`` marks it finished
    (no mode is held between stages: ``tracing()`` is entered by each stage)."""

    def __init__(self, *, fn, example_inputs, fake_mode, static_input_indices, decompositions, sources):
        self.fn = fn
        self.example_inputs = list(example_inputs)
        self.fake_mode: FakeTensorMode = fake_mode
        self.shape_env = fake_mode.shape_env   # None: static shapes
        self.static_input_indices: list[int] = list(static_input_indices)
        self.decompositions = decompositions
        self.sources = sources
        self.wrappers: list = []          # runtime wrappers, in pre-capture order
        self.flat_fn: Callable | None = None
        self.flat_args: list = []         # fake inputs of flat_fn (after the wrappers)
        self.meta: ViewAndMutationMeta | None = None
        # the grad mode the function is entered in (kiln calls its backends in the mode at the
        # start of the graph); every stage traces in it
        self.grad_enabled = torch.is_grad_enabled()
        self.needs_autograd = False
        self.static_mask: list[bool] = []
        self.closed = False
        # dynamic graphs: traced with symbolic fakes (the function's inputs, before the
        # wrappers), and the ShapeEnv's guard count before tracing added any
        self.symbolic = False
        self.input_fakes: list = []
        self.guard_mark = 0
        self.saved_hooks = None           # (pack, unpack) to inline (saved_hooks.active())

    @contextlib.contextmanager
    def tracing(self):
        """The contexts a stage traces under, entered for the stage's duration only."""
        from torch._dispatch.python import enable_python_dispatcher

        if self.closed:
            raise RuntimeError("kiln.aot: the AOTState is closed; run the stages before closing it")
        fm = self.fake_mode
        with contextlib.ExitStack() as stack:
            if self.symbolic and not fm.allow_non_fake_inputs:
                # the capture's mode: constants the graph holds (get_attr) are real tensors
                fm.allow_non_fake_inputs = True
                stack.callback(setattr, fm, "allow_non_fake_inputs", False)
            stack.enter_context(torch.autograd.set_grad_enabled(self.grad_enabled))
            stack.enter_context(torch.autograd.set_multithreading_enabled(False))
            stack.enter_context(trace_context.saved_tensor_hooks_deferred())
            stack.enter_context(fm)
            stack.enter_context(enable_python_dispatcher())
            yield

    # context manager -------------------------------------------------------------------------
    def close(self) -> None:
        self.closed = True

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
    with trace_context.preserve_rng_state(), trace_context.no_mkldnn_decompositions(), \
            functional_tensors.exclude_functionalize_key(), FunctionalTensorMode(_allow_token_discovery=True):
        f_args = [functional_tensors.to_fun(a) for a in fake_args]
        # an in-place op autograd records gives the input a new grad_fn; one through a detached
        # alias (``x.detach().copy_(...)``) or under no_grad does not
        grad_fn_before = [a.grad_fn if isinstance(a, torch.Tensor) else None for a in f_args]
        try:
            with versions.recording_saves() as recording:
                out = flat_fn(*f_args)
            grad_after = torch.is_grad_enabled()
        except _torch.DATA_DEPENDENT_ERRORS as e:
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
            functional_tensors.sync(fa)
            elem = fa.elem
            if torch._functionalize_was_storage_changed(elem):
                raise Unsupported(f"AOT autograd: input {i} has its storage replaced (set_()); "
                                  "kiln cannot compile storage swaps of graph inputs")
            if torch._functionalize_was_inductor_storage_resized(elem):
                raise Unsupported(f"AOT autograd: input {i} has its storage resized")
            mutates_data = bool(torch._functionalize_has_data_mutation(elem))
            # compared without guarding: a symbolic size not provably unchanged counts as changed
            meta_changed = not symbolic.known_equal((*fa.shape, *fa.stride(), fa.storage_offset()),
                                             (*a.shape, *a.stride(), a.storage_offset()))
            mutates_metadata = bool(torch._functionalize_has_metadata_mutation(elem)) and meta_changed
            hidden = False
            if mutates_data and a.requires_grad and fa.grad_fn is not grad_fn_before[i]:
                # autograd recorded it: an in-place op, or a custom Function's ctx.mark_dirty
                # (whose forward runs under no_grad, so functionalization calls it hidden)
                hidden = False
            elif mutates_data:
                hidden = bool(torch._functionalize_are_all_mutations_hidden_from_autograd(elem)) or \
                    bool(torch._functionalize_are_all_mutations_under_no_grad_or_inference_mode(elem)) or \
                    a.requires_grad
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
                symbolic.refuse_unbacked(o, f"output {k}")
                if isinstance(o, (torch.SymInt, torch.SymBool)) and symbolic.has_symbols(o):
                    # computed from the input sizes at runtime (ShapeCode), not by the graph
                    outputs.append(OutputInfo("symbolic", value=o))
                    continue
                if isinstance(o, (torch.SymInt, torch.SymBool)):
                    o = bool(o) if isinstance(o, torch.SymBool) else symbolic.hint(o)   # a constant
                elif isinstance(o, torch.SymFloat):
                    raise symbolic.SymbolicUnsupported("AOT autograd: symbolic float outputs are not supported")
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
            cm = _creation_meta(o)
            if id(o) in inp_ids:
                outputs.append(OutputInfo("is_input", base=inp_ids[id(o)], requires_grad=rg, dtype=dtype))
            elif st in inp_storage:
                b = inp_storage[st]
                if rg and o._base is None:
                    raise Unsupported(_SEPARATE_HISTORY.format(k=k, what=f"input {b}"))
                if rg and _made_by_custom_function(grad_fn):
                    # a custom Function returned (a view of) its input: eager's output is a
                    # view whose grad_fn is the user's backward; re-taking the view from the
                    # input at runtime would differentiate it as a plain view
                    raise Unsupported(f"AOT autograd: output {k} is a view of input {b} returned by a "
                                      "custom autograd.Function")
                size, stride, offset = _view_geometry(o, b, f_args, fake_args, inputs)
                outputs.append(OutputInfo(
                    "alias_of_input", base=b, requires_grad=rg, differentiable=diff,
                    size=size, stride=stride, rel_offset=offset - fake_args[b].storage_offset(), dtype=dtype,
                    creation_meta=cm, **_bits_against(o, f_args[b])))
                if o.dtype != fake_args[b].dtype:
                    raise Unsupported(f"AOT autograd: output {k} is a view of input {b} with another dtype "
                                      "(view(dtype)); not supported")
            else:
                outputs.append(OutputInfo("graph", requires_grad=rg, differentiable=diff,
                                          size=tuple(o.shape), stride=tuple(o.stride()), dtype=dtype,
                                          device=str(o.device), creation_meta=cm))
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
                continue        # views of an intermediate that is not returned (see below)
            grad_roots = [k for k in roots if outs[k].requires_grad]
            if len(grad_roots) > 1:
                raise Unsupported(_SEPARATE_HISTORY.format(k=grad_roots[1], what=f"output {grad_roots[0]}"))
            returned = {id(outs[k]) for k in ks}
            if not grad_roots and any(outs[k]._base is not None and id(outs[k]._base) not in returned for k in ks):
                continue        # ``y.detach(), y.diagonal()`` of an intermediate ``y``: both re-taken from y
            j = (grad_roots or roots)[0]
            for k in ks:
                o = outs[k]
                if k == j or o.dtype != outs[j].dtype:
                    continue
                outputs[k] = OutputInfo("alias_of_output", base=j, requires_grad=outputs[k].requires_grad,
                                        size=tuple(o.shape), stride=tuple(o.stride()),
                                        rel_offset=o.storage_offset() - outs[j].storage_offset(),
                                        dtype=outputs[k].dtype, creation_meta=outputs[k].creation_meta,
                                        **_bits_against(o, outs[j]))
        intermediate_bases = _views_of_intermediates(outs, outputs)
        saved = recording.storages()
        for a, info in zip(f_args, inputs):
            info.saved_by_eager = isinstance(a, torch.Tensor) and StorageWeakRef(a.untyped_storage()) in saved
        for o, info in zip(outs, outputs):
            if info.kind == "graph":
                info.saved_by_eager = StorageWeakRef(o.untyped_storage()) in saved
        for b in intermediate_bases:
            b.saved_by_eager = StorageWeakRef(outs[b.base].untyped_storage()) in saved
        _record_saves_below(recording, f_args, inputs, outs, outputs, intermediate_bases, grad_fn_before)
        # (a node can save what the hooks never see: ``x * 0.5`` saves its wrapped scalar, and a
        # second backward() through it raises in eager)
        saves_any = bool(saved) or any(i.saves_below for i in [*inputs, *outputs, *intermediate_bases])
        fm = fake_tensors.fake_mode_of(fake_args)
        if fm is not None:
            fm.epoch += 1   # nothing traced here may be memoized into the real trace
    return ViewAndMutationMeta(inputs, outputs, spec, intermediate_bases,
                               grad_after if grad_after != prior_grad else None, eager_saves_any=saves_any)


def _record_saves_below(recording, f_args, inputs, outs, outputs, intermediate_bases, grad_fn_before) -> None:
    """``saves_below`` of each mutated input, graph output and intermediate base: per autograd
    node, not once for the graph (a graph whose backward is several nodes raises eager's
    "backward through the graph a second time" per node)."""
    def grad_fn(t):
        return t.grad_fn if isinstance(t, torch.Tensor) else None

    infos, roots = [], []
    for a, info in zip(f_args, inputs):
        if info.mutates_data:
            infos.append(info)
            roots.append(grad_fn(a))
    for o, info in zip(outs, outputs):
        if info.kind == "graph":
            infos.append(info)
            roots.append(grad_fn(o))
    for b in intermediate_bases:
        view = outs[b.base]
        infos.append(b)
        roots.append(grad_fn(view._base if isinstance(view, torch.Tensor) and view._base is not None else view))
    stop = {g for g in grad_fn_before if g is not None}
    for info, saves in zip(infos, recording.saves_below(roots, stop)):
        info.saves_below = saves


def mark_mutations_in_graph(meta: ViewAndMutationMeta) -> None:
    """Let the graph write the new value of the inputs it can write itself (as torch's
    ``keep_input_mutations``): a BatchNorm's running statistics, a buffer updated under
    no_grad. The compiler then fuses the write into the kernel that computes the value, and the
    runtime neither gets the value as an extra output nor launches a ``copy_`` per input (a
    ResNet-50 training step updates 159 buffers).

    Only plain data writes to inputs autograd does not track: the input does not require grad,
    and neither does its new value or every write was hidden from autograd (under no_grad,
    through ``.detach()``, BatchNorm's own update): a write autograd records must stay the
    runtime's ``copy_`` under the autograd.Function. And its metadata is unchanged (sizes, strides:
    ``as_strided_`` is the runtime's). The runtime still bumps the input's version counter
    (as eager's in-place op) and, for memory eager saved (BatchNorm saves its running stats),
    records the version for backward()'s check (``versions.attach_late_checks``). A backward
    that would read the input (a partitioner saved it) gets a copy made before the write
    (``compile.clone_saved_before_writes``)."""
    for info in meta.inputs:
        if not info.mutates_data or info.mutates_metadata:
            continue
        if not info.requires_grad and (not info.new_requires_grad or info.mutations_hidden_from_autograd):
            info.mutation_in_graph = True


# ``t = x.detach(); t.copy_(w)``: ``t`` shares x's memory but has an autograd history of its
# own; the runtime can re-take views of a tensor, not give its memory another history.
_SEPARATE_HISTORY = ("AOT autograd: output {k} shares the memory of {what} without being a view of it, "
                     "and has an autograd history of its own (an in-place write through .detach())")


def _made_by_custom_function(grad_fn) -> bool:
    """Whether ``grad_fn`` is the node of a custom autograd.Function (Python or C++)."""
    return isinstance(grad_fn, torch.autograd.function.BackwardCFunction) or \
        type(grad_fn).__name__ == "CppFunction"


def _view_geometry(o, b: int, f_args: list, fake_args: list, inputs: list) -> tuple:
    """(size, stride, storage offset) of output ``o``, a view of input ``b``, in the input's
    layout as it comes in: the view ops replayed on the input's fake. Where they cannot be
    (another input shares the memory, so the ops may start from that one), read off ``o``
    itself, which is right unless the input was written in place with a value laid out
    otherwise (then the view would read other elements: refused)."""
    storage = StorageWeakRef(o.untyped_storage())
    sharing = [fa for fa in f_args if isinstance(fa, torch.Tensor) and StorageWeakRef(fa.untyped_storage()) == storage]
    if len(sharing) == 1:
        replayed = functional_tensors.replay_view(fake_args[b], o)
        if replayed is not None and symbolic.known_equal(tuple(replayed.shape), tuple(o.shape)):
            return tuple(replayed.shape), tuple(replayed.stride()), replayed.storage_offset()
    if inputs[b].mutates_data and not functional_tensors.keeps_layout(f_args[b], fake_args[b]):
        raise Unsupported(f"AOT autograd: an output is a view of input {b}, which the function writes in "
                          "place with a value laid out otherwise, and its view ops cannot be replayed")
    return tuple(o.shape), tuple(o.stride()), o.storage_offset()


def _creation_meta(t: torch.Tensor) -> str | None:
    """How autograd made the view ``t`` (None when ``t`` is not a view)."""
    if not t._is_view():
        return None
    try:
        return torch._C._autograd._get_creation_meta(t).name
    except (RuntimeError, AttributeError):   # no autograd view metadata
        return None


def _views_of_intermediates(outs: list, outputs: list[OutputInfo]) -> list[OutputInfo]:
    """Outputs that are views of an intermediate the function does not return become
    ``alias_of_intermediate`` (in place in ``outputs``); returns the intermediates' infos.

    Returned from inside the compiled autograd.Function, such a view would be a view created
    in a custom Function (autograd refuses in-place ops on it, where eager allows them) or
    would lose its no_grad / multi-output flags. The graph returns the base instead and the
    runtime takes the view again, the way eager made it."""
    bases: list[OutputInfo] = []
    index: dict[int, int] = {}
    keep = []                        # the base tensors: their ids stay valid
    graph = [k for k, info in enumerate(outputs) if info.kind == "graph"]
    views = [k for k in graph if outs[k]._base is not None and isinstance(outs[k]._base, FunctionalTensor)
             and outs[k]._base.dtype == outs[k].dtype]       # (as_strided keeps the dtype)
    base_in = {StorageWeakRef(outs[k]._base.untyped_storage()): outs[k]._base for k in views}

    def base_of(o):
        if o._base is not None:
            return o._base
        b = base_in.get(StorageWeakRef(o.untyped_storage()))
        return b if b is not None and b is not o and b.dtype == o.dtype else None
    # outputs in that memory that are not views (``base.detach()``) are taken from it too
    others = [k for k in graph if outs[k]._base is None and base_of(outs[k]) is not None]
    for k in others:
        if outs[k].requires_grad:
            raise Unsupported(_SEPARATE_HISTORY.format(k=k, what="an intermediate"))
    for k in views + others:
        o, info = outs[k], outputs[k]
        base = base_of(o)
        b = index.get(id(base))
        if b is None:
            b = index[id(base)] = len(bases)
            keep.append(base)
            brg = bool(base.requires_grad)
            bases.append(OutputInfo("intermediate_base", base=k, requires_grad=brg, differentiable=brg,
                                    size=tuple(base.shape), stride=tuple(base.stride()),
                                    dtype=str(base.dtype).replace("torch.", ""), device=str(base.device)))
        outputs[k] = OutputInfo("alias_of_intermediate", base=b, requires_grad=info.requires_grad,
                                size=info.size, stride=info.stride,
                                rel_offset=o.storage_offset() - base.storage_offset(), dtype=info.dtype,
                                creation_meta=info.creation_meta, **_bits_against(o, base))
    return bases


def _bits_against(view: torch.Tensor, base: torch.Tensor) -> dict:
    """The conjugate and negative bits a view has that its base has not (or the reverse)."""
    return {"conj": bool(view.is_conj() != base.is_conj()), "neg": bool(view.is_neg() != base.is_neg())}


