"""Tensors: an FX node plus the fake tensor that carries its metadata."""
from __future__ import annotations

import functools
import operator
import warnings

import torch

from ...errors import Unsupported
from ..guards import GuardKind
from ..sources import IS_VIEW, STORAGE_OFFSET, AttrSource, TensorPropertySource, TypeSource
from .attributes import guard_attribute_absent
from .base import ConstantValue, Value
from .containers import TupleValue
from .functions import MethodValue
from .objects import ClassValue
from .overlap import may_partially_overlap, same_storage
from .storage import StorageValue
from .symbolic import is_symbolic, size_value, wrap_sym

# Tensor methods whose result is metadata, computed from the fake tensor at capture time.
# Sound because TENSOR_MATCH guards dtype, device, sizes, strides and requires_grad.
METADATA_METHODS = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous",
    "is_floating_point", "is_complex", "is_signed", "element_size", "storage_offset",
    "get_device", "__len__", "is_inference",
})
METADATA_ATTRS = frozenset({
    "shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "is_cpu", "is_sparse",
    "is_quantized", "is_meta", "layout", "is_mkldnn", "is_nested", "itemsize",
})
# Attributes that are tensors computed from the tensor (become graph nodes).
TENSOR_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag"})
# Methods that need real data or leave the graph: not capturable as one graph.
DATA_DEPENDENT_METHODS = frozenset({
    "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "data_ptr",
    "untyped_storage", "storage", "__array__", "backward", "register_hook", "retain_grad",
    "__reduce_ex__", "__deepcopy__", "__setstate__",
    # where the storage lives and who else holds it: facts of the real tensor, not its fake
    "is_shared", "is_pinned", "is_set_to",
})


