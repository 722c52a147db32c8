"""torch's symbolic shapes as kiln traces with them: the ShapeEnv, symbol sources, fake modes.

Part of the adapter over torch internals (``kiln._torch``, which forwards these names): kept
apart because ``torch.fx.experimental.symbolic_shapes`` imports sympy, a third of a second that
a warm start (a frame record's entries loaded, nothing traced) never needs. Only tracing and
compiling import this module.
"""
from __future__ import annotations

import contextlib as _contextlib
import functools as _functools
import hashlib as _hashlib
import inspect as _inspect
import warnings as _warnings
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)

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



from torch._guards import GuardSource as _GuardSource
from torch._guards import Source as _TorchSource
from torch.fx.experimental.symbolic_shapes import (  # noqa: F401  (re-exported)
    DimDynamic,
    ShapeEnv,
    StatelessSymbolicContext,
)

# Symbol ids are a hash of the symbol's source name in [0, SYMBOL_ID_SPACE), probed linearly
# on collision. torch hashes into 100 slots; with tens of dynamic dims that collides
# often, and a collision makes a name depend on what else was allocated first. 10,000 slots
# keep collisions rare while names stay short (``s4821``).
SYMBOL_ID_SPACE = 10_000


def symbol_id(source_name: str, taken: set) -> int:
    """The stable id of the symbol for ``source_name``: its hash, probed past ``taken``."""
    i = int(_hashlib.sha256(source_name.encode()).hexdigest(), 16) % SYMBOL_ID_SPACE
    while i in taken:
        i = (i + 1) % SYMBOL_ID_SPACE
    return i


class _SitedGuards(list):
    """The ShapeEnv's guard list, remembering where in the user's code each guard arose."""

    def __init__(self, env: "KilnShapeEnv"):
        super().__init__()
        self.env = env
        self.sites: list = []

    def append(self, guard) -> None:
        super().append(guard)
        self.sites.append(self.env.where())


class KilnShapeEnv(ShapeEnv):
    """torch's ShapeEnv, with kiln's stable symbol ids, and the user's line behind each
    guard and specialization (``location`` is set by the capture)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.location: Any = None            # () -> (filename, lineno, source line)
        self.specialized_at: dict = {}       # symbol -> where it became a constant
        self.guards = _SitedGuards(self)

    def where(self):
        return self.location() if self.location is not None else None

    def _generate_unique_id(self, source_name: str) -> int:
        i = symbol_id(source_name, self.unique_ids)
        self.unique_ids.add(i)
        return i

    def _set_replacement(self, a, tgt, msg):
        if getattr(tgt, "is_number", False) and a not in self.specialized_at:
            self.specialized_at[a] = self.where()
        return super()._set_replacement(a, tgt, msg)


class SymbolSource(_TorchSource):
    """What torch's ShapeEnv needs of a source: its name (``L['x']``). kiln's own sources do
    the guarding; this only names symbols and locates them in torch's messages."""

    def __init__(self, text: str):
        self.text = text

    def __eq__(self, other):
        return isinstance(other, SymbolSource) and other.text == self.text

    def __hash__(self):
        return hash(("kiln", self.text))

    def __repr__(self):
        return self.text

    @property
    def _name_template(self) -> str:
        return self.text

    @property
    def guard_source(self):
        return _GuardSource.LOCAL


# torch 2.13 derives ``name`` (a cached property) from _name_template; older torch calls name().
if not isinstance(_inspect.getattr_static(_TorchSource, "name", None), _functools.cached_property):
    SymbolSource.name = lambda self: self.text  # type: ignore[assignment]


def new_fake_mode() -> FakeTensorMode:
    """A fake mode with a ShapeEnv: static inputs have int sizes, dynamic ones symbols."""
    # ops whose output size depends on data (nonzero) or that produce Python numbers from data
    # (item) raise, as without a ShapeEnv: kiln breaks the graph there
    env = KilnShapeEnv(allow_scalar_outputs=False, allow_dynamic_output_shape_ops=False)
    return FakeTensorMode(allow_non_fake_inputs=False, shape_env=env)


def fake_from_real(mode: FakeTensorMode, t: torch.Tensor, source_name: str | None = None,
                   dims: list | None = None, stride_dims: list | None = None) -> torch.Tensor:
    """The fake of ``t``: static sizes, or, where ``dims[i]`` is a DimDynamic other than
    STATIC, a symbol named from ``source_name``; likewise its strides where ``stride_dims[i]``
    is DYNAMIC (elsewhere they follow the sizes, or stay static with them)."""
    if (dims is None or all(d is DimDynamic.STATIC for d in dims)) and stride_dims is None:
        return static_fake(mode, t)
    ctx = StatelessSymbolicContext(
        dynamic_sizes=list(dims) if dims is not None else [DimDynamic.STATIC] * t.dim(),
        dynamic_strides=list(stride_dims) if stride_dims is not None else None)
    with _grad_read_quiet():
        return mode.from_tensor(t, symbolic_context=ctx, source=SymbolSource(source_name))


def static_fake(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    """The fake of ``t`` with its sizes as they are."""
    with _grad_read_quiet():
        return mode.from_tensor(t, static_shapes=True)


@_contextlib.contextmanager
def _grad_read_quiet():
    """The conversion to a fake tensor reads ``.grad`` of every tensor, which warns for a
    non-leaf. torch hides that warning from the display only, so under the user's
    ``warnings.simplefilter("error")`` (pytest's ``-W error``) it would raise and fail the
    capture: it is ignored here instead."""
    with _warnings.catch_warnings():
        _warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not a leaf")
        yield


def symbolic_int(mode: FakeTensorMode, value: int, source_name: str):
    """A SymInt for a Python int input (any value, no 0/1 specialization)."""
    env = mode.shape_env
    src = SymbolSource(source_name)
    sym = env.create_unspecified_symbol(value, source=src, dynamic_dim=DimDynamic.DYNAMIC)
    return env.create_symintnode(sym, hint=value, source=src)


def static_fake_mode() -> FakeTensorMode:
    """A fake mode for a graph with static shapes that still has a ShapeEnv (every size is an
    int): Inductor's FX graph cache needs one to store and look up graphs."""
    return FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True,
                          shape_env=ShapeEnv(allow_scalar_outputs=False, allow_dynamic_output_shape_ops=False))
