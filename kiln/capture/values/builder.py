"""``wrap``: turn a real object read from a source into a Value, installing the guards that
the value's use relies on. This is where the soundness rule is enforced for inputs."""
from __future__ import annotations

import collections
import functools
import inspect
import os
import sys
import types
from typing import Any

import torch

from ... import _torch
from ...errors import Unsupported
from ..comptime import Comptime, comptime_value
from ..guards import Guard, GuardKind, is_identity_key, ordered_keys
from ..sources import (ITEM_DICT, ITEM_INDEX, ITEM_LIST, ITEM_TUPLE, AttrSource, DictItemSource, DictKeySource,
                       ItemSource, ReduceSource)
from ..sources import is_argument_rooted
from .base import CONSTANT_TYPES, ConstantValue, Value, is_constant_object, is_type_annotation
from .builtins import _HANDLERS, BuiltinValue, ReversedListIteratorValue
from .checkpoint import CHECKPOINT, call_checkpoint
from .higher_order_cond import COND_FUNCTIONS, call_cond
from .higher_order_associative_scan import ASSOCIATIVE_SCAN_FUNCTIONS, call_associative_scan
from .higher_order_map import MAP_FUNCTIONS, call_map
from .higher_order_scan import SCAN_FUNCTIONS, call_scan
from .higher_order_flex import flex_capture
from .higher_order_while import WHILE_LOOP_FUNCTIONS, call_while_loop
from .modelled_functions import ModelledFunctionValue
from .environ import EnvironValue
from . import identity, itertools_fns  # noqa: F401  (register id() and the itertools handlers)
from .exceptions import ExceptionValue
from .functions import MethodValue
from .lru_cache import LRU_CACHE_WRAPPER, LruCacheValue
from . import new_objects  # noqa: F401  (registers collections.namedtuple)
from .containers import DictValue, IteratorValue, ListValue, NamedTupleValue, SetValue, TupleValue
from .functions import (BoundMethodValue, ExistingCellValue, PartialValue, TorchOpValue,
                        UserFunctionValue)
from ..numpy.values import is_numpy_object, pure_numpy_result, wrap_numpy
from .objects import ClassValue, NNModuleValue, ObjectValue, PythonModuleValue
from .symbolic import size_value

# Python functions whose module makes them tensor operators (one graph node each).
TORCH_OP_MODULES = frozenset({"torch.nn.functional", "torch.functional", "torch._tensor",
                              "torch.nn.init", "torch._refs", "torch._decomp"})
# torch._C submodules whose builtins are operators.
TORCH_OP_C_MODULES = frozenset({"torch._C._nn", "torch._C._fft", "torch._C._linalg",
                                "torch._C._special", "torch._C._nested", "torch._C._sparse"})


def _state_readers() -> dict:
    """torch functions that read state which kiln guards (GLOBAL_STATE) or that are constant
    in eager execution: folded at capture time. The value is None when the function is called
    at capture time, else the constant it folds to."""
    out = {torch.is_grad_enabled: None, torch.get_default_dtype: None, torch.is_autocast_enabled: None,
           torch.get_autocast_dtype: None,
           torch.are_deterministic_algorithms_enabled: None,
           torch.is_deterministic_algorithms_warn_only_enabled: None}
    for mod, name in (("torch.jit", "is_scripting"), ("torch.jit", "is_tracing"),
                      ("torch.compiler", "is_dynamo_compiling"),
                      ("torch._C", "_get_tracing_state"), ("torch._jit_internal", "is_scripting"),
                      # the name a process gives its out-of-tree device, once, before using it
                      ("torch._C", "_get_privateuse1_backend_name")):
        fn = getattr(sys.modules.get(mod), name, None)
        if fn is not None:
            out[fn] = None
    # "is a graph being traced by a compiler": True during capture, as under torch.compile, so
    # library code (transformers, torch.nn) takes the path it wrote for compilers (no context
    # variables, no data-dependent shortcuts). What runs natively (an eager frame, the step at
    # a graph break) sees False, as with torch.compile. is_dynamo_compiling stays False.
    for mod, name in (("torch.compiler", "is_compiling"), ("torch._utils", "is_compiling")):
        fn = getattr(sys.modules.get(mod), name, None)
        if fn is not None:
            out[fn] = True
    return out


