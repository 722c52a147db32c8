"""``torch._higher_order_ops.associative_scan(combine_fn, xs, dim, reverse=False,
combine_mode="pointwise")`` in compiled code: a higher-order op node.

torch's wrapper is not traced. ``combine_fn(a, b)`` is inlined once on two copies of ``x[0]``
of each ``xs`` leaf (moved to scan along dimension 0, flipped for ``reverse``), moved into a
GraphModule taking the flat left slices, the right slices, then what it reads from outside,
and the graph gets one ``torch.ops.higher_order.associative_scan(combine_gm, xs,
additional_inputs)`` node; its outputs are flipped back and moved to ``dim``.

The op applies ``combine_fn`` to whole strided slices of ``xs`` at once. Eager's
``combine_mode="generic"`` applies it through ``torch.vmap`` instead; the two agree for a
pointwise function, so kiln captures only a ``combine_fn`` whose every operation is pointwise
(ATen's ``pointwise`` tag) and that reads no sizes. ``combine_mode="pointwise"`` needs CUDA or
XPU tensors (eager rejects others). torch's op has no correct autograd (a prototype, and
documented so: its backward put FalconMamba-style state-decay gradients 95% off on an H200,
under torch.compile too). Where a gradient is needed (grad mode on and a tensor of ``xs`` or
one ``combine_fn`` reads requiring grad), pointwise mode is captured as generic mode is, below:
the same values, and the gradients of the ops that compute them.

``combine_mode="generic"`` is not the op in eager: torch runs its own odd-even recursion
(``generic_associative_scan``) with plain tensor ops, and autograd differentiates those ops.
The op's own backward is another formula, whose gradients differ from eager's by far more than
rounding where the scan multiplies many small factors (Mamba's state decay: 4e-3 relative on
FalconMamba's ``dt_proj``). So generic mode is captured as that recursion, op for op, with
``combine_fn`` called on each batch of slices (pointwise, it is what ``vmap`` computes): eager's
values and eager's gradients, tensors read from outside included. Its depth depends on the scan
length: a dynamic length is specialized (one graph per length, as under torch.compile).

Also refused (the call runs natively; an error under fullgraph): leaves of ``xs`` that are not
tensors, lack ``dim``, are empty along it or differ in shape; ``combine_fn`` returning another
structure than ``xs`` or tensors of other dtypes, devices, shapes or strides than a slice;
outputs that alias inputs or each other; Python side effects, in-place writes, grad-mode
changes.
"""
from __future__ import annotations

import torch
from torch._higher_order_ops.associative_scan import associative_scan as _associative_scan
from torch.utils._python_dispatch import TorchDispatchMode

from ...errors import Unsupported
from .base import Value
from .containers import ListValue
from .higher_order_bodies import (
    call_on_graph, erase_operand_nodes, fake_call, first_slices, move_to_subgraphs,
    refuse_outputs_aliasing_each_other, same_strides, tensor_mismatch, trace_branch,
)
from .higher_order_scan import scan_dimension
from .value_trees import describe_structure, flatten_tensors, unflatten

ASSOCIATIVE_SCAN_FUNCTIONS = (_associative_scan,)
ASSOCIATIVE_SCAN_OP = torch.ops.higher_order.associative_scan

_PARAMETERS = ("combine_fn", "xs", "dim", "reverse", "combine_mode")
_MODES = ("pointwise", "generic")


