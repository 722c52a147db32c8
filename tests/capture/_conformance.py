"""Shared helpers for the kiln capture conformance suite (tests/capture/test_conformance_*.py).

Every case is a small function ``fn`` plus ``make_args`` (a zero-argument callable returning
``(args, kwargs)`` built from FRESH random tensors on every call, always with the same
shapes/dtypes and the same Python values).  ``check`` compiles ``fn`` with
``fullgraph=True`` under a ``CompileCounter`` backend, calls it twice, and requires:

* the compiled result equals eager (run on deep copies of the inputs), recursively;
* the inputs after the compiled call equal the eager copies after the eager call
  (input-mutation parity);
* exactly one graph was compiled (the second call, with fresh values, hits the cache)
  and that graph contains at least one op.

Set ``KILN_CONFORMANCE_REFERENCE=torch`` to run the very same suite against
``torch.compile(..., backend=<counter>, fullgraph=True)`` instead of kiln; that is how the
cases themselves are sanity-checked (each must be capturable as one graph by dynamo).
"""
import collections
import copy
import math
import os

import pytest
import torch
from torch import nn

REFERENCE = os.environ.get("KILN_CONFORMANCE_REFERENCE", "").strip().lower() == "torch"


# --------------------------------------------------------------------------- backends
def _kiln():
    import kiln

    return kiln


def make_counter():
    if REFERENCE:
        from torch._dynamo.testing import CompileCounter
    else:
        from kiln.testing import CompileCounter
    return CompileCounter()


def compile_fn(fn, backend):
    if REFERENCE:
        return torch.compile(fn, backend=backend, fullgraph=True)
    return _kiln().compile(fn, backend=backend, fullgraph=True)


def reset():
    if REFERENCE:
        import torch._dynamo

        torch._dynamo.reset()
    else:
        _kiln().reset()


# --------------------------------------------------------------------------- arg factories
class Fresh:
    """A value rebuilt on every make_args() call (e.g. a fresh random tensor)."""

    def __init__(self, factory, label="fresh"):
        self.factory = factory
        self.label = label

    def __call__(self):
        return self.factory()

    def __repr__(self):
        return self.label


def fresh(factory):
    return Fresh(factory)


def R(*shape, dtype=torch.float32, requires_grad=False):
    """Fresh standard-normal tensor of the given shape."""
    return Fresh(lambda: torch.randn(*shape, dtype=dtype).requires_grad_(requires_grad),
                 f"randn{shape}")


def RI(low, high, *shape, dtype=torch.int64):
    """Fresh random integer tensor in [low, high)."""
    return Fresh(lambda: torch.randint(low, high, shape, dtype=dtype), f"randint{shape}")


def _materialize(v):
    if isinstance(v, Fresh):
        return v()
    if type(v) in (list, tuple):
        return type(v)(_materialize(x) for x in v)
    if type(v) is dict:
        return {k: _materialize(x) for k, x in v.items()}
    return v


def A(*args, **kwargs):
    """make_args factory: Fresh entries (also inside plain lists/tuples/dicts) are rebuilt
    on every call; everything else is passed as is (same object on both calls)."""

    def make():
        return tuple(_materialize(a) for a in args), {k: _materialize(v) for k, v in kwargs.items()}

    return make


def case(fn, make_args, id=None, **opts):
    """A pytest.param for ``check``; ``opts`` are forwarded (rtol/atol)."""
    return pytest.param(fn, make_args, opts, id=id or fn.__name__)


def ids_unique(cases):
    seen = collections.Counter(p.id for p in cases)
    dup = [k for k, v in seen.items() if v > 1]
    assert not dup, f"duplicate case ids: {dup}"
    return cases