STATE_READERS = _state_readers()


def is_torch_op(fn: Any) -> bool:
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    if isinstance(fn, types.BuiltinFunctionType):
        owner = getattr(fn, "__self__", None)
        if owner is None:
            return getattr(fn, "__module__", None) == "torch"
        return isinstance(owner, types.ModuleType) and owner.__name__ in TORCH_OP_C_MODULES
    if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return getattr(fn, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor)
    if isinstance(fn, types.FunctionType):
        mod = getattr(fn, "__module__", None)
        if mod in TORCH_OP_MODULES:
            return True
        # functions of torch.nn.functional built by boolean_dispatch live in _jit_internal
        return mod == "torch._jit_internal" and fn.__name__ == "fn" and hasattr(fn, "__wrapped__")
    return False


def is_trusted_module(mod: types.ModuleType) -> bool:
    """torch, NumPy and the standard library: their attributes are assumed not to be re-bound, the
    same assumption torch.compile makes, so reading them installs no guard."""
    name = getattr(mod, "__name__", "") or ""
    top = name.split(".", 1)[0]
    return top in ("torch", "numpy") or top in sys.stdlib_module_names


_LIST_REVERSEITERATOR = type(reversed([]))
_SEQUENCE_ITERATORS = (type(iter(())), type(iter([])), type(iter(range(0))), _LIST_REVERSEITERATOR)


def wrap_pure_result(v: Any) -> Value:
    """A value computed at capture time from constants (no source, no guards needed)."""
    if type(v) is tuple:
        return TupleValue([wrap_pure_result(x) for x in v])
    if type(v) is list:
        return ListValue([wrap_pure_result(x) for x in v])
    if type(v) is dict:
        return DictValue({k: wrap_pure_result(x) for k, x in v.items()})
    if type(v) in (set, frozenset):
        return SetValue({k: wrap_pure_result(k) for k in v}, type(v), keys=v)
    if is_constant_object(v) or isinstance(v, (torch.finfo, torch.iinfo)):
        return ConstantValue(v)
    if type(v) in (inspect.Signature, inspect.Parameter, inspect._ParameterKind) or is_type_annotation(v):
        return ConstantValue(v)  # immutable (see functions.signature_of; typing constructs)
    if type(v) is types.MappingProxyType:
        return DictValue({k: wrap_pure_result(x) for k, x in v.items()})  # Signature.parameters
    numpy_value = pure_numpy_result(v)   # NumPy scalars, dtypes, finfo: see numpy/values.py
    if numpy_value is not None:
        return numpy_value
    if isinstance(v, type):
        return ClassValue(v)
    if isinstance(v, tuple) and hasattr(type(v), "_fields"):
        return NamedTupleValue([wrap_pure_result(x) for x in v], None, type(v))
    if isinstance(v, (types.BuiltinFunctionType, types.FunctionType)):
        return wrap_callable(v, None)
    raise Unsupported(f"a capture-time result of type {type(v).__name__}")


def wrap_callable(fn, source) -> Value:
    if fn in STATE_READERS or isinstance(fn, types.FunctionType) and fn in _HANDLERS:
        # a Python function kiln models itself (os.getenv, collections.namedtuple)
        return BuiltinValue(fn, source)
    if fn is torch.is_tensor:
        return BuiltinValue(fn, source)
    if fn is CHECKPOINT:   # captured as a recompute region, not traced through torch's internals
        return ModelledFunctionValue(fn, source, "torch.utils.checkpoint.checkpoint", call_checkpoint)
    if fn in COND_FUNCTIONS:   # captured as a higher-order op node, not traced through torch's wrapper
        return ModelledFunctionValue(fn, source, "torch.cond", call_cond)
    if fn in WHILE_LOOP_FUNCTIONS:
        return ModelledFunctionValue(fn, source, "torch.while_loop", call_while_loop)
    if fn in SCAN_FUNCTIONS:
        return ModelledFunctionValue(fn, source, "torch._higher_order_ops.scan", call_scan)
    if fn in ASSOCIATIVE_SCAN_FUNCTIONS:
        return ModelledFunctionValue(fn, source, "torch._higher_order_ops.associative_scan",
                                     call_associative_scan)
    if fn in MAP_FUNCTIONS:
        return ModelledFunctionValue(fn, source, "torch._higher_order_ops.map", call_map)
    flex = flex_capture(fn)   # flex_attention: a higher-order op node with score_mod/mask_mod subgraphs
    if flex is not None:
        return ModelledFunctionValue(fn, source, *flex)
    if is_torch_op(fn):
        return TorchOpValue(fn, source)
    if isinstance(fn, types.FunctionType):
        return UserFunctionValue(fn, source)
    inline = getattr(fn, "_torchdynamo_inline", None) if type(fn) is torch.jit.ScriptFunction else None
    if isinstance(inline, types.FunctionType):
        # a @torch.jit.script function: its Python original is traced (torch keeps it there
        # for compilers; torch.compile does the same)
        return UserFunctionValue(inline, AttrSource(source, "_torchdynamo_inline") if source else None)
    return BuiltinValue(fn, source)


