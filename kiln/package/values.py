"""The objects generated code refers to, written as JSON and found again in a fresh process.

An entry's generated code reads kiln's values from its namespace (``___G0``, ``___t3``...,
see ``capture.sources.RenderContext``). A package cannot keep those objects; it keeps how
to find each one again:

* plain values (numbers, strings, dtypes, devices, and tuples of them) by value;
* an object of the compiled function (its globals dict, a closure cell, a default, a
  global it reads) by where it is in the function given to ``load_package``;
* a module, class or function by its qualified name (import + attributes), checked at
  save time to give back the very object;
* a torch operator (higher-order ones included) by its name.

Anything else (an object made in the call, a class defined inside a function) has no name
that outlives the process: ``encode`` raises ``NotPackageable`` and the entry is left out.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import logging
import math
import sys
import types
import weakref
from typing import Any, Callable

import torch
from torch.fx.immutable_collections import immutable_dict, immutable_list

from .. import _torch
from ..capture.codegen import MISS
from ..capture.guard_cse import IdentityMemo
from ..capture.module_state import ModuleStateMemo
from ..names import defining_name, functions_under, resolve_name
from .errors import NotPackageable

_SCALARS = (bool, int, str)


def _name_of(obj) -> tuple[str, str] | None:
    """(module, qualname) that imports back to ``obj`` itself, else None."""
    if isinstance(obj, types.ModuleType):
        return None
    qual = getattr(obj, "__qualname__", None)
    mod = getattr(obj, "__module__", None)
    if mod is None and hasattr(obj, "__objclass__"):     # list.__getitem__ and friends
        mod = getattr(obj.__objclass__, "__module__", None)
    if mod is None and isinstance(obj, types.BuiltinFunctionType) and obj.__self__ is not None:
        self = obj.__self__
        mod = self.__name__ if isinstance(self, types.ModuleType) else None
    if _lookup(mod, qual) is obj:
        return mod, qual
    # a function or class a factory made, bound in its module under its ``__name__``
    # (``torch.nn.functional.max_pool2d``, ``boolean_dispatch.<locals>.fn``)
    name = getattr(obj, "__name__", None)
    if isinstance(name, str) and name != qual and _lookup(mod, name) is obj:
        return mod, name
    return None


_MISSING = object()


def _lookup(mod, qual):
    """What ``mod``/``qual`` finds in this process (``_MISSING``: nothing, or not a name)."""
    if not isinstance(qual, str) or not isinstance(mod, str) or "<" in qual:
        return _MISSING
    try:
        return resolve_name(mod, qual)
    except Exception:
        return _MISSING


# where a builtin function whose own names do not import back (``torch.sin``: its
# ``__qualname__`` is ``_VariableFunctionsClass.sin``) is found by its ``__name__``
_BUILTIN_HOMES = ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft",
                  "torch._C", "torch._C._nn", "torch._C._autograd", "math", "operator", "builtins")


def _builtin_name(obj) -> tuple[str, str] | None:
    name = getattr(obj, "__name__", None)
    if not isinstance(obj, types.BuiltinFunctionType) or not isinstance(name, str):
        return None
    for mod in _BUILTIN_HOMES:
        m = sys.modules.get(mod)
        if m is not None and getattr(m, name, None) is obj:
            return mod, name
    return None


def _types_name(obj) -> tuple[str, str] | None:
    """``types.NoneType``, ``types.FunctionType``...: classes whose own names (``builtins.NoneType``,
    ``builtins.function``) do not import."""
    if isinstance(obj, type):
        for name, v in vars(types).items():
            if v is obj:
                return "types", name
    return None


def _module_of_globals(d: dict) -> str | None:
    """The name in ``sys.modules`` of the module whose ``__dict__`` is ``d``. Its own
    ``__name__`` may say another (``_collections_abc`` calls itself ``collections.abc``)."""
    name = d.get("__name__")
    if isinstance(name, str) and getattr(sys.modules.get(name), "__dict__", None) is d:
        return name
    for key, mod in list(sys.modules.items()):
        if getattr(mod, "__dict__", None) is d:
            return key
    return None


def _module_attribute(obj) -> list | None:
    """A module-level instance found in the module that defines its class (``os.environ``,
    a library's registry such as ``ACT2FN``); a function or class a factory made, found in
    the module it says it belongs to under another name."""
    if isinstance(obj, types.ModuleType):
        return None
    made = isinstance(obj, (type, types.FunctionType))
    mod_name = getattr(obj if made else type(obj), "__module__", None)
    if isinstance(obj, functools.partial):     # (``GELU_TANH = partial(gelu, ...)``: beside its users)
        return _found_in_some_module(obj)
    mod = sys.modules.get(mod_name) if isinstance(mod_name, str) else None
    if mod is None:
        return None
    for key, value in list(vars(mod).items()):
        if value is obj and isinstance(key, str) and key.isidentifier():
            return ["attr", ["module", mod_name], key]
    return None


def _code_path(code: types.CodeType) -> list | None:
    """A code object by where it is a constant: in the code of the named function that
    defines it (``make.<locals>.inner``'s in ``make``'s), in the module whose file holds it:
    ``["code", module, name, k, [indices]]`` (``k``: which of the functions the name reaches,
    ``names.functions_under``; the indices walk ``co_consts``)."""
    qual = getattr(code, "co_qualname", code.co_name)
    outer = defining_name(qual) or (qual if "<" not in qual else None)
    if outer is None:
        return None
    for mod_name, mod in sorted(list(sys.modules.items()), key=lambda kv: str(kv[0])):
        if getattr(mod, "__file__", None) != code.co_filename or mod_name in ("__main__", "__mp_main__"):
            continue
        try:
            top = resolve_name(mod_name, outer)
        except Exception:
            continue
        for k, f in enumerate(functions_under(top)):
            path = _const_path(f.__code__, code)
            if path is not None:
                return ["code", mod_name, outer, k, path]
    return None


def _const_path(root: types.CodeType, code: types.CodeType, depth: int = 8) -> list | None:
    if root is code:
        return []
    if depth == 0:
        return None
    for i, c in enumerate(root.co_consts):
        if isinstance(c, types.CodeType):
            rest = _const_path(c, code, depth - 1)
            if rest is not None:
                return [i, *rest]
    return None


def _found_in_some_module(obj) -> list | None:
    """An object bound at module level where nothing about it says which module: the first
    imported module, in name order, that binds it (read when a package or frame record is
    written, not per call)."""
    # (not the running script: another process runs another one)
    for name in sorted(k for k in list(sys.modules) if isinstance(k, str) and k not in ("__main__", "__mp_main__")):
        mod = sys.modules.get(name)
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for key, value in list(d.items()):
            if value is obj and isinstance(key, str) and key.isidentifier():
                return ["attr", ["module", name], key]
    return None


def _wrapped_path(obj) -> list | None:
    """A decorated function (``functools.wraps`` gave its wrapper the same qualified name): the
    name finds the wrapper, and ``__wrapped__`` from there the function."""
    qual, mod = getattr(obj, "__qualname__", None), getattr(obj, "__module__", None)
    found = _lookup(mod, qual)
    if found is _MISSING:
        return None
    path: list = ["name", mod, qual]
    for _ in range(8):
        found = getattr(getattr(found, "__func__", found), "__wrapped__", None)
        if found is None:
            return None
        path = ["attr", path, "__wrapped__"]
        if found is obj:
            return path
    return None


_C_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType, types.MethodDescriptorType,
                  types.WrapperDescriptorType, types.ClassMethodDescriptorType)


def _class_dict_owner(obj) -> tuple[type, str] | None:
    """(class, name) with ``class.__dict__[name] is obj``, for what classes hold in their
    ``__dict__`` without a name of its own that imports back: C descriptors (an instance's
    ``__dict__`` slot, ``__slots__`` members, methods of builtin types), properties,
    ``staticmethod``/``classmethod`` objects and ``functools.cached_property``."""
    if isinstance(obj, _C_DESCRIPTORS):
        owner, name = getattr(obj, "__objclass__", None), getattr(obj, "__name__", None)
    else:
        fn = obj.fget if isinstance(obj, property) else \
            obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else \
            obj.func if isinstance(obj, functools.cached_property) else None
        qual, mod = getattr(fn, "__qualname__", None), getattr(fn, "__module__", None)
        if not isinstance(qual, str) or "." not in qual:
            return None
        owner_qual, name = qual.rsplit(".", 1)
        if isinstance(obj, functools.cached_property):
            name = obj.attrname or name
        owner = _lookup(mod, owner_qual)
    if isinstance(owner, type) and isinstance(name, str) and owner.__dict__.get(name) is obj:
        return owner, name
    return None


def _op_name(obj) -> list | None:
    if isinstance(obj, torch._ops.OpOverload):
        return ["op", obj._schema.name, obj._overloadname]
    if isinstance(obj, torch._ops.OpOverloadPacket):
        return ["op", obj._qualified_op_name, None]
    if _torch.is_higher_order_op(obj):     # (by its registered name, and where its class is)
        return ["higher_order_op", *_torch.higher_order_op_home(obj)]
    return None


def _resolve_op(qualified: str, overload: str | None):
    ns, name = qualified.split("::", 1)
    packet = getattr(getattr(torch.ops, ns), name)
    return packet if overload is None else getattr(packet, overload)


class Encoder:
    """Encodes the objects of one function's entries (``fn``: the function the package is
    loaded against: a top-level function, a module's caller, or a continuation)."""

    def __init__(self, fn: types.FunctionType, specials: dict[int, list] | None = None):
        self.fn = fn
        self.specials = dict(specials or {})     # id(obj) -> encoding (the factory's callee...)
        self._classes_seen: set = set()
        self._where: dict[int, list] = {}
        self._where[id(fn)] = ["fn"]
        self._where[id(fn.__code__)] = ["fn_code"]
        self._where[id(fn.__globals__)] = ["globals"]
        if fn.__defaults__ is not None:
            self._where[id(fn.__defaults__)] = ["defaults"]
        if fn.__kwdefaults__ is not None:
            self._where[id(fn.__kwdefaults__)] = ["kwdefaults"]
        for i, d in enumerate(fn.__defaults__ or ()):
            self._where.setdefault(id(d), ["default", i])
        for k, d in (fn.__kwdefaults__ or {}).items():
            self._where.setdefault(id(d), ["kwdefault", k])
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            self._where[id(cell)] = ["cell", name]
        self._globals_by_id: dict[int, str] | None = None

    def add_function(self, module: str, qualname: str) -> None:
        """Objects of a function the capture inlined, found again through its name: its
        defaults and kwdefaults (their values too) and its closure cells."""
        try:
            f = resolve_name(module, qualname)
        except Exception:
            return
        base: list = ["name", module, qualname]
        for _ in range(8):      # (and the functions a decorator's wrapper wraps: same name)
            f = getattr(f, "__func__", f)
            if not isinstance(f, types.FunctionType):
                return
            self._add_function_objects(f, base)
            f = getattr(f, "__wrapped__", None)
            if f is None:
                return
            base = ["attr", base, "__wrapped__"]

    def where(self, obj) -> list | None:
        """Where ``obj`` was found among the objects of named functions (None: nowhere)."""
        return self._where.get(id(obj))

    def _add_class_functions(self, cls: type, base: list) -> None:
        """The objects of the functions a named class holds in its ``__dict__``, found through
        it (a wrapper a decorator or ``huggingface_hub``'s ``strict`` put there, with the
        function it replaced in a closure cell)."""
        if id(cls) in self._classes_seen:
            return
        self._classes_seen.add(id(cls))
        for name, f in list(vars(cls).items()):
            if isinstance(name, str) and isinstance(f, types.FunctionType) and f.__closure__:
                self._add_function_objects(f, ["class_dict", base, name])

    def _add_function_objects(self, f: types.FunctionType, base: list) -> None:
        if f.__defaults__ is not None:
            where = ["attr", base, "__defaults__"]
            self._where.setdefault(id(f.__defaults__), where)
            for i, d in enumerate(f.__defaults__):
                self._where.setdefault(id(d), ["index", where, i])
        if f.__kwdefaults__ is not None:
            where = ["attr", base, "__kwdefaults__"]
            self._where.setdefault(id(f.__kwdefaults__), where)
            for k, d in f.__kwdefaults__.items():
                self._where.setdefault(id(d), ["index", where, k])
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
            self._where.setdefault(id(cell), ["cell_of", base, name])
            try:
                inner = cell.cell_contents
            except ValueError:          # (an empty cell)
                continue
            if isinstance(inner, types.FunctionType):   # (the function a wrapper replaced)
                self._where.setdefault(id(inner), ["attr", ["cell_of", base, name], "cell_contents"])

    def _global_name(self, obj) -> str | None:
        if self._globals_by_id is None:
            self._globals_by_id = {}
            for k, v in list(self.fn.__globals__.items()):
                if isinstance(k, str):
                    self._globals_by_id.setdefault(id(v), k)
        return self._globals_by_id.get(id(obj))

    def _plans(self, plans) -> list | None:
        """A ModuleStateMemo's plans (``module_state``): nested tuples of kinds, classes (by
        name), attribute names and keys."""
        def plan(p):
            if p is None:
                return None
            if p[0] == 0:
                return [0, self.encode(p[1], identity=True), [[k, plan(c)] for k, c in p[2]]]
            return [1, [[k, plan(c)] for k, c in p[1]]]
        return None if plans is None else [plan(p) for p in plans]

    def encode(self, obj: Any, identity: bool = False) -> list:
        """The JSON form of ``obj``. ``identity``: the code compares it with ``is``, so only
        an encoding that finds the object itself again will do."""
        hit = self.specials.get(id(obj))
        if hit is not None:
            return hit
        if obj is MISS:
            return ["miss"]
        if type(obj) is IdentityMemo:
            return ["memo"]          # (what passed a check last: a new process starts empty)
        if type(obj) is ModuleStateMemo:   # (its plans; the snapshot: a new process takes its own)
            return ["module_state", self._plans(obj.plans)]
        if obj is None or obj is Ellipsis:
            return ["const", repr(obj)]
        if type(obj) in _SCALARS:
            return ["v", obj]
        if type(obj) is float:
            return ["float", repr(obj)]
        if type(obj) is complex:
            return ["complex", repr(obj.real), repr(obj.imag)]
        if type(obj) is bytes:
            return ["bytes", obj.hex()]
        if isinstance(obj, torch.dtype):
            return ["dtype", str(obj).replace("torch.", "")]
        if type(obj) is torch.device:
            return ["device", str(obj)]
        if type(obj) is torch.Size:
            return ["size", list(obj)]
        if isinstance(obj, (torch.layout, torch.memory_format)):
            return ["torch_attr", str(obj).replace("torch.", "")]
        where = self._where.get(id(obj))
        if where is not None:
            return where
        if type(obj) is tuple and not identity:
            return ["tuple", [self.encode(x) for x in obj]]
        if isinstance(obj, types.ModuleType):
            if sys.modules.get(obj.__name__) is obj:
                return ["module", obj.__name__]
            raise NotPackageable(f"module {obj.__name__} is not importable by its name")
        if type(obj) is dict and obj.get("__name__"):
            home = _module_of_globals(obj)
            if home is not None:
                return ["module_dict", home]
        if isinstance(obj, weakref.ref) and type(obj) is weakref.ref:
            target = obj()
            if target is None:
                raise NotPackageable("a weakly held object was freed")
            return ["weakref", self.encode(target, identity=True)]
        op = _op_name(obj)
        if op is not None:
            return op
        if isinstance(obj, enum.Enum):
            name = _name_of(type(obj))
            if name is not None:
                return ["enum", *name, obj.name]
        if isinstance(obj, types.CellType):
            raise NotPackageable("a closure cell that is not the compiled function's own (of a "
                                 "function it inlined)")
        if isinstance(obj, types.MethodType) and isinstance(obj.__self__, (type, types.ModuleType)):
            name = _name_of(obj.__self__)
            base = ["module", obj.__self__.__name__] if isinstance(obj.__self__, types.ModuleType) \
                else (["name", *name] if name else None)
            if base is not None and getattr(obj.__self__, obj.__name__, None) == obj:
                return ["attr", base, obj.__name__]
        if isinstance(obj, types.MethodType):
            # a method of a named instance (a registry's, ``os.environ.get``): an equal bound
            # method comes back (a new one on every attribute read, in any process)
            try:
                if getattr(obj.__self__, obj.__name__, None) == obj:
                    return ["attr", self.encode(obj.__self__, identity=True), obj.__name__]
            except NotPackageable:
                pass
        name = _name_of(obj) or _builtin_name(obj) or _types_name(obj)
        if name is not None:
            if isinstance(obj, type):
                self._add_class_functions(obj, ["name", *name])
            return ["name", *name]
        if isinstance(obj, logging.Logger) and (obj is logging.root or
                                                logging.root.manager.loggerDict.get(obj.name) is obj):
            return ["logger", None if obj is logging.root else obj.name]
        wrapped = _wrapped_path(obj) or _module_attribute(obj)
        if wrapped is not None:
            return wrapped
        if isinstance(obj, types.CodeType):
            found = _code_path(obj)
            if found is not None:
                return found
        owner = _class_dict_owner(obj)
        if owner is not None:
            try:
                return ["class_dict", self.encode(owner[0], identity=True), owner[1]]
            except NotPackageable:
                pass
        g = self._global_name(obj)
        if g is not None:
            return ["global", g]
        if not identity:
            if type(obj) in (list, immutable_list):     # (an FX node's argument list)
                return ["list", [self.encode(x) for x in obj]]
            if type(obj) in (dict, immutable_dict):
                return ["dict", [[self.encode(k), self.encode(v)] for k, v in obj.items()]]
            if type(obj) in (set, frozenset):
                return ["set" if type(obj) is set else "frozenset", [self.encode(x) for x in obj]]
            if type(obj) is slice:
                return ["slice", [self.encode(x) for x in (obj.start, obj.stop, obj.step)]]
            if type(obj) is range:
                return ["range", [obj.start, obj.stop, obj.step]]
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and \
                    type(obj).__module__.startswith("kiln.") and _name_of(type(obj)):
                return ["dataclass", *_name_of(type(obj)),
                        {f.name: self.encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}]
        what = getattr(obj, "__qualname__", None) or type(obj).__qualname__
        raise NotPackageable(f"{type(obj).__name__} {what!s:.60} has no name that finds it in "
                             "another process (made in the call, or defined inside a function)")


class Decoder:
    """Finds the encoded objects again, for the function the package is loaded against."""

    def __init__(self, fn: types.FunctionType, specials: dict[str, Callable[[], Any]] | None = None):
        self.fn = fn
        self.specials = specials or {}

    def _plan(self, p):
        if p is None:
            return None
        if p[0] == 0:
            return (0, self.decode(p[1]), tuple((k, self._plan(c)) for k, c in p[2]))
        return (1, tuple((k, self._plan(c)) for k, c in p[1]))

    def decode(self, enc: list) -> Any:
        tag = enc[0]
        fn = self.fn
        if tag == "v":
            return enc[1]
        if tag == "const":
            return {"None": None, "Ellipsis": Ellipsis}[enc[1]]
        if tag == "float":
            return float(enc[1])
        if tag == "complex":
            return complex(float(enc[1]), float(enc[2]))
        if tag == "bytes":
            return bytes.fromhex(enc[1])
        if tag == "dtype":
            return getattr(torch, enc[1])
        if tag == "device":
            return torch.device(enc[1])
        if tag == "size":
            return torch.Size(enc[1])
        if tag == "torch_attr":
            return getattr(torch, enc[1])
        if tag == "miss":
            return MISS
        if tag == "memo":
            return IdentityMemo()
        if tag == "module_state":
            return ModuleStateMemo(None if enc[1] is None else tuple(self._plan(p) for p in enc[1]))
        if tag == "fn":
            return fn
        if tag == "fn_code":
            return fn.__code__
        if tag == "globals":
            return fn.__globals__
        if tag == "defaults":
            return fn.__defaults__
        if tag == "kwdefaults":
            return fn.__kwdefaults__
        if tag == "default":
            return fn.__defaults__[enc[1]]
        if tag == "kwdefault":
            return fn.__kwdefaults__[enc[1]]
        if tag == "cell":
            return fn.__closure__[fn.__code__.co_freevars.index(enc[1])]
        if tag == "global":
            return fn.__globals__[enc[1]]
        if tag == "module":
            return importlib.import_module(enc[1])
        if tag == "module_dict":
            return importlib.import_module(enc[1]).__dict__
        if tag == "name":
            return resolve_name(enc[1], enc[2])
        if tag == "attr":
            return getattr(self.decode(enc[1]), enc[2])
        if tag == "code":
            code = functions_under(resolve_name(enc[1], enc[2]))[enc[3]].__code__
            for i in enc[4]:
                code = code.co_consts[i]
            return code
        if tag == "logger":             # (logging's registry makes one per name, per process)
            return logging.getLogger(enc[1])
        if tag == "class_dict":
            return self.decode(enc[1]).__dict__[enc[2]]
        if tag == "index":
            return self.decode(enc[1])[enc[2]]
        if tag == "cell_of":
            f = self.decode(enc[1])
            f = getattr(f, "__func__", f)
            return f.__closure__[f.__code__.co_freevars.index(enc[2])]
        if tag == "enum":
            return getattr(resolve_name(enc[1], enc[2]), enc[3])
        if tag == "op":
            return _resolve_op(enc[1], enc[2])
        if tag == "higher_order_op":
            return _torch.higher_order_op(enc[1], enc[2])
        if tag == "weakref":
            return weakref.ref(self.decode(enc[1]))
        if tag == "tuple":
            return tuple(self.decode(x) for x in enc[1])
        if tag == "list":
            return [self.decode(x) for x in enc[1]]
        if tag == "dict":
            return {self.decode(k): self.decode(v) for k, v in enc[1]}
        if tag == "set":
            return {self.decode(x) for x in enc[1]}
        if tag == "frozenset":
            return frozenset(self.decode(x) for x in enc[1])
        if tag == "slice":
            return slice(*(self.decode(x) for x in enc[1]))
        if tag == "range":
            return range(*enc[1])
        if tag == "dataclass":
            cls = resolve_name(enc[1], enc[2])
            return cls(**{k: self.decode(v) for k, v in enc[3].items()})
        if tag == "special":
            return self.specials[enc[1]]()
        raise ValueError(f"unknown encoding {tag!r}")


def same(a: Any, b: Any) -> bool:
    """Whether a decoded object stands for the original (itself, or an equal plain value)."""
    if a is b:
        return True
    if isinstance(a, weakref.ref) and isinstance(b, weakref.ref):
        return a() is b()
    if type(a) is not type(b):
        return False
    if type(a) is float and math.isnan(a):
        return math.isnan(b)
    try:
        return bool(a == b)
    except Exception:
        return False
