"""Where the inlined offload copies finish and where the copies back start.

A pack hook that calls ``kiln::offload_start`` then ``kiln::offload_finish`` (kiln.activations'
offload policy, stream_ops.py) is traced with the two ops back to back, which would make the
compute stream wait for each copy at once. After inlining, this pass spreads them out:

* forward: the finish of the i-th offload moves right after the start of offload i+ahead
  (the last ones: to the end of the forward), with that start's token in its ``order``
  argument so that no later scheduler (Inductor) moves it back. Up to ``ahead`` saved
  tensors then stay in device memory while their copies run; each is freed at its finish.
* backward: the ``prefetch`` of the j-th saved tensor (in order of first use) moves before
  the wait of tensor j-ahead (the first ``ahead`` ones: to the start of the backward), whose
  ``order`` lists it. So at most ``ahead`` copies back are in flight ahead of the compute,
  and device memory holds at most ``ahead`` prefetched tensors before their use.

Inductor keeps this order: kiln compiles a graph with these ops without Inductor's peak-memory
reordering (backends/inductor/backend.py), which sees no memory in a copy in flight and would start every
copy back at the top of the backward.

Only moves that keep the graph valid are made (inputs before, users after); the others stay
where the hook put them, which is correct, only without overlap. Any graph with these ops
(a user's hooks calling them) is scheduled the same way.
"""
from __future__ import annotations

import torch
import torch.fx

from ..fx_graphs import op_name




def _positions(graph: torch.fx.Graph) -> dict:
    return {n: i for i, n in enumerate(graph.nodes)}


def _ahead(n: torch.fx.Node, index: int) -> int | None:
    a = n.args[index] if len(n.args) > index else None
    return a if isinstance(a, int) and not isinstance(a, bool) and a >= 1 else None


def schedule_forward(graph: torch.fx.Graph) -> int:
    """Move each ``offload_finish`` ``ahead`` offloads later; the number moved."""
    starts = [n for n in graph.nodes if op_name(n) == "kiln::offload_start"]
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    moved = 0
    for i, start in enumerate(starts):
        finishes = [u for u in start.users if op_name(u) == "kiln::offload_finish" and u.args[0] is start]
        ahead = _ahead(start, 1)
        if len(finishes) != 1 or ahead is None:
            continue
        finish = finishes[0]
        later = starts[i + ahead] if i + ahead < len(starts) else None
        pos = _positions(graph)
        at = pos[later] if later is not None else pos[out]
        if pos[finish] >= at or any(pos[u] <= at for u in finish.users if u is not out):
            continue
        if later is not None:
            later.append(finish)
            finish.args = (*finish.args[:-1], list(finish.args[-1]) + [later])
        else:
            out.prepend(finish)
        moved += 1
    return moved


def schedule_backward(graph: torch.fx.Graph) -> int:
    """Move each ``prefetch`` ``ahead`` first uses earlier; the number moved."""
    waits = [n for n in graph.nodes if op_name(n) == "kiln::prefetch_wait"]
    first_op = next((n for n in graph.nodes if n.op != "placeholder"), None)
    moved = 0
    for j, wait in enumerate(waits):
        start = wait.args[0]
        if not isinstance(start, torch.fx.Node) or op_name(start) != "kiln::prefetch":
            continue
        ahead = _ahead(start, 2)
        if ahead is None or first_op is None:
            continue
        anchor = waits[j - ahead] if j >= ahead else first_op
        if anchor is start:
            continue
        pos = _positions(graph)
        if pos[start] <= pos[anchor] or any(pos[a] >= pos[anchor] for a in start.all_input_nodes):
            continue
        anchor.prepend(start)
        if j >= ahead:
            anchor.args = (*anchor.args[:-1], list(anchor.args[-1]) + [start])
        moved += 1
    return moved


def schedule(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule) -> tuple[int, int]:
    """Both passes, in place (the caller lints and recompiles)."""
    return schedule_forward(fw.graph), schedule_backward(bw.graph)
