"""Conversions between tensors and ndarrays inside a capture: ``Tensor.numpy()``,
``torch.from_numpy``, ``torch.as_tensor``, ``torch.asarray`` and ``torch.tensor``. Where eager
shares memory, the two values share the graph's tensor; where eager copies, the graph copies;
where eager raises, the capture breaks and eager raises."""
from __future__ import annotations

import torch

from ...errors import Unsupported
from ..values.base import Value
from ..values.tensor import TensorValue
from .values import NdarrayValue, tensor_to_ndarray


def tensor_numpy_method(tx, t: TensorValue, args, kwargs) -> NdarrayValue:
    if args or set(kwargs) - {"force"}:
        raise tx.user_exception(TypeError("numpy() takes only the keyword argument force"))
    force = kwargs["force"].as_constant() if "force" in kwargs else False
    return tensor_to_ndarray(tx, t, bool(force))


def torch_function_on_numpy(tx, fn, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """``torch.from_numpy(a)``, ``torch.as_tensor(a)``, ``torch.asarray(a)``, ``torch.tensor(a)``
    on an ndarray of the graph; other torch functions do not take ndarrays."""
    if not args or not isinstance(args[0], NdarrayValue) or any(
            isinstance(v, NdarrayValue) for v in [*args[1:], *kwargs.values()]):
        raise Unsupported(f"torch.{getattr(fn, '__name__', fn)} with a NumPy array argument")
    arr = args[0]
    shares = fn in (torch.from_numpy, torch.as_tensor, torch.asarray)
    if fn is torch.from_numpy:
        if arr.scalar:
            raise tx.user_exception(TypeError("expected np.ndarray (got a NumPy scalar)"))
        if len(args) != 1 or kwargs:
            raise tx.user_exception(TypeError("from_numpy() takes exactly one argument"))
    elif fn not in (torch.as_tensor, torch.asarray, torch.tensor) or len(args) != 1 or (
            set(kwargs) - {"dtype", "device"}):
        raise Unsupported(f"torch.{getattr(fn, '__name__', fn)} with a NumPy array argument")
    t = TensorValue(arr.tensor.node, arr.fake)
    if not shares or arr.scalar:   # a copy: torch.tensor, or a NumPy scalar's value
        t = tx.output.call_op("call_method", "clone", (t,), {})
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    conv = {}
    if dtype is not None and dtype.as_constant() is not None:
        conv["dtype"] = dtype
    if device is not None and device.as_constant() is not None:
        conv["device"] = device
    if conv:
        t = tx.output.call_op("call_method", "to", (t,), conv)
    return t
