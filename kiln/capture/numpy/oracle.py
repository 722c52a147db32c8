"""NumPy itself checks each traced NumPy call at capture time.

torch._numpy follows NumPy closely but not everywhere: result dtypes (``np.sin`` of bools is
float16 in NumPy), shapes (``np.median`` of a vector is 0-d), scalars against 0-d arrays,
tuples against lists and named tuples, and some values (``np.cbrt`` of negatives). A graph
that silently computed something else would be a wrong answer, so each call is also run, at
capture time, by NumPy and by torch._numpy on the same stand-in arrays: arrays of the real
shapes and dtypes filled with random numbers (a private generator: NumPy's global stream is
not touched). Results must agree in Python type, dtype, shape and values, and so must the
arguments a call writes into; otherwise the call breaks the graph and NumPy runs it. NumPy's
own result also tells whether a 0-d result is a scalar or an array, and which container a
tuple of results is.

Stand-ins of the real shapes are built for small arrays (``MAX_ELEMENTS`` in all). For larger
ones every size is cut to 2, and only Python types, dtypes and ranks are compared; a call that
cannot run on such stand-ins (a reshape to the real sizes) is traced unchecked, with the
result kinds taken from name lists.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from ...errors import Unsupported
from ..values.base import Value
from ..values.containers import DictValue, ListValue, TupleValue
from ..values.symbolic import SymNodeValue, SymSliceValue
from ..values.tensor import TensorValue
from .values import NdarrayValue

MAX_ELEMENTS = 1 << 16
# Functions whose values are arbitrary (uninitialized memory): only types, dtypes, shapes.
_ARBITRARY_VALUES = frozenset({"empty", "empty_like"})
# Calls whose integer arrays are indices: their stand-ins are zeros.
_INDEXING = frozenset({"__getitem__", "__setitem__", "take", "put", "take_along_axis",
                       "put_along_axis", "choose"})
# Results that are right in more than one way (eigenvectors: any sign; the order of equal
# elements in an unstable sort): NumPy's own choice cannot be checked on stand-ins, so these
# are not traced.
NOT_CHECKABLE = frozenset({"eig", "eigh", "argsort", "argpartition", "partition", "lexsort"})


class _NoOracle(Exception):
    """NumPy cannot be asked for this call (large arrays, a symbolic size without a hint)."""


def _hint(n) -> int:
    if isinstance(n, torch.SymInt):
        hint = n.node.hint
        if hint is None:
            raise _NoOracle()
        return int(hint)
    return int(n)


class _StandIns:
    """Stand-in arrays for a call's arguments: the same array for the same graph value."""

    def __init__(self, rng, indices: bool, shrink: bool = False):
        self.rng = rng
        self.indices = indices
        self.shrink = shrink   # every size cut to at most 2 (large arrays: dtypes and kinds only)
        self.by_fake: dict[int, np.ndarray] = {}
        self.elements = 0

    def array(self, fake: torch.Tensor, scalar: bool):
        key = id(fake)
        if key not in self.by_fake:
            shape = tuple(_hint(s) for s in fake.shape)
            if self.shrink:
                shape = tuple(min(s, 2) for s in shape)
            dtype = np.dtype(str(fake.dtype).replace("torch.", ""))
            self.elements += int(np.prod(shape, dtype=np.int64))
            if self.elements > MAX_ELEMENTS:
                raise _NoOracle()
            if dtype.kind == "b":
                a = self.rng.random(shape) > 0.5
            elif dtype.kind in "iu" and self.indices:
                a = np.zeros(shape, dtype)   # valid wherever an index is
            elif dtype.kind in "iu":   # no zeros (integer division by zero raises in torch)
                values = [1, 2, 3] if dtype.kind == "u" else [-3, -2, -1, 1, 2, 3]
                a = self.rng.choice(values, size=shape).astype(dtype)
            elif dtype.kind == "c":
                a = (self.rng.standard_normal(shape) + 1j * self.rng.standard_normal(shape)).astype(dtype)
            else:
                a = self.rng.standard_normal(shape).astype(dtype)
            self.by_fake[key] = np.asarray(a)
        a = self.by_fake[key]
        return a[()] if scalar else a


def _numpy_argument(v: Value, stand_ins: _StandIns, as_constant):
    if isinstance(v, NdarrayValue):
        return stand_ins.array(v.fake, v.scalar)
    if isinstance(v, TensorValue):
        return stand_ins.array(v.fake, False)
    if isinstance(v, SymNodeValue):
        return _hint(v.fake)
    if isinstance(v, SymSliceValue):
        return slice(*[_numpy_argument(p, stand_ins, as_constant) for p in v.parts])
    if isinstance(v, (TupleValue, ListValue)):
        items = [_numpy_argument(i, stand_ins, as_constant) for i in v.items]
        return items if isinstance(v, ListValue) else tuple(items)
    if isinstance(v, DictValue):
        return {k: _numpy_argument(x, stand_ins, as_constant) for k, x in v.items.items()}
    return as_constant(v)


def _as_tensors(x, by_id: dict):
    """The stand-ins as tensors of their own (torch._numpy's run must not write NumPy's)."""
    if isinstance(x, np.ndarray):
        if id(x) not in by_id:
            by_id[id(x)] = (x, torch.from_numpy(x.copy()))
        return by_id[id(x)][1]
    if isinstance(x, np.generic):
        return torch.from_numpy(np.array(x))
    if type(x) in (list, tuple):
        return type(x)(_as_tensors(i, by_id) for i in x)
    if type(x) is dict:
        return {k: _as_tensors(v, by_id) for k, v in x.items()}
    return x


