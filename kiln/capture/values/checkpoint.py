"""``torch.utils.checkpoint.checkpoint(fn, *args, ...)`` in compiled code: a recompute region.

Eager checkpointing runs ``fn``, keeps only its inputs, and runs ``fn`` again in the backward
to get the activations back. torch's implementation (saved-tensor hooks, autograd.Function,
dynamo-disable wrappers, a generator) is not traced: the call is modelled as what it computes.
The body is inlined as any call is (its guards as usual), and the nodes it adds are tagged as
one region (``kiln/aot/recompute.py`` reads the tags)::

    node.meta["ac_graph_id"]  the region, numbered from 1 in the capture (the outermost of
                              nested regions wins: its recomputation reruns the inner ones)
    node.meta["recompute"]    CheckpointPolicy.PREFER_RECOMPUTE
    node.meta["kiln_checkpoint_policy"]  a selective policy (``context_fn=``), decided per
                              ATen op when the AOT stage traces the graph

The forward computes what eager's forward computes; the AOT partitioner recomputes the region
in the backward instead of saving its insides, and never recomputes a random op (its output
is saved: the recomputation sees the numbers the forward drew, as eager's restored RNG state
gives). With ``use_reentrant=True`` (torch's default when it is not given) eager runs ``fn``
under no_grad and differentiates only when a tensor argument requires grad: the body is then
captured under no_grad when none does.

Not modelled, so the call runs natively (a graph break at it; an error under fullgraph): a
``context_fn`` other than ``create_selective_checkpoint_contexts`` over a function or a list of
ops, ``debug=True``, arguments eager rejects, and a body that does not capture or that changes
Python state outside itself (eager's recomputation would do that a second time).
"""
from __future__ import annotations

import functools
import warnings

import torch
import torch.fx
import torch.utils.checkpoint as torch_checkpoint
from torch.multiprocessing.reductions import StorageWeakRef

from ... import _torch
from ...aot.recompute import POLICY_KEY, REGION_KEY, SELECTIVE_POLICY_KEY
from ...errors import FrameRunsEagerly, Unsupported
from ...inplace_ops import mutates
from .base import RealCallableValue, Value
from .containers import BaseSequenceValue, DictValue, SetValue, TupleValue
from .functions import PartialValue, UserFunctionValue
from .objects import ObjectValue
from .tensor import TensorValue

CHECKPOINT = torch_checkpoint.checkpoint

_NODE_OPS = ("call_function", "call_method", "call_module")


class SelectivePolicy:
    """A selective-checkpoint policy, called per ATen op: ``policy(ctx, op, *args, **kwargs)``
    -> CheckpointPolicy or bool (True: save). ``str()`` is its part of the compile-cache key."""

    def __init__(self, fn, key: str):
        self.fn = fn
        self.key = key

    def __call__(self, ctx, op, *args, **kwargs):
        return self.fn(ctx, op, *args, **kwargs)

    def __str__(self) -> str:
        return self.key

    __repr__ = __str__


