"""Steps: CUDA graphs record in the order the graphs run.

A step is one call, from Python, of a kiln-compiled function whose graphs run as CUDA graphs
(torch's "generation"), with everything that call runs: the continuations after its graph
breaks and the compiled callees it calls are part of it (a call inside a step starts none,
per thread). A backward runs inside the step of its forward's call (the counter moves only
when the next step begins). Only functions with CUDA graphs count steps (the runtime's
``counting_steps``): the call path of every other compiled function does not pay for it.

A graph called for the first time warms up (runs as compiled, outside any capture), and
while any graph warmed up in the current step, the others of that step warm up too instead of
recording; the next step records them all, one after the other, in the order they run.
(Recording a backward during the step its forward warmed up in would place the backward
before its forward in the pool: its replays would overwrite what the forward returns. The same
holds for a continuation recorded in the step its caller's graph warmed up in.)

The counter itself (``count``, ``warming``) is ``kiln.process_state.cudagraph_steps``.
"""
from __future__ import annotations

from ..process_state import cudagraph_steps as state


def run_in_step(call, *args, **kwargs):
    """``call(*args, **kwargs)`` as a step, or inside the step this thread is already in."""
    inside = state.inside
    if getattr(inside, "in_step", False):
        return call(*args, **kwargs)
    state.count += 1
    inside.in_step = True
    try:
        return call(*args, **kwargs)
    finally:
        inside.in_step = False
