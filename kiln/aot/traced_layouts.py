"""Inputs of layout-checking kernels get the strides the trace saw.

A graph traced under fake tensors relies on each value's strides being what the fake one had.
They can differ where nothing is computed differently: the strides of a size-1 dimension (a
``view`` gives ``(32, 1, 512, 32)`` where the fake computed ``(8192, 1, 512, 32)``, batch 1).
Most kernels do not care. A few check their input's layout: ``native_group_norm`` requires its
input to be contiguous in the tensor's suggested memory format, and eager's ``group_norm`` makes
it so with ``contiguous()``, a call the trace dropped because the fake input already was
(diffusers' VAE and UNet2DModel under ``aot_eager``: "Expected X.is_contiguous(memory_format)").

Before each such kernel the graph gives the input the traced strides: by restriding where only
size-1 dimensions differ (no copy: their strides address nothing), else by a copy into them.
"""
from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten

# op -> the positions of the tensor arguments its kernel checks the layout of
LAYOUT_CHECKED = {
    aten.native_group_norm.default: (0,),
    aten.native_group_norm_backward.default: (0, 1),
    # a view needs strides its new shape can be read with: a kernel whose real output layout
    # is not its fake one (``softplus_backward`` follows its transposed input where its fake
    # value is contiguous) makes ``view`` refuse what the trace allowed (Qwen3-Next's gated
    # delta rule, training under aot_eager)
    aten.view.default: (0,),
    aten._unsafe_view.default: (0,),
}


def as_traced_layout(x: torch.Tensor, stride: tuple) -> torch.Tensor:
    """``x`` with the strides ``stride`` (its values unchanged)."""
    if x.stride() == stride:
        return x
    if all(a == b or n == 1 for a, b, n in zip(x.stride(), stride, x.shape)):
        return x.as_strided(x.shape, stride, x.storage_offset())
    return torch.empty_strided(x.shape, stride, dtype=x.dtype, device=x.device).copy_(x)


STRIDES_META = "kiln_traced_strides"     # node meta: {position: strides}, kept by saved graphs


def traced_strides(node: torch.fx.Node) -> dict:
    """{argument position: the strides the trace saw} for a layout-checked ``node`` (plain
    integers only), from its saved record or its arguments' fake values."""
    positions = LAYOUT_CHECKED.get(node.target) if node.op == "call_function" else None
    if not positions:
        return {}
    if STRIDES_META in node.meta:
        return dict(node.meta[STRIDES_META])
    out = {}
    for i in positions:
        arg = node.args[i] if i < len(node.args) else None
        fake = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if isinstance(fake, torch.Tensor):
            stride = tuple(fake.stride())
            if all(type(s) is int for s in stride):   # (symbolic strides: kept as they come)
                out[i] = stride
    return out


def give_traced_layouts(graph: torch.fx.Graph) -> None:
    """Insert ``as_traced_layout`` before the layout-checked arguments of ``graph``'s nodes."""
    for node in list(graph.nodes):
        for i, stride in traced_strides(node).items():
            arg = node.args[i]
            with graph.inserting_before(node):
                fixed = graph.call_function(as_traced_layout, (arg, stride))
            if "val" in arg.meta:
                fixed.meta["val"] = arg.meta["val"]
            node.update_arg(i, fixed)
