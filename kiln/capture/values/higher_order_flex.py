"""``flex_attention(query, key, value, score_mod, block_mask, ...)`` in compiled code: one
``torch.ops.higher_order.flex_attention`` node.

torch's wrapper is not traced (it compiles the op with dynamo when called eagerly): the call
is modelled as what the wrapper computes when a compiler captures it.

* The checks eager makes (dtypes, devices, dimensions, heads, the block mask's lengths) run at
  capture time on the example tensors; what eager would reject raises ``Unsupported`` (the call
  then runs natively and raises eager's error). CPU tensors that require grad are one of them:
  eager's flex_attention has no CPU backward for query, key and value.
* ``score_mod(score, b, h, q_idx, kv_idx)`` is inlined on 0-dim tensors (``score`` in the
  query's dtype, the indices int32) and moved into a GraphModule, as is the block mask's
  ``mask_mod(b, h, q_idx, kv_idx)``. What they read from outside (a bias table, slopes, a
  parameter) becomes ``score_mod_other_buffers`` / ``mask_mod_other_buffers``. Indexing a
  tensor by those 0-dim index tensors (``bias[q_idx - kv_idx]``) is recorded as the indexing
  it is: torch's implementations of the op run the subgraph with a mode that turns it into
  ``aten.index`` (the capture computes the example value that way too, instead of reading the
  index as a Python int).
* A ``BlockMask`` argument is read through ``BlockMask.as_tuple`` like any object: its tensors
  are graph inputs guarded like tensors, its sizes and block sizes constants guarded by value,
  its ``mask_mod`` guarded as any function read from an input. Without one, the wrapper's
  one-block mask (``noop_mask``) is built in the graph.
* The default scale (``1/sqrt(E)``) and the kernel options (torch's defaults and the choice of
  computing the logsumexp, which depends on grad mode and device) are computed at capture time:
  the head dimension is specialized, grad mode is guarded.

torch's op has fake, functionalization, make_fx and autograd implementations: the AOT stages
trace through the node (the backward is ``flex_attention_backward``), and Inductor lowers both
to its flex attention templates.

``create_block_mask`` in compiled code is not captured (it evaluates ``mask_mod`` under
``vmap``): the call runs natively, a graph break, and the mask it returns reaches
``flex_attention`` as an input of the graph after it.
"""
from __future__ import annotations

import inspect
import math
import operator
import sys

import torch

from ...errors import Unsupported
from .base import ConstantValue, Value
from .containers import DictValue, NamedTupleValue, TupleValue
from .higher_order_cond import fake_call, trace_branch
from .subgraphs import subgraph
from .symbolic import specialize
from .tensor import TensorValue

FLEX_MODULE = "torch.nn.attention.flex_attention"
FLEX_OP = torch.ops.higher_order.flex_attention


def flex_capture(fn) -> tuple[str, object] | None:
    """The name and capture function of a function of torch's flex attention module that the
    capture models (``flex_attention``, ``create_block_mask``), or None. The module is looked up,
    not imported: a program that never imported it cannot hold its functions."""
    mod = sys.modules.get(FLEX_MODULE)
    if mod is None:
        return None
    if fn is getattr(mod, "flex_attention", None):
        return "flex_attention", call_flex_attention
    if fn is getattr(mod, "create_block_mask", None):
        return "create_block_mask", call_create_block_mask
    return None


def call_create_block_mask(tx, args: list[Value], kwargs: dict[str, Value]) -> Value:
    raise Unsupported("create_block_mask in compiled code (kiln does not capture its vmap over "
                      "mask_mod): it runs natively; create the BlockMask outside the compiled "
                      "function and pass it in to keep one graph")