def call_associative_scan(tx, args: list[Value], kwargs: dict[str, Value]) -> Value:
    bound = _bind(args, kwargs)
    dim = _constant(bound["dim"], int, "dim")
    reverse = _constant(bound["reverse"], bool, "reverse") if "reverse" in bound else False
    mode = _constant(bound["combine_mode"], str, "combine_mode") if "combine_mode" in bound else "pointwise"
    if mode not in _MODES:
        raise Unsupported(f"associative_scan with combine_mode={mode!r} (eager rejects it)")
    leaves, structure = flatten_tensors(bound["xs"], "an associative_scan xs")
    if not leaves:
        raise Unsupported("associative_scan without tensors (eager rejects it)")
    if mode == "pointwise" and not all(x.fake.device.type in ("cuda", "xpu") for x in leaves):
        raise Unsupported("associative_scan with combine_mode='pointwise' on tensors not on CUDA or "
                          "XPU (eager rejects it)")
    dim = scan_dimension(leaves, dim, "associative_scan")
    if len({tuple(str(d) for d in x.fake.shape) for x in leaves}) > 1:
        raise Unsupported("associative_scan of tensors of different shapes")

    steps = [x if dim == 0 else call_on_graph(tx, torch.movedim, x, dim, 0) for x in leaves]
    if reverse:
        steps = [call_on_graph(tx, torch.flip, x, [0]) for x in steps]
    moved = steps
    # the op's fake implementation gives its outputs the strides of xs, its dense one makes
    # them contiguous: contiguous xs keep the two alike (the values are the same)
    steps = [tx.output.call_op("call_method", "contiguous", (x,), {}) for x in steps]
    lhs, rhs = first_slices(tx, steps), first_slices(tx, steps)
    body = trace_branch(tx, "combine", "an associative_scan combine_fn", bound["combine_fn"], lhs + rhs,
                        call_args=[unflatten(structure, lhs), unflatten(structure, rhs)], nested=True)
    if body.structure != structure:
        raise Unsupported(f"an associative_scan combine_fn returning {describe_structure(body.structure)} "
                          f"for xs of structure {describe_structure(structure)}")
    for i, (out, x) in enumerate(zip(body.outputs, lhs)):
        reason = tensor_mismatch(out.fake, x.fake)
        if reason is None and not same_strides(out.fake, x.fake):
            reason = f"strides ({out.fake.stride()} and {x.fake.stride()})"
        if reason is not None:
            raise Unsupported(f"an associative_scan combine_fn returning output {i} and a slice of "
                              f"xs {i} of different {reason}")
    refuse_outputs_aliasing_each_other(body)

    output = tx.output
    output.control_flow_ops += 1
    operands = lhs + rhs
    inputs, (gm,) = move_to_subgraphs(tx, [body], [o.node for o in operands],
                                      [f"AssociativeScanCombine{output.control_flow_ops}"], "associative_scan")
    erase_operand_nodes(tx, operands)
    additional = inputs[len(operands):]
    fakes = [n.meta["example_value"] for n in additional]
    _refuse_non_pointwise(tx, gm, [o.fake for o in operands] + fakes)
    needs_grad = torch.is_grad_enabled() and \
        any(isinstance(t, torch.Tensor) and t.requires_grad for t in [*fakes, *(x.fake for x in steps)])
    if mode == "generic" or needs_grad:
        # (on xs as eager's recursion gets them: a scan of length 1 hands back views of xs)
        items = _generic_scan(tx, bound["combine_fn"], structure, moved)
        return _placed(tx, items, structure, dim, reverse)
    fake_outs = fake_call(tx, ASSOCIATIVE_SCAN_OP, (gm, [x.fake for x in steps], tuple(fakes)), "associative_scan")
    node = output._op_node("call_function", ASSOCIATIVE_SCAN_OP,
                           (output.constant_node(gm), [x.node for x in steps], tuple(additional)), {})
    items = list(output._wrap_result(node, tuple(fake_outs)).items)
    return _placed(tx, items, structure, dim, reverse)


def _placed(tx, items: list, structure, dim: int, reverse: bool) -> Value:
    """The scan's outputs (along dimension 0, flipped for ``reverse``) where ``xs`` had them."""
    if reverse:
        items = [call_on_graph(tx, torch.flip, y, [0]) for y in items]
    if dim != 0:
        items = [call_on_graph(tx, torch.movedim, y, 0, dim) for y in items]
    return unflatten(structure, items)


_slice = torch.ops.aten.slice.Tensor


