"""``torch.cond(pred, true_fn, false_fn, operands)`` in compiled code: a higher-order op node.

torch's ``cond`` is not traced through (its Python wrapper validates pytrees and compiles the
call with dynamo): the call is modelled as what it computes.

* A predicate known at capture time (a Python bool, or a symbolic bool from sizes, guarded as
  any ``if`` on it is) runs the branch it selects, inlined like any call: eager's ``cond``
  does the same.
* A tensor predicate (one element: a data-dependent choice) keeps both branches. Each is
  inlined on the operands, its nodes are moved out of the graph into a ``GraphModule``
  (``true_graph_N`` / ``false_graph_N``, held by the graph module as constants, read with
  ``get_attr``), and the graph gets one ``torch.ops.higher_order.cond(pred, true_gm, false_gm,
  operands)`` node. What a branch reads from outside itself (closures' tensors, parameters,
  sizes) is lifted into the operands: both subgraphs take the same operands, the user's first.
  torch's cond has fake, functionalization, make_fx and autograd implementations, so the AOT
  stages trace through the node (an ATen-level ``cond`` in the graphs they make) and Inductor
  lowers it.

Whatever eager would treat differently raises ``Unsupported`` at the call (the call then runs
natively; an error under fullgraph): branches returning different structures, dtypes, shapes or
devices; outputs that are not tensors; a branch returning one of its inputs or a view of one (an
alias, which torch refuses); a branch that changes Python state, changes a tensor it did not create in
place, or changes grad mode (it would happen whichever branch is taken).
"""
from __future__ import annotations

import torch

from ...errors import Unsupported
from .base import Value
from .containers import BaseSequenceValue, ListValue, TupleValue
from .higher_order_bodies import Branch, fake_call, move_to_subgraphs, numel, tensor_mismatch, trace_branch
from .tensor import TensorValue

COND_FUNCTIONS = (torch.cond,)   # (torch._higher_order_ops.cond is the same function)
COND_OP = torch.ops.higher_order.cond

_PARAMETERS = ("pred", "true_fn", "false_fn", "operands")


def call_cond(tx, args: list[Value], kwargs: dict[str, Value]) -> Value:
    bound = _bind(args, kwargs)
    pred, true_fn, false_fn = bound["pred"], bound["true_fn"], bound["false_fn"]
    operands = _operands(bound.get("operands"))
    if not isinstance(pred, TensorValue):
        # known when captured: eager runs the branch it selects (a guard keeps the choice)
        if pred.is_constant() and type(pred.as_constant()) is not bool:
            raise Unsupported(f"torch.cond with predicate {pred.describe()} (eager rejects it)")
        taken = true_fn if pred.truthy(tx) else false_fn
        return tx.call(taken, list(operands), {})
    if pred.node is None:
        raise Unsupported("a torch.cond predicate with no graph value")
    if numel(pred.fake) != 1:
        raise Unsupported("torch.cond with a predicate of more than one element (eager rejects it)")

    output = tx.output
    branches = []
    for name, fn in (("true", true_fn), ("false", false_fn)):
        branch = trace_branch(tx, name, f"a torch.cond {name} branch", fn, operands)
        branches.append(branch)
    true_b, false_b = branches
    _check_same_outputs(true_b, false_b)

    output.control_flow_ops += 1
    inputs, gms = move_to_subgraphs(tx, branches, [o.node for o in operands],
                                    [f"TrueBranch{output.control_flow_ops}", f"FalseBranch{output.control_flow_ops}"],
                                    "torch.cond")
    fake_inputs = tuple(n.meta["example_value"] for n in inputs)
    fake_outs = fake_call(tx, COND_OP, (pred.fake, gms[0], gms[1], fake_inputs), "torch.cond")
    gm_nodes = [output.constant_node(gm) for gm in gms]
    node = output._op_node("call_function", COND_OP, (pred.node, *gm_nodes, tuple(inputs)), {})
    result = output._wrap_result(node, tuple(fake_outs))
    items = list(result.items)
    if true_b.kind is None:
        return items[0]
    return ListValue(items) if true_b.kind is list else TupleValue(items)


def _bind(args: list[Value], kwargs: dict[str, Value]) -> dict[str, Value]:
    if len(args) > len(_PARAMETERS):
        raise Unsupported("torch.cond with more than four arguments (eager rejects it)")
    bound = dict(zip(_PARAMETERS, args))
    for k, v in kwargs.items():
        if k not in _PARAMETERS or k in bound:
            raise Unsupported(f"torch.cond with argument {k!r} (eager rejects it)")
        bound[k] = v
    missing = [p for p in _PARAMETERS[:3] if p not in bound]
    if missing:
        raise Unsupported(f"torch.cond without {', '.join(missing)}")
    return bound


def _operands(v: Value | None) -> list[TensorValue]:
    if v is None:
        return []
    if not isinstance(v, BaseSequenceValue) or v.python_type() not in (tuple, list):
        raise Unsupported(f"torch.cond operands {v.describe()} (kiln captures a tuple or list of tensors)")
    for item in v.items:
        if not isinstance(item, TensorValue) or item.node is None:
            raise Unsupported(f"a torch.cond operand {item.describe()} (kiln captures tensors)")
    return list(v.items)


def _check_same_outputs(a: Branch, b: Branch) -> None:
    def shape(kind, outs):
        return "a tensor" if kind is None else f"a {kind.__name__} of {len(outs)} tensors"

    if a.kind is not b.kind or len(a.outputs) != len(b.outputs):
        raise Unsupported(f"torch.cond branches returning different structures (true: "
                          f"{shape(a.kind, a.outputs)}, false: {shape(b.kind, b.outputs)})")
    for i, (x, y) in enumerate(zip(a.outputs, b.outputs)):
        reason = tensor_mismatch(x.fake, y.fake)
        if reason is not None:
            raise Unsupported(f"torch.cond branches returning different {reason} (output {i})")