def call_flex_attention(tx, args: list[Value], kwargs: dict[str, Value]) -> Value:
    mod = sys.modules[FLEX_MODULE]
    bound = _bind(mod.flex_attention, args, kwargs)
    q, k, v = (_tensor(bound[n], n) for n in ("query", "key", "value"))
    enable_gqa = _constant(bound.get("enable_gqa", False), "enable_gqa")
    return_lse = _constant(bound.get("return_lse", False), "return_lse")
    return_aux = _constant(bound.get("return_aux"), "return_aux")
    options = _constant(bound.get("kernel_options"), "kernel_options")
    scale = _constant(bound.get("scale"), "scale")
    _check_inputs(mod, q.fake, k.fake, v.fake, enable_gqa)
    if return_lse and return_aux is not None:
        raise Unsupported("flex_attention with both return_lse and return_aux (eager rejects it)")

    block_mask = bound.get("block_mask", ConstantValue(None))
    if block_mask.is_constant() and block_mask.as_constant() is None:
        items = _empty_block_mask(tx, mod, q)
    else:
        _check_mask_object(mod, block_mask)
        _check_mask_lengths(tx, mod, block_mask, q.fake, k.fake)
        items = block_mask.call_method(tx, "as_tuple", [], {})
    if not isinstance(items, TupleValue):
        raise Unsupported(f"BlockMask.as_tuple() gave {items.describe()}")
    mask_items = [specialize(i) for i in items.items[:-1]]
    for item in mask_items:
        if not isinstance(item, TensorValue) and not item.is_constant():
            raise Unsupported(f"a BlockMask field {item.describe()} (kiln captures tensors and constants)")
    mask_tensors = [i for i in mask_items if isinstance(i, TensorValue)]
    if any(t.fake.device != q.fake.device for t in mask_tensors):
        raise Unsupported("flex_attention with a block mask on another device than the query "
                          "(eager rejects it)")
    mask_mod = items.items[-1]
    if mask_mod.is_constant() and mask_mod.as_constant() is None:
        mask_mod = tx.output.builder.wrap(mod.noop_mask, None)
    if getattr(mask_mod, "real_object", lambda: None)() is getattr(mod, "_sliced_mask_mod_error", ()):
        raise Unsupported("flex_attention with a sliced BlockMask's mask_mod (eager rejects it)")

    if scale is None:
        scale = 1.0 / math.sqrt(_static(q.fake.size(-1)))
    try:
        with tx.output.fake_mode:
            options = _private(mod, "_apply_kernel_options")(q.fake, k.fake, v.fake, return_lse, options,
                                                              return_aux)
    except Exception as e:
        raise Unsupported(f"flex_attention kernel_options eager rejects ({type(e).__name__}: {e})") from e

    score_mod = bound.get("score_mod", ConstantValue(None))
    if score_mod.is_constant() and score_mod.as_constant() is None:
        score_mod = tx.output.builder.wrap(_private(mod, "_identity"), None)
    output = tx.output
    output.control_flow_ops += 1
    index = output.control_flow_ops
    score_gm, score_buffers = _trace_mod(tx, score_mod, q, True, f"FlexScoreMod{index}")
    mask_gm, mask_buffers = _trace_mod(tx, mask_mod, q, False, f"FlexMaskMod{index}")

    fake_mask = tuple(i.fake if isinstance(i, TensorValue) else i.as_constant() for i in mask_items)
    fx_mask = tuple(output.to_fx(i) for i in mask_items)
    fake_outs = fake_call(tx, FLEX_OP, (q.fake, k.fake, v.fake, score_gm, fake_mask + (mask_gm,), scale,
                                        options, tuple(n.meta["example_value"] for n in score_buffers),
                                        tuple(n.meta["example_value"] for n in mask_buffers)),
                          "flex_attention")
    node = output._op_node("call_function", FLEX_OP,
                           (q.node, k.node, v.node, output.constant_node(score_gm),
                            fx_mask + (output.constant_node(mask_gm),), scale, options,
                            tuple(score_buffers), tuple(mask_buffers)), {})
    out, lse, max_scores = output._wrap_result(node, tuple(fake_outs)).items
    return _finalize(tx, out, lse, max_scores, return_lse, return_aux, options, mod)


def _finalize(tx, out, lse, max_scores, return_lse, return_aux, options, mod) -> Value:
    """What the wrapper returns: the output, and the statistics asked for (in natural log)."""
    want_lse = return_lse or (return_aux is not None and return_aux.lse)
    want_max = return_aux is not None and return_aux.max_scores
    if not want_lse and not want_max:
        return out
    stats_are_log2 = options.get("BACKEND") != "FLASH"

    def scaled(stat, wanted):
        if not wanted or bool(stat.fake.numel() == 0):   # (a guard, not a specialization)
            return ConstantValue(None)
        if not stats_are_log2:
            return stat
        return tx.output.call_op("call_function", operator.mul, (stat, ConstantValue(math.log(2.0))), {})

    lse_v, max_v = scaled(lse, want_lse), scaled(max_scores, want_max)
    if return_aux is not None:
        return TupleValue([out, NamedTupleValue([lse_v, max_v], None, mod.AuxOutput)])
    return TupleValue([out, lse_v])