class TensorValue(Value):
    def __init__(self, node, fake: torch.Tensor, source=None, cls: type = torch.Tensor):
        self.node = node
        self.fake = fake
        self.source = source
        self.cls = cls

    def python_type(self):
        return self.cls

    def describe(self):
        src = f" from {self.source.describe()}" if self.source is not None else ""
        return f"Tensor({self.node.name}{src})"

    def truthy(self, tx):
        raise Unsupported("truth value of a tensor (a branch on tensor data) needs its values")


    def unpack(self, tx):
        if self.fake.dim() == 0:
            raise Unsupported("iteration over a 0-d tensor")
        int(self.fake.shape[0])   # a symbolic length specializes (guarded)
        # Tensor.__iter__ is iter(self.unbind(0)): its rows are the outputs of one
        # multi-output view op (autograd forbids changing them in place), not selects
        rows = tx.output.call_op("call_method", "unbind", (self, ConstantValue(0)), {})
        return list(rows.items)

    def getattr(self, tx, name):
        if name in METADATA_ATTRS:
            v = getattr(self.fake, name)
            if name == "requires_grad" or name == "is_leaf":
                v = bool(v)
            return self._metadata(tx, "size" if name == "shape" else name, (), v)
        if name in TENSOR_ATTRS:
            return tx.output.call_op("call_function", getattr, (self, ConstantValue(name)), {})
        if name == "__class__":   # what type(x) gives (torch.Tensor's own __class__ is its metaclass)
            return ClassValue(self.python_type(), TypeSource(self.source) if self.source is not None else None)
        if name in ("is_leaf", "grad_fn"):
            return self._leafness(tx, name)
        if name == "grad":
            # an input's gradient is an input too (its None-ness or its tensor guarded): a
            # graph never runs a backward, and a store to ``.grad`` breaks the graph, so it
            # holds what it held at the call (writes into it are the input's writes)
            if self.source is None:
                raise Unsupported("reading .grad of a tensor made inside the compiled function")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")          # (a non-leaf's .grad warns, as eager's read does)
                grad = tx.output.real_tensor(self).grad
            return tx.wrap(grad, AttrSource(self.source, "grad"))
        if name == "data":
            if torch.is_grad_enabled():
                # x.data is x's memory with a version counter of its own: an in-place op
                # through it is hidden from autograd (x may be saved for the backward). A
                # detach() in the graph would share x's counter: read natively instead
                raise Unsupported("Tensor.data with grad enabled (its version counter is its own)")
            return tx.output.call_op("call_method", "detach", (self,), {})
        if name == "numpy" or name == "backward":   # numpy traced (capture/numpy); backward
            return MethodValue(self, name)          # breaks at the call, which sees create_graph
        if name in DATA_DEPENDENT_METHODS and name != "untyped_storage":
            raise Unsupported(f"Tensor.{name}() needs the tensor's data")
        attr = getattr(torch.Tensor, name, None)
        if attr is None:
            # not a Tensor attribute: an input may carry it in its __dict__ (read and guarded,
            # absence included); a tensor computed in the graph has no instance attributes
            if self.source is not None:
                real = tx.output.real_tensor(self)
                try:
                    value = getattr(real, name)
                except AttributeError as e:
                    guard_attribute_absent(tx, self, type(real), name)   # (a later call's may have it)
                    raise tx.user_exception(e)
                return tx.wrap(value, AttrSource(self.source, name))
            raise tx.user_exception(AttributeError(f"'Tensor' object has no attribute '{name}'"))
        if callable(attr):
            return MethodValue(self, name)
        raise Unsupported(f"tensor attribute {name!r}")

    def _metadata(self, tx, name: str, cargs, result, ckw=None) -> Value:
        """A size, stride, numel... of this tensor: constants, or (dynamic shapes) symbolic
        numbers computed in the graph from the tensor (or taken from a symbol input)."""
        if isinstance(result, tuple):
            if not any(is_symbolic(r) for r in result):
                return tx.wrap_pure_result(result)
            method = "stride" if name == "stride" else "size"
            items = [wrap_sym(tx.output, r, functools.partial(
                tx.output.graph.call_method, method, (self.node, i))) for i, r in enumerate(result)]
            return size_value(items) if method == "size" else TupleValue(items)
        if not is_symbolic(result):
            return tx.wrap_pure_result(result)
        if name == "__len__":
            name, cargs = "size", (0,)
        return wrap_sym(tx.output, result, lambda: tx.output.graph.call_method(name, (self.node, *cargs), dict(ckw or {})))

    def _leafness(self, tx, name):
        # TENSOR_MATCH does not cover leafness: an input's is_leaf gets its own guard.
        if self.source is not None:
            leaf = bool(tx.output.real_tensor(self).is_leaf)
            tx.output.builder.guard(GuardKind.EQUALS_MATCH, AttrSource(self.source, "is_leaf"), leaf)
        else:
            leaf = bool(self.fake.is_leaf)
        if name == "is_leaf":
            return ConstantValue(leaf)
        if leaf:
            return ConstantValue(None)
        raise Unsupported("grad_fn of a non-leaf tensor")

    def call_method(self, tx, name, args, kwargs):
        if name == "untyped_storage" and not args and not kwargs:
            return StorageValue(self)   # its size, guarded (storage.py)
        if name == "numpy":
            from ..numpy.conversions import tensor_numpy_method  # cycle: ndarrays hold tensors

            return tensor_numpy_method(tx, self, args, kwargs)
        if name == "backward":
            from ..interpreter import refuse_higher_order_grad  # cycle: it holds tensors

            refuse_higher_order_grad("Tensor.backward", list(args), kwargs, 2)
        if name in DATA_DEPENDENT_METHODS:
            raise Unsupported(f"Tensor.{name}() needs the tensor's data")
        if name in _INPUT_LAYOUT_METHODS and not args and not kwargs:
            return _input_layout(tx, self, name)
        if name in METADATA_METHODS:
            cargs = [a.as_constant() for a in args]
            ckw = {k: v.as_constant() for k, v in kwargs.items()}
            return self._metadata(tx, name, cargs, getattr(self.fake, name)(*cargs, **ckw), ckw)
        if name == "__getitem__":
            special = tx.output.subgraph_getitem
            indexed = special(tx, self, *args) if special is not None and len(args) == 1 else None
            if indexed is not None:
                return indexed
            return tx.output.call_op("call_function", _getitem, (self, *args), {})
        if name == "__setitem__":
            if len(args) == 2 and isinstance(args[1], TensorValue) and same_storage(self.fake, args[1].fake):
                _refuse_setitem_overlap(tx, self.fake, args[0], args[1].fake)
            tx.output.call_op("call_function", _setitem, (self, *args), {})
            return ConstantValue(None)
        if name == "type" and not args and not kwargs:
            return ConstantValue(self.fake.type().replace("Fake", ""))
        if name == "requires_grad_" and self.fake.requires_grad and _asks_for_grad(args, kwargs):
            return self     # (already requires grad: eager's call changes nothing)
        if name == "requires_grad_" or name == "retain_grad":
            raise Unsupported(f"Tensor.{name}() changes autograd state of a graph value")
        scalar = _SCALAR_ARGUMENTS.get(name)
        if scalar is not None and _is_tensor_scalar(kwargs.get(scalar), self):
            return _with_tensor_scalar(tx, self, name, list(args), dict(kwargs))
        return tx.output.call_op("call_method", name, (self, *args), kwargs)


