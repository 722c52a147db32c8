"""``torch._higher_order_ops.scan(combine_fn, init, xs, dim=0, reverse=False)`` in compiled
code: a higher-order op node.

As with ``torch.cond`` (``higher_order_cond.py``), torch's wrapper is not traced: the call is
modelled as what the wrapper does. ``xs`` is moved to scan along dimension 0 (and flipped for
``reverse``) in the graph; ``combine_fn(carry, x)`` is inlined once on a copy of ``init`` and
on ``x[0]`` of each ``xs`` leaf, moved into a GraphModule taking the flat leaves (carry, then
slices, then what it reads from outside: closures, parameters, sizes), and the graph gets one
``torch.ops.higher_order.scan(combine_gm, init, xs, additional_inputs)`` node, whose outputs
are the last carry and the stacked per-step outputs. Those are flipped back and moved to
``dim`` where the installed torch's wrapper does (torch 2.11 leaves them stacked along
dimension 0). torch's scan has fake, functionalization, make_fx and
autograd implementations, so the AOT stages trace through it, in training too.

Refused (the call runs natively; an error under fullgraph): leaves of ``init`` or ``xs`` that
are not tensors (or containers other than tuples and lists); an empty ``init``; ``xs`` leaves
without ``dim``, empty along it, or of different lengths; ``combine_fn`` not returning a pair
``(next_carry, y)`` whose carry has ``init``'s structure, dtypes, devices, shapes and strides;
outputs that alias inputs or each other; Python side effects, in-place writes to tensors from
outside, grad-mode changes.
"""
from __future__ import annotations

import functools
import inspect

import torch
from torch._higher_order_ops.scan import scan as _scan

from ...errors import Unsupported
from .base import Value
from .containers import ListValue, TupleValue
from .higher_order_bodies import (
    call_on_graph, erase_operand_nodes, fake_call, first_slices, fresh_copies, move_to_subgraphs,
    refuse_outputs_aliasing_each_other, same_strides, tensor_mismatch,
    trace_branch,
)
from .value_trees import describe_structure, flatten_tensors, unflatten

SCAN_FUNCTIONS = (_scan,)   # (torch._higher_order_ops.scan)
SCAN_OP = torch.ops.higher_order.scan

_PARAMETERS = ("combine_fn", "init", "xs")
_KEYWORDS = ("dim", "reverse")


def call_scan(tx, args: list[Value], kwargs: dict[str, Value]) -> Value:
    bound = _bind(args, kwargs)
    dim = _constant(bound.get("dim"), int, 0, "dim")
    reverse = _constant(bound.get("reverse"), bool, False, "reverse")
    init, xs = bound["init"], bound["xs"]
    init_leaves, init_structure = flatten_tensors(init, "a scan init")
    xs_leaves, xs_structure = flatten_tensors(xs, "a scan xs")
    if not xs_leaves:
        return TupleValue([init, ListValue([])])    # eager returns init as it is
    if not init_leaves:
        raise Unsupported("scan without init tensors (eager rejects it)")
    dim = scan_dimension(xs_leaves, dim, "scan")

    steps = [x if dim == 0 else call_on_graph(tx, torch.movedim, x, dim, 0) for x in xs_leaves]
    if reverse:
        steps = [call_on_graph(tx, torch.flip, x, [0]) for x in steps]

    carry_operands = fresh_copies(tx, init_leaves)
    slice_operands = first_slices(tx, steps)
    operands = carry_operands + slice_operands
    body = trace_branch(tx, "combine", "a scan combine_fn", bound["combine_fn"], operands,
                        call_args=[unflatten(init_structure, carry_operands),
                                   unflatten(xs_structure, slice_operands)], nested=True)
    carry_structure, y_structure = _split_result(body.structure)
    if carry_structure != init_structure:
        raise Unsupported(f"a scan combine_fn returning a carry of structure "
                          f"{describe_structure(carry_structure)} for an init of structure "
                          f"{describe_structure(init_structure)}")
    n_carry = len(init_leaves)
    for i, (out, c) in enumerate(zip(body.outputs[:n_carry], init_leaves)):
        reason = tensor_mismatch(out.fake, c.fake)
        if reason is None and not same_strides(out.fake, c.fake):
            reason = f"strides ({out.fake.stride()} and {c.fake.stride()})"
        if reason is not None:
            raise Unsupported(f"a scan combine_fn returning carry {i} and init {i} of different {reason}")
    refuse_outputs_aliasing_each_other(body)

    output = tx.output
    output.control_flow_ops += 1
    inputs, (gm,) = move_to_subgraphs(tx, [body], [o.node for o in operands],
                                      [f"ScanCombine{output.control_flow_ops}"], "scan")
    erase_operand_nodes(tx, operands)
    additional = inputs[len(operands):]
    fake_outs = fake_call(tx, SCAN_OP, (gm, [c.fake for c in init_leaves], [x.fake for x in steps],
                                        tuple(n.meta["example_value"] for n in additional)), "scan")
    node = output._op_node("call_function", SCAN_OP, (output.constant_node(gm), [c.node for c in init_leaves],
                                                      [x.node for x in steps], tuple(additional)), {})
    items = list(output._wrap_result(node, tuple(fake_outs)).items)
    carry, ys = items[:n_carry], items[n_carry:]
    if reverse:
        ys = [call_on_graph(tx, torch.flip, y, [0]) for y in ys]
    if dim != 0 and _wrapper_moves_outputs_back():
        ys = [call_on_graph(tx, torch.movedim, y, 0, dim) if dim < y.fake.ndim else y for y in ys]
    return TupleValue([unflatten(carry_structure, carry), unflatten(y_structure, ys)])