def _empty_block_mask(tx, mod, q: TensorValue) -> TupleValue:
    """The wrapper's mask when none is given (one block spanning every query and key, made of
    constant int32 tensors, ``noop_mask``), as its ``as_tuple()``; its tensors are made in the
    graph. torch makes it as a function of the query's device alone."""
    real = _private(mod, "_create_empty_block_mask")(torch.empty(0), torch.empty(0)).as_tuple()
    items = []
    for item in real[:-1]:
        if isinstance(item, torch.Tensor):
            if not bool((item == item.flatten()[0]).all()):
                raise Unsupported("torch's default BlockMask is not made of constant-filled tensors")
            items.append(tx.output.call_op("call_function", torch.full,
                                           (ConstantValue(list(item.shape)), ConstantValue(item.flatten()[0].item())),
                                           {"dtype": ConstantValue(item.dtype),
                                            "device": ConstantValue(q.fake.device)}))
        else:
            items.append(ConstantValue(item))
    return TupleValue(items + [tx.output.builder.wrap(real[-1], None)])


def _trace_mod(tx, fn: Value, q: TensorValue, is_score: bool, class_name: str):
    """``fn`` inlined on 0-dim tensors (``score`` in the query's dtype for a score_mod; b, h,
    q_idx, kv_idx as int32) and moved into a GraphModule. Returns it and the outer nodes it
    reads (its other buffers, after the 0-dim inputs)."""
    output = tx.output
    what = "a flex_attention score_mod" if is_score else "a flex_attention mask_mod"
    scalars = []
    dtypes = ([q.fake.dtype] if is_score else []) + [torch.int32] * 4
    for i, dtype in enumerate(dtypes):
        grad = is_score and i == 0 and q.fake.requires_grad
        with output.fake_mode:
            fake = torch.empty((), dtype=dtype, device=q.fake.device, requires_grad=grad)
        node = output._op_node("call_function", torch.empty, ((),), {"dtype": dtype, "device": q.fake.device})
        scalars.append(output._wrap_result(node, fake))
    previous = output.subgraph_getitem
    output.subgraph_getitem = index_by_scalar_tensors
    try:
        branch = trace_branch(tx, "mod", what, fn, scalars)
    finally:
        output.subgraph_getitem = previous
    if branch.kind is not None:
        raise Unsupported(f"{what} returning a {branch.kind.__name__} (kiln captures one tensor)")
    result = branch.outputs[0].fake
    if not is_score and result.dtype != torch.bool:
        raise Unsupported(f"{what} returning a {result.dtype} tensor (a mask is bool)")
    if result.dim() != 0:
        raise Unsupported(f"{what} returning a tensor of shape {tuple(result.shape)} (one score is 0-dim)")
    scalar_nodes = [s.node for s in scalars]
    buffers = [a for a in branch.reads() if a not in scalar_nodes]
    for n in buffers:
        ex = n.meta.get("example_value")
        if not isinstance(ex, (torch.Tensor, int, torch.SymInt)):
            raise Unsupported(f"{what} reading {n.name}, which is not a tensor or an int")
    inputs = [(f"arg{i}", n) for i, n in enumerate(scalar_nodes + buffers)]
    gm = subgraph(inputs, branch.region, [branch.outputs[0].node], class_name, output.constant_attrs)
    out = gm.graph.output_node()
    out.args = (out.args[0][0],)     # a score_mod or mask_mod returns one tensor, not a tuple
    gm.recompile()
    for n in reversed(branch.region):
        output.graph.erase_node(n)
    for n in reversed(scalar_nodes):
        output.graph.erase_node(n)
    return gm, buffers


def index_by_scalar_tensors(tx, tensor: TensorValue, index: Value) -> Value | None:
    """``tensor[index]`` in a score_mod or mask_mod where the index is tensors and ints
    (``bias[h, q_idx - kv_idx]``): torch's implementations of flex_attention index with
    ``aten.index`` there (a 0-dim index tensor is not read as a Python int), so the example
    value is computed that way; the node stays the indexing it is. None: another index."""
    leaves = index.items if isinstance(index, TupleValue) and index.python_type() is tuple else [index]
    fakes = []
    for leaf in leaves:
        if isinstance(leaf, TensorValue):
            fakes.append(leaf.fake)
        elif leaf.is_constant() and type(leaf.as_constant()) is int:
            fakes.append(leaf.as_constant())
        else:
            return None
    if not any(isinstance(f, torch.Tensor) for f in fakes):
        return None
    output = tx.output
    try:
        with output.fake_mode:
            device = tensor.fake.device
            converted = [f if isinstance(f, torch.Tensor) else torch.tensor(f, dtype=torch.int64, device=device)
                         for f in fakes]
            result = torch.ops.aten.index.Tensor(tensor.fake, converted)
    except Exception as e:
        raise Unsupported(f"indexing in a flex_attention score_mod/mask_mod ({type(e).__name__}: {e})") from e
    node = output._op_node("call_function", operator.getitem, (tensor.node, output.to_fx(index)), {})
    return output._wrap_result(node, result)


