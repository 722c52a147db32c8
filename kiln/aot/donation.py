"""Which saved tensors a backward may take the memory of (donate): those sharing memory with
no forward input, no output the user sees and no gradient. A backend that reuses them (Inductor)
marks them on the backward, and runs it on copies when autograd keeps the graph; AOT recomputes
the positions when it changes what is saved."""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx

from .. import _torch
from . import fake_tensors, fx_graphs


def donatable_saved_tensors(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, nfw: int) -> list[int]:
    """Positions (among the backward's inputs) of the saved tensors whose memory the backward
    may reuse for its own buffers: those sharing memory with no forward input, no output the
    user sees and no gradient. The autograd.Function hands them to the backward and drops its
    own references first (``retain_graph=True`` gets copies: ``copies_when_graph_kept``)."""
    def val(n):
        return n.meta.get("val") if isinstance(n, torch.fx.Node) else None

    fw_outs = fx_graphs.flat_outputs(fw.graph)
    placeholders = [n for n in fw.graph.nodes if n.op == "placeholder"]
    kept = {fake_tensors.fake_storage(val(n))
            for n in (*placeholders, *fw_outs[:nfw], *fx_graphs.flat_outputs(bw.graph))} - {None}
    donated = []
    for j, n in enumerate(fw_outs[nfw:]):
        s = fake_tensors.fake_storage(val(n))
        if s is not None and s not in kept:
            donated.append(j)
    return donated


def copies_when_graph_kept(compiled: Callable, donated: list[int]) -> Callable:
    """The backward, handed copies of its donated inputs when autograd keeps the graph
    (``retain_graph=True``: the saved tensors are read again by a later backward) or when they
    came through the user's eager saved-tensor hooks (which may hold them)."""
    def backward(args: list):
        if _torch.backward_keeps_graph() or _torch.saved_tensors_from_user_hooks.active:
            for j in donated:
                if isinstance(args[j], torch.Tensor):
                    args[j] = args[j].clone()
        return compiled(args)
    backward._boxed_call = True
    return backward