@functools.cache
def _wrapper_moves_outputs_back() -> bool:
    """Whether the installed torch's ``scan`` hands its stacked outputs back along ``dim``
    (newer torch) or leaves them stacked along dimension 0 (torch 2.11 documents "stacked
    output along first dim" and returns them so). Read from the wrapper itself: running it
    would compile it with torch.compile."""
    try:
        source = inspect.getsource(_scan)
    except (OSError, TypeError):
        return torch.__version__ >= (2, 12)     # (a TorchVersion compares with a tuple)
    return "movedim(elem, 0, dim)" in source


def scan_dimension(xs: list, dim: int, what: str) -> int:
    """``dim`` made non-negative; refuses leaves that lack it, are empty along it, or differ
    in length along it (eager raises, or reads past the shortest)."""
    ndim = xs[0].fake.ndim
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise Unsupported(f"{what} along dim {dim} of a {ndim}-dimensional tensor (eager rejects it)")
    dim = dim % max(ndim, 1)
    if any(x.fake.ndim <= dim for x in xs):
        raise Unsupported(f"{what} of tensors without dimension {dim} (eager rejects it)")
    lengths = [x.fake.shape[dim] for x in xs]
    if any(isinstance(n, int) and n == 0 for n in lengths):
        raise Unsupported(f"{what} along an empty dimension (eager rejects it)")
    if len({str(n) for n in lengths}) > 1:     # compared as expressions: no guards
        raise Unsupported(f"{what} of tensors of different lengths along dim {dim}")
    return dim


def _split_result(structure):
    if structure is None or len(structure[1]) != 2:
        raise Unsupported("a scan combine_fn not returning a pair (next_carry, y)")
    carry, y = structure[1]
    return carry, y


def _constant(v: Value | None, kind: type, default, name: str):
    if v is None:
        return default
    if not v.is_constant() or type(v.as_constant()) is not kind:
        raise Unsupported(f"scan with {name}={v.describe()} (kiln captures a Python {kind.__name__})")
    return v.as_constant()


def _bind(args: list[Value], kwargs: dict[str, Value]) -> dict[str, Value]:
    if len(args) > len(_PARAMETERS):
        raise Unsupported("scan with more than three positional arguments (eager rejects it)")
    bound = dict(zip(_PARAMETERS, args))
    for k, v in kwargs.items():
        if k not in _PARAMETERS + _KEYWORDS or k in bound:
            raise Unsupported(f"scan with argument {k!r} (eager rejects it)")
        bound[k] = v
    missing = [p for p in _PARAMETERS if p not in bound]
    if missing:
        raise Unsupported(f"scan without {', '.join(missing)}")
    return bound

