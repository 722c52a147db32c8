"""A custom ``torch.autograd.Function`` called in compiled code: ``MyFn.apply(*args)``.

Eager runs the user's ``forward`` under no_grad with a fresh ``ctx``, and later, when a
gradient is needed, the user's ``backward`` with that ctx. kiln captures both:

* the forward is inlined by the interpreter, under no_grad, with a modelled ctx
  (``CtxValue``); its nodes land in the capture's graph like any inlined code, so what it reads
  is guarded like any inlined code;
* if eager would build a backward (grad mode on and a tensor argument requires grad), the
  backward is inlined too, speculatively, with fake incoming gradients (``GradValue``): what it
  reads is guarded, its effects checked (none allowed), its operations recorded;
* both node ranges are then moved out of the graph into two FX subgraphs, and the graph gets
  ONE node calling a generated ``torch.autograd.Function`` (``runtime_function``) whose forward
  runs the forward subgraph and whose backward runs the backward subgraph.

torch's own autograd then treats the outputs exactly as eager's (a returned input becomes a
view, non-differentiable outputs, dirty inputs, gradients materialized and accumulated where
the user's backward sends them). Under the AOT backends, make_fx traces the generated forward
and, when the joint graph calls ``torch.autograd.grad``, the generated backward: the joint
graph holds the user's backward, never the derivative of the forward's operations.

Whatever is not modelled raises ``Unsupported`` at the ``.apply`` call (never from inside the
inlined forward, so the break does not try to compile torch's ``Function.apply``): the call
then runs natively, which is correct by construction.
"""
from __future__ import annotations

import contextlib
import inspect
import operator
import types

import torch

from ... import _torch
from ...errors import Unsupported
from ..interpreter import BreakHere, GraphBreakRequest
from ..semantics import bind_arguments
from ..captured_function import runtime_function
from . import backward_capture
from .base import CONSTANT_TYPES, ConstantValue, Value
from .containers import DictValue, ListValue, SetValue, TupleValue
from .functions import MethodValue, UserFunctionValue
from .objects import ClassValue, NewObjectValue, static_lookup
from .subgraphs import mutated_operands, new_nodes, subgraph
from .tensor import TensorValue

_BASE = torch.autograd.function._SingleLevelFunction
_BASE_SETUP_CONTEXT = _BASE.__dict__["setup_context"]
_BASE_JVP = _BASE.__dict__["jvp"]
_BASE_VMAP = torch.autograd.Function.__dict__["vmap"]
_ONCE_DIFFERENTIABLE_CODE = torch.autograd.function.once_differentiable(lambda ctx: None).__code__

# What the modelled ctx offers; every other name a real ctx has is refused (set or read).
_CTX_METHODS = frozenset({"save_for_backward", "mark_dirty", "mark_non_differentiable",
                          "set_materialize_grads"})
_CTX_ATTRS = frozenset({"saved_tensors", "needs_input_grad"})
_CTX_INTERNALS = frozenset(dir(torch.autograd.function.BackwardCFunction)) - _CTX_METHODS - _CTX_ATTRS

# In-place methods that change a tensor's metadata (not only its data).
_METADATA_MUTATIONS = frozenset({"resize_", "resize_as_", "t_", "transpose_", "squeeze_",
                                 "unsqueeze_", "as_strided_", "swapdims_", "swapaxes_", "set_",
                                 "detach_", "requires_grad_", "share_memory_"})


