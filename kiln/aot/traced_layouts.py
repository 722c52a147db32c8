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
}


def as_traced_layout(x: torch.Tensor, stride: tuple) -> torch.Tensor:
    """``x`` with the strides ``stride`` (its values unchanged)."""
    if x.stride() == stride:
        return x
    if all(a == b or n == 1 for a, b, n in zip(x.stride(), stride, x.shape)):
        return x.as_strided(x.shape, stride, x.storage_offset())
    return torch.empty_strided(x.shape, stride, dtype=x.dtype, device=x.device).copy_(x)


def give_traced_layouts(graph: torch.fx.Graph) -> None:
    """Insert ``as_traced_layout`` before the layout-checked arguments of ``graph``'s nodes
    (where the trace's strides are plain integers)."""
    for node in list(graph.nodes):
        positions = LAYOUT_CHECKED.get(node.target) if node.op == "call_function" else None
        if not positions:
            continue
        for i in positions:
            arg = node.args[i] if i < len(node.args) else None
            fake = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
            if not isinstance(fake, torch.Tensor):
                continue
            stride = tuple(fake.stride())
            if not all(type(s) is int for s in stride):
                continue        # (symbolic strides: a dynamic graph keeps its input as it comes)
            with graph.inserting_before(node):
                fixed = graph.call_function(as_traced_layout, (arg, stride))
            fixed.meta["val"] = fake
            node.update_arg(i, fixed)