def _is_tensor_method(obj) -> bool:
    """``x.add`` of a tensor ``x``: a builtin bound to the tensor, named like a method of
    torch.Tensor that is one of its C methods (not a Python override of a subclass)."""
    if not _is(obj, types.BuiltinMethodType) or not _is(obj.__self__, torch.Tensor):
        return False
    attr = getattr(torch.Tensor, obj.__name__, None)
    return isinstance(attr, (types.MethodDescriptorType, types.WrapperDescriptorType)) and \
        getattr(type(obj.__self__), obj.__name__, None) is attr


class Builder:
    """Wraps objects for one capture; remembers what it wrapped (by source and by identity)
    so that one object read twice is one value (mutations and aliasing stay consistent)."""

    def __init__(self, output):
        self.output = output
        self.by_source: dict = {}
        self.by_id: dict[int, tuple[Any, Value]] = {}

    # Value classes reach this through the builder they are handed (``tx.output.builder``),
    # since this module imports every kind of value.
    wrap_pure_result = staticmethod(wrap_pure_result)

    def guard(self, kind: GuardKind, source, expected=None) -> None:
        if source is not None and self.output.guards_enabled_for(source):
            self.output.guards.add(Guard(kind, source, expected))

    def _function_of_the_call(self, fn: types.FunctionType, source) -> Value:
        """A nested function the caller made (an argument: a resume function gets the
        caller's locals): a new object each call, so it is guarded by what inlining it
        reads (its code, globals, the shape of its defaults; its cells and defaults are
        read, and guarded, through it), and by identity only where identity is used."""
        g = self.guard
        g(GuardKind.ID_MATCH, AttrSource(source, "__code__"), fn.__code__)
        g(GuardKind.ID_MATCH, AttrSource(source, "__globals__"), fn.__globals__)
        for attr, value in (("__defaults__", fn.__defaults__), ("__kwdefaults__", fn.__kwdefaults__)):
            if value is None:
                g(GuardKind.EQUALS_MATCH, AttrSource(source, attr), None)
            elif type(value) is tuple:
                g(GuardKind.TYPE_MATCH, AttrSource(source, attr), tuple)
                g(GuardKind.LENGTH_MATCH, AttrSource(source, attr), (len(value), "tuple"))
            else:
                g(GuardKind.TYPE_MATCH, AttrSource(source, attr), type(value))
                g(GuardKind.DICT_KEYS, AttrSource(source, attr), list(value))
        v = wrap_callable(fn, source)
        if isinstance(v, UserFunctionValue):
            v.on_identity = lambda: g(GuardKind.ID_MATCH, source, fn)
        else:
            g(GuardKind.ID_MATCH, source, fn)
        return v

    def wrap(self, obj: Any, source, static: bool = False) -> Value:
        if source is not None:
            hit = self.by_source.get(source)
            if hit is not None:
                return hit
            if not _is_immutable_scalar(obj):
                prior = self.by_id.get(id(obj))
                if prior is not None and prior[0] is obj and prior[1].source is not None:
                    # The same object reached two ways: guard that it stays the same object.
                    self.guard(GuardKind.ALIAS_MATCH, source, prior[1].source)
                    self.by_source[source] = prior[1]
                    return prior[1]
        v = self._wrap(obj, source, static)
        if source is not None:
            self.by_source[source] = v
            if not _is_immutable_scalar(obj):
                self.by_id[id(obj)] = (obj, v)
        return v

    def _wrap(self, obj, source, static):
        g = self.guard
        t = type(obj)
        if t is Comptime:
            return comptime_value()
        if obj is os.environ:   # reads become guards on one variable each (environ.py)
            g(GuardKind.ID_MATCH, source, obj)
            return EnvironValue(source)
        if t is LRU_CACHE_WRAPPER:   # see LruCacheValue for what a call does
            g(GuardKind.ID_MATCH, source, obj)
            return LruCacheValue(obj, source)
        if _is(obj, torch.Tensor):
            if source is None:
                raise Unsupported("a tensor that is not reachable from the arguments, globals "
                                  "or closures (cannot be a graph input)")
            # (a tensor marked at a static address, a static KV cache's: read and written in
            # place by CUDA graphs, as a parameter is)
            return self.output.add_tensor_input(obj, source, static or _torch.has_static_address(obj))
        if t is torch.Size and source is not None:
            # item by item, so that a size that varies can become symbolic like an int input
            g(GuardKind.TYPE_MATCH, source, t)
            g(GuardKind.LENGTH_MATCH, source, (len(obj), "tuple"))
            return size_value([self.wrap(v, ItemSource(source, i)) for i, v in enumerate(obj)],
                              keep_items=True)
        if t in (bool, type(None)) or t in (int, float, str, bytes, complex, torch.Size, range):
            if source is None:
                return ConstantValue(obj)
            g(GuardKind.TYPE_MATCH, source, t)
            if t is int and self._may_be_dynamic_int(source, obj):
                return self.output.add_int_input(obj, source)
            return ConstantValue(obj, source, on_use=lambda: g(GuardKind.EQUALS_MATCH, source, obj))
        if t in (torch.dtype, torch.layout, torch.memory_format) or obj is Ellipsis or is_type_annotation(obj):
            g(GuardKind.ID_MATCH, source, obj)
            return ConstantValue(obj, source)
        if t is torch.device:
            g(GuardKind.EQUALS_MATCH, source, obj)
            return ConstantValue(obj, source)
        if t is slice and is_constant_object(obj):   # (a slice of lists: its fields are objects)
            g(GuardKind.EQUALS_MATCH, source, obj)
            return ConstantValue(obj, source)
        if is_numpy_object(obj):   # ndarrays are graph inputs, NumPy functions are traced
            return wrap_numpy(self, obj, source)
        if _is(obj, torch.nn.Module):
            g(GuardKind.TYPE_MATCH, source, t)
            return NNModuleValue(obj, source)
        if _is(obj, tuple):
            g(GuardKind.TYPE_MATCH, source, t)
            g(GuardKind.LENGTH_MATCH, source, (len(obj), "tuple"))
            how = ITEM_INDEX if t is tuple or hasattr(t, "_fields") else ITEM_TUPLE
            items = [self.wrap(x, ItemSource(source, i, how) if source else None)
                     for i, x in enumerate(tuple.__iter__(obj))]
            if hasattr(t, "_fields") or getattr(t, "n_fields", None) is not None:
                return NamedTupleValue(items, source, t)
            return TupleValue(items, source, t)
        if _is(obj, list):
            g(GuardKind.TYPE_MATCH, source, t)
            g(GuardKind.LENGTH_MATCH, source, (len(obj), "list"))
            how = ITEM_INDEX if t is list else ITEM_LIST
            items = [self.wrap(x, ItemSource(source, i, how) if source else None)
                     for i, x in enumerate(list.__iter__(obj))]
            return ListValue(items, source, t)
        if _is(obj, dict) and t is not collections.defaultdict or t is collections.defaultdict:
            keys = list(ordered_keys(obj))
            # (keys: constants, classes, typing constructs: ``huggingface_hub``'s validators by
            # ``typing.Union`` and ``Literal``; tensors and modules by identity: an optimizer's
            # ``state``, a table of layers)
            by_identity = [_is_tensor_key(k) or _is_module_key(k) for k in keys]
            if not all(i or is_constant_object(k) or _is_class_key(k) or is_type_annotation(k)
                       for i, k in zip(by_identity, keys)):
                raise Unsupported("a dict whose keys are not Python constants, classes, tensors or modules")
            if any(by_identity) and source is None:
                raise Unsupported("a dict keyed by tensors or modules, not reachable from the arguments, "
                                  "globals or closures")
            g(GuardKind.TYPE_MATCH, source, t)
            g(GuardKind.DICT_KEYS_IDENTITY if any(by_identity) else GuardKind.DICT_KEYS, source, keys)
            how = ITEM_INDEX if t in (dict, collections.OrderedDict) else ITEM_DICT
            items = {}
            for i, (k, keyed_by_id) in enumerate(zip(keys, by_identity)):
                if keyed_by_id:
                    # the key tensor is a value of the graph, the same one however it is reached
                    # (``p`` of ``param_groups``): a lookup by that value finds it. A module key
                    # is the module itself (lookups compare modules as objects); iterating the
                    # keys gives the value wrapped here (``key_value``)
                    key = self.wrap(k, DictKeySource(source, i, k))
                    if not isinstance(k, torch.Tensor):
                        key = k
                    item_source = DictItemSource(source, i, k, how)
                else:
                    key, item_source = k, ItemSource(source, k, how) if source else None
                items[key] = self.wrap(dict.__getitem__(obj, k), item_source)
            d = DictValue(items, source, t)
            pending = self.output.side_effects.take_globals(obj)
            if pending:     # (a module's globals, assigned to earlier in the capture)
                for name, value in pending:
                    d.items[name] = value
                self.output.side_effects.mutated(d)
            if t not in (dict, collections.OrderedDict, collections.defaultdict):
                d.instance_attrs = getattr(obj, "__dict__", None)
            if _is(obj, collections.defaultdict):
                d.default_factory = self.wrap(obj.default_factory,
                                              AttrSource(source, "default_factory") if source else None)
            return d
        if t in (set, frozenset):
            if not all(is_constant_object(k) for k in obj):
                raise Unsupported("a set of values that are not Python constants")
            g(GuardKind.EQUALS_MATCH, source, obj)
            v = SetValue({k: ConstantValue(k) for k in obj}, t, source,
                         keys=obj.copy() if t is set else obj if t is frozenset else set(obj))
            v.real_order = True
            return v
        if _is(obj, types.ModuleType):
            g(GuardKind.ID_MATCH, source, obj)
            return PythonModuleValue(obj, source)
        if _is(obj, type):
            g(GuardKind.ID_MATCH, source, obj)
            return ClassValue(obj, source)
        if type(obj) is types.FunctionType and _made_by_the_caller(source, obj):
            return self._function_of_the_call(obj, source)
        if _is_tensor_method(obj) and source is not None:
            # a tensor's bound method (``x.add``: a continuation gets one from the stack of a
            # call that a graph break interrupted): that tensor's method, as LOAD_ATTR gives it
            g(GuardKind.TYPE_MATCH, source, t)
            g(GuardKind.EQUALS_MATCH, AttrSource(source, "__name__"), obj.__name__)
            return MethodValue(self.wrap(obj.__self__, AttrSource(source, "__self__")), obj.__name__)
        if _is(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType,
                            types.WrapperDescriptorType, torch._ops.OpOverload,
                            torch._ops.OpOverloadPacket)):
            g(GuardKind.ID_MATCH, source, obj)
            return wrap_callable(obj, source)
        if _is(obj, torch.jit.ScriptFunction) and \
                isinstance(getattr(obj, "_torchdynamo_inline", None), types.FunctionType):
            g(GuardKind.ID_MATCH, source, obj)
            return wrap_callable(obj, source)
        if _is(obj, types.MethodType):
            return BoundMethodValue(
                self.wrap(obj.__func__, AttrSource(source, "__func__") if source else None),
                self.wrap(obj.__self__, AttrSource(source, "__self__") if source else None))
        if t is functools.partial:
            g(GuardKind.TYPE_MATCH, source, t)
            func = self.wrap(obj.func, AttrSource(source, "func") if source else None)
            if source is None:
                return PartialValue(func, TupleValue([self.wrap(a, None) for a in obj.args]),
                                    DictValue({k: self.wrap(v, None) for k, v in obj.keywords.items()}))
            # (its args and keywords as the objects they are: a change to keywords is written back)
            return PartialValue(func, self.wrap(obj.args, AttrSource(source, "args")),
                                self.wrap(obj.keywords, AttrSource(source, "keywords")), source)
        if _is(obj, (torch.finfo, torch.iinfo)):
            return ConstantValue(obj, source)
        if t in _SEQUENCE_ITERATORS and source is not None:
            # its sequence and position, as the iterator itself describes them
            g(GuardKind.TYPE_MATCH, source, t)
            reduced = obj.__reduce__()
            red = ReduceSource(source)
            self.guard(GuardKind.LENGTH_MATCH, red, (len(reduced), "tuple"))
            if len(reduced) == 2:       # (ended: it yields nothing more, whatever is appended)
                ended = IteratorValue([], real=obj, source=source)
                ended.exhausted = True
                return ended
            _fn, (seq,), index = reduced
            if t is _LIST_REVERSEITERATOR:
                seq_value = self.wrap(seq, ItemSource(ItemSource(red, 1), 0))
                self.guard(GuardKind.EQUALS_MATCH, ItemSource(red, 2), index)
                if not isinstance(seq_value, ListValue):
                    raise Unsupported("a reversed() iterator over a list that is not a plain list")
                return ReversedListIteratorValue(seq_value, index, real=obj, source=source)
            seq_value = self.wrap(seq, ItemSource(ItemSource(red, 1), 0))
            self.guard(GuardKind.EQUALS_MATCH, ItemSource(red, 2), index)
            if type(seq) is list and isinstance(seq_value, ListValue):
                # live over the list: what the code appends to it later is taken as in eager
                return IteratorValue(seq_value, live=True, real=obj, source=source, start=index)
            items = seq_value.unpack(self.output) if not isinstance(seq_value, ConstantValue) \
                else [ConstantValue(x) for x in seq_value.as_constant()]
            return IteratorValue(list(items[index:]), real=obj, source=source)
        if t is types.CellType:
            g(GuardKind.TYPE_MATCH, source, t)
            return ExistingCellValue(obj, getattr(source, "name", "cell"), source)
        if source is None:
            raise Unsupported(f"an object of type {t.__name__} that cannot be guarded")
        g(GuardKind.TYPE_MATCH, source, t)
        if _is(obj, BaseException):
            return ExceptionValue(obj, source)   # a continuation's handled exception
        return ObjectValue(obj, source)


    def _may_be_dynamic_int(self, source, value: int) -> bool:
        """An int input that the shape policy makes symbolic. Ints of torch and the standard
        library, and attributes of nn.Modules (layer sizes, head counts), stay constants."""
        policy = self.output.policy
        if policy is None or not self.output.guards_enabled_for(source):
            return False
        if isinstance(source, AttrSource) and isinstance(self.by_source.get(source.base), NNModuleValue):
            return False
        return policy.int_is_dynamic(source.describe(), value)