def check_with_numpy(target, twin, name: str, args: list[Value], kwargs: dict[str, Value],
                     as_constant, fake_result):
    """NumPy's result for this call on stand-ins, after checking that torch._numpy (``target``
    on tensors) agrees with it (and with ``fake_result``, the traced result); None when NumPy
    cannot be asked. Raises Unsupported where they differ."""
    if name in NOT_CHECKABLE:
        raise Unsupported(f"NumPy {name} (its result is one of several valid ones; NumPy runs it)")
    stand_ins = _StandIns(np.random.default_rng(0), name in _INDEXING)
    try:
        np_args = [_numpy_argument(a, stand_ins, as_constant) for a in args]
        np_kwargs = {k: _numpy_argument(v, stand_ins, as_constant) for k, v in kwargs.items()}
    except _NoOracle:
        return _check_kinds(target, twin, name, args, kwargs, as_constant, fake_result)
    by_id: dict = {}
    t_args = _as_tensors(np_args, by_id)
    t_kwargs = _as_tensors(np_kwargs, by_id)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            expected = twin(*np_args, **np_kwargs)
        except Exception as e:   # NumPy raises here: so does eager (natively, after a break)
            raise Unsupported(f"NumPy {name} raises on these arguments ({type(e).__name__}: {e})")
        try:
            with torch.no_grad():
                actual = target(*t_args, **t_kwargs)
        except Exception as e:
            raise Unsupported(f"torch._numpy's {name} fails where NumPy does not "
                              f"({type(e).__name__}: {e})")
    why = _difference(actual, expected, name)
    if why is None:   # arguments written to (a[i] = v, a += b, a.sort()) must end the same
        for arr, tensor in by_id.values():
            why = _difference(tensor, arr, name)
            if why is not None:
                why = f"an argument written to: {why}"
                break
    if why is None and isinstance(fake_result, torch.Tensor) and isinstance(actual, torch.Tensor) \
            and fake_result.dtype != actual.dtype:
        why = "the traced dtype"
    if why is not None:
        raise Unsupported(f"torch._numpy's {name} differs from NumPy ({why}): NumPy runs it")
    return expected


def _difference(actual, expected, name: str) -> str | None:
    if isinstance(expected, (np.ndarray, np.generic)):
        if not isinstance(actual, torch.Tensor):
            return f"{type(actual).__name__} for {type(expected).__name__}"
        try:
            got = actual.numpy()
        except TypeError:   # a dtype NumPy lacks (complex32...)
            return f"dtype {actual.dtype}"
        if got.dtype != expected.dtype:
            return f"dtype {got.dtype}, NumPy's {expected.dtype}"
        if got.shape != np.shape(expected):
            return f"shape {got.shape}, NumPy's {np.shape(expected)}"
        if name in _ARBITRARY_VALUES:
            return None
        tol = {np.float16: 1e-2, np.float32: 1e-4, np.complex64: 1e-4}.get(expected.dtype.type, 1e-6)
        if expected.dtype.kind in "fc":
            same = np.allclose(got, expected, rtol=tol, atol=tol, equal_nan=True)
        else:
            same = np.array_equal(got, expected)
        return None if same else "values"
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return f"{type(actual).__name__} for {type(expected).__name__}"
        for a, e in zip(actual, expected):
            why = _difference(a, e, name)
            if why is not None:
                return why
        return None
    if isinstance(actual, torch.Tensor):
        return f"an array for {type(expected).__name__}"
    try:
        return None if type(actual) is type(expected) and actual == expected else "value"
    except Exception:
        return "value"



def _check_kinds(target, twin, name, args, kwargs, as_constant, fake_result):
    """For large arrays: NumPy and torch._numpy on stand-ins with every size cut to 2 must
    agree on Python types, dtypes and ranks (sizes and values are not compared). None when
    the call cannot run on such stand-ins (a shape argument that needs the real sizes): it is
    traced unchecked."""
    stand_ins = _StandIns(np.random.default_rng(0), name in _INDEXING, shrink=True)
    try:
        np_args = [_numpy_argument(a, stand_ins, as_constant) for a in args]
        np_kwargs = {k: _numpy_argument(v, stand_ins, as_constant) for k, v in kwargs.items()}
    except _NoOracle:
        return None
    by_id: dict = {}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            expected = twin(*np_args, **np_kwargs)
            with torch.no_grad():
                actual = target(*_as_tensors(np_args, by_id), **_as_tensors(np_kwargs, by_id))
        except Exception:
            return None
    why = _kind_difference(actual, expected)
    if why is None and isinstance(fake_result, torch.Tensor) and isinstance(actual, torch.Tensor) \
            and (fake_result.dtype != actual.dtype or fake_result.dim() != actual.dim()):
        why = "the traced dtype or rank"
    if why is not None:
        raise Unsupported(f"torch._numpy's {name} differs from NumPy ({why}): NumPy runs it")
    return expected


def _kind_difference(actual, expected) -> str | None:
    if isinstance(expected, (np.ndarray, np.generic)):
        if not isinstance(actual, torch.Tensor):
            return f"{type(actual).__name__} for {type(expected).__name__}"
        if str(actual.dtype).replace("torch.", "") != expected.dtype.name:
            return f"dtype {actual.dtype}, NumPy's {expected.dtype}"
        if actual.dim() != np.ndim(expected):
            return f"rank {actual.dim()}, NumPy's {np.ndim(expected)}"
        return None
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return f"{type(actual).__name__} for {type(expected).__name__}"
        for a, e in zip(actual, expected):
            why = _kind_difference(a, e)
            if why is not None:
                return why
        return None
    if isinstance(actual, torch.Tensor):
        return f"an array for {type(expected).__name__}"
    return None
