"""NumPy code traced into the graph.

An ndarray (or NumPy scalar) that the function computes is an ``NdarrayValue``: a tensor of
the graph (node + fake tensor) that Python sees as a ``numpy.ndarray`` (or ``numpy.float64``...).
NumPy functions, ndarray methods and operators on it become graph nodes that call
``torch._numpy`` (see ``runtime``), which gives NumPy's semantics (dtype promotion,
float64 and int64 defaults, broadcasting, indexing) with torch operators. Nothing of NumPy
runs when the graph runs.

Where NumPy values meet the outside world:

* an ndarray argument is a graph input: ``torch.from_numpy(arg)`` (no copy) under a type
  guard and a TENSOR_MATCH guard (dtype, shape, strides), like a tensor argument; a NumPy
  scalar argument is a constant guarded by value, like a Python float;
* an ndarray the function returns (or hands to a graph break) is rebuilt from the graph's
  output tensor with ``Tensor.numpy()``; a NumPy scalar as ``numpy.float64`` & co. Whether a
  0-d result is a scalar or a 0-d array follows NumPy (ufuncs and reductions give scalars;
  ``np.array``, ``copy``, ``reshape``... keep arrays); where kiln cannot tell, it breaks;
* ``Tensor.numpy()``, ``torch.from_numpy``, ``torch.as_tensor`` and ``torch.tensor`` convert
  between the two in the graph (sharing the tensor where eager shares memory);
* dtypes (``np.float32``, ``np.dtype("int64")``), ``np.finfo``/``np.iinfo`` and scalar
  constants are Python constants, computed at capture time;
* every traced call is checked at capture time against NumPy itself on stand-in arrays
  (``oracle``): where torch._numpy differs from NumPy, NumPy runs the call;
* ``np.random`` is not traced: NumPy's generator is state kiln cannot guard or replay, so each
  call is a graph break and runs natively, drawing from NumPy's stream exactly as eager does.

NumPy ufuncs on torch tensors return tensors in eager (``Tensor.__array_wrap__``); kiln
traces those too. Other NumPy functions dispatch to Tensor methods or convert tensors in ways
kiln does not model: they break, and run natively.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import sys
import types

import torch

from ... import _torch
from ...errors import Unsupported
from ..graph_constants import fx_argument
from ..guards import GuardKind
from ..sources import AttrSource, RenderContext, Source
from ..values.base import ConstantValue, RealCallableValue, Value
from ..values.containers import DictValue, ListValue, NamedTupleValue, TupleValue
from ..values.functions import MethodValue
from ..values.objects import ClassValue
from ..values.symbolic import SymNodeValue, SymSliceValue, specialize
from ..values.tensor import TensorValue
from . import runtime
from .aliasing import check_aliasing

# torch dtypes that have a NumPy twin (Tensor.numpy() / torch.from_numpy accept them)
_NUMPY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                           torch.float16, torch.float32, torch.float64, torch.complex64,
                           torch.complex128})

# NumPy functions and ndarray methods whose 0-d result is a NumPy scalar (as every ufunc's
# is), and those whose 0-d result stays a 0-d ndarray. A 0-d result of any other function is a
# graph break: returning the wrong one of the two would be a wrong answer.
SCALAR_RESULTS = frozenset({
    "sum", "prod", "product", "mean", "std", "var", "max", "min", "amax", "amin", "any", "all",
    "argmax", "argmin", "ptp", "median", "average", "nansum", "nanprod", "nanmean", "nanmax",
    "nanmin", "nanstd", "nanvar", "trace", "dot", "vdot", "inner", "take", "clip", "round",
    "around", "count_nonzero", "norm", "det", "cumulative_sum", "einsum", "quantile",
    "percentile", "nanmedian",
})
ARRAY_RESULTS = frozenset({
    "array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "copy", "zeros",
    "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like", "reshape",
    "squeeze", "transpose", "where", "concatenate", "stack", "cumsum", "cumprod", "ravel",
    "expand_dims", "atleast_1d", "atleast_2d", "atleast_3d", "diag", "broadcast_to", "moveaxis",
    "swapaxes", "flip", "roll", "sort", "astype", "flatten", "view", "T", "arange", "linspace",
    "eye", "identity", "tril", "triu", "repeat", "tile", "diagonal", "real", "imag",
})
# ndarray members that need the array's data (or leave NumPy): a graph break.
DATA_MEMBERS = frozenset({
    "item", "tolist", "tobytes", "tofile", "dump", "dumps", "__bool__", "__float__", "__int__",
    "__index__", "__complex__", "__array__", "__repr__", "__str__", "__format__", "__contains__",
    "flags", "strides", "data", "base", "ctypes", "__array_interface__", "__reduce__",
    "__reduce_ex__", "__deepcopy__", "__copy__", "__setstate__", "__dlpack__", "itemset",
})
_UNARY_DUNDERS = {"__neg__": operator.neg, "__pos__": operator.pos, "__invert__": operator.invert,
                  "__abs__": operator.abs}


def numpy_module():
    """NumPy, if the process imported it (a NumPy object exists only then)."""
    return sys.modules.get("numpy")


def _tnp():
    tnp = _torch.numpy_on_tensors()
    if tnp is None:
        raise Unsupported("torch._numpy's default dtypes were changed from NumPy's (float64, "
                          "int64): NumPy code is not traced")
    return tnp


def _np_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def numpy_dtype_of(t) -> object:
    return numpy_module().dtype(_np_name(t.dtype))


# -- graph inputs -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class NumpyTensorSource(Source):
    """The tensor a graph takes for an ndarray argument: ``base`` converted without a copy."""
    base: Source

    def render(self, ctx: RenderContext) -> str:
        return f"{ctx.bind(runtime.ndarray_as_tensor, 'np2t')}({self.base.render(ctx)})"

    def describe(self) -> str:
        return f"from_numpy({self.base.describe()})"


def is_numpy_object(obj) -> bool:
    np = numpy_module()
    if np is None:
        return False
    t = type(obj)      # (by type: isinstance could run a user's __getattribute__)
    if issubclass(t, (np.ndarray, np.generic, np.dtype, np.ufunc, np.finfo, np.iinfo)):
        return True
    if issubclass(t, type):
        return (getattr(obj, "__module__", "") or "").split(".")[0] == "numpy"
    if issubclass(t, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType,
                      functools.partial)) or getattr(t, "__module__", "").split(".")[0] == "numpy":
        return (getattr(obj, "__module__", None) or "").split(".")[0] == "numpy"
    return False


def wrap_numpy(builder, obj, source) -> Value:
    """A NumPy object read from a source (``Builder._wrap``)."""
    np = numpy_module()
    g = builder.guard
    t = type(obj)
    if isinstance(obj, np.generic):
        # like a Python float: a constant, its value guarded where it is used (a tensor op
        # with it then follows torch's rules for scalars, as in eager)
        if source is None:
            return ConstantValue(obj)
        g(GuardKind.TYPE_MATCH, source, t)
        return ConstantValue(obj, source, on_use=lambda: g(GuardKind.EQUALS_MATCH, source, obj))
    if isinstance(obj, np.ndarray):
        if source is None:
            raise Unsupported("an ndarray that is not reachable from the arguments, globals or closures")
        return _wrap_array_input(builder, obj, source)
    if t in (np.dtype, np.finfo, np.iinfo) or isinstance(obj, np.dtype):
        g(GuardKind.EQUALS_MATCH if isinstance(obj, np.dtype) else GuardKind.ID_MATCH, source, obj)
        return ConstantValue(obj, source)
    if isinstance(obj, type):
        g(GuardKind.ID_MATCH, source, obj)
        return NumpyClassValue(obj, source)
    g(GuardKind.ID_MATCH, source, obj)
    return NumpyFunctionValue(obj, source)


def _wrap_array_input(builder, obj, source) -> "NdarrayValue":
    np = numpy_module()
    t = type(obj)
    if t is not np.ndarray:
        raise Unsupported(f"an argument of ndarray subclass {t.__name__}")
    builder.guard(GuardKind.TYPE_MATCH, source, t)
    if not obj.flags.writeable:
        raise Unsupported("a read-only ndarray argument (its writes would need to raise)")
    builder.guard(GuardKind.EQUALS_MATCH, AttrSource(AttrSource(source, "flags"), "writeable"), True)
    if any(st < 0 for st in obj.strides):
        raise Unsupported("an ndarray argument with negative strides (a tensor cannot view it)")
    try:
        tensor = runtime.ndarray_as_tensor(obj)
    except (TypeError, ValueError, RuntimeError) as e:
        raise Unsupported(f"an ndarray argument torch cannot view ({str(e)[:120]})")
    if tensor.dtype not in _NUMPY_DTYPES:
        raise Unsupported(f"an ndarray argument of dtype {obj.dtype}")
    _tnp()
    value = builder.output.add_tensor_input(tensor, NumpyTensorSource(source), False)
    return NdarrayValue(value, source)


def pure_numpy_result(v) -> Value | None:
    """A NumPy object computed at capture time from constants (``np.finfo(np.float32)``,
    its ``eps``, ``np.dtype("f4")``), or None when ``v`` is not one."""
    np = numpy_module()
    if np is None:
        return None
    if isinstance(v, (np.generic, np.dtype, np.finfo, np.iinfo)):
        return ConstantValue(v)
    if isinstance(v, type) and is_numpy_object(v):
        return NumpyClassValue(v)
    if not isinstance(v, (np.ndarray, type)) and is_numpy_object(v):
        return NumpyFunctionValue(v)
    return None


# -- ndarray values -------------------------------------------------------------------------------
class NdarrayValue(Value):
    """An ndarray (``scalar``: a NumPy scalar) held by the graph as ``tensor``."""

    def __init__(self, tensor: TensorValue, source=None, scalar: bool = False):
        self.tensor = tensor
        self.source = source
        self.scalar = scalar

    @property
    def fake(self):
        return self.tensor.fake

    def python_type(self):
        np = numpy_module()
        return numpy_dtype_of(self.fake).type if self.scalar else np.ndarray

    def describe(self):
        kind = "NumpyScalar" if self.scalar else "Ndarray"
        src = f" from {self.source.describe()}" if self.source is not None else ""
        return f"{kind}({self.tensor.node.name}{src})"

    def truthy(self, tx):
        raise Unsupported("truth value of a NumPy array or scalar (a branch on its data)")


    def unpack(self, tx):
        if self.scalar or self.fake.dim() == 0:
            raise tx.user_exception(TypeError("iteration over a 0-d array"))
        n = int(self.fake.shape[0])   # a symbolic length specializes (guarded)
        return [self.call_method(tx, "__getitem__", [ConstantValue(i)], {}) for i in range(n)]

    def getattr(self, tx, name):
        if name in DATA_MEMBERS:
            raise Unsupported(f"ndarray.{name} needs the array's data")
        if name == "shape":
            return TupleValue(tx.unpack_iterable(self.tensor.getattr(tx, "shape")))
        if name == "ndim":
            return ConstantValue(self.fake.dim())
        if name == "size":
            return self.tensor.call_method(tx, "numel", [], {})
        if name == "dtype":
            return ConstantValue(numpy_dtype_of(self.fake))
        if name == "itemsize":
            return ConstantValue(self.fake.element_size())
        if name == "nbytes":
            return tx.binary(operator.mul, self.tensor.call_method(tx, "numel", [], {}),
                             ConstantValue(self.fake.element_size()))
        if name in ("T", "real", "imag", "mT"):
            return trace_numpy(tx, runtime.NdarrayMethod(name, attribute=True), [self], {}, name,
                               zero_dim="scalar" if self.scalar else None)
        tnp = _tnp()
        if not callable(getattr(tnp.ndarray, name, None)):
            raise Unsupported(f"ndarray.{name} (not implemented on tensors by torch._numpy)")
        return MethodValue(self, name)

    def call_method(self, tx, name, args, kwargs):
        if name in DATA_MEMBERS:
            raise Unsupported(f"ndarray.{name}() needs the array's data")
        if name == "__len__":
            if self.fake.dim() == 0:
                raise tx.user_exception(TypeError("len() of unsized object"))
            return self.tensor._metadata(tx, "__len__", (), self.fake.shape[0])
        if name == "__getitem__":
            return _getitem(tx, self, args[0])
        if name == "__setitem__":
            if self.scalar:
                raise tx.user_exception(TypeError("NumPy scalars do not support item assignment"))
            trace_numpy(tx, runtime.NdarrayOperator(operator.setitem), [self, *args], {}, "__setitem__")
            return ConstantValue(None)
        if name in _UNARY_DUNDERS:
            return numpy_unary(tx, _UNARY_DUNDERS[name], self)
        if self.scalar and not hasattr(numpy_module().generic, name):
            raise tx.user_exception(AttributeError(f"NumPy scalar has no attribute {name!r}"))
        if not callable(getattr(_tnp().ndarray, name, None)):
            raise Unsupported(f"ndarray.{name}() (not implemented on tensors by torch._numpy)")
        if name == "astype" and args:
            args = [_dtype_argument(args[0]), *args[1:]]
        # a NumPy scalar's methods run on it as a 0-d array and give scalars back
        return trace_numpy(tx, runtime.NdarrayMethod(name), [self, *args], kwargs, name,
                           zero_dim="scalar" if self.scalar else None)

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        convert = runtime.tensor_as_numpy_scalar if self.scalar else runtime.tensor_as_ndarray
        return cg.stash(self, lambda: f"{cg.bind(convert, 'to_numpy')}({self.tensor.reconstruct(cg)})")


# -- a tensor seen as an ndarray (Tensor.numpy(), np.asarray(t)) --------------------------------
def check_numpy_convertible(t: TensorValue) -> None:
    """What ``Tensor.numpy()`` (and ``__array__``) needs; where it raises in eager, the
    capture breaks and eager raises."""
    fake = t.fake
    if fake.requires_grad:
        raise Unsupported("Tensor.numpy() on a tensor that requires grad (eager raises)")
    if fake.device.type != "cpu":
        raise Unsupported(f"Tensor.numpy() on a {fake.device.type} tensor (eager raises)")
    if fake.dtype not in _NUMPY_DTYPES:
        raise Unsupported(f"Tensor.numpy() on a {fake.dtype} tensor (eager raises)")
    if fake.is_conj() or fake.is_neg() or fake.layout != torch.strided:
        raise Unsupported("Tensor.numpy() on a tensor with a conjugate/negative bit or a layout")
    _tnp()


def tensor_to_ndarray(tx, t: TensorValue, force: bool = False) -> NdarrayValue:
    """``t.numpy()``: the same memory, seen as an ndarray (``force``: detached first)."""
    if force:
        fake = t.fake
        if fake.requires_grad:
            t = tx.output.call_op("call_method", "detach", (t,), {})
        if fake.device.type != "cpu":
            t = tx.output.call_op("call_method", "cpu", (t,), {})
        if fake.is_conj():
            t = tx.output.call_op("call_method", "resolve_conj", (t,), {})
        if fake.is_neg():
            t = tx.output.call_op("call_method", "resolve_neg", (t,), {})
    check_numpy_convertible(t)
    return NdarrayValue(TensorValue(t.node, t.fake))


def _getitem(tx, arr: NdarrayValue, index: Value) -> Value:
    """``arr[index]``: NumPy gives a scalar for a 0-d result, unless the index holds an
    Ellipsis (``a[...]``, ``a[0, ...]``); the scalar is a copy, never a view of ``arr``."""
    parts = index.items if isinstance(index, TupleValue) else [index]
    has_ellipsis = any(p.is_constant() and p.as_constant() is Ellipsis for p in parts
                       if isinstance(p, ConstantValue))
    result = trace_numpy(tx, runtime.NdarrayOperator(operator.getitem), [arr, index], {}, "__getitem__",
                         zero_dim="array")
    if isinstance(result, NdarrayValue) and result.fake.dim() == 0 and not has_ellipsis:
        copy = tx.output.call_op("call_method", "clone", (result.tensor,), {})
        return NdarrayValue(copy, scalar=True)
    return result


# -- NumPy callables ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _numpy_callables() -> dict:
    """id(NumPy callable) -> (its module's name, its name, it) for every public NumPy
    function that torch._numpy implements (numpy, numpy.linalg, numpy.fft)."""
    np = numpy_module()
    tnp = _tnp()
    table = {}
    for mod_name, np_mod, tnp_mod in (("numpy", np, tnp), ("numpy.linalg", np.linalg, tnp.linalg),
                                      ("numpy.fft", np.fft, tnp.fft)):
        for name, impl in vars(tnp_mod).items():
            if name.startswith("_") or not callable(impl) or isinstance(impl, type):
                continue
            fn = getattr(np_mod, name, None)
            if callable(fn) and not isinstance(fn, type):
                table[id(fn)] = (mod_name, name, fn)
    return table


def _is_random(fn) -> bool:
    mod = getattr(fn, "__module__", None) or ""
    owner = getattr(fn, "__self__", None)
    return mod.startswith("numpy.random") or type(owner).__module__.startswith("numpy.random")


class NumpyFunctionValue(RealCallableValue):
    """A NumPy function or ufunc (``np.sin``, ``np.sum``, ``np.linalg.norm``)."""

    def is_constant(self):
        return True

    def as_constant(self):
        return self.fn

    def describe(self):
        return f"NumpyFunction({getattr(self.fn, '__name__', self.fn)})"

    def truthy(self, tx):
        return True

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return ConstantValue(getattr(self.fn, name, None))
        raise Unsupported(f"attribute {name!r} of NumPy function {getattr(self.fn, '__name__', self.fn)}")

    def reconstruct(self, cg):
        return cg.source_expr(self.source) if self.source is not None else cg.bind(self.fn, "npfn")

    def call(self, tx, args, kwargs):
        return call_numpy_function(tx, self.fn, args, kwargs)


def call_numpy_function(tx, fn, args: list[Value], kwargs: dict[str, Value]) -> Value:
    np = numpy_module()
    label = f"np.{getattr(fn, '__name__', fn)}"
    if _is_random(fn):
        raise Unsupported(f"{label}: np.random is not traced (NumPy's generator state cannot be "
                          "guarded or replayed): the call runs natively at a graph break, drawing "
                          "from NumPy's stream as in eager")
    entry = _numpy_callables().get(id(fn))
    if entry is None:
        raise Unsupported(f"{label} (torch._numpy has no implementation; it runs natively)")
    module, name, _ = entry
    if "out" in kwargs or "where" in kwargs and isinstance(fn, np.ufunc):
        raise Unsupported(f"{label} with out= or where= (not traced)")
    leaves = list(_leaves([*args, *kwargs.values()]))
    tensors = [v for v in leaves if isinstance(v, TensorValue)]
    arrays = [v for v in leaves if isinstance(v, NdarrayValue)]
    if not tensors and not arrays and all(_is_constant_arg(v) for v in leaves):
        folded = _fold(tx, fn, args, kwargs)
        if folded is not None:
            return folded
    if "dtype" in kwargs:
        kwargs = {**kwargs, "dtype": _dtype_argument(kwargs["dtype"])}
    target = runtime.NumpyFunction(module, name)
    if tensors:
        if name in ("asarray", "array", "asanyarray") and len(args) == 1 and set(kwargs) <= {"dtype"} \
                and isinstance(args[0], TensorValue):
            # np.asarray(t): Tensor.__array__, the tensor's memory as an ndarray (np.array copies)
            arr = tensor_to_ndarray(tx, args[0], force=False)
            dtype = kwargs.get("dtype")
            if dtype is not None and not (dtype.is_constant() and dtype.as_constant() is None) \
                    and _argument(_dtype_argument(dtype), False) != numpy_dtype_of(arr.fake).name:
                return arr.call_method(tx, "astype", [dtype], {})   # another dtype: a copy
            return arr if name != "array" else arr.call_method(tx, "copy", [], {})
        if name in TENSORS_AS_ARRAYS:
            # these convert every array-like argument with np.asarray (Tensor.__array__) first
            args = [_tensors_as_ndarrays(tx, a) for a in args]
            kwargs = {k: _tensors_as_ndarrays(tx, v) for k, v in kwargs.items()}
            return call_numpy_function(tx, fn, args, kwargs)
        if not isinstance(fn, np.ufunc):
            raise Unsupported(f"{label} on a torch.Tensor (NumPy dispatches to Tensor methods or "
                              "converts the tensor; not traced): use Tensor.numpy() first")
        for t in tensors:
            check_numpy_convertible(t)
        # a ufunc on tensors returns a tensor (Tensor.__array_wrap__: booleans as uint8)
        result = trace_numpy(tx, target, args, kwargs, name, zero_dim="array")
        if not isinstance(result, NdarrayValue):
            raise Unsupported(f"{label} on a torch.Tensor returning {result.describe()}")
        return tx.output.call_op("call_function", runtime.ufunc_result_as_tensor, (result.tensor,), {})
    zero_dim = "scalar" if isinstance(fn, np.ufunc) else None
    return trace_numpy(tx, target, args, kwargs, name, zero_dim=zero_dim)


# NumPy functions that turn each tensor argument into an ndarray (np.asarray) before working:
# on tensors they return ndarrays, as on arrays.
TENSORS_AS_ARRAYS = frozenset({"where", "concatenate", "stack", "zeros_like", "ones_like",
                               "full_like"})


def _tensors_as_ndarrays(tx, v: Value) -> Value:
    if isinstance(v, TensorValue):
        return tensor_to_ndarray(tx, v, force=False)
    if isinstance(v, (TupleValue, ListValue)):
        return type(v)([_tensors_as_ndarrays(tx, i) for i in v.items])
    return v


def _is_constant_arg(v: Value) -> bool:
    return v.is_constant()


def _fold(tx, fn, args, kwargs) -> Value | None:
    """A NumPy function of constants whose result is a scalar or a dtype, computed now (an
    array result is built by the graph instead, a new one on every call)."""
    np = numpy_module()
    try:
        cargs = [_constant_of(a) for a in args]
        ckw = {k: _constant_of(v) for k, v in kwargs.items()}
    except Unsupported:
        return None
    try:
        result = fn(*cargs, **ckw)
    except Exception:
        return None   # traced instead: tnp raises the error, or eager does after a break
    if isinstance(result, np.ndarray):
        return None
    try:
        return tx.wrap_pure_result(result)
    except Unsupported:
        return None


def _constant_of(v: Value):
    if isinstance(v, SymNodeValue):
        v = specialize(v)   # NumPy needs the number: decided for this size (guarded)
    if isinstance(v, (TupleValue, ListValue)):
        items = [_constant_of(i) for i in v.items]
        return items if isinstance(v, ListValue) else tuple(items)
    if not v.is_constant():
        raise Unsupported("not a constant")
    return v.as_constant()


class NumpyClassValue(ClassValue):
    """A NumPy class: a scalar type (``np.float32``), ``np.dtype``, ``np.finfo``,
    ``np.iinfo``, ``np.ndarray``. Called on constants, evaluated at capture time."""

    def describe(self):
        return f"NumpyClass({self.value.__name__})"

    def call(self, tx, args, kwargs):
        np = numpy_module()
        cls = self.value
        if _is_random(cls):
            raise Unsupported(f"np.random.{cls.__name__}: np.random is not traced (runs natively)")
        if cls in (np.finfo, np.iinfo, np.dtype) and args and isinstance(args[0], NdarrayValue):
            args = [ConstantValue(numpy_dtype_of(args[0].fake)), *args[1:]]
        if issubclass(cls, np.generic) and len(args) == 1 and not kwargs \
                and isinstance(args[0], NdarrayValue):
            # np.float32(x): a scalar of x's value (a 0-d x), an array for a larger x
            arr = args[0]
            result = arr.call_method(tx, "astype", [ConstantValue(np.dtype(cls))], {})
            if arr.scalar or arr.fake.dim() == 0:
                return NdarrayValue(result.tensor, scalar=True)
            return result
        if cls is np.ndarray or any(isinstance(v, (NdarrayValue, TensorValue)) for v in _leaves(
                [*args, *kwargs.values()])):
            raise Unsupported(f"np.{cls.__name__}(...) of arrays (not traced)")
        try:
            cargs = [_constant_of(a) for a in args]
            ckw = {k: _constant_of(v) for k, v in kwargs.items()}
        except Unsupported:
            raise Unsupported(f"np.{cls.__name__}(...) of values that are not constants")
        try:
            result = cls(*cargs, **ckw)
        except Exception as e:
            raise tx.user_exception(e)
        if isinstance(result, np.ndarray):
            raise Unsupported(f"np.{cls.__name__}(...) building an array from constants")
        return tx.wrap_pure_result(result)


def _dtype_argument(v: Value) -> Value:
    """A dtype argument as torch._numpy takes it: its NumPy name (``"float32"``)."""
    np = numpy_module()
    if v.is_constant():
        d = v.as_constant()
        if d is None:
            return v
        if isinstance(d, torch.dtype):
            raise Unsupported("a torch.dtype given to NumPy")
        try:
            return ConstantValue(np.dtype(d).name)
        except TypeError as e:
            raise Unsupported(f"a dtype argument NumPy rejects ({e})")
    return v


# -- tracing ---------------------------------------------------------------------------------------
def _leaves(values):
    for v in values:
        if isinstance(v, (TupleValue, ListValue)):
            yield from _leaves(v.items)
        elif isinstance(v, DictValue):
            yield from _leaves(list(v.items.values()))
        else:
            yield v


# NumPy calls whose Python-number arguments are sizes, counts or indices (they never take part
# in dtype promotion): a symbolic size stays symbolic there (dynamic shapes). Elsewhere a
# symbolic number is specialized: as a weak Python scalar it decides NumPy's result dtype.
SIZE_ARGUMENTS = frozenset({"reshape", "zeros", "ones", "empty", "arange", "broadcast_to",
                            "__getitem__", "__setitem__", "eye", "identity", "tile", "repeat",
                            "expand_dims", "swapaxes", "transpose", "sum", "mean", "max", "min",
                            "cumsum", "concatenate", "stack", "take", "split"})


def _argument(v: Value, fx: bool, symbolic: bool = False):
    """A Value as the graph's argument (``fx``) or as the fake-run argument; ``symbolic``:
    symbolic sizes stay symbolic."""
    if isinstance(v, NdarrayValue):
        v = v.tensor
    if isinstance(v, TensorValue):
        return v.node if fx else v.fake
    if isinstance(v, SymNodeValue) and symbolic:
        return v.node if fx else v.fake
    if isinstance(v, SymSliceValue) and symbolic:
        return slice(*[_argument(p, fx, symbolic) for p in v.parts])
    if isinstance(v, (SymNodeValue, SymSliceValue)):
        v = specialize(v)   # NumPy semantics on Python numbers: decided for this size (guarded)
    if isinstance(v, (TupleValue, ListValue)):
        items = [_argument(i, fx, symbolic) for i in v.items]
        return items if isinstance(v, ListValue) else tuple(items)
    if isinstance(v, DictValue):
        return {k: _argument(x, fx, symbolic) for k, x in v.items.items()}
    if isinstance(v, NumpyClassValue):
        return numpy_module().dtype(v.value).name if issubclass(v.value, numpy_module().generic) \
            else _unsupported_arg(v)
    if v.is_constant() and not isinstance(v, (ClassValue, NumpyFunctionValue)):
        c = v.as_constant()
        if isinstance(c, (torch.dtype, torch.device)):
            raise Unsupported(f"a torch {type(c).__name__} given to NumPy")
        if isinstance(c, numpy_module().dtype):
            return c.name
        return c
    return _unsupported_arg(v)


def _has_symbolic(values) -> bool:
    return any(isinstance(v, (SymNodeValue, SymSliceValue)) for v in _leaves(values))


def _scalar_constant_as_array(tx, v: Value) -> Value:
    """A NumPy scalar constant (``np.float32(2)``, ``finfo.eps``) as a 0-d array of the graph:
    tnp gives it NumPy's promotion (a typed scalar, unlike a Python number), and NumPy code
    never sees it."""
    if isinstance(v, (TupleValue, ListValue)):
        items = [_scalar_constant_as_array(tx, i) for i in v.items]
        return type(v)(items) if any(a is not b for a, b in zip(items, v.items)) else v
    if isinstance(v, ConstantValue):
        np = numpy_module()
        c = v.as_constant()
        if isinstance(c, np.generic):
            if not isinstance(c, (np.bool_, np.number)) or np.dtype(type(c)).name not in {
                    _np_name(d) for d in _NUMPY_DTYPES}:
                raise Unsupported(f"a NumPy scalar of type {type(c).__name__} in NumPy code")
            dtype = getattr(torch, np.dtype(type(c)).name)
            t = tx.output.call_op("call_function", torch.tensor, (ConstantValue(c.item()),),
                                  {"dtype": ConstantValue(dtype)})
            return NdarrayValue(t, scalar=True)
    return v


def _unsupported_arg(v: Value):
    raise Unsupported(f"{v.describe()} as an argument of NumPy code")


def trace_numpy(tx, target, args: list[Value], kwargs: dict[str, Value], name: str,
                zero_dim: str | None = None) -> Value:
    """One graph node calling ``target`` (a ``runtime`` wrapper) on ``args``. Its
    tensor results are ndarrays; ``zero_dim`` says what a 0-d result is ("scalar", "array",
    or None: by ``name``, as NumPy does)."""
    out = tx.output
    args = [_scalar_constant_as_array(tx, a) for a in args]
    kwargs = {k: _scalar_constant_as_array(tx, v) for k, v in kwargs.items()}
    arg_fakes = [v.fake for v in _leaves([*args, *kwargs.values()])
                 if isinstance(v, (NdarrayValue, TensorValue))]
    versions = [f._version for f in arg_fakes]
    symbolic = name in SIZE_ARGUMENTS and _has_symbolic([*args, *kwargs.values()])
    try:
        try:
            fake_args = tuple(_argument(a, False, symbolic) for a in args)
            fake_kwargs = {k: _argument(v, False, symbolic) for k, v in kwargs.items()}
            with out.fake_mode, _torch.python_dispatcher():
                result = target(*fake_args, **fake_kwargs)
        except Exception:
            if not symbolic or any(f._version != v for f, v in zip(arg_fakes, versions)):
                raise
            symbolic = False   # torch._numpy wants a plain number there: decided for this size
            fake_args = tuple(_argument(a, False) for a in args)
            fake_kwargs = {k: _argument(v, False) for k, v in kwargs.items()}
            with out.fake_mode, _torch.python_dispatcher():
                result = target(*fake_args, **fake_kwargs)
    except _torch.DATA_DEPENDENT_ERRORS as e:
        raise Unsupported(f"NumPy {name} needs the array's data ({type(e).__name__})")
    except Unsupported:
        raise
    except Exception as e:
        # torch._numpy refused (or NumPy would raise): never guessed, NumPy runs it natively
        raise Unsupported(f"NumPy {name} could not be traced ({type(e).__name__}: {e})")
    check_aliasing(tx, name, args, arg_fakes, versions, result)
    from .oracle import check_with_numpy  # cycle: the oracle reads NdarrayValue arguments

    expected = check_with_numpy(target, target.numpy_twin(), name, args, kwargs,
                                lambda v: _argument(v, False), result)
    fx_args = tuple(_argument(a, True, symbolic) for a in args)
    fx_kwargs = {k: _argument(v, True, symbolic) for k, v in kwargs.items()}

    fx_args = fx_argument(fx_args, out.constant_node)
    fx_kwargs = {k: fx_argument(v, out.constant_node) for k, v in fx_kwargs.items()}
    node = out.graph.create_node("call_function", target, fx_args, fx_kwargs)
    node.meta["example_value"] = result
    return _wrap_result(tx, node, result, args, name, zero_dim, expected)


def _wrap_result(tx, node, result, args, name, zero_dim, expected=None) -> Value:
    """The graph's result as Values. ``expected``: NumPy's own result on stand-ins (see
    oracle.py), which says what a 0-d result is and which container holds several."""
    np = numpy_module()
    if isinstance(result, torch.Tensor):
        for a in args:   # an in-place operation returns its receiver
            if isinstance(a, NdarrayValue) and a.fake is result:
                if a.scalar and (name in ARRAY_RESULTS or isinstance(expected, np.ndarray)):
                    # np.asarray(scalar): a new 0-d array, not the (immutable) scalar itself
                    copy = tx.output.call_op("call_method", "clone", (a.tensor,), {})
                    return NdarrayValue(copy, scalar=False)
                return a
        if result.dtype not in _NUMPY_DTYPES:
            raise Unsupported(f"NumPy {name} computed a {result.dtype} array")
        if result.device.type != "cpu":   # NumPy's arrays live in host memory
            raise Unsupported(f"NumPy {name} made an array on {result.device} (a default device is set)")
        scalar = False
        if result.dim() == 0:
            if zero_dim is None and isinstance(expected, (np.ndarray, np.generic)):
                zero_dim = "scalar" if isinstance(expected, np.generic) else "array"
            how = zero_dim or ("scalar" if name in SCALAR_RESULTS else
                               "array" if name in ARRAY_RESULTS else None)
            if how is None:
                raise Unsupported(f"NumPy {name} returned a 0-d value: kiln cannot tell whether "
                                  "NumPy makes it a scalar or a 0-d array")
            scalar = how == "scalar"
        return NdarrayValue(TensorValue(node, result), scalar=scalar)
    if isinstance(result, (tuple, list)) and any(isinstance(r, torch.Tensor) for r in result):
        parts = list(expected) if isinstance(expected, (tuple, list)) else [None] * len(result)
        items = []
        for i, (r, e) in enumerate(zip(result, parts)):
            if isinstance(r, torch.Tensor):
                child = tx.output.graph.call_function(operator.getitem, (node, i))
                child.meta["example_value"] = r
                items.append(_wrap_result(tx, child, r, (), name, zero_dim, e))
            else:
                items.append(_constant_result(tx, r, name))
        kind = type(expected) if isinstance(expected, (tuple, list)) else type(result)
        if kind is list:
            return ListValue(items)
        if kind is not tuple and hasattr(kind, "_fields"):   # np.linalg.svd's SVDResult...
            return NamedTupleValue(items, None, kind)
        return TupleValue(items)
    if result is None:
        return ConstantValue(None)
    return _constant_result(tx, result, name)


def _constant_result(tx, r, name) -> Value:
    try:
        return tx.wrap_pure_result(r)
    except Unsupported:
        raise Unsupported(f"NumPy {name} returned a {type(r).__name__}, which cannot be captured")


# -- operators --------------------------------------------------------------------------------------
_INPLACE = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
            operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
            operator.ilshift, operator.irshift, operator.imatmul}


def _operand(tx, v: Value, other: Value) -> Value:
    if isinstance(v, TensorValue):
        raise Unsupported("an operator between a NumPy array and a torch.Tensor (NumPy defers to "
                          "the tensor; not traced)")
    if isinstance(v, SymNodeValue):
        return _symbolic_int_operand(tx, v, other) or specialize(v)
    if isinstance(v, ConstantValue) and v.as_constant() is None:
        raise Unsupported("an operator between a NumPy array and None")
    if isinstance(v, (NdarrayValue, ConstantValue, TupleValue, ListValue)):
        return v
    raise Unsupported(f"an operator between a NumPy array and {v.describe()}")


def _symbolic_int_operand(tx, v, other: Value) -> Value | None:
    """A symbolic int (``len(a)``, ``a.shape[0]``) beside an array, kept symbolic: a 0-d array
    of the other operand's dtype, which NumPy's promotion treats as it treats the Python int
    (NEP 50: the array's dtype wins; bools give int64)."""
    if v.python_type() is not int or not isinstance(other, NdarrayValue):
        return None
    dtype = other.fake.dtype
    if dtype == torch.bool or dtype == torch.uint8 or not (dtype.is_floating_point or dtype.is_complex
                                                           or dtype in (torch.int32, torch.int64)):
        dtype = torch.int64 if dtype == torch.bool else None   # small ints may overflow: not kept
    if dtype is None:
        return None
    t = tx.output.call_op("call_function", torch.full, (TupleValue([]), v), {"dtype": ConstantValue(dtype)})
    return NdarrayValue(t, scalar=True)


def numpy_binary(tx, op, a: Value, b: Value) -> Value:
    a, b = _operand(tx, a, b), _operand(tx, b, a)
    if op in _INPLACE and not (isinstance(a, NdarrayValue) and not a.scalar):
        from ..semantics import _INPLACE_TO_BINARY  # cycle: semantics sends NumPy operators here

        op = _INPLACE_TO_BINARY[op]   # numbers and NumPy scalars are immutable: a new value
    name = op.__name__.strip("_")
    return trace_numpy(tx, runtime.NdarrayOperator(op), [a, b], {}, name, zero_dim="scalar")


def numpy_unary(tx, op, v: Value) -> Value:
    return trace_numpy(tx, runtime.NdarrayOperator(op), [v], {}, op.__name__, zero_dim="scalar")
