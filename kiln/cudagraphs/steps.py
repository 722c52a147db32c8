"""The step counter: one more for each call of a kiln-compiled function from Python (torch's
"generation"). A backward runs inside the step of its forward's call.

CUDA graphs use it to record in call order: a graph called for the first time warms up (runs
as compiled, outside any capture), and while any graph warmed up in the current step, the
others of that step warm up too instead of recording; the next step records them all, one
after the other, in the order they run. (Recording a backward during the step its forward
warmed up in would place the backward before its forward in the pool: its replays would
overwrite what the forward returns.)"""

count = 0           # incremented by kiln.runtime.function.CompiledFunction.__call__
warming = -1        # the step in which a graph last warmed up