# --------------------------------------------------------------------------- comparison
def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def assert_same(got, expected, rtol=1e-5, atol=1e-6, path="out"):
    """Recursive structural equality: same container types, tensors via assert_close
    (dtype/device/shape/values) plus requires_grad, python scalars by type and ==."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: expected a Tensor, got {type(got).__name__}: {got!r}"
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{path}: {m}")
        assert got.requires_grad == expected.requires_grad, (
            f"{path}: requires_grad {got.requires_grad} != {expected.requires_grad}")
        return
    if isinstance(expected, nn.Module):
        assert type(got) is type(expected), f"{path}: type {type(got).__name__} != {type(expected).__name__}"
        assert got.training == expected.training, f"{path}: training flag differs"
        assert_same(dict(got.state_dict()), dict(expected.state_dict()), rtol, atol, path + ".state_dict()")
        return
    assert type(got) is type(expected), (
        f"{path}: type {type(got).__name__} != {type(expected).__name__} (got {got!r}, expected {expected!r})")
    if isinstance(expected, (list, tuple)):  # includes namedtuple, torch.Size, user subclasses
        assert len(got) == len(expected), f"{path}: len {len(got)} != {len(expected)}"
        names = expected._fields if _is_namedtuple(expected) else None
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, rtol, atol, f"{path}.{names[i]}" if names else f"{path}[{i}]")
        if hasattr(expected, "__dict__") and not _is_namedtuple(expected):
            assert_same(vars(got), vars(expected), rtol, atol, path + ".__dict__")
        return
    if isinstance(expected, dict):  # includes OrderedDict, defaultdict, user subclasses
        assert list(got.keys()) == list(expected.keys()), (
            f"{path}: keys {list(got.keys())} != {list(expected.keys())}")
        for k in expected:
            assert_same(dict.__getitem__(got, k), dict.__getitem__(expected, k), rtol, atol, f"{path}[{k!r}]")
        return
    if isinstance(expected, (set, frozenset)):
        assert got == expected, f"{path}: {got!r} != {expected!r}"
        return
    if isinstance(expected, float):
        if math.isnan(expected):
            assert math.isnan(got), f"{path}: {got!r} != nan"
        else:
            assert got == expected or math.isclose(got, expected, rel_tol=rtol, abs_tol=atol), (
                f"{path}: {got!r} != {expected!r}")
        return
    if expected is None or isinstance(expected, (bool, int, str, complex, torch.dtype, torch.device, type)):
        assert got == expected, f"{path}: {got!r} != {expected!r}"
        return
    if callable(expected):
        return  # functions / lambdas passed through: identity is not meaningful across copies
    if hasattr(expected, "__dict__"):
        assert_same(vars(got), vars(expected), rtol, atol, path + ".__dict__")
        return
    assert got == expected, f"{path}: {got!r} != {expected!r}"


# --------------------------------------------------------------------------- drivers
def check(fn, make_args, rtol=1e-5, atol=1e-6, calls=2, frames=1):
    """Compile ``fn`` (fullgraph) and compare against eager on fresh inputs ``calls`` times."""
    torch.manual_seed(0)
    reset()
    cnt = make_counter()
    cf = compile_fn(fn, cnt)
    for i in range(calls):
        args, kwargs = make_args()
        eargs, ekwargs = copy.deepcopy((args, kwargs))
        expected = fn(*eargs, **ekwargs)
        got = cf(*args, **kwargs)
        assert_same(got, expected, rtol, atol, path=f"call{i}:out")
        assert_same(args, eargs, rtol, atol, path=f"call{i}:args")
        assert_same(kwargs, ekwargs, rtol, atol, path=f"call{i}:kwargs")
    assert cnt.frame_count == frames, f"expected {frames} compiled graph(s), got {cnt.frame_count}"
    assert cnt.op_count >= 1, "the captured graph has no ops"
    return cnt


def run_case(fn, make_args, opts):
    check(fn, make_args, **opts)


def same_as_eager_in_one_graph(fn, *args):
    """``fn(*args)`` compiled by kiln (graph breaks allowed): the same result as eager's (by
    ``repr``: Python values, their types and order, and tensors), in one graph."""
    kiln = _kiln()
    from kiln.testing import CompileCounter

    counter = CompileCounter()
    expected = fn(*args)
    got = kiln.compile(fn, backend=counter)(*args)
    assert repr(got) == repr(expected)
    assert counter.frame_count == 1
    return got
