"""What a captured graph calls to run NumPy code on tensors.

Inside a graph an ndarray is a tensor. NumPy semantics (dtype promotion, default dtypes,
broadcasting, indexing) come from ``torch._numpy`` ("tnp"), which implements NumPy's API
with torch operators: each callable here wraps its tensor arguments as tnp arrays, calls the
tnp function, method or operator, and unwraps the result back to tensors. Backends trace
through them (make_fx) into ATen operators like any other Python function of tensors.

The callables are objects with a stable ``__module__``/``__qualname__`` per NumPy name, so that
graphs print readably and the compile cache can key them.
"""
from __future__ import annotations


import torch

from ... import _torch


def _tnp():
    tnp = _torch.numpy_on_tensors()
    if tnp is None:  # checked at capture time; defaults changed since
        raise RuntimeError("torch._numpy's default dtypes were changed after kiln traced NumPy code")
    return tnp


def to_tnp(x):
    """Tensors (ndarrays of the graph) as tnp arrays, through lists, tuples and dicts."""
    if isinstance(x, torch.Tensor):
        return _tnp().ndarray(x)
    if type(x) in (list, tuple):
        return type(x)(to_tnp(i) for i in x)
    if type(x) is dict:
        return {k: to_tnp(v) for k, v in x.items()}
    return x


def to_tensors(x):
    """The result of a tnp call with its arrays as tensors."""
    tnp = _tnp()
    if isinstance(x, tnp.ndarray):
        return x.tensor
    if isinstance(x, (list, tuple)) and type(x) in (list, tuple):
        return type(x)(to_tensors(i) for i in x)
    if isinstance(x, tuple):   # a named tuple of results (np.linalg.eigh, ...)
        return tuple(to_tensors(i) for i in x)
    return x


# Binary ufuncs that NumPy computes in float64 for integer (and bool) operands, where
# torch._numpy leaves the promotion to torch, which picks torch's default dtype (float32).
_INTEGERS_TO_FLOAT64 = frozenset({"true_divide", "divide", "truediv", "arctan2", "hypot"})


def _integers_as_float64(name: str, args):
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name not in _INTEGERS_TO_FLOAT64 or not tensors or any(
            t.dtype.is_floating_point or t.dtype.is_complex for t in tensors):
        return args
    return tuple(a.to(torch.float64) if isinstance(a, torch.Tensor) else a for a in args)


def _accumulator_dtype(name: str, args, kwargs: dict, positional_dtype_at: int) -> dict:
    """NumPy's ``cumsum``/``cumprod`` of small integers (and bools) accumulate in the platform
    integer (int64, uint64); torch._numpy keeps the input's dtype."""
    if name not in ("cumsum", "cumprod") or "dtype" in kwargs or len(args) > positional_dtype_at:
        return kwargs
    t = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if t is None or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype.itemsize >= 8:
        return kwargs
    unsigned = t.dtype in (torch.uint8, torch.uint16, torch.uint32)
    return {**kwargs, "dtype": "uint64" if unsigned else "int64"}


# Where NumPy always copies but torch._numpy may return its argument or a view of it.
_NUMPY_COPIES = frozenset({"flatten", "pos"})


def _copied(name: str, result):
    if name in _NUMPY_COPIES and isinstance(result, torch.Tensor):
        return result.clone()
    return result


class _Wrapper:
    __module__ = __name__

    def __repr__(self) -> str:
        return f"<kiln numpy {self.__qualname__}>"

    def __reduce__(self):
        return (type(self), self._args())


class NumpyFunction(_Wrapper):
    """``numpy.<name>`` (or ``numpy.linalg.<name>``...) on tensors."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name
        self.__name__ = f"np_{name}"
        self.__qualname__ = f"{module}.{name}"

    def _args(self):
        return (self.module, self.name)

    def numpy_twin(self):
        """The NumPy function this stands for (checked against at capture time)."""
        import numpy

        mod = numpy
        for part in self.module.split(".")[1:]:
            mod = getattr(mod, part)
        return getattr(mod, self.name)

    def target(self):
        tnp = _tnp()
        mod = tnp
        for part in self.module.split(".")[1:]:
            mod = getattr(mod, part)
        return getattr(mod, self.name)

    def __call__(self, /, *args, **kwargs):
        args = _integers_as_float64(self.name, args)
        kwargs = _accumulator_dtype(self.name, args, kwargs, 2)   # np.cumsum(a, axis, dtype)
        return _copied(self.name, to_tensors(self.target()(*to_tnp(args), **to_tnp(kwargs))))


class NdarrayMethod(_Wrapper):
    """``ndarray.<name>(...)`` (or the attribute ``ndarray.<name>`` when ``attribute``)."""

    def __init__(self, name: str, attribute: bool = False):
        self.name, self.attribute = name, attribute
        self.__name__ = f"ndarray_{name}"
        self.__qualname__ = f"ndarray.{name}"

    def _args(self):
        return (self.name, self.attribute)

    def numpy_twin(self):
        name = self.name
        if self.attribute:
            return lambda obj: getattr(obj, name)
        return lambda obj, *args, **kwargs: getattr(obj, name)(*args, **kwargs)

    def __call__(self, obj, *args, **kwargs):
        kwargs = _accumulator_dtype(self.name, (obj, *args), kwargs, 2)   # a.cumsum(axis, dtype)
        member = getattr(to_tnp(obj), self.name)
        if self.attribute:
            return to_tensors(member)
        return _copied(self.name, to_tensors(member(*to_tnp(args), **to_tnp(kwargs))))


class NdarrayOperator(_Wrapper):
    """A Python operator (``operator.add``, ``operator.setitem``...) with NumPy semantics."""

    def __init__(self, op):
        self.op = op
        self.__name__ = f"ndarray_{op.__name__}"
        self.__qualname__ = f"ndarray_operator.{op.__name__}"

    def _args(self):
        return (self.op,)

    def numpy_twin(self):
        return self.op

    def __call__(self, *args):
        args = _integers_as_float64(self.op.__name__, args)
        return _copied(self.op.__name__, to_tensors(self.op(*to_tnp(args))))


def ufunc_result_as_tensor(t: torch.Tensor) -> torch.Tensor:
    """What ``Tensor.__array_wrap__`` makes of a NumPy ufunc's result on tensors: a tensor,
    booleans as uint8."""
    return t.to(torch.uint8) if t.dtype == torch.bool else t


def ndarray_as_tensor(a):
    """An ndarray argument of a compiled function as the tensor its graph takes (shared
    memory, no copy)."""
    return torch.from_numpy(a)


def tensor_as_ndarray(t: torch.Tensor):
    """A graph's tensor output as the ndarray the user's code returns (shared memory)."""
    return t.numpy()


def tensor_as_numpy_scalar(t: torch.Tensor):
    """A 0-d graph output as the NumPy scalar (``numpy.float64``...) NumPy code returns."""
    return t.numpy()[()]


