"""The one adapter over torch internals that kiln uses.

Everything kiln takes from torch beyond its public API is imported here, so that a torch
version difference is handled in one place. kiln never calls torch.compile, dynamo,
aot_autograd or torch's precompile APIs: those are the peer that kiln is measured against.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import (  # noqa: F401  (re-exported)
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)

# C-level checks. TensorGuards compares, for several tensors at once, the Python type, dispatch
# keys, dtype, device, requires_grad, sizes and strides, and also that no two are the same
# object. GlobalStateGuard snapshots grad mode, torch-function mode, deterministic algorithms,
# TF32/reduced-precision flags, thread count and default dtype. kiln's guard semantics and code
# generation are its own; these are the fast primitives its generated code calls.
from torch._C._dynamo.guards import GlobalStateGuard, TensorGuards  # noqa: F401

Graph = torch.fx.Graph
GraphModule = torch.fx.GraphModule
Node = torch.fx.Node

# Exceptions that mean "this op needs real data": the frame cannot be captured as one graph.
DATA_DEPENDENT_ERRORS: tuple[type[BaseException], ...] = (
    DataDependentOutputException,
    DynamicOutputShapeException,
)
try:  # torch >= 2.1 raises this for data-dependent guards on unbacked symbols
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    DATA_DEPENDENT_ERRORS += (GuardOnDataDependentSymNode,)
except ImportError:  # pragma: no cover
    pass


def make_tensor_guards(tensors: list[torch.Tensor]) -> Any:
    """A TensorGuards over static shapes: sizes and strides are compared exactly."""
    return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)


def tensor_guard_failure(tg: Any, tensors: list, names: list[str]) -> str | None:
    """The first failing tensor check as text, or None when all hold."""
    try:
        res = tg.check_verbose(*tensors, tensor_check_names=names)
    except TypeError as e:  # wrong arity or a non-tensor where a tensor was expected
        return str(e)
    return None if res is True else str(res)


def global_state_snapshot() -> Any:
    return GlobalStateGuard()


def global_state_description() -> dict[str, Any]:
    """The global state that GlobalStateGuard covers, readable, for explaining a failure."""
    return {
        "grad_mode": torch.is_grad_enabled(),
        "default_dtype": torch.get_default_dtype(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "num_threads": torch.get_num_threads(),
        "torch_function_enabled": torch._C._is_torch_function_enabled(),
    }


def new_fake_mode() -> FakeTensorMode:
    # static_shapes here; issue 4 brings a ShapeEnv for symbolic sizes.
    return FakeTensorMode(allow_non_fake_inputs=False)


def fake_from_real(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    return mode.from_tensor(t, static_shapes=True)


def is_fake(t: Any) -> bool:
    return isinstance(t, FakeTensor)


def module_hooks_empty(m: torch.nn.Module) -> bool:
    return not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or m._backward_pre_hooks)


def global_module_hooks() -> tuple:
    """The dicts of globally registered nn.Module hooks (torch.nn.modules.module)."""
    import torch.nn.modules.module as mm

    return tuple(getattr(mm, n) for n in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks") if hasattr(mm, n))