def call_checkpoint(tx, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if not args:
        raise Unsupported("torch.utils.checkpoint.checkpoint() without a function")
    fn, fn_args = args[0], list(args[1:])
    fn_kwargs = dict(kwargs)
    reentrant = _constant(fn_kwargs.pop("use_reentrant", None), "use_reentrant")
    context_fn = fn_kwargs.pop("context_fn", None)
    determinism = _constant(fn_kwargs.pop("determinism_check", None), "determinism_check")
    debug = _constant(fn_kwargs.pop("debug", None), "debug")
    _constant(fn_kwargs.pop("early_stop", None), "early_stop")   # (only when recomputation stops)
    # preserve_rng_state: random ops are never recomputed, so the backward always sees the
    # forward's numbers, as with eager's default (True)
    _constant(fn_kwargs.pop("preserve_rng_state", None), "preserve_rng_state")

    if reentrant is None:
        reentrant, message = _torch.checkpoint_default_mode()
        if reentrant is None:
            raise Unsupported("torch.utils.checkpoint.checkpoint() without use_reentrant (this torch "
                              "raises: it runs natively)")
        if message is not None:
            _warn_at(tx, message)
    if debug:
        raise Unsupported("torch.utils.checkpoint.checkpoint(debug=True) (runs natively)")
    if determinism is not None and determinism not in ("default", "none"):
        raise Unsupported(f"torch.utils.checkpoint.checkpoint(determinism_check={determinism!r}) "
                          "(eager rejects it)")
    policy = _selective_policy(context_fn)
    if reentrant and (fn_kwargs or policy is not None or context_fn is not None and not _is_noop(context_fn)):
        raise Unsupported("torch.utils.checkpoint.checkpoint(use_reentrant=True) with keyword arguments "
                          "or a context_fn (eager rejects them)")

    needs_grad = any(isinstance(a, TensorValue) and a.fake.requires_grad for a in fn_args)
    if reentrant and not needs_grad:
        _warn_at(tx, "None of the inputs have requires_grad=True. Gradients will be None")
    if not torch.is_grad_enabled():        # nothing is saved, nothing recomputed
        return _run_body(tx, fn, fn_args, fn_kwargs)
    if reentrant and not needs_grad:
        # eager runs the function under no_grad and its outputs need no gradient
        tx.output.set_grad_enabled(False)
        try:
            return _run_body(tx, fn, fn_args, fn_kwargs)
        finally:
            tx.output.set_grad_enabled(True)

    graph = tx.output.graph
    before = set(graph.nodes)
    effects = tx.output.side_effects.count()
    result = _run_body(tx, fn, fn_args, fn_kwargs)
    if tx.output.side_effects.count() != effects:
        raise Unsupported("a checkpointed function that changes Python state outside itself (eager "
                          "runs it again in the backward): checkpoint runs natively")
    if _writes_outside(graph, before):
        raise Unsupported("a checkpointed function that writes a tensor made outside it in place "
                          "(eager writes it again in the backward's recomputation): checkpoint "
                          "runs natively")
    if reentrant:
        _refuse_what_a_function_would_not_return(result, before)
    tx.output.recompute_regions += 1
    region = tx.output.recompute_regions
    for node in graph.nodes:
        if node.op in _NODE_OPS and node not in before:
            node.meta[REGION_KEY] = region
            node.meta[POLICY_KEY] = torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE
            if policy is not None:
                node.meta[SELECTIVE_POLICY_KEY] = policy
            else:
                node.meta.pop(SELECTIVE_POLICY_KEY, None)
    return result


def _refuse_what_a_function_would_not_return(result: Value, before: set) -> None:
    """Eager's reentrant checkpoint is an autograd.Function over a no_grad forward: only the
    tensors its function returns alone or as items of a returned tuple are the Function's
    outputs, new tensors with its backward. A tensor inside a list, a dict or an object comes
    back as the no_grad forward made it (no gradient), and a tensor made outside the function
    (an argument returned as it is) comes back as a new tensor. The region would give the
    first a gradient and hand back the second itself: the call runs natively instead."""
    top = result.items if isinstance(result, TupleValue) and result.python_type() is tuple else [result]
    for v in top:
        if isinstance(v, TensorValue):
            if v.node is None or v.node in before or v.node.op in ("placeholder", "get_attr"):
                raise Unsupported("torch.utils.checkpoint.checkpoint(use_reentrant=True) of a function that "
                                  "returns a tensor made outside it (eager returns a new tensor): "
                                  "checkpoint runs natively")
        elif _holds_tensor(v):
            raise Unsupported("torch.utils.checkpoint.checkpoint(use_reentrant=True) of a function that "
                              "returns a tensor inside a list, dict or object (eager returns it without "
                              "a gradient): checkpoint runs natively")


def _holds_tensor(v: Value, depth: int = 0) -> bool:
    if isinstance(v, TensorValue):
        return True
    if depth > 32:
        return True             # (too deep to tell: as if it held one)
    if isinstance(v, BaseSequenceValue):
        return any(_holds_tensor(i, depth + 1) for i in v.items)
    if isinstance(v, DictValue):
        return any(_holds_tensor(i, depth + 1) for i in v.items.values())
    if isinstance(v, (ObjectValue, SetValue)):
        return True             # (its attributes or items are not looked into)
    return False


def _writes_outside(graph, before: set) -> bool:
    """Whether a node added since ``before`` writes in place (or through ``out=``) a tensor
    that was not made after ``before``, or a view of one."""
    # (an input read for the first time inside the region is a new placeholder: not made here)
    made = {n for n in graph.nodes if n not in before and n.op not in ("placeholder", "get_attr")}
    for node in made:
        if node.op not in ("call_function", "call_method"):
            continue
        if not (mutates(node.op, node.target) or "out" in node.kwargs):
            continue
        written = [node.args[0]] if node.args else []
        out = node.kwargs.get("out")
        written += list(out) if isinstance(out, (tuple, list)) else [out] if out is not None else []
        for w in written:
            if isinstance(w, torch.fx.Node) and _root(w, made) not in made:
                return True
    return False


def _root(node, made: set):
    """The node a chain of views inside the region starts from."""
    seen = 0
    while node in made and node.args and isinstance(node.args[0], torch.fx.Node) and seen < 1000:
        val = node.meta.get("example_value")
        base = node.args[0].meta.get("example_value")
        if not (isinstance(val, torch.Tensor) and isinstance(base, torch.Tensor) and val._is_view()
                and StorageWeakRef(val.untyped_storage()) == StorageWeakRef(base.untyped_storage())):
            break
        node, seen = node.args[0], seen + 1
    return node


def _run_body(tx, fn: Value, args: list[Value], kwargs: dict[str, Value]) -> Value:
    try:
        return tx.call(fn, args, kwargs)
    except FrameRunsEagerly:
        raise
    except Unsupported as e:
        # the body cannot be captured: the call of checkpoint runs natively (eager's
        # checkpointing), not as a compiled function of its own
        raise Unsupported(f"torch.utils.checkpoint.checkpoint of a function kiln cannot capture "
                          f"({e.construct}): checkpoint runs natively") from e


def _constant(v: Value | None, name: str):
    if v is None:
        return None
    try:
        return v.as_constant()
    except Unsupported:
        raise Unsupported(f"torch.utils.checkpoint.checkpoint({name}=...) that is not a constant") from None


def _is_noop(v: Value) -> bool:
    return isinstance(v, UserFunctionValue) and v.fn is torch_checkpoint.noop_context_fn


def _selective_policy(context_fn: Value | None) -> SelectivePolicy | None:
    """The policy of ``context_fn=partial(create_selective_checkpoint_contexts, policy)``; None
    for no context_fn; Unsupported for any other context_fn."""
    if context_fn is None or _is_noop(context_fn):
        return None
    if not (isinstance(context_fn, PartialValue) and isinstance(context_fn.func, UserFunctionValue)
            and context_fn.func.fn is torch_checkpoint.create_selective_checkpoint_contexts
            and len(context_fn.args) == 1 and set(context_fn.kwargs) <= {"allow_cache_entry_mutation"}):
        raise Unsupported(f"torch.utils.checkpoint.checkpoint(context_fn={context_fn.describe()}): only "
                          "partial(create_selective_checkpoint_contexts, policy) is compiled")
    policy = context_fn.args[0]
    if isinstance(policy, BaseSequenceValue):
        ops = [getattr(item, "fn", None) if isinstance(item, RealCallableValue) else None for item in policy.items]
        if not all(isinstance(op, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)) for op in ops):
            raise Unsupported("create_selective_checkpoint_contexts over a list that is not of OpOverloads "
                              "(eager rejects it)")
        for item in policy.items:
            item.real_object()
        return SelectivePolicy(functools.partial(_save_listed, tuple(ops)),
                               "must_save:" + ",".join(sorted(str(op) for op in ops)))
    real = policy.real_object() if isinstance(policy, (UserFunctionValue, RealCallableValue)) else None
    if real is None or not callable(real):
        raise Unsupported(f"create_selective_checkpoint_contexts({policy.describe()}): the policy must be "
                          "a function that exists outside the compiled code")
    name = f"{getattr(real, '__module__', '')}.{getattr(real, '__qualname__', type(real).__name__)}"
    return SelectivePolicy(real, f"{name}@{id(real):x}")


def _save_listed(ops: tuple, ctx, op, *args, **kwargs):
    policy = torch_checkpoint.CheckpointPolicy
    return policy.MUST_SAVE if op in ops else policy.PREFER_RECOMPUTE


def _warn_at(tx, message: str) -> None:
    """Eager's warning, at the user's line of the call (once per capture)."""
    filename, lineno, _ = tx.location()
    warnings.warn_explicit(message, UserWarning, filename, lineno or 0, module=tx.f_globals.get("__name__"),
                           registry=tx.f_globals.setdefault("__warningregistry__", {}))