# Metadata that TENSOR_MATCH does not cover: where a view starts in its storage, and whether a
# tensor is a view. Read from an input (or from a view of one), it is guarded.
_INPUT_LAYOUT_METHODS = {STORAGE_OFFSET, IS_VIEW}


def _input_layout(tx, value, name: str) -> Value:
    result = getattr(value.fake, name)()
    if is_symbolic(result):
        return value._metadata(tx, name, (), result)
    if name == IS_VIEW:
        if value.source is None:
            return ConstantValue(bool(result))
        real = bool(tx.output.real_tensor(value)._is_view())     # (an input's fake need not be a view)
        tx.output.builder.guard(GuardKind.EQUALS_MATCH, TensorPropertySource(value.source, IS_VIEW), real)
        return ConstantValue(real)
    # an offset within an input's memory follows from the input's own (a slice of it)
    tx.output.guard_storage_offsets(value.fake)
    return ConstantValue(int(result))


# Methods whose Scalar argument a caller may give as a one-element tensor (an optimizer's step
# size, a scheduled learning rate): eager reads its number (``.item()``), which a graph cannot.
_SCALAR_ARGUMENTS = {"add": "alpha", "add_": "alpha", "sub": "alpha", "sub_": "alpha",
                     "addcdiv": "value", "addcdiv_": "value", "addcmul": "value", "addcmul_": "value"}


def _is_tensor_scalar(v, self) -> bool:
    # (eager refuses one that requires grad: "must be Number, not Tensor", raised as eager does)
    return isinstance(v, TensorValue) and v.fake.dim() == 0 and not v.fake.requires_grad \
        and v.fake.is_floating_point() and self.fake.is_floating_point()


def _with_tensor_scalar(tx, self, name: str, args: list, kwargs: dict):
    """``name`` with its Scalar argument given as a 0-d tensor, as tensor ops in the order
    eager's kernel computes: ``self + alpha * other``, ``self + value * t1 / t2``, ``self +
    value * t1 * t2``."""
    scalar = kwargs.pop(_SCALAR_ARGUMENTS[name])
    operands = args + [kwargs.pop(k) for k in ("other", "tensor1", "tensor2") if k in kwargs]
    base = name.rstrip("_")
    if kwargs or len(operands) != (1 if base in ("add", "sub") else 2) or \
            not all(isinstance(o, TensorValue) for o in operands):
        raise Unsupported(f"Tensor.{name}() with a tensor as its Scalar argument, called otherwise")
    term = tx.output.call_op("call_function", torch.mul, (scalar, operands[0]), {})
    if base == "addcdiv":
        term = tx.output.call_op("call_function", torch.div, (term, operands[1]), {})
    elif base == "addcmul":
        term = tx.output.call_op("call_function", torch.mul, (term, operands[1]), {})
    combine = ("sub" if base == "sub" else "add") + ("_" if name.endswith("_") else "")
    return tx.output.call_op("call_method", combine, (self, term), {})


def _asks_for_grad(args, kwargs) -> bool:
    """``requires_grad_()``, ``requires_grad_(True)`` or ``requires_grad_(requires_grad=True)``."""
    given = list(args) + [v for k, v in kwargs.items() if k == "requires_grad"]
    if len(given) > 1 or set(kwargs) - {"requires_grad"}:
        return False
    return not given or (given[0].is_constant() and given[0].as_constant() is True)


def _refuse_setitem_overlap(tx, fake: torch.Tensor, index, value: torch.Tensor) -> None:
    """``tensor[index] = value`` copies into the indexed part: eager may refuse the overlap
    (overlap.py). ``t[i] += 1`` writes back the very view it read, which eager allows."""
    from ..output_graph import _to_fake  # cycle: the graph holds tensors
    try:
        with tx.output.fake_mode:
            target = fake[_to_fake(index)]   # what eager writes into (a copy if advanced)
        if not same_storage(fake, target):
            target = fake                    # advanced indexing writes into the tensor itself
    except Exception:   # noqa: BLE001 - an index the fake cannot take: let eager decide
        target = None
    if target is None or may_partially_overlap(target, value):
        raise Unsupported("tensor[...] = a partly overlapping view of the same tensor (eager checks the overlap)")


# The real operator functions: graphs print as operator.getitem and backends recognise them.
_getitem = operator.getitem
_setitem = operator.setitem


def _reconstruct(self, cg) -> str:
    # An input tensor is returned as the very object that was passed in (identity as in
    # eager); a computed one is an output of the graph.
    if self.source is not None:
        return cg.source_expr(self.source)
    return cg.graph_output(self.node)


TensorValue.reconstruct = _reconstruct
