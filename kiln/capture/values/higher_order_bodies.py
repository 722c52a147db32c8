"""The bodies of torch's higher-order ops (``torch.cond`` branches, loop bodies, scan and map
combine functions) traced into the capture's graph, then moved into subgraphs of their own.

A body is inlined like any call on its operands (what it reads is guarded as usual), then the
nodes it added are copied into an FX ``GraphModule`` and erased from the capture's graph. What
it reads from outside itself (closures' tensors, parameters, sizes) becomes extra inputs of
the subgraph, after the operands. A body that changes Python state, writes a tensor it did not
create in place, or changes grad mode is refused: torch runs it any number of times (or not
at all), never as eager Python runs it once.
"""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ...errors import FrameRunsEagerly, Unsupported
from .base import ConstantValue, Value, next_serial
from .containers import ListValue, TupleValue
from .subgraphs import mutated_operands, new_nodes, subgraph
from .tensor import TensorValue
from .value_trees import flatten_tensors


class Branch:
    """One traced branch: its nodes (still in the outer graph), its output tensors and their
    structure (a tensor, or a tuple/list of them; any nesting of those where traced with
    ``nested``)."""

    def __init__(self, name: str, what: str, region: list, outputs: list[TensorValue], kind: type | None,
                 structure=None):
        self.name = name
        self.what = what        # its name in reasons: "a torch.cond true branch"
        self.region = region
        self.outputs = outputs
        self.kind = kind        # None: a single tensor; tuple or list: a sequence of them
        self.structure = structure   # the nesting of the outputs (``value_trees``)

    def reads(self) -> list:
        """The outer nodes the branch reads (in first-read order), ``get_attr`` constants aside."""
        inside = set(self.region)
        found: list = []
        for a in [a for n in self.region for a in n.all_input_nodes] + [o.node for o in self.outputs]:
            if a not in inside and a.op != "get_attr" and a not in found:
                found.append(a)
        return found



def trace_branch(tx, name: str, what: str, fn: Value, operands: list[TensorValue],
                 call_args: list[Value] | None = None, nested: bool = False) -> Branch:
    """``fn(*operands)`` inlined into the capture's graph; ``what`` names it in reasons ("a
    torch.cond true branch"). Its nodes stay in the graph until the caller moves them out.

    ``call_args``: what ``fn`` is called with where that is not the operands themselves (the
    operands nested in tuples, a scan's ``(carry, x)``). ``nested``: the result may be any
    nesting of tuples and lists of tensors (its ``structure``)."""
    output = tx.output
    graph = output.graph
    before = set(graph.nodes)
    effects = output.side_effects.count()
    side_effects = output.side_effects
    first_made, written = next_serial(), len(side_effects.written)
    side_effects.watching += 1
    try:
        result = tx.call(fn, list(operands) if call_args is None else list(call_args), {})
    except FrameRunsEagerly:
        raise
    except Unsupported as e:
        raise Unsupported(f"{what} kiln cannot capture ({e.construct})") from e
    finally:
        side_effects.watching -= 1
    region = new_nodes(graph, before)
    # (a list, dict, object or cell the frame made before the body, changed by it: the body is
    # traced once, whatever branch or iteration runs, so the change would be applied once)
    changed_before = any(getattr(v, "serial", -1) < first_made for v in side_effects.written[written:])
    del side_effects.written[written:]
    if output.side_effects.count() != effects or changed_before:
        raise Unsupported(f"{what} that changes Python state (a subgraph "
                          "of torch's control flow has no Python effects)")
    inside = set(region)
    for n in region:
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            raise Unsupported(f"{what} that changes grad mode")
        if any(a not in inside for a in mutated_operands(n)):
            raise Unsupported(f"{what} that changes a tensor in place that it "
                              "did not create")
    structure = None
    if nested:
        outputs, structure = flatten_tensors(result, f"{what} returning")
        kind = None
    elif isinstance(result, TensorValue):
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
    return Branch(name, what, region, outputs, kind, structure)



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

def refuse_outputs_aliasing_each_other(branch: Branch) -> None:
    """Two outputs sharing memory (the same tensor twice, or views of one): torch's scan and
    map refuse it (their functionalization and autograd give each output its own memory)."""
    seen = set()
    for o in branch.outputs:
        ref = StorageWeakRef(o.fake.untyped_storage())
        if ref in seen:
            raise Unsupported(f"{branch.what} returning the same tensor twice or views of one "
                              "(an alias, which torch refuses; return a clone)")
        seen.add(ref)


def same_strides(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Strides compared as expressions (comparing SymInts would add guards)."""
    return [str(s) for s in x.stride()] == [str(s) for s in y.stride()]


def numel(fake: torch.Tensor):
    n = 1
    for d in fake.shape:
        if not isinstance(d, int):
            return None     # a symbolic size: not known to be one element
        n *= d
    return n


def first_slices(tx, xs: list[TensorValue]) -> list[TensorValue]:
    """``x[0]`` of each tensor, a copy (``torch.select_copy``, as torch's scan and map trace
    their bodies): the operands a body is traced on where it runs on slices. The nodes are
    temporary (``erase_operand_nodes``)."""
    zero = ConstantValue(0)
    return [tx.output.call_op("call_function", torch.select_copy, (x, zero, zero), {}) for x in xs]


def fresh_copies(tx, ts: list[TensorValue]) -> list[TensorValue]:
    """A clone of each tensor: the operands a body is traced on where they stand for values
    that change from step to step (a scan's carry), so that a closure reading the initial
    tensor itself is not mistaken for the carry. The nodes are temporary."""
    return [tx.output.call_op("call_function", torch.clone, (t,), {}) for t in ts]


def erase_operand_nodes(tx, operands: list[TensorValue]) -> None:
    """The temporary operand nodes, once the body that read them is in its subgraph."""
    for v in reversed(operands):
        if not v.node.users:
            tx.output.graph.erase_node(v.node)


def call_on_graph(tx, fn, *args) -> Value:
    """``fn(*args)`` as a node of the capture's graph (args: values or Python constants)."""
    return tx.output.call_op("call_function", fn,
                             tuple(a if isinstance(a, Value) else ConstantValue(a) for a in args), {})
