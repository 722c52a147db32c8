"""A ``torch.optim`` optimizer's ``param_groups`` as its step is captured: each group's
``capturable`` reads True, as torch.compile traces it.

``torch.optim`` writes every step twice: a default implementation that reads its step counts as
Python numbers (``step.item()``, ``rho_t > 5`` in RAdam, ``max(1, step - t0)`` in ASGD, step
sizes handed to foreach ops as lists of numbers), and a ``capturable`` one in tensor math
only, made for CUDA graphs. Under a compiler (``torch.compiler.is_compiling()``), the default
one reads the counts as tensors instead, which breaks the graph at each of those reads and
recompiles as the counts change (Adamax's foreach step does not run at all). The capturable
one is the same update in tensor ops: one graph, values within float rounding of eager's.

So while a step of one of torch.optim's own optimizers is captured, ``group["capturable"]``
reads True (another library's optimizer may give the key another meaning). The real setting
is not changed, and nothing is guarded on it (the graph is the same either way). Only where
it is safe: every parameter of the group and every existing step count on one device (a
count left on the CPU beside CUDA parameters by an eager step stays with the default
implementation). On a GPU, a first step captured this way creates the step counts on the
parameters' device, as a capturable optimizer does.
"""
from __future__ import annotations

import torch

from .base import ConstantValue, Value
from .containers import DictValue, ListValue

_KEY = "capturable"


def is_optimizer(obj) -> bool:
    """One of torch.optim's own optimizers (another library's may give ``capturable`` another
    meaning)."""
    return isinstance(obj, torch.optim.Optimizer) and type(obj).__module__.startswith("torch.optim.")


class _ReadAsCapturable(ConstantValue):
    """True to the code being captured; the group's own value wherever the group is written
    back (a compiled step that also sets ``lr``, a scheduler's): the real setting stays."""

    def __init__(self, real):
        super().__init__(True)
        self.real = real

    def reconstruct(self, cg):
        return cg.constant_expr(self.real)


def read_as_capturable(optimizer: torch.optim.Optimizer, groups: Value) -> Value:
    """``groups`` (the capture's value of ``optimizer.param_groups``), each group whose
    implementation can run as capturable reading ``capturable`` as True."""
    if not isinstance(groups, ListValue):
        return groups
    for real, group in zip(optimizer.param_groups, groups.items):
        if isinstance(group, DictValue) and _KEY in group.items and _safe(optimizer, real):
            group.items[_KEY] = _ReadAsCapturable(real[_KEY])
    return groups


def _safe(optimizer: torch.optim.Optimizer, group: dict) -> bool:
    if group.get(_KEY) is not False or group.get("fused") or group.get("differentiable"):
        return False
    devices = set()
    for p in group.get("params", ()):
        if not isinstance(p, torch.Tensor):
            return False
        devices.add(p.device)
        step = optimizer.state.get(p, {}).get("step") if isinstance(optimizer.state, dict) else None
        if step is not None:
            if not isinstance(step, torch.Tensor):
                return False
            devices.add(step.device)
    return len(devices) == 1 and next(iter(devices)).type in ("cpu", "cuda")