def _generic_scan(tx, combine_fn: Value, structure, steps: list) -> list:
    """torch's ``generic_associative_scan`` along dimension 0, the same ops in the same order,
    with ``combine_fn`` inlined on each batch of slices."""
    def combine(lhs: list, rhs: list) -> list:
        result = tx.call(combine_fn, [unflatten(structure, lhs), unflatten(structure, rhs)], {})
        outs, got = flatten_tensors(result, "an associative_scan combine_fn returning")
        if got != structure:
            raise Unsupported("an associative_scan combine_fn returning another structure on a batch of slices")
        return outs

    def length(x) -> int:
        # (a symbolic length is specialized, guarded by the ShapeEnv: the recursion's depth and
        # its odd and even cases depend on it, as they do in eager)
        return int(x.fake.shape[0])

    def scan(elems: list) -> list:
        n = length(elems[0])
        if n < 2:
            return elems
        odd = scan(combine([call_on_graph(tx, _slice, e, 0, 0, -1, 2) for e in elems],
                           [call_on_graph(tx, _slice, e, 0, 1, None, 2) for e in elems]))
        rest = [call_on_graph(tx, _slice, e, 0, 2, None, 2) for e in elems]
        if n % 2 == 0:
            even = combine([call_on_graph(tx, _slice, e, 0, 0, -1) for e in odd], rest)
        else:
            even = combine(odd, rest)
        firsts = [call_on_graph(tx, _slice, e, 0, 0, 1) for e in elems]
        even = [call_on_graph(tx, torch.cat, ListValue([first, r]), 0) if r.fake.numel() > 0 else first
                for first, r in zip(firsts, even)]
        return [_interleave(tx, a, b) for a, b in zip(even, odd)]

    return scan(list(steps))


def _interleave(tx, a, b):
    """torch's ``_interleave`` along dimension 0: a[0], b[0], a[1], b[1], ..."""
    longer = a.fake.shape[0] == b.fake.shape[0] + 1
    if longer:          # (b padded with one zero slice at its end, cut off again below)
        ndim = b.fake.dim()
        pad = [0] * ((ndim - 1) * 2 + 1) + [1] + [0] * (ndim * 2 - ((ndim - 1) * 2 + 2))
        b = call_on_graph(tx, torch.nn.functional.pad, b, pad)
    stacked = call_on_graph(tx, torch.stack, ListValue([a, b]), 1)
    out = call_on_graph(tx, torch.flatten, stacked, 0, 1)
    if longer:
        out = call_on_graph(tx, _slice, out, 0, 0, b.fake.shape[0] + a.fake.shape[0] - 1)
    return out


class _AtenOps(TorchDispatchMode):
    """Records the ATen ops run under it."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _refuse_non_pointwise(tx, gm: torch.fx.GraphModule, fake_inputs: list) -> None:
    """The op applies ``gm`` to batches of slices: only pointwise ATen ops and no size reads
    (a size of a slice would become a size of the batch) keep that equal to per-slice calls."""
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method") and \
                not isinstance(n.meta.get("example_value"), torch.Tensor):
            raise Unsupported("an associative_scan combine_fn that reads sizes or makes non-tensor "
                              "values (kiln captures pointwise functions)")
    recorder = _AtenOps()
    try:
        with tx.output.fake_mode, recorder:
            gm(*fake_inputs)
    except Exception as e:
        raise Unsupported(f"an associative_scan combine_fn kiln could not run on fake tensors "
                          f"({type(e).__name__})") from e
    for op in recorder.ops:
        # (``prim`` ops read metadata: a tensor's device)
        if getattr(op, "namespace", None) != "prim" and torch.Tag.pointwise not in getattr(op, "tags", ()):
            raise Unsupported(f"an associative_scan combine_fn calling {op} (kiln captures pointwise "
                              "functions: the op applies them to many slices at once)")


def _constant(v: Value, kind: type, name: str):
    if not v.is_constant() or type(v.as_constant()) is not kind:
        raise Unsupported(f"associative_scan with {name}={v.describe()} (kiln captures a Python "
                          f"{kind.__name__})")
    return v.as_constant()


def _bind(args: list[Value], kwargs: dict[str, Value]) -> dict[str, Value]:
    if len(args) > len(_PARAMETERS):
        raise Unsupported("associative_scan with more than five arguments (eager rejects it)")
    bound = dict(zip(_PARAMETERS, args))
    for k, v in kwargs.items():
        if k not in _PARAMETERS or k in bound:
            raise Unsupported(f"associative_scan with argument {k!r} (eager rejects it)")
        bound[k] = v
    missing = [p for p in _PARAMETERS[:3] if p not in bound]
    if missing:
        raise Unsupported(f"associative_scan without {', '.join(missing)}")
    return bound
