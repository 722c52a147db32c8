"""Test helpers: a counting backend, and comparison with eager."""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.fx


class CompileCounter:
    """A backend that counts graphs (``frame_count``) and their operator nodes (``op_count``),
    then runs the graph as is. ``graphs`` keeps each GraphModule it saw."""

    def __init__(self) -> None:
        self.frame_count = 0
        self.op_count = 0
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
        self.graphs.append(gm)
        return gm.forward

    def clear(self) -> None:
        self.frame_count = 0
        self.op_count = 0
        self.graphs.clear()

    @property
    def __name__(self) -> str:
        return "CompileCounter"


def assert_same(actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None,
                path: str = "out") -> None:
    """Recursive equality: same container types, close tensors (dtype and shape too), == else."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: expected a tensor, got {type(actual).__name__}"
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{path}: {m}")
        return
    assert type(actual) is type(expected), f"{path}: expected {type(expected).__name__}, got {type(actual).__name__}"
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, rtol=rtol, atol=atol, path=f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_same(actual[k], expected[k], rtol=rtol, atol=atol, path=f"{path}[{k!r}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def run_both(fn: Callable, compiled: Callable, args: tuple, kwargs: dict | None = None):
    """Run eager on deep copies and compiled on the originals; return both results and both
    argument states (for checking input mutations)."""
    kwargs = kwargs or {}
    e_args, e_kwargs = copy.deepcopy((args, kwargs))
    expected = fn(*e_args, **e_kwargs)
    actual = compiled(*args, **kwargs)
    return actual, expected, (args, kwargs), (e_args, e_kwargs)
