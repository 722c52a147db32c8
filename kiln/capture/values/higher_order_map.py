"""``torch._higher_order_ops.map(f, xs, *args)`` in compiled code: a higher-order op node.

As with ``torch.cond`` (``higher_order_cond.py``), torch's wrapper is not traced: ``f(x,
*args)`` is inlined once on ``x[0]`` of each ``xs`` leaf (in ``xs``'s tuples and lists) and
``args`` as given, moved into a GraphModule taking the flat slices, then what it reads from
outside (the tensors of ``args``, closures, parameters, sizes), and the graph gets one
``torch.ops.higher_order.map_impl(body_gm, xs, additional_inputs)`` node whose outputs are
``f``'s outputs stacked along a new leading dimension. torch's map has fake,
functionalization, make_fx and autograd implementations: the AOT stages trace through it, in
training too.

Refused (the call runs natively; an error under fullgraph): ``xs`` leaves that are not
tensors, that are 0-dimensional, empty along dimension 0 or of different lengths; outputs that
are not tensors (in tuples and lists) or that alias inputs or each other; Python side
effects, in-place writes to tensors from outside, grad-mode changes.
"""
from __future__ import annotations

import sys

import torch

from ...errors import Unsupported
from .base import Value
from .higher_order_bodies import (
    erase_operand_nodes, fake_call, first_slices, move_to_subgraphs, refuse_outputs_aliasing_each_other,
    trace_branch,
)
from .higher_order_scan import scan_dimension
from .value_trees import flatten_tensors, unflatten

# (``torch._higher_order_ops.map`` is the function, shadowing its module's name)
MAP_FUNCTIONS = (sys.modules["torch._higher_order_ops.map"].map,)
MAP_OP = torch.ops.higher_order.map_impl


def call_map(tx, args: list[Value], kwargs: dict[str, Value]) -> Value:
    fn, xs, rest = _bind(args, kwargs)
    xs_leaves, xs_structure = flatten_tensors(xs, "a map xs")
    if not xs_leaves:
        raise Unsupported("map without tensors to map over (eager rejects it)")
    if xs_leaves[0].fake.ndim == 0:
        raise Unsupported("map over a 0-dimensional tensor (eager rejects it)")
    scan_dimension(xs_leaves, 0, "map")

    operands = first_slices(tx, xs_leaves)
    body = trace_branch(tx, "body", "a map function", fn, operands,
                        call_args=[unflatten(xs_structure, operands), *rest], nested=True)
    if not body.outputs:
        raise Unsupported("a map function returning no tensors")
    refuse_outputs_aliasing_each_other(body)

    output = tx.output
    output.control_flow_ops += 1
    inputs, (gm,) = move_to_subgraphs(tx, [body], [o.node for o in operands],
                                      [f"MapBody{output.control_flow_ops}"], "map")
    erase_operand_nodes(tx, operands)
    additional = inputs[len(operands):]
    fake_outs = fake_call(tx, MAP_OP, (gm, [x.fake for x in xs_leaves],
                                       [n.meta["example_value"] for n in additional]), "map")
    node = output._op_node("call_function", MAP_OP, (output.constant_node(gm), [x.node for x in xs_leaves],
                                                     list(additional)), {})
    items = list(output._wrap_result(node, tuple(fake_outs)).items)
    return unflatten(body.structure, items)


def _bind(args: list[Value], kwargs: dict[str, Value]) -> tuple[Value, Value, list[Value]]:
    args = list(args)
    for name in ("f", "xs"):
        if name in kwargs:
            if len(args) > ("f", "xs").index(name):
                raise Unsupported(f"map with two values for {name!r} (eager rejects it)")
            args.append(kwargs[name])
    extra = [k for k in kwargs if k not in ("f", "xs")]
    if extra:
        raise Unsupported(f"map with argument {extra[0]!r} (eager rejects it)")
    if len(args) < 2:
        raise Unsupported("map without f and xs (eager rejects it)")
    return args[0], args[1], args[2:]