def call_apply(tx, cls_value: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``cls.apply(*args, **kwargs)`` during capture (``cls`` a subclass of Function)."""
    cls = cls_value.as_constant() if isinstance(cls_value, ClassValue) else None
    if not isinstance(cls, type) or not issubclass(cls, torch.autograd.Function):
        raise Unsupported(f"torch.autograd.Function.apply on {cls_value.describe()}")
    name = cls.__qualname__
    try:
        return _AutogradFunctionCall(tx, cls).run(args, kwargs)
    except (RecursionError, MemoryError):
        raise
    except Exception as e:
        if isinstance(e, (BreakHere, GraphBreakRequest)):  # pragma: no cover (top frame only)
            raise
        if not isinstance(e, Unsupported):   # a bug in kiln: the call runs natively
            raise Unsupported(f"autograd.Function {name}: internal error while capturing "
                              f"({type(e).__name__}: {e})") from e
        # A fresh exception: the break happens at the .apply call, which then runs natively
        # (an exception marked as raised inside an inlined callee would compile the callee,
        # torch's Function.apply). The innermost location is kept.
        if e.construct.startswith("autograd.Function"):
            raise Unsupported(e.construct, e.filename, e.lineno, e.source_line) from None
        raise Unsupported(f"autograd.Function {name}: {e.construct}", e.filename, e.lineno,
                          e.source_line) from None


class CtxValue(Value):
    """The ``ctx`` the user's forward, setup_context and backward receive."""

    def __init__(self, needs_input_grad: tuple[bool, ...]):
        self.needs_input_grad = needs_input_grad
        self.attrs: dict[str, Value] = {}
        self.saved: list[Value] = []            # what save_for_backward received
        self.dirty: list[Value] = []
        self.non_differentiable: list[Value] = []
        self.materialize_grads = True
        self.phase = "forward"
        self.saved_tensors_read = False

    def python_type(self):
        return torch.autograd.function.BackwardCFunction

    def describe(self):
        return "autograd.Function ctx"

    def truthy(self, tx):
        return True

    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name == "needs_input_grad":
            return TupleValue([ConstantValue(b) for b in self.needs_input_grad])
        if name == "saved_tensors":
            if self.phase != "backward":
                raise Unsupported("ctx.saved_tensors read before the backward")
            self.saved_tensors_read = True
            return TupleValue(list(self.saved))
        if name in _CTX_METHODS:
            return MethodValue(self, name)
        if name in _CTX_INTERNALS:
            raise Unsupported(f"ctx.{name} (not modelled by kiln)")
        raise tx.user_exception(AttributeError(f"'ctx' object has no attribute '{name}'"))

    def setattr(self, tx, name, value):
        if name in _CTX_INTERNALS or name in _CTX_ATTRS or name in _CTX_METHODS:
            raise Unsupported(f"setting ctx.{name}")
        self.attrs[name] = value

    def delattr(self, tx, name):
        if name not in self.attrs:
            raise Unsupported(f"del ctx.{name}")
        del self.attrs[name]

    def call_method(self, tx, name, args, kwargs):
        if kwargs:
            raise Unsupported(f"ctx.{name} with keyword arguments")
        if name == "set_materialize_grads":
            if len(args) != 1 or not args[0].is_constant():
                raise Unsupported("ctx.set_materialize_grads with a value not known at capture time")
            self.materialize_grads = bool(args[0].as_constant())
            return ConstantValue(None)
        if self.phase != "forward":
            raise Unsupported(f"ctx.{name} called in the backward")
        if name == "save_for_backward":
            for a in args:
                if not (isinstance(a, TensorValue) or a.is_constant() and a.as_constant() is None):
                    raise Unsupported(f"ctx.save_for_backward of {a.describe()}")
            self.saved = list(args)
            return ConstantValue(None)
        if not all(isinstance(a, TensorValue) for a in args):
            raise Unsupported(f"ctx.{name} of a value that is not a tensor")
        if name == "mark_dirty":
            self.dirty = list(args)
        elif name == "mark_non_differentiable":
            self.non_differentiable = list(args)
        else:  # pragma: no cover (getattr only hands out _CTX_METHODS)
            raise Unsupported(f"ctx.{name}")
        return ConstantValue(None)


class GradValue(TensorValue):
    """An incoming gradient of the backward being captured. Its shape and dtype are the
    output's (autograd guarantees them); its memory layout is not known until it arrives."""

    def getattr(self, tx, name):
        if name == "requires_grad":
            backward_capture.note_grad_mode_read()
        return super().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name in ("stride", "is_contiguous", "storage_offset", "data_ptr"):
            raise Unsupported(f"grad.{name}() (an incoming gradient's layout is only known "
                              "when the backward runs)")
        return super().call_method(tx, name, args, kwargs)


class _AutogradFunctionCall:
    """One ``.apply`` call being captured."""

    def __init__(self, tx, cls: type):
        self.tx = tx
        self.output = tx.output
        self.graph = tx.output.graph
        self.cls = cls

    # -- the class ---------------------------------------------------------------------------
    def _static(self, name: str, required: bool = True):
        raw = static_lookup(self.cls, name)
        if not isinstance(raw, staticmethod) or not isinstance(raw.__func__, types.FunctionType):
            if not required:
                return None
            raise Unsupported(f"{self.cls.__qualname__}.{name} is not a static method of Python code")
        self.output.guard_class_attribute(self.cls, name, raw)
        return raw.__func__

    def _check_class(self):
        cls = self.cls
        if static_lookup(cls, "jvp") is not _BASE_JVP:
            raise Unsupported("a jvp staticmethod (forward-mode AD is not captured)")
        if static_lookup(cls, "vmap") is not _BASE_VMAP or getattr(cls, "generate_vmap_rule", False):
            raise Unsupported("a vmap rule (not captured)")
        self.forward = self._static("forward")
        setup = static_lookup(cls, "setup_context")
        self.setup_context = None
        if setup is not _BASE_SETUP_CONTEXT:
            self.setup_context = self._static("setup_context")

    # -- the call ----------------------------------------------------------------------------
    def run(self, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if backward_capture.active():
            raise Unsupported("an autograd.Function applied inside a captured backward (its "
                              "grad mode is only known when the backward runs)")
        self._check_class()
        inputs = self._bind(args, kwargs)
        for a in inputs:
            if isinstance(a, TensorValue) and a.node is None:
                raise Unsupported("an argument tensor with no graph value")
        grad_mode = torch.is_grad_enabled()
        executable = grad_mode and any(isinstance(a, TensorValue) and a.fake.requires_grad for a in inputs)
        ctx = CtxValue(tuple(isinstance(a, TensorValue) and bool(a.fake.requires_grad) for a in inputs))

        before = set(self.graph.nodes)
        out = self._under_no_grad(lambda: self._trace_forward(ctx, inputs))
        region_f = new_nodes(self.graph, before)
        outs = self._check_outputs(out)
        self._check_forward_region(region_f)
        if not ctx.materialize_grads:
            raise Unsupported("ctx.set_materialize_grads(False) (which gradients are None is "
                              "only known when the backward runs)")
        for d in ctx.dirty:
            if not any(d is o for o in outs):
                raise Unsupported("ctx.mark_dirty of a tensor the forward does not return")
            if not any(d is a for a in inputs):
                raise Unsupported("ctx.mark_dirty of a tensor that is not an argument")

        backward = None
        if executable:
            backward = self._trace_backward(ctx, outs, inputs)
        return self._emit(ctx, inputs, out, outs, region_f, backward)

    def _bind(self, args, kwargs) -> list[Value]:
        """The inputs of the Function: the arguments as torch's ``Function.apply`` passes them."""
        if self.setup_context is None:
            if kwargs:
                raise Unsupported("keyword arguments to apply() of a forward(ctx, ...) (torch "
                                  "binds them in C++; kiln runs such calls natively)")
            return list(args)
        # setup_context style: apply binds the arguments to forward's signature, defaults
        # applied (torch.autograd.Function.apply, bind_default_args)
        code = self.forward.__code__
        if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount:
            if kwargs or code.co_kwonlyargcount:
                raise Unsupported("apply() binding *args/**kwargs or keyword-only parameters")
            return list(args)
        fn = UserFunctionValue(self.forward)
        bound = bind_arguments(self.tx, code, self.forward.__qualname__, list(args), dict(kwargs),
                               fn.defaults(self.tx), fn.kwdefaults(self.tx))
        return [bound[n] for n in code.co_varnames[:code.co_argcount]]

    def _under_no_grad(self, trace):
        prev = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            return trace()
        finally:
            torch._C._set_grad_enabled(prev)

    def _inline(self, fn, args: list[Value]) -> Value:
        return self.tx.inline_function(UserFunctionValue(fn), args, {})

    def _trace_forward(self, ctx: CtxValue, inputs: list[Value]) -> Value:
        if self.setup_context is None:
            return self._inline(self.forward, [ctx, *inputs])
        out = self._inline(self.forward, list(inputs))
        self._inline(self.setup_context, [ctx, TupleValue(list(inputs)), out])
        return out

    def _check_outputs(self, out: Value) -> list[Value]:
        if isinstance(out, TensorValue):
            return [out]
        if type(out) is not TupleValue or out.python_type() is not tuple:
            raise Unsupported(f"a forward returning {out.describe()} (kiln captures a tensor or "
                              "a tuple of tensors and constants)")
        for item in out.items:
            if isinstance(item, TensorValue):
                continue
            if not item.is_constant() or type(item.as_constant()) not in CONSTANT_TYPES:
                raise Unsupported(f"a forward output {item.describe()} (kiln captures tensors "
                                  "and constants)")
        return list(out.items)

    def _check_forward_region(self, region: list) -> None:
        inside = set(region)
        for n in region:
            name = n.target if n.op == "call_method" else getattr(n.target, "__name__", "")
            if name in _METADATA_MUTATIONS and any(a not in inside for a in mutated_operands(n)):
                raise Unsupported(f"the forward changes the metadata of a tensor it did not "
                                  f"create ({name})")

    # -- the backward --------------------------------------------------------------------------
    def _trace_backward(self, ctx: CtxValue, outs: list[Value], inputs: list[Value]):
        output = self.output
        backward = self._static("backward")
        if backward.__code__ is _ONCE_DIFFERENTIABLE_CODE:
            raise Unsupported("a backward decorated with once_differentiable")
        scratch = torch.fx.Graph()   # the incoming gradients: placeholders outside the graph
        grads: list[Value] = []
        grad_nodes = []
        for i, o in enumerate(outs):
            if not isinstance(o, TensorValue):
                grads.append(ConstantValue(None))
                continue
            node = scratch.placeholder(f"grad_{i}")
            with output.fake_mode:
                fake = torch.empty(o.fake.shape, dtype=o.fake.dtype, device=o.fake.device)
            node.meta["example_value"] = fake
            grad_nodes.append(node)
            grads.append(GradValue(node, fake))
        ctx.phase = "backward"
        effects = _effects_fingerprint(output.side_effects, ctx)
        before = set(self.graph.nodes)
        read_grad_mode: list = []
        with backward_capture.capturing(read_grad_mode), _autocast_off():   # (outside the forward's autocast)
            result = self._under_no_grad(lambda: self._inline(backward, [ctx, *grads]))
        reads_grad_mode = read_grad_mode[0]
        region_b = new_nodes(self.graph, before)
        if _effects_fingerprint(output.side_effects, ctx) != effects:
            raise Unsupported("the backward has side effects (they would happen in the forward)")
        inside = set(region_b)
        for n in region_b:
            if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
                raise Unsupported("a grad-mode change inside the backward")
            if any(a not in inside for a in mutated_operands(n)):
                raise Unsupported("the backward changes a tensor in place that it did not create")
        grads_in = self._check_backward_result(result, inputs)
        return _Backward(grad_nodes, region_b, grads_in, ctx.saved_tensors_read, reads_grad_mode)

    def _check_backward_result(self, result: Value, inputs: list[Value]) -> list[Value | None]:
        items = list(result.items) if type(result) is TupleValue and result.python_type() is tuple \
            else [result]
        grads: list[Value | None] = []
        for it in items:
            if isinstance(it, TensorValue):
                grads.append(it)
            elif it.is_constant() and it.as_constant() is None:
                grads.append(None)
            else:
                raise Unsupported(f"a backward returning {it.describe()} as a gradient")
        n = len(inputs)
        if len(grads) > n and all(g is None for g in grads[n:]):
            grads = grads[:n]   # torch drops extra trailing Nones
        if len(grads) != n:
            raise Unsupported(f"a backward returning {len(grads)} gradients for {n} inputs")
        for g, a in zip(grads, inputs):
            if g is not None and not isinstance(a, TensorValue):
                raise Unsupported("a backward returning a gradient for an input that is not a tensor")
        return grads

    # -- the graph node --------------------------------------------------------------------------
    def _emit(self, ctx: CtxValue, inputs, out, outs, region_f, backward) -> Value:
        graph, output = self.graph, self.output
        tensor_pos = [p for p, a in enumerate(inputs) if isinstance(a, TensorValue)]
        arg_nodes = [inputs[p].node for p in tensor_pos]
        out_pos = [k for k, o in enumerate(outs) if isinstance(o, TensorValue)]
        f_inside = set(region_f)

        # what the backward reads from before it: saved by the forward
        saved: list = []
        if backward is not None:
            if backward.reads_saved_tensors:
                for v in ctx.saved:
                    if isinstance(v, TensorValue) and v.node not in saved:
                        saved.append(v.node)
            n_sfb = len(saved)
            b_inside = set(backward.region) | set(backward.grad_nodes)
            needed = [a for n in backward.region for a in n.all_input_nodes]
            needed += [g.node for g in backward.grads_in if g is not None]
            for a in needed:
                if a not in b_inside and a not in saved and a.op != "get_attr":
                    saved.append(a)
        else:
            n_sfb = 0

        # the Function's inputs: the tensor arguments, then what else the forward reads from
        # outside (globals, attributes of objects passed in, sizes), detached
        outer_reads = [a for n in region_f for a in n.all_input_nodes]
        outer_reads += [outs[k].node for k in out_pos] + saved
        extras = []
        arg_set = set(arg_nodes)
        for a in outer_reads:
            if a not in f_inside and a not in arg_set and a not in extras and a.op != "get_attr":
                extras.append(a)
        for k in out_pos:
            if outs[k].node in extras:
                raise Unsupported("a forward returning a tensor that is neither an argument nor "
                                  "computed by the forward")
        in_nodes = arg_nodes + extras
        for n in in_nodes:
            if "example_value" not in n.meta:
                raise Unsupported(f"a value without an example ({n.name}) read by the forward")

        constants = getattr(output, "constant_attrs", {})
        fwd_gm = subgraph(
            [(f"in_{i}", n) for i, n in enumerate(in_nodes)], region_f,
            [outs[k].node for k in out_pos] + saved, f"{self.cls.__name__}Forward", constants)
        bwd_gm = None
        if backward is not None:
            grads_out = [backward.grads_in[p].node if backward.grads_in[p] is not None else None
                         for p in tensor_pos] + [None] * len(extras)
            bwd_gm = subgraph(
                [(f"grad_{i}", n) for i, n in enumerate(backward.grad_nodes)]
                + [(f"saved_{i}", n) for i, n in enumerate(saved)],
                backward.region, grads_out, f"{self.cls.__name__}Backward", constants)
            for n in reversed(backward.region):
                graph.erase_node(n)
        for n in reversed(region_f):
            graph.erase_node(n)

        out_index = {id(outs[k]): j for j, k in enumerate(out_pos)}
        non_diff = sorted({out_index[id(v)] for v in ctx.non_differentiable if id(v) in out_index})
        dirty_inputs = sorted({next(i for i, a in enumerate(arg_nodes) if a is d.node) for d in ctx.dirty})
        fn = runtime_function(self.cls, fwd_gm, bwd_gm, len(out_pos), n_sfb, non_diff, dirty_inputs,
                              reads_grad_mode=backward is not None and backward.reads_grad_mode)

        # the node. Where eager builds no backward, extras that require grad are passed
        # detached, so that the generated Function builds none either. Where it builds one,
        # they are passed as they are: the backward returns None for them (eager's forward
        # reads them under no_grad), and a differentiable backward that reads them
        # (create_graph=True) reaches them, as eager's does.
        call_args, fake_args = [], []
        for i, n in enumerate(in_nodes):
            fake = n.meta["example_value"]
            if backward is None and i >= len(arg_nodes) and isinstance(fake, torch.Tensor) \
                    and fake.requires_grad:
                with output.fake_mode:
                    fake = fake.detach()
                n = graph.call_method("detach", (n,))
                n.meta["example_value"] = fake
            call_args.append(n)
            fake_args.append(fake)
        try:
            with output.fake_mode, _torch.python_dispatcher():
                fake_outs = fn(*fake_args)
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(f"running the captured Function on fake tensors failed "
                              f"({type(e).__name__}: {e})")
        node = graph.call_function(fn, tuple(call_args))
        node.meta["example_value"] = fake_outs
        results: list[Value] = list(outs)
        for j, k in enumerate(out_pos):
            dirty = [a for a in ctx.dirty if a is outs[k]]
            if dirty:
                results[k] = dirty[0]          # a dirty input is returned as itself
                continue
            item = graph.call_function(operator.getitem, (node, j))
            item.meta["example_value"] = fake_outs[j]
            results[k] = TensorValue(item, fake_outs[j])
        if isinstance(out, TensorValue):
            return results[0]
        return TupleValue(results)


class _Backward:
    def __init__(self, grad_nodes, region, grads_in, reads_saved_tensors, reads_grad_mode=False):
        self.grad_nodes = grad_nodes
        self.region = region
        self.grads_in = grads_in
        self.reads_saved_tensors = reads_saved_tensors
        self.reads_grad_mode = reads_grad_mode



@contextlib.contextmanager
def _autocast_off():
    devices = [d for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
    with contextlib.ExitStack() as stack:
        for d in devices:
            stack.enter_context(torch.autocast(d, enabled=False))
        yield


def _effects_fingerprint(side_effects, ctx: CtxValue):
    """What the capture's side effects and the containers reachable from ctx hold now."""
    state = [tuple((id(c), _items_ids(c)) for c in side_effects.containers),
             tuple((k, id(v[2])) for k, v in side_effects.attrs.items()),
             tuple((k, id(v[2])) for k, v in side_effects.cells.items())]
    seen: set = set()
    todo = list(ctx.attrs.values())
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        ids = _items_ids(v)
        if ids is not None:
            state.append((id(v), ids))
            todo += _children(v)
    return state


def _children(v) -> list:
    if isinstance(v, (ListValue, TupleValue)):
        return list(v.items)
    if isinstance(v, (DictValue, SetValue)):
        return list(v.items.values())
    if isinstance(v, NewObjectValue):
        return list(v.attrs.values())
    return []


def _items_ids(v):
    if isinstance(v, (ListValue, TupleValue)):
        return tuple(id(i) for i in v.items)
    if isinstance(v, (DictValue, SetValue)):
        return tuple((k, id(i)) for k, i in v.items.items())
    if isinstance(v, NewObjectValue):
        return tuple((k, id(i)) for k, i in v.attrs.items())
    return None
