"""Which saved tensors a backward may take the memory of (donate): those sharing memory with
no forward input, no output the user sees and no gradient. A backend that reuses them (Inductor)
marks them on the backward; AOT recomputes the positions when it changes what is saved."""
from __future__ import annotations

import torch
import torch.fx

from . import _utils as U


def donatable_saved_tensors(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, nfw: int) -> list[int]:
    """Positions (among the backward's inputs) of the saved tensors whose memory the backward
    may reuse for its own buffers: those sharing memory with no forward input, no output the
    user sees and no gradient. The autograd.Function hands them to the backward and drops its
    own references first (``retain_graph=True`` gets copies: Inductor's ``copies_when_graph_kept``)."""
    def val(n):
        return n.meta.get("val") if isinstance(n, torch.fx.Node) else None

    fw_outs = U.flat_outputs(fw.graph)
    placeholders = [n for n in fw.graph.nodes if n.op == "placeholder"]
    kept = {U.fake_storage(val(n)) for n in (*placeholders, *fw_outs[:nfw], *U.flat_outputs(bw.graph))} - {None}
    donated = []
    for j, n in enumerate(fw_outs[nfw:]):
        s = U.fake_storage(val(n))
        if s is not None and s not in kept:
            donated.append(j)
    return donated
