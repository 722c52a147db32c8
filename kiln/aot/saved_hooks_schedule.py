"""Where the inlined offload copies finish and where the copies back start (issue 14).

A pack hook that calls ``kiln::offload_start`` then ``kiln::offload_finish`` (kiln.activations'
offload policy, stream_ops.py) is traced with the two ops back to back, which would make the
compute stream wait for each copy at once. After inlining, this pass spreads them out:

* forward: the finish of the i-th offload moves right after the start of offload i+ahead
  (the last ones: to the end of the forward), with that start's token in its ``order``
  argument so that no later scheduler (Inductor) moves it back. Up to ``ahead`` saved
  tensors then stay in device memory while their copies run; each is freed at its finish.
* backward: the wait of each saved tensor stays right before its first use and lists, in its
  ``order`` argument, the other values that use reads (computed just before it), so that no
  scheduler hoists it. The ``prefetch`` of the j-th saved tensor (in order of first use) moves
  right after the wait of tensor j-ahead (the first ``ahead`` ones: to the start of the
  backward) and lists that wait's result in its ``after`` argument. So at most ``ahead``
  copies back are in flight ahead of the compute, and device memory holds at most about
  ``ahead`` prefetched tensors before their use: the dependencies say so, not only the order
  of the graph's nodes, which Inductor's scheduler may change.

Only moves that keep the graph valid are made (inputs before, users after); the others stay
where the hook put them, which is correct, only without overlap. Any graph with these ops
(a user's hooks calling them) is scheduled the same way.
"""
from __future__ import annotations

import torch
import torch.fx


def _op(n: torch.fx.Node) -> str | None:
    if n.op != "call_function":
        return None
    schema = getattr(n.target, "_schema", None)
    return schema.name if schema is not None else None


def _positions(graph: torch.fx.Graph) -> dict:
    return {n: i for i, n in enumerate(graph.nodes)}


def _ahead(n: torch.fx.Node, index: int) -> int | None:
    a = n.args[index] if len(n.args) > index else None
    return a if isinstance(a, int) and not isinstance(a, bool) and a >= 1 else None


def schedule_forward(graph: torch.fx.Graph) -> int:
    """Move each ``offload_finish`` ``ahead`` offloads later; the number moved."""
    starts = [n for n in graph.nodes if _op(n) == "kiln::offload_start"]
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    moved = 0
    for i, start in enumerate(starts):
        finishes = [u for u in start.users if _op(u) == "kiln::offload_finish" and u.args[0] is start]
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
    """Pin each ``prefetch_wait`` to its first use and each ``prefetch`` after the wait
    ``ahead`` first uses earlier; the number of prefetches moved."""
    waits = [n for n in graph.nodes if _op(n) == "kiln::prefetch_wait"]
    for wait in waits:
        _pin_to_first_use(graph, wait)
    waits.sort(key=_positions(graph).__getitem__)       # (in order of first use)
    first_op = next((n for n in graph.nodes if n.op != "placeholder"), None)
    moved = 0
    for j, wait in enumerate(waits):
        start = wait.args[0]
        if not isinstance(start, torch.fx.Node) or _op(start) != "kiln::prefetch" or len(start.args) < 4:
            continue
        ahead = _ahead(start, 2)
        if ahead is None or first_op is None:
            continue
        anchor = waits[j - ahead] if j >= ahead else None
        pos = _positions(graph)
        if anchor is None:
            # one of the first ``ahead``: issued at the start of the backward
            if pos[start] > pos[first_op] and all(pos[a] < pos[first_op] for a in start.all_input_nodes):
                first_op.prepend(start)
                moved += 1
            continue
        if anchor is start or pos[anchor] >= pos[wait]:
            continue
        anchor.append(start)      # (its inputs, placeholders and earlier values, come before)
        start.args = (*start.args[:3], list(start.args[3]) + [anchor])
        moved += 1
    return moved


def _pin_to_first_use(graph: torch.fx.Graph, wait: torch.fx.Node) -> None:
    """``wait`` right before its first user, ordered after the values that user reads."""
    pos = _positions(graph)
    users = sorted((u for u in wait.users if not (_op(u) or "").startswith("kiln::")), key=pos.__getitem__)
    if not users or users[0].op == "output":
        return
    use = users[0]
    if pos[wait] + 1 < pos[use] and all(pos[a] < pos[use] for a in wait.all_input_nodes):
        use.prepend(wait)
    pos = _positions(graph)
    pins = [a for a in use.all_input_nodes
            if a is not wait and a.op != "placeholder" and pos[a] < pos[wait]
            and isinstance(a.meta.get("val"), torch.Tensor) and a not in wait.args[-1]]
    if pins:
        wait.args = (*wait.args[:-1], list(wait.args[-1]) + pins)


def schedule(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule) -> tuple[int, int]:
    """Both passes, in place (the caller lints and recompiles)."""
    return schedule_forward(fw.graph), schedule_backward(bw.graph)
