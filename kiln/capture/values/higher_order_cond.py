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
from torch.multiprocessing.reductions import StorageWeakRef

from ...errors import FrameRunsEagerly, Unsupported
from .base import Value
from .containers import BaseSequenceValue, ListValue, TupleValue
from .subgraphs import mutated_operands, new_nodes, subgraph
from .tensor import TensorValue

COND_FUNCTIONS = (torch.cond,)   # (torch._higher_order_ops.cond is the same function)
COND_OP = torch.ops.higher_order.cond

_PARAMETERS = ("pred", "true_fn", "false_fn", "operands")


class Branch:
    """One traced branch: its nodes (still in the outer graph), its output tensors and their
    structure (a tensor, or a tuple/list of them)."""

    def __init__(self, name: str, what: str, region: list, outputs: list[TensorValue], kind: type | None):
        self.name = name
        self.what = what        # its name in reasons: "a torch.cond true branch"
        self.region = region
        self.outputs = outputs
        self.kind = kind        # None: a single tensor; tuple or list: a sequence of them

    def reads(self) -> list:
        """The outer nodes the branch reads (in first-read order), ``get_attr`` constants aside."""
        inside = set(self.region)
        found: list = []
        for a in [a for n in self.region for a in n.all_input_nodes] + [o.node for o in self.outputs]:
            if a not in inside and a.op != "get_attr" and a not in found:
                found.append(a)
        return found


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


def move_to_subgraphs(tx, branches: list[Branch], operand_nodes: list, class_names: list[str],
                      what: str) -> tuple[list, list[torch.fx.GraphModule]]:
    """Each branch's nodes, moved out of the capture's graph into a GraphModule taking the
    same inputs: ``operand_nodes``, then what any branch reads from outside (lifted). Returns
    those inputs and the GraphModules."""
    output = tx.output
    lifted: list = []
    for b in branches:
        for a in b.reads():
            if a not in operand_nodes and a not in lifted:
                lifted.append(a)
    inputs = list(operand_nodes) + lifted
    for n in inputs:
        if "example_value" not in n.meta:
            raise Unsupported(f"{what}: a subgraph reads {n.name}, which has no example value")
    for b in branches:
        refuse_aliased_outputs(b, inputs)
    gms = []
    for b, class_name in zip(branches, class_names):
        gm = subgraph([(f"arg{i}", n) for i, n in enumerate(inputs)], b.region,
                      [o.node for o in b.outputs], class_name, output.constant_attrs)
        gms.append(gm)
    for b in reversed(branches):
        for n in reversed(b.region):
            output.graph.erase_node(n)
    return inputs, gms


def fake_call(tx, op, args: tuple, what: str):
    """``op(*args)`` on fake tensors: the example outputs of the node."""
    try:
        with tx.output.fake_mode:
            return op(*args)
    except Unsupported:
        raise
    except Exception as e:
        raise Unsupported(f"{what}: running the captured subgraphs on fake tensors failed "
                          f"({type(e).__name__}: {e})") from e


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


def numel(fake: torch.Tensor):
    n = 1
    for d in fake.shape:
        if not isinstance(d, int):
            return None     # a symbolic size: not known to be one element
        n *= d
    return n


def trace_branch(tx, name: str, what: str, fn: Value, operands: list[TensorValue]) -> Branch:
    """``fn(*operands)`` inlined into the capture's graph; ``what`` names it in reasons ("a
    torch.cond true branch"). Its nodes stay in the graph until the caller moves them out."""
    output = tx.output
    graph = output.graph
    before = set(graph.nodes)
    effects = output.side_effects.count()
    try:
        result = tx.call(fn, list(operands), {})
    except FrameRunsEagerly:
        raise
    except Unsupported as e:
        raise Unsupported(f"{what} kiln cannot capture ({e.construct})") from e
    region = new_nodes(graph, before)
    if output.side_effects.count() != effects:
        raise Unsupported(f"{what} that changes Python state (a subgraph "
                          "of torch's control flow has no Python effects)")
    inside = set(region)
    for n in region:
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            raise Unsupported(f"{what} that changes grad mode")
        if any(a not in inside for a in mutated_operands(n)):
            raise Unsupported(f"{what} that changes a tensor in place that it "
                              "did not create")
    if isinstance(result, TensorValue):
        outputs, kind = [result], None
    elif isinstance(result, (TupleValue, ListValue)) and result.python_type() in (tuple, list):
        outputs, kind = list(result.items), result.python_type()
        for item in outputs:
            if not isinstance(item, TensorValue):
                raise Unsupported(f"{what} returning {item.describe()} "
                                  "(kiln captures tensor outputs)")
    else:
        raise Unsupported(f"{what} returning {result.describe()} (kiln captures "
                          "a tensor or a tuple or list of tensors)")
    for o in outputs:
        if o.node is None:
            raise Unsupported(f"{what} returning a tensor with no graph value")
    return Branch(name, what, region, outputs, kind)


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


def tensor_mismatch(x: torch.Tensor, y: torch.Tensor) -> str | None:
    """How two tensors' dtype, device or shape differ ("dtypes (float32 and int32)"), or None."""
    if x.dtype != y.dtype:
        return f"dtypes ({x.dtype} and {y.dtype})"
    if x.device != y.device:
        return f"devices ({x.device} and {y.device})"
    # sizes compared as expressions: comparing SymInts would add guards
    if [str(d) for d in x.shape] != [str(d) for d in y.shape]:
        return f"shapes ({tuple(x.shape)} and {tuple(y.shape)})"
    return None


def refuse_aliased_outputs(branch: Branch, inputs: list) -> None:
    """An output that is an input or a view of one: torch's control-flow ops refuse it (eager
    raises), so the call is left to eager."""
    storages = {StorageWeakRef(n.meta["example_value"].untyped_storage()) for n in inputs
                if isinstance(n.meta["example_value"], torch.Tensor)}
    for o in branch.outputs:
        if StorageWeakRef(o.fake.untyped_storage()) in storages:
            raise Unsupported(f"{branch.what} returning one of its inputs or a view of one (an "
                              "alias, which torch refuses)")
