"""Activation memory: saved-tensor hooks that kiln inlines into compiled training graphs.

Built-in policies (context managers around a training step)::

    with kiln.activations.cast(torch.bfloat16):   # or fp8(), offload()
        loss = compiled_step(batch)
    loss.backward()
    print(kiln.activations.report())              # saved bytes before/after, per graph

Each takes ``min_bytes`` (tensors below it are saved unchanged). ``report()`` covers every graph
compiled with inlined hooks (``policy.report()`` only that policy's); ``KILN_LOGS=activations``
logs the same as graphs are compiled.
"""
from .policies import DEFAULT_MIN_BYTES, Policy, cast, fp8, fp8_supported, offload
from .report import ActivationReport, report

__all__ = ["cast", "fp8", "offload", "report", "ActivationReport", "Policy", "DEFAULT_MIN_BYTES",
           "fp8_supported"]