def _is_tensor_key(k) -> bool:
    # (a tensor subclass may define its own hash and equality)
    return type(k) in (torch.Tensor, torch.nn.Parameter)


def _is_module_key(k) -> bool:
    """An nn.Module as a dict key, hashed and compared by identity (as nn.Module leaves it)."""
    return isinstance(k, torch.nn.Module) and is_identity_key(k)


def _is_class_key(k) -> bool:
    """A class as a dict key (a dispatch table such as ``copy._deepcopy_dispatch``): hashed
    and compared by identity, unless its metaclass says otherwise."""
    return isinstance(k, type) and type(k).__eq__ is type.__eq__ and type(k).__hash__ is type.__hash__


def _is(obj, classes) -> bool:
    """``isinstance`` by the object's real type. ``isinstance`` also reads ``obj.__class__``
    when the type does not match, which runs a user's ``__getattribute__``: a call eager never
    makes, seen by the user's code (and a class that lies about ``__class__`` is still what its
    type says)."""
    return issubclass(type(obj), classes)


def _is_immutable_scalar(obj) -> bool:
    return type(obj) in CONSTANT_TYPES and type(obj) is not torch.Size or obj is None


def _made_by_the_caller(source, fn: types.FunctionType) -> bool:
    """A function reached from the call's arguments that a frame made (a nested function,
    a lambda): not one of a module's or a class's (those are guarded by identity)."""
    if source is None or not is_argument_rooted(source):
        return False
    return "<locals>" in fn.__qualname__ or fn.__name__ == "<lambda>"
