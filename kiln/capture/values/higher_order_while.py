"""``torch.while_loop(cond_fn, body_fn, carried_inputs)`` in compiled code: a higher-order op node.

As with ``torch.cond`` (``higher_order_cond.py``), torch's wrapper is not traced: ``cond_fn``
and ``body_fn`` are each inlined once on the carried inputs, moved into GraphModules, and the
graph gets one ``torch.ops.higher_order.while_loop(cond_gm, body_gm, carried, additional)``
node. What they read from outside (closures, parameters, sizes) becomes the additional inputs,
as torch's own capture makes them.

Refused (the call runs natively; an error under fullgraph): carried inputs that are not
tensors; ``cond_fn`` not returning a one-element bool tensor; ``body_fn`` not returning a
tuple or list of tensors of the carried inputs' count, dtypes, devices and shapes; outputs that
alias inputs; Python side effects, in-place writes to tensors from outside, grad-mode changes;
and any input requiring grad with grad mode on (torch's while_loop does not support training).
"""
from __future__ import annotations

import torch

from ...errors import Unsupported
from .base import Value
from .containers import BaseSequenceValue, TupleValue
from .higher_order_bodies import fake_call, move_to_subgraphs, numel, tensor_mismatch, trace_branch
from .tensor import TensorValue

WHILE_LOOP_FUNCTIONS = (torch.while_loop,)   # (torch._higher_order_ops.while_loop is the same function)
WHILE_LOOP_OP = torch.ops.higher_order.while_loop

_PARAMETERS = ("cond_fn", "body_fn", "carried_inputs")


def call_while_loop(tx, args: list[Value], kwargs: dict[str, Value]) -> Value:
    bound = _bind(args, kwargs)
    carried = _carried(bound["carried_inputs"])
    if torch.is_grad_enabled() and any(c.fake.requires_grad for c in carried):
        raise Unsupported("torch.while_loop on tensors that require grad (torch's while_loop does "
                          "not support training)")
    cond_b = trace_branch(tx, "cond", "a torch.while_loop cond_fn", bound["cond_fn"], carried)
    body_b = trace_branch(tx, "body", "a torch.while_loop body_fn", bound["body_fn"], carried)
    if cond_b.kind is not None or cond_b.outputs[0].fake.dtype != torch.bool \
            or numel(cond_b.outputs[0].fake) != 1:
        raise Unsupported("a torch.while_loop cond_fn not returning a one-element bool tensor")
    if body_b.kind is None or len(body_b.outputs) != len(carried):
        raise Unsupported(f"a torch.while_loop body_fn not returning a tuple or list of "
                          f"{len(carried)} tensors (one per carried input)")
    for i, (out, c) in enumerate(zip(body_b.outputs, carried)):
        reason = tensor_mismatch(out.fake, c.fake)
        if reason is not None:
            raise Unsupported(f"a torch.while_loop body_fn output {i} and carried input {i} of "
                              f"different {reason}")

    output = tx.output
    output.control_flow_ops += 1
    index = output.control_flow_ops
    carried_nodes = [c.node for c in carried]
    inputs, gms = move_to_subgraphs(tx, [cond_b, body_b], carried_nodes,
                                    [f"WhileCond{index}", f"WhileBody{index}"], "torch.while_loop")
    _returns_bare(gms[0])      # (torch's while_loop takes the bool tensor itself, not a tuple of it)
    additional = inputs[len(carried_nodes):]
    if any(isinstance(n.meta["example_value"], torch.Tensor) and n.meta["example_value"].requires_grad
           for n in additional) and torch.is_grad_enabled():
        raise Unsupported("a torch.while_loop reading tensors that require grad (torch's "
                          "while_loop does not support training)")
    fakes = [n.meta["example_value"] for n in inputs]
    fake_outs = fake_call(tx, WHILE_LOOP_OP, (gms[0], gms[1], tuple(fakes[:len(carried)]),
                                              tuple(fakes[len(carried):])), "torch.while_loop")
    gm_nodes = [output.constant_node(gm) for gm in gms]
    node = output._op_node("call_function", WHILE_LOOP_OP,
                           (*gm_nodes, tuple(carried_nodes), tuple(additional)), {})
    return TupleValue(list(output._wrap_result(node, tuple(fake_outs)).items))


def _returns_bare(gm: torch.fx.GraphModule) -> None:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    (values,) = out.args
    if isinstance(values, (tuple, list)) and len(values) == 1:
        out.args = (values[0],)
        gm.recompile()


def _bind(args: list[Value], kwargs: dict[str, Value]) -> dict[str, Value]:
    if len(args) > len(_PARAMETERS):
        raise Unsupported("torch.while_loop with more than three arguments (eager rejects it)")
    bound = dict(zip(_PARAMETERS, args))
    for k, v in kwargs.items():
        if k not in _PARAMETERS or k in bound:
            raise Unsupported(f"torch.while_loop with argument {k!r} (eager rejects it)")
        bound[k] = v
    missing = [p for p in _PARAMETERS if p not in bound]
    if missing:
        raise Unsupported(f"torch.while_loop without {', '.join(missing)}")
    return bound


def _carried(v: Value) -> list[TensorValue]:
    if not isinstance(v, BaseSequenceValue) or v.python_type() not in (tuple, list):
        raise Unsupported(f"torch.while_loop carried_inputs {v.describe()} (kiln captures a tuple "
                          "or list of tensors)")
    for item in v.items:
        if not isinstance(item, TensorValue) or item.node is None:
            raise Unsupported(f"a torch.while_loop carried input {item.describe()} (kiln captures "
                              "tensors)")
    if not v.items:
        raise Unsupported("torch.while_loop without carried inputs")
    return list(v.items)