def _private(mod, name: str):
    """A helper of torch's wrapper that kiln uses to compute what it computes (the default mask,
    the kernel options); one a torch version lacks leaves the call to eager."""
    found = getattr(mod, name, None)
    if found is None:
        raise Unsupported(f"flex_attention: this torch has no {FLEX_MODULE}.{name}, which kiln's "
                          "model of the wrapper uses")
    return found


def _bind(fn, args: list[Value], kwargs: dict[str, Value]) -> dict[str, Value]:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"flex_attention called with arguments eager rejects ({e})") from e
    return dict(bound.arguments)


def _tensor(v: Value, name: str) -> TensorValue:
    if not isinstance(v, TensorValue) or v.node is None:
        raise Unsupported(f"flex_attention {name} {v.describe()} (kiln captures tensors)")
    return v


def _constant(v, what: str):
    if v is None or not isinstance(v, Value):
        return v
    if isinstance(v, DictValue) and v.python_type() is dict:
        return {key: _constant(item, what) for key, item in v.items.items()}
    v = specialize(v)
    if isinstance(v, TupleValue):
        items = [_constant(i, what) for i in v.items]
        return v.cls._make(items) if hasattr(v.cls, "_make") else tuple(items)   # (AuxRequest)
    if not v.is_constant():
        raise Unsupported(f"flex_attention {what} {v.describe()} (kiln captures a constant)")
    return v.as_constant()


def _static(n) -> int:
    """A size as an int (a symbolic one is specialized, with a guard)."""
    return int(n)


def _check_inputs(mod, q, k, v, enable_gqa) -> None:
    """The wrapper's checks, on the example tensors: what eager rejects runs natively."""
    if any(t.is_nested for t in (q, k, v)):
        raise Unsupported("flex_attention on nested tensors (eager rejects it)")
    if not (q.dtype == k.dtype == v.dtype):
        raise Unsupported("flex_attention with query, key and value of different dtypes")
    if q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise Unsupported("flex_attention on float8 tensors (their layouts are not modelled)")
    if not (q.device == k.device == v.device) or q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise Unsupported("flex_attention needs 4-D query, key and value on one device (eager rejects others)")
    if q.device.type in ("cpu", "mps") and any(t.requires_grad for t in (q, k, v)):
        raise Unsupported(f"flex_attention on {q.device.type} tensors that require grad (eager has no "
                          "backward for them there and raises)")
    hq, hkv = _static(q.size(1)), _static(k.size(1))
    if _static(q.size(-1)) != _static(k.size(-1)):
        raise Unsupported("flex_attention with query and key of different embedding sizes (eager rejects it)")
    if not enable_gqa and hq != hkv or enable_gqa and hq % hkv != 0:
        raise Unsupported("flex_attention with query and key head counts eager rejects")
    if q.size(0) != k.size(0):
        raise Unsupported("flex_attention with query and key of different batch sizes")


def _check_mask_object(mod, block_mask: Value) -> None:
    if block_mask.python_type() is not mod.BlockMask:
        raise Unsupported(f"flex_attention with block_mask {block_mask.describe()} (kiln captures a BlockMask)")


def _check_mask_lengths(tx, mod, block_mask: Value, q, k) -> None:
    """The block mask is made for the query's and key's lengths (eager rejects others)."""
    block = block_mask.getattr(tx, "BLOCK_SIZE")
    lengths = block_mask.getattr(tx, "seq_lengths")
    block, lengths = _constant(block, "BLOCK_SIZE"), _constant(lengths, "seq_lengths")
    large = _private(mod, "_LARGE_SPARSE_BLOCK_SIZE")
    if tuple(block) == (large, large):
        return
    if (q.size(-2), k.size(-2)) != tuple(lengths):
        raise Unsupported(f"flex_attention with a block mask made for lengths {tuple(lengths)} on "
                          f"query and key of lengths {q.size(-2)}, {k.size(-2)} (eager rejects it)")
