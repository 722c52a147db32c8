"""Tuples, lists, dicts, sets, iterators, and user subclasses of list and dict.

Mutable containers that existed before the call (they have a source) record that they were
mutated; the transformed code writes their final contents back after the graph has run
(``side_effects``). A user subclass keeps its class: methods the subclass overrides are
inlined; everything else acts on the underlying storage, as ``list.__getitem__`` would.
"""
from __future__ import annotations

import collections
import collections.abc
import operator
import types
from typing import Callable

import torch

from ...errors import Unsupported
from ..sources import AttrSource
from .attributes import _MISSING, static_lookup
from .attributes import (del_attribute, descriptor_delete, get_attribute, guard_attribute_absent, guard_classes_lack,
                         set_attribute)
from .base import ConstantValue, MadeInOrder, Value, is_constant_object
from .functions import MethodValue, UserFunctionValue
from .truth import checked_bool, checked_len


def _user_override(cls: type, base: type, name: str):
    """The function a user subclass defines for ``name`` before reaching ``base``, or None."""
    for klass in cls.__mro__:
        if klass is base:
            return None
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


def _truthy_by_overrides(tx, v) -> bool:
    """Truth of a container subclass's instance: its class's own ``__bool__`` or ``__len__``
    (a Python override), else the storage's length."""
    cls = v.python_type()
    for name in ("__bool__", "__len__"):
        fn = static_lookup(cls, name)
        if isinstance(fn, types.FunctionType):
            result = tx.call(UserFunctionValue(fn), [v], {})
            return checked_bool(tx, result) if name == "__bool__" else checked_len(tx, result) > 0
    return len(v.items) > 0


class BaseSequenceValue(Value):
    base_type: type = tuple

    def __init__(self, items: list[Value], source=None, cls: type | None = None):
        self.items = list(items)
        self.source = source
        self.cls = cls or self.base_type

    def python_type(self):
        return self.cls

    def is_constant(self):
        return self.cls in (tuple, list) and all(i.is_constant() for i in self.items)

    def as_constant(self):
        vals = [i.as_constant() for i in self.items]
        return self.cls(vals) if self.cls in (tuple, list) else super().as_constant()

    def describe(self):
        return f"{self.cls.__name__}[{', '.join(i.describe() for i in self.items)}]"

    def unpack(self, tx):
        return list(self.items)

    def truthy(self, tx):
        return _truthy_by_overrides(tx, self) if self.cls is not self.base_type else len(self.items) > 0

    def override(self, name: str):
        if self.cls is self.base_type:
            return None
        return _user_override(self.cls, self.base_type, name)

    def getitem(self, tx, index: Value) -> Value:
        idx = index.as_constant()
        if isinstance(idx, slice):
            return type(self)(self.items[idx], None, self.base_type)
        try:
            return self.items[operator.index(idx)]
        except IndexError:
            # (the items are a Python list: eager names the sequence's own type)
            what = "tuple" if issubclass(self.base_type, tuple) else "list"
            raise tx.user_exception(IndexError(f"{what} index out of range")) from None

    def getattr(self, tx, name):
        fn = self.override(name)
        if fn is not None:
            return tx.bind_user_attribute(self, fn, name)
        if hasattr(self.base_type, name):
            return MethodValue(self, name)
        if self.source is not None and self.cls is not self.base_type:
            return tx.wrap_attribute(self, name)
        raise Unsupported(f"attribute {name!r} of {self.cls.__name__}")

    def call_method(self, tx, name, args, kwargs):
        fn = self.override(name)
        if fn is not None:
            return tx.bind_user_attribute(self, fn, name).call(tx, args, kwargs)
        return self.base_method(tx, name, args, kwargs)

    def base_method(self, tx, name, args, kwargs):
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__len__":
            return ConstantValue(len(self.items))
        if name == "__contains__":
            return ConstantValue(tx.contains(self.items, args[0]))
        if name == "index" and not kwargs and 1 <= len(args) <= 3:
            bounds = [_index_bound(tx, a) for a in args[1:]]
            start, stop, _ = slice(*bounds if len(bounds) == 2 else (*bounds, None)).indices(len(self.items)) \
                if bounds else (0, len(self.items), 1)
            for i in range(start, stop):
                if tx.values_equal(self.items[i], args[0]):
                    return ConstantValue(i)
            if self.base_type is tuple:
                raise tx.user_exception(ValueError("tuple.index(x): x not in tuple"))
            x = args[0]
            shown = repr(x.as_constant()) if x.is_constant() else x.describe()
            raise tx.user_exception(ValueError(f"{shown} is not in list"))
        if name == "count" and not kwargs:
            return ConstantValue(sum(1 for i in self.items if tx.values_equal(i, args[0])))
        if name == "__iter__":
            it = IteratorValue(list(self.items))
            it.over_tuple = self.base_type is tuple
            return it
        raise Unsupported(f"{self.cls.__name__}.{name}()")

    def reconstruct(self, cg):
        if self.source is not None and self.base_type in (list, tuple):
            return cg.source_expr(self.source)      # (a tuple read from outside: the same object)
        # one object however many times it is referenced (``t is u``, an attribute set on it)
        return cg.stash(self, lambda: self._build(cg))

    def _build(self, cg):
        inner = [i.reconstruct(cg) for i in self.items]
        if self.base_type is tuple:
            body = "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"
        else:
            body = "[" + ", ".join(inner) + "]"
        if self.cls is self.base_type:
            return body
        return f"{cg.bind(self.cls)}({body})"


class TupleValue(BaseSequenceValue):
    base_type = tuple

    def real_object(self):
        return None


class NamedTupleValue(TupleValue):
    """A namedtuple (collections / typing) or a torch.return_types structseq."""

    def getattr(self, tx, name):
        fields = getattr(self.cls, "_fields", None) or _structseq_fields(self.cls)
        if fields and name in fields:
            return self.items[fields.index(name)]
        attr = None
        for klass in self.cls.__mro__:
            if klass is tuple:
                break
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                break
        if attr is not None:
            if isinstance(attr, (staticmethod, classmethod, property)) or callable(attr):
                return tx.bind_user_attribute(self, attr, name)
            return tx.wrap_pure_result(attr)
        return super().getattr(tx, name)

    def reconstruct(self, cg):
        if self.source is not None:     # (immutable: the object read is the value; some
            return cg.source_expr(self.source)      # structseqs, sys.version_info, cannot be made)

        def build():
            inner = ", ".join(i.reconstruct(cg) for i in self.items)
            if hasattr(self.cls, "_make"):
                return f"{cg.bind(self.cls)}._make(({inner},))"
            return f"{cg.bind(self.cls)}(({inner},))"
        return cg.stash(self, build)


def _structseq_fields(cls) -> list[str] | None:
    # torch.return_types.* are structseqs: __match_args__ lists the fields in order
    names = getattr(cls, "__match_args__", None)
    return list(names) if names else None


class ListValue(MadeInOrder, BaseSequenceValue):
    base_type = list

    def __init__(self, items, source=None, cls=None):
        super().__init__(items, source, cls)

    def _mutate(self, tx):
        tx.output.side_effects.mutated(self)

    def base_method(self, tx, name, args, kwargs):
        _check_list_arguments(tx, name, args, kwargs)
        if name in ("insert", "pop", "__setitem__", "__delitem__"):
            if args and not args[0].is_constant():
                raise Unsupported(f"list.{name} at an index that is not a Python constant ({args[0].describe()})")
            try:
                return self._positional_method(tx, name, args)
            except (IndexError, TypeError, ValueError) as e:     # (eager's, on the same list)
                raise tx.user_exception(e)
        if name == "append" and len(args) == 1:
            self._mutate(tx)
            self.items.append(args[0])
            return ConstantValue(None)
        if name == "extend" and len(args) == 1:
            self._mutate(tx)
            for item in tx.each_item(args[0]):     # (a generator may read the list as it grows)
                self.items.append(item)
            return ConstantValue(None)
        if name == "remove" and len(args) == 1:
            for i, item in enumerate(self.items):
                if tx.values_equal(item, args[0]):
                    self._mutate(tx)
                    del self.items[i]
                    return ConstantValue(None)
            raise tx.user_exception(ValueError("list.remove(x): x not in list"))
        if name == "clear":
            self._mutate(tx)
            self.items.clear()
            return ConstantValue(None)
        if name == "reverse":
            self._mutate(tx)
            self.items.reverse()
            return ConstantValue(None)
        if name == "copy":
            return ListValue(list(self.items))
        if name == "sort":
            key = kwargs.get("key")
            reverse = kwargs.get("reverse", ConstantValue(False)).as_constant()
            # CPython empties the list while it sorts: the key function sees [], and what it
            # adds is dropped (then ValueError); the items come back, sorted or (on an error) not
            saved = list(self.items)
            self._mutate(tx)
            self.items.clear()
            result = saved
            try:
                if key is not None and not (key.is_constant() and key.as_constant() is None):
                    key_values = [tx.call(key, [i], {}) for i in saved]
                else:
                    key_values = list(saved)
                if not all(k.is_constant() for k in key_values):
                    raise Unsupported("list.sort() by keys that are not Python constants")
                keys = [k.as_constant() for k in key_values]
                try:
                    order = sorted(range(len(saved)), key=lambda j: keys[j], reverse=reverse)
                except TypeError as e:      # (eager's: keys that do not compare)
                    raise tx.user_exception(e)
                result = [saved[j] for j in order]
                modified = bool(self.items)
            finally:
                self.items[:] = result
            if modified:
                raise tx.user_exception(ValueError("list modified during sort"))
            return ConstantValue(None)
        if name == "__iter__":
            return IteratorValue(self, live=True)
        return super().base_method(tx, name, args, kwargs)

    def _positional_method(self, tx, name, args):
        """insert, pop, item assignment and deletion at a constant index (or slice)."""
        if name == "insert":
            idx = operator.index(args[0].as_constant())
            self._mutate(tx)
            self.items.insert(idx, args[1])
            return ConstantValue(None)
        if name == "pop":
            idx = operator.index(args[0].as_constant()) if args else -1
            if not self.items:
                raise IndexError("pop from empty list")
            if not -len(self.items) <= idx < len(self.items):
                raise IndexError("pop index out of range")      # (before any change, as eager)
            item = self.items[idx]
            self._mutate(tx)
            del self.items[idx]
            return item
        idx = args[0].as_constant()
        if not isinstance(idx, slice):
            idx = operator.index(idx) if not isinstance(idx, (str, float)) else idx
            try:
                self.items[idx]          # (eager's IndexError or TypeError, nothing changed yet)
            except IndexError:
                raise IndexError("list assignment index out of range") from None
        if name == "__delitem__":
            self._mutate(tx)
            del self.items[idx]
            return ConstantValue(None)
        if isinstance(idx, slice):
            new = tx.unpack_iterable(args[1])
            if idx.step not in (None, 1) and len(range(*idx.indices(len(self.items)))) != len(new):
                raise ValueError(f"attempt to assign sequence of size {len(new)} to extended slice of size "
                                 f"{len(range(*idx.indices(len(self.items))))}")
            self._mutate(tx)
            self.items[idx] = new
        else:
            self._mutate(tx)
            self.items[idx] = args[1]
        return ConstantValue(None)


# list methods: (least, most) positional arguments; keywords taken (sort's only)
_LIST_ARITY = {"append": (1, 1), "extend": (1, 1), "insert": (2, 2), "pop": (0, 1), "remove": (1, 1),
               "clear": (0, 0), "reverse": (0, 0), "copy": (0, 0), "sort": (0, 0), "count": (1, 1),
               "index": (1, 3), "__setitem__": (2, 2), "__delitem__": (1, 1)}


def _check_list_arguments(tx, name: str, args, kwargs) -> None:
    """eager's TypeError for a list method called with arguments it does not take."""
    if name not in _LIST_ARITY:
        return
    least, most = _LIST_ARITY[name]
    allowed = ("key", "reverse") if name == "sort" else ()
    for k in kwargs:
        if k not in allowed:
            raise tx.user_exception(TypeError(f"list.{name}() takes no keyword arguments" if not allowed
                                              else f"sort() got an unexpected keyword argument {k!r}"))
    n = len(args)
    if least <= n <= most:
        return
    if name == "sort":
        raise tx.user_exception(TypeError("sort() takes no positional arguments"))
    if most == 0:
        raise tx.user_exception(TypeError(f"list.{name}() takes no arguments ({n} given)"))
    if least == most == 1:
        raise tx.user_exception(TypeError(f"list.{name}() takes exactly one argument ({n} given)"))
    if least == most:
        raise tx.user_exception(TypeError(f"{name} expected {least} arguments, got {n}"))
    bound, m = ("at most", most) if n > most else ("at least", least)
    raise tx.user_exception(TypeError(f"{name} expected {bound} {m} argument{'s' * (m != 1)}, got {n}"))


# dict methods: (least, most) positional arguments, and the keyword arguments taken
_DICT_ARITY = {"__getitem__": (1, 1, ()), "get": (1, 2, ()), "__contains__": (1, 1, ()), "__len__": (0, 0, ()),
               "keys": (0, 0, ()), "values": (0, 0, ()), "items": (0, 0, ()), "__iter__": (0, 0, ()),
               "copy": (0, 0, ()), "__setitem__": (2, 2, ()), "__delitem__": (1, 1, ()),
               "setdefault": (1, 2, ()), "pop": (1, 2, ()), "popitem": (0, 0, ()), "update": (0, 1, None),
               "clear": (0, 0, ()), "move_to_end": (1, 2, ("last",))}
_ORDERED_DICT_ARITY = {"popitem": (0, 1, ("last",))}


def _check_dict_arguments(tx, cls: type, name: str, args, kwargs) -> None:
    """eager's TypeError for a dict method called with arguments it does not take."""
    ordered = issubclass(cls, collections.OrderedDict)
    least, most, keywords = (ordered and _ORDERED_DICT_ARITY.get(name)) or _DICT_ARITY.get(name, (0, 99, None))
    if keywords is not None:
        for k in kwargs:
            if k not in keywords:
                raise tx.user_exception(TypeError(f"{name}() got an unexpected keyword argument {k!r}")
                                        if keywords else TypeError(f"{cls.__name__}.{name}() takes no keyword arguments"))
    given = len(args) + sum(1 for k in kwargs if keywords and k in keywords)
    if least <= given <= most:
        return
    if most == 0:
        raise tx.user_exception(TypeError(f"{cls.__name__}.{name}() takes no arguments ({given} given)"))
    if least == most == 1:
        raise tx.user_exception(TypeError(f"{cls.__name__}.{name}() takes exactly one argument ({given} given)"))
    bound, n = ("at most", most) if given > most else ("at least", least)
    raise tx.user_exception(TypeError(f"{name} expected {bound} {n} argument{'s' * (n != 1)}, got {given}"))


def _index_bound(tx, v: Value) -> int | None:
    """A start or stop of ``list.index``: an int, or what has ``__index__``."""
    if not v.is_constant():
        raise Unsupported(f"list.index with a bound that is not a Python constant ({v.describe()})")
    c = v.as_constant()
    try:
        return operator.index(c)
    except TypeError:
        raise tx.user_exception(TypeError("slice indices must be integers or have an __index__ method")) from None


class DictValue(MadeInOrder, Value):
    """A dict with keys known at capture time (Python constants or objects by identity)."""

    def __init__(self, items: dict, source=None, cls: type = dict, key_values: dict | None = None):
        self.items = dict(items)      # key (hashable Python object) -> Value
        self.source = source
        self.cls = cls
        self.default_factory: Value | None = None   # collections.defaultdict
        # the real __dict__ of an existing instance of a dict subclass (read-only here:
        # setting attributes on it is not modelled), else None
        self.instance_attrs: dict | None = None

    def python_type(self):
        return self.cls

    def describe(self):
        return f"{self.cls.__name__}{{{', '.join(f'{k!r}: {v.describe()}' for k, v in self.items.items())}}}"

    def merged_items(self) -> dict:
        """What ``dict.update(self)``, ``dict(self)`` and ``**self`` copy: the storage, unless
        the class overrides ``__iter__`` (CPython then goes through ``keys()`` and
        ``__getitem__``, the class's own code: it runs natively)."""
        if self.override("__iter__") is not None:
            raise Unsupported(f"copying {self.describe()}, whose class overrides __iter__")
        return self.items

    def override(self, name):
        if self.cls is dict:
            return None
        base = collections.OrderedDict if issubclass(self.cls, collections.OrderedDict) else dict
        return _user_override(self.cls, base, name)

    def unpack(self, tx):
        return [tx.key_value(k) if isinstance(k, Value) or not _is_const_key(k) else ConstantValue(k)
                for k in self.items]

    def truthy(self, tx):
        return _truthy_by_overrides(tx, self) if self.cls is not dict else len(self.items) > 0

    def _mutate(self, tx):
        tx.output.side_effects.mutated(self)

    def getattr(self, tx, name):
        fn = self.override(name)
        if isinstance(fn, property):
            return tx.bind_user_attribute(self, fn, name)
        if self.instance_attrs is not None and name in self.instance_attrs and self.source is not None:
            # an attribute of an existing dict-subclass instance (a dataclass field of a
            # ModelOutput): its __dict__ shadows the class, as in Python
            return tx.wrap(self.instance_attrs[name], AttrSource(self.source, name))
        if fn is not None and (callable(fn) or isinstance(fn, (staticmethod, classmethod))):
            return tx.bind_user_attribute(self, fn, name)
        if name == "default_factory" and issubclass(self.cls, collections.defaultdict):
            return self.default_factory if self.default_factory is not None else ConstantValue(None)
        if hasattr(dict, name) or hasattr(self.cls, name) and not name.startswith("_") \
                and callable(getattr(self.cls, name)):
            return MethodValue(self, name)
        if self.source is not None and self.cls is not dict:
            if self.instance_attrs is not None and name not in self.instance_attrs and _plain_lookup(self.cls, name):
                # in neither the instance's __dict__ nor its class, with Python's own lookup:
                # AttributeError, guarded to stay missing (a later call's object may have it)
                guard_attribute_absent(tx, self, self.cls, name)
                raise tx.user_exception(AttributeError(
                    f"'{self.cls.__name__}' object has no attribute '{name}'"))
            raise Unsupported(f"attribute {name!r} of {self.cls.__name__} (not a method, not in its __dict__)")
        raise Unsupported(f"attribute {name!r} of {self.cls.__name__}")

    def call_method(self, tx, name, args, kwargs):
        fn = self.override(name)
        if fn is not None:
            return tx.bind_user_attribute(self, fn, name).call(tx, args, kwargs)
        return self.base_method(tx, name, args, kwargs)

    def key_of(self, tx, v: Value):
        return tx.dict_key(v)

    def base_method(self, tx, name, args, kwargs):
        _check_dict_arguments(tx, self.cls, name, args, kwargs)
        items = self.items
        if name == "__getitem__" and len(args) == 1:
            k = self.key_of(tx, args[0])
            if k not in items:
                # a subclass's own __missing__ first (it replaces defaultdict's, which calls
                # the default factory)
                missing = _user_override(self.cls, dict, "__missing__") if self.cls is not dict else None
                if isinstance(missing, types.FunctionType):
                    return tx.bind_user_attribute(self, missing, "__missing__").call(tx, args, {})
                if self.default_factory is not None:
                    self._mutate(tx)
                    items[k] = tx.call(self.default_factory, [], {})
                    return items[k]
                if missing is not None and missing is not collections.defaultdict.__missing__:
                    raise Unsupported(f"{self.describe()}[{k!r}] through a __missing__ that is not Python")
                raise tx.user_exception(KeyError(k))
            return items[k]
        if name == "get":
            k = self.key_of(tx, args[0])
            return items.get(k, args[1] if len(args) > 1 else ConstantValue(None))
        if name == "__contains__":
            return ConstantValue(self.key_of(tx, args[0]) in items)
        if name == "__len__":
            return ConstantValue(len(items))
        if name == "keys":
            return DictViewValue(self, "keys")
        if name == "values":
            return DictViewValue(self, "values")
        if name == "items":
            return DictViewValue(self, "items")
        if name == "__iter__":
            return ContainerIteratorValue(tx, self, "keys")
        if name == "copy":
            # dict.copy() of a subclass is a dict; OrderedDict and defaultdict copy their type
            # (a subclass of those, through its own constructor: not modelled)
            if issubclass(self.cls, (collections.OrderedDict, collections.defaultdict)) and \
                    self.cls not in (collections.OrderedDict, collections.defaultdict):
                raise Unsupported(f"{self.cls.__name__}.copy() (its class's constructor makes the copy)")
            cls = self.cls if self.cls in (collections.OrderedDict, collections.defaultdict) else dict
            copied = DictValue(items, None, cls)
            copied.default_factory = self.default_factory if cls is collections.defaultdict else None
            return copied
        if name in ("__setitem__",) and len(args) == 2:
            self._mutate(tx)
            items[self.key_of(tx, args[0])] = args[1]
            return ConstantValue(None)
        if name == "__delitem__":
            self._mutate(tx)
            k = self.key_of(tx, args[0])
            if k not in items:
                raise tx.user_exception(KeyError(k))
            del items[k]
            return ConstantValue(None)
        if name == "setdefault":
            k = self.key_of(tx, args[0])
            if k not in items:
                self._mutate(tx)
                items[k] = args[1] if len(args) > 1 else ConstantValue(None)
            return items[k]
        if name == "pop":
            k = self.key_of(tx, args[0])
            if k in items:
                self._mutate(tx)
                return items.pop(k)
            if len(args) > 1:
                return args[1]
            raise tx.user_exception(KeyError(k))
        if name == "popitem":
            if not items:
                raise tx.user_exception(KeyError("popitem(): dictionary is empty"))
            last = (args[0] if args else kwargs.get("last", ConstantValue(True))).as_constant()
            self._mutate(tx)
            if last:
                k, v = items.popitem()
            else:
                k = next(iter(items))
                v = items.pop(k)
            return TupleValue([tx.key_value(k), v])
        if name == "update":
            self._mutate(tx)
            if args:
                other = args[0]
                if isinstance(other, DictValue):
                    items.update(other.merged_items())
                elif _has_keys(tx, other):
                    # a mapping (a MutableMapping, a dict-like object): its keys, each read
                    # with ``other[key]``, as dict.update does
                    keys = other if _abc_keys(other) else tx.call_method(other, "keys", [], {})
                    for k in tx.unpack_iterable(keys):
                        items[self.key_of(tx, k)] = tx.getitem(other, k)
                else:
                    for i, pair in enumerate(tx.each_item(other)):
                        kv = tx.unpack_iterable(pair)
                        if len(kv) != 2:
                            raise tx.user_exception(ValueError(
                                f"dictionary update sequence element #{i} has length {len(kv)}; 2 is required"))
                        items[self.key_of(tx, kv[0])] = kv[1]
            for k, v in kwargs.items():
                items[k] = v
            return ConstantValue(None)
        if name == "clear":
            self._mutate(tx)
            items.clear()
            return ConstantValue(None)
        if name == "move_to_end":
            self._mutate(tx)
            k = self.key_of(tx, args[0])
            last = (args[1] if len(args) > 1 else kwargs.get("last", ConstantValue(True))).as_constant()
            if k not in items:
                raise tx.user_exception(KeyError(k))
            v = items.pop(k)
            if last:
                items[k] = v
            else:
                self.items = {k: v, **items}
            return ConstantValue(None)
        raise Unsupported(f"{self.cls.__name__}.{name}()")

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        return cg.stash(self, lambda: self._build(cg))

    def _build(self, cg):
        body = "{" + ", ".join(f"{cg.key_expr(k)}: {v.reconstruct(cg)}" for k, v in self.items.items()) + "}"
        if self.cls is dict:
            return body
        if self.cls is collections.defaultdict:
            factory = self.default_factory.reconstruct(cg) if self.default_factory is not None else "None"
            return f"{cg.bind(collections.defaultdict)}({factory}, {body})"
        return f"{cg.bind(self.cls)}({body})"


def _is_const_key(k) -> bool:
    return is_constant_object(k)


class NewDictObjectValue(DictValue):
    """An instance of a dict subclass created during capture whose class has its own
    ``__init__``/``__setattr__`` (a dataclass such as transformers' ModelOutput): dict storage
    plus instance attributes, both symbolic; rebuilt with ``cls.__new__`` if it escapes."""

    def __init__(self, cls: type):
        super().__init__({}, None, cls)
        self.attrs: dict[str, Value] = {}

    def describe(self):
        return f"new {self.cls.__name__}"

    def _storage_base(self):
        return collections.OrderedDict if issubclass(self.cls, collections.OrderedDict) else dict

    def getattr(self, tx, name):
        return get_attribute(tx, self, name, self.object_getattr)

    def object_getattr(self, tx, name):
        from .objects import (_MISSING, _is_data_descriptor,  # cycle: objects use containers
                              class_dict_source, static_lookup)

        cls_attr = static_lookup(self.cls, name)
        if isinstance(cls_attr, property):
            return tx.call_function_value(cls_attr.fget, [self])
        if name in self.attrs and not _is_data_descriptor(cls_attr):
            return self.attrs[name]
        if name == "__dict__":
            view = DictValue({})
            view.items = self.attrs  # a live view of the instance attributes
            return view
        if name == "__class__":
            from .objects import ClassValue  # cycle: objects use containers

            return ClassValue(self.cls)
        if cls_attr is _MISSING:
            guard_classes_lack(tx, self.cls.__mro__, name)     # (a later call's class may have it)
            raise tx.user_exception(AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'"))
        if callable(cls_attr) or isinstance(cls_attr, (staticmethod, classmethod)):
            return super().getattr(tx, name)
        return tx.wrap(cls_attr, class_dict_source(self.cls, name))

    def setattr(self, tx, name, value):
        set_attribute(tx, self, name, value, self.object_setattr)

    def object_setattr(self, tx, name, value):
        from .objects import store_on_new_object  # cycle: objects use containers

        store_on_new_object(tx, self, name, value)

    def delattr(self, tx, name):
        del_attribute(tx, self, name, self.object_delattr)

    def object_delattr(self, tx, name):
        from .objects import static_lookup  # cycle: objects use containers

        if descriptor_delete(tx, self, self.cls, name, static_lookup(self.cls, name)):
            return
        if name not in self.attrs:
            raise tx.user_exception(AttributeError(name))
        del self.attrs[name]

    def reconstruct(self, cg):
        def build():
            items = "{" + ", ".join(f"{cg.key_expr(k)}: {v.reconstruct(cg)}" for k, v in self.items.items()) + "}"
            attrs = "{" + ", ".join(f"{k!r}: {v.reconstruct(cg)}" for k, v in self.attrs.items()) + "}"
            return (f"{cg.bind(_new_dict_object)}({cg.bind(self.cls)}, {cg.bind(self._storage_base())}, "
                    f"{items}, {attrs})")
        return cg.stash(self, build)


def store_items(base: type, d: dict, items: dict) -> None:
    """``items`` into ``d``'s storage through ``base``'s own ``__setitem__`` (OrderedDict's
    ``update`` is Python and calls ``self[k] = v``: a subclass's override, an LRU cache's
    counter and eviction, which the captured program already ran)."""
    if base is dict:
        dict.update(d, items)
        return
    for k, v in items.items():
        base.__setitem__(d, k, v)


def _new_dict_object(cls, base, items, attrs):
    obj = cls.__new__(cls)
    store_items(base, obj, items)
    obj.__dict__.update(attrs)
    return obj


class DictViewValue(Value):
    def __init__(self, d: DictValue, kind: str):
        self.d = d
        self.kind = kind

    def python_type(self):
        return type(getattr({}, self.kind)())

    def unpack(self, tx):
        keys = self.d.unpack(tx)
        if self.kind == "keys":
            return keys
        vals = list(self.d.items.values())
        if self.kind == "values":
            return vals
        return [TupleValue([k, v]) for k, v in zip(keys, vals)]

    def truthy(self, tx):
        return bool(self.d.items)


    def call_method(self, tx, name, args, kwargs):
        if name == "__len__":
            return ConstantValue(len(self.d.items))
        if name == "__contains__" and self.kind == "keys":
            return ConstantValue(tx.dict_key(args[0]) in self.d.items)
        if name == "__iter__":
            return ContainerIteratorValue(tx, self.d, self.kind)
        if name == "__contains__":
            return ConstantValue(tx.contains(self.unpack(tx), args[0]))
        raise Unsupported(f"dict_{self.kind}.{name}()")

    def getattr(self, tx, name):
        if name == "mapping":
            raise Unsupported(f"dict_{self.kind}.mapping (a read-only proxy of the dict)")
        if not hasattr(self.python_type(), name):
            raise tx.user_exception(AttributeError(f"'dict_{self.kind}' object has no attribute '{name}'"))
        return MethodValue(self, name)

    def equals(self, tx, other: Value) -> bool:
        """``==`` as dict views define it: keys and items views are set-like, a values view
        equals only itself."""
        if self.kind == "values" or isinstance(other, DictViewValue) and other.kind == "values":
            return other is self
        if isinstance(other, DictViewValue) and other.kind == self.kind:
            if self.kind == "keys":
                return self.d.items.keys() == other.d.items.keys()
            return self.d.items.keys() == other.d.items.keys() and all(
                tx.values_equal(v, other.d.items[k]) for k, v in self.d.items.items())
        if self.kind == "keys" and isinstance(other, SetValue):
            return self.d.items.keys() == other.items.keys()
        if self.kind == "keys" and other.is_constant() and isinstance(other.as_constant(), (set, frozenset)):
            return self.d.items.keys() == other.as_constant()
        if self.kind == "items" and isinstance(other, SetValue):
            if not (self.d.is_constant() and other.is_constant()):
                raise Unsupported("== of a dict's items and a set of values that are not constants")
            return {k: v.as_constant() for k, v in self.d.items.items()}.items() == other.as_constant()
        return False

    def set_operation(self, tx, op, other: Value, reflected: bool) -> "SetValue":
        """``keys | x``, ``&``, ``-``, ``^`` of a keys view: a new set, as eager returns."""
        mine = dict(self.d.items) if self.kind == "keys" else None
        if mine is None:
            raise Unsupported(f"set operator on dict_{self.kind}")
        theirs = {tx.dict_key(v): v for v in tx.unpack_iterable(other)}
        mine = {k: tx.key_value(k) for k in mine}
        a, b = (theirs, mine) if reflected else (mine, theirs)
        keys = op(a.keys(), b.keys())       # (a real set: eager's order)
        return SetValue(set_members(keys, [a, b]), keys=keys)

    def reconstruct(self, cg):
        # the view of the rebuilt (or the existing) dict, through the storage class's method
        base = collections.OrderedDict if issubclass(self.d.cls, collections.OrderedDict) else dict
        return cg.stash(self, lambda: f"{cg.bind(getattr(base, self.kind))}({self.d.reconstruct(cg)})")


class SetValue(MadeInOrder, Value):
    """A set of hashable capture-time values (constants, or existing objects by identity).

    ``items`` maps each member's key (the hashable Python object) to the Value it came from;
    ``keys`` holds the same keys in a real set that every operation changes as eager changes
    its set, so that iterating, ``pop()`` and the member kept among equal ones (``{1, 1.0}``)
    follow eager's hash order and insertion history. Keys that stand for tensors hash by the
    value's identity, not the tensor's address: such a set iterates in insertion order (eager's
    order for those depends on addresses)."""

    def __init__(self, items, cls: type = set, source=None, keys=None):
        self.items: dict = items if isinstance(items, dict) else {k: ConstantValue(k) for k in items}
        self.cls = cls
        self.source = source
        self.keys = keys if keys is not None else set(self.items)
        # built by adds alone, in ``items``' order: adding them again in that order lays out a
        # new set as eager's (its iteration order where hashes collide); a copy or a set
        # operation's result keeps its layout only in the real set ``keys``
        self.added_only = keys is None
        # ``items`` in the iteration order of the real set they were read from, untouched since
        # (a copy of that set may be laid out otherwise)
        self.real_order = False

    @classmethod
    def of(cls, tx, values, set_cls: type = set) -> "SetValue":
        """The set of ``values`` added in order (the first of equal members is kept)."""
        s = cls({}, set_cls)
        for v in values:
            s._add(tx.dict_key(v), v)
        return s

    def _add(self, k, v) -> None:
        self.items.setdefault(k, v)
        self.keys.add(k)
        self.real_order = False

    def _in_order(self) -> list:
        """The keys in eager's iteration order (see the class)."""
        if self.real_order or any(isinstance(k, Value) for k in self.items):
            return list(self.items)
        return list(self.keys)

    def override(self, name: str):
        base = frozenset if issubclass(self.cls, frozenset) else set
        return None if self.cls is base else _user_override(self.cls, base, name)

    def python_type(self):
        return self.cls

    def is_constant(self):
        return all(v.is_constant() for v in self.items.values())

    def as_constant(self):
        return self.cls(self._in_order())

    def members(self) -> list:
        """The members' values, in eager's iteration order."""
        return [self.items[k] for k in self._in_order()]

    def unpack(self, tx):
        return self.members()

    def truthy(self, tx):
        return _truthy_by_overrides(tx, self) if self.cls not in (set, frozenset) else bool(self.items)

    def getattr(self, tx, name):
        if not hasattr(self.cls, name):      # (frozenset has no add, discard, ...)
            raise tx.user_exception(AttributeError(f"{self.cls.__name__!r} object has no attribute {name!r}"))
        return MethodValue(self, name)

    def call_method(self, tx, name, args, kwargs):
        mutating = name in ("add", "discard", "remove", "pop", "update", "clear",
                            "difference_update", "intersection_update", "symmetric_difference_update")
        if kwargs:
            raise tx.user_exception(TypeError(f"set.{name}() takes no keyword arguments"))
        fixed = {"add": 1, "discard": 1, "remove": 1, "pop": 0, "clear": 0, "copy": 0, "__contains__": 1,
                 "__len__": 0, "__iter__": 0, "isdisjoint": 1, "issubset": 1, "issuperset": 1}
        if name in fixed and len(args) != fixed[name]:
            takes = "exactly one argument" if fixed[name] else "no arguments"
            raise tx.user_exception(TypeError(f"{self.cls.__name__}.{name}() takes {takes} ({len(args)} given)"))
        if mutating and self.source is not None:
            if self.cls is not set:   # (a subclass's own methods are not modelled)
                raise Unsupported(f"mutating a {self.cls.__name__} that existed before the call ({name})")
            tx.output.side_effects.mutated(self)   # written back after the graph
        if name == "__contains__":
            x = args[0]
            if isinstance(x, SetValue) and x.cls is set:    # (a set is looked up as a frozenset)
                return ConstantValue(frozenset(x._in_order()) in self.items)
            return ConstantValue(tx.dict_key(x) in self.items)
        if name == "__len__":
            return ConstantValue(len(self.items))
        if name == "__iter__":
            return ContainerIteratorValue(tx, self, "members")
        if name == "__init__":
            raise Unsupported(f"{self.cls.__name__}.__init__ called on an existing set")
        if name in ("isdisjoint", "issuperset") and not isinstance(args[0], SetValue):
            # eager takes the other's items one at a time and stops at the deciding one
            it = tx.get_iter(args[0])
            while (v := it.next(tx)) is not None:
                if (tx.dict_key(v) in self.items) == (name == "isdisjoint"):
                    return ConstantValue(False)
            return ConstantValue(True)
        if name == "add":
            self._add(tx.dict_key(args[0]), args[0])
            return ConstantValue(None)
        if name in ("discard", "remove"):
            k = tx.dict_key(args[0])
            if k not in self.items and name == "remove":
                raise tx.user_exception(KeyError(k))
            self.items.pop(k, None)
            self.keys.discard(k)
            self.added_only = self.real_order = False
            return ConstantValue(None)
        if name == "pop":
            if not self.items:
                raise tx.user_exception(KeyError("pop from an empty set"))
            k = self._in_order()[0] if any(isinstance(k, Value) for k in self.items) else self.keys.pop()
            self.keys.discard(k)
            self.added_only = self.real_order = False
            return self.items.pop(k)
        if name == "clear":
            self.items.clear()
            self.keys.clear()
            self.added_only = self.real_order = False
            return ConstantValue(None)
        if name == "copy":
            if self.cls is frozenset:
                return self         # (frozenset.copy() is the frozenset itself)
            return SetValue(dict(self.items), set, keys=set(self.keys))
        # the other operands as eager's set sees them: a set as its keys' set, any other
        # iterable as its keys in its own order
        others, pools = [], []
        for a in args:
            if isinstance(a, SetValue):
                others.append(a.keys)
                pools.append(a.items)
            else:
                values = tx.unpack_iterable(a)
                keys = [tx.dict_key(v) for v in values]
                others.append(keys)
                pools.append(dict(zip(keys, values)))
        try:
            result = getattr(self.keys, name)(*others)
        except (KeyError, TypeError, ValueError) as e:
            raise tx.user_exception(e)
        if name.endswith("_update") or name == "update":
            self.items = set_members(self.keys, [self.items, *pools])
            self.added_only = self.real_order = False
            return ConstantValue(None)
        if isinstance(result, (set, frozenset)):
            return SetValue(set_members(result, [self.items, *pools]), self.cls if self.cls in (set, frozenset)
                            else set, keys=result if type(result) is set else set(result))
        return tx.wrap_pure_result(result)

    def reconstruct(self, cg):
        if self.source is not None:
            return cg.source_expr(self.source)
        order = list(self.items) if self.added_only else self._in_order()
        inner = ", ".join(self.items[k].reconstruct(cg) for k in order)
        if self.cls is frozenset:
            # (built once: a frozenset made in the frame is one object wherever it is handed,
            # as ``copy.copy(x) is x`` sees; the empty one is CPython's singleton)
            return cg.stash(self, lambda: f"frozenset(({inner},))") if inner else "frozenset()"
        if not inner:
            return cg.stash(self, lambda: "set()")
        if self.added_only:
            # (``set((...))`` adds them one by one, in order, as they were added; a literal of
            # constants would be compiled into an update from a frozenset constant)
            return cg.stash(self, lambda: f"set(({inner},))")
        return cg.stash(self, lambda: f"{{{inner}}}")


def set_members(keys, pools: list) -> dict:
    """Each key of ``keys`` with the value it came from: the pool holding that very key object
    first (among equal members, the set kept one object), then any pool holding an equal one."""
    by_id = {}
    for pool in reversed(pools):
        by_id.update((id(k), v) for k, v in pool.items())
    out = {}
    for k in keys:
        v = by_id.get(id(k))
        if v is None:
            v = next(pool[k] for pool in pools if k in pool)
        out[k] = v
    return out


MAX_LAZY_ITEMS = 10_000


def identity_free(items: list) -> bool:
    """Whether a list's items are tensors and constants only. An iterator over such a list is
    handed over a graph break as a real one over the list (it sees what is appended after the
    break); over other objects (functions, modules, your objects) as what is left of it, a
    tuple: the list's every item would otherwise be guarded, by identity, in the code after
    the break, which would then compile again for each call's new objects."""
    return all(isinstance(i, ConstantValue) or (isinstance(i.python_type(), type)
                                                and issubclass(i.python_type(), torch.Tensor)) for i in items)


def iterator_at(it, index: int):
    """The real list iterator ``it`` (``iter(xs)`` or ``reversed(xs)``) moved to ``index``."""
    it.__setstate__(index)
    return it


class IteratorKind:
    """What an iterator over items known at capture time is in eager (``enumerate(xs)``, a
    ``zip``, ``reversed(t)``, ``iter(s)``): its ``type()``, and the code of a real one of that
    type that yields the items it has left, for when it leaves the capture."""

    def __init__(self, cls: type, write: Callable):
        self.cls = cls
        self.write = write      # (cg, items left) -> expression


def _tuple_expr(parts: list) -> str:
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def enumerate_kind(start: int) -> IteratorKind:
    """``enumerate(xs, start)``: its items are ``(i, x)`` pairs; one that has items left is
    written as ``enumerate(those x, their first i)``."""
    def write(cg, rows):
        first = rows[0].items[0].as_constant() if rows else start
        return f"{cg.bind(enumerate)}({_tuple_expr([r.items[1].reconstruct(cg) for r in rows])}, {first})"
    return IteratorKind(enumerate, write)


def zip_kind(width: int) -> IteratorKind:
    """``zip`` of ``width`` iterables: what is left is written as a zip of its columns."""
    def write(cg, rows):
        columns = [_tuple_expr([r.items[k].reconstruct(cg) for r in rows]) for k in range(width)]
        return f"{cg.bind(zip)}({', '.join(columns)})"
    return IteratorKind(zip, write)


def reversed_kind() -> IteratorKind:
    """``reversed()`` of a tuple, a string or a user sequence (a ``reversed`` object)."""
    def write(cg, items):
        return f"{cg.bind(reversed)}({_tuple_expr([v.reconstruct(cg) for v in reversed(items)])})"
    return IteratorKind(reversed, write)


def str_iterator_kind(s: str) -> IteratorKind:
    """``iter(s)`` of a string (``str_ascii_iterator`` for an ASCII one): what is left is
    written as the iterator of the rest of the string."""
    def write(cg, items):
        return f"{cg.bind(iter)}({cg.constant_expr(''.join(v.as_constant() for v in items))})"
    return IteratorKind(type(iter(s)), write)


class IteratorValue(MadeInOrder, Value):
    """An iterator over a known list of values (or live over a ListValue)."""

    def __init__(self, items, live: bool = False, real=None, source=None, start: int = 0,
                 kind: IteratorKind | None = None):
        self.seq = items
        self.live = live
        self.pos = start
        self.start = start      # (a real iterator passed in is advanced by pos - start)
        self.exhausted = False  # CPython's sequence iterators stay exhausted once they ended
        self.real = real        # a real iterator passed in: advanced afterwards (side effect)
        self.source = source
        self.kind = kind        # (what eager's iterator is: enumerate, zip...; None: a list's)

    # an iterator whose items are computed as they are taken (a generator, a user iterator):
    # a consumer with effects of its own takes them one at a time, as eager does
    lazy = False

    def take_all(self, tx) -> list:
        """Every item left, taken one ``next`` at a time (how a lazy iterator unpacks)."""
        items = []
        while (v := self.next(tx)) is not None:
            items.append(v)
            if len(items) > MAX_LAZY_ITEMS:     # (one that never stops would unroll forever)
                raise Unsupported(f"{self.describe()} gave more than {MAX_LAZY_ITEMS} items")
        return items

    def python_type(self):
        if self.real is not None:
            return type(self.real)
        if self.kind is not None:
            return self.kind.cls
        return type(iter(())) if self.over_tuple else type(iter([]))

    over_tuple = False      # (set on an iterator a tuple made: type() is tuple_iterator)

    def _items(self):
        return self.seq.items if self.live else self.seq

    def handed_over_items(self) -> int:
        """How many items a graph break hands to the continuation (and guards): those left."""
        return 0 if self.exhausted else max(len(self._items()) - self.pos, 0)

    def next(self, tx) -> Value | None:
        items = self._items()
        if self.exhausted or self.pos >= len(items):
            # (a list appended to after its iterator ended: the iterator yields nothing more)
            if self.live and not self.exhausted:
                self.exhausted = True
                if self.real is not None:
                    tx.output.side_effects.mutated(self)
            return None
        v = items[self.pos]
        self.pos += 1
        if self.real is not None:
            tx.output.side_effects.mutated(self)
        return v

    def unpack(self, tx):
        items = [] if self.exhausted else self._items()[self.pos:]
        self.pos = len(self._items())
        self.exhausted = self.live
        if self.real is not None and items:
            tx.output.side_effects.mutated(self)
        return list(items)

    def truthy(self, tx):
        return True

    def getattr(self, tx, name):
        return MethodValue(self, name)

    def reconstruct_remaining(self, cg) -> str:
        """The items not consumed yet, as a tuple (a continuation iterates over it); an
        iterator over a list is handed over as a real one over that list, at its position,
        which sees what is appended to the list after the break as eager's does."""
        if self._over_list():
            return self.reconstruct(cg)
        items = [] if self.exhausted else [i.reconstruct(cg) for i in self._items()[self.pos:]]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    def _over_list(self) -> bool:
        return self.live and isinstance(self.seq, ListValue) and not self.exhausted \
            and self.seq.python_type() is list and identity_free(self.seq.items)

    def reconstruct(self, cg):
        if self.real is not None and self.source is not None:
            return cg.source_expr(self.source)     # (advanced as far as the capture took it)
        if self._over_list():
            return cg.stash(self, lambda: f"{cg.bind(iterator_at)}({cg.bind(iter)}({self.seq.reconstruct(cg)}), {self.pos})")
        if self.kind is not None and not self.live:
            left = [] if self.exhausted else list(self._items()[self.pos:])
            return cg.stash(self, lambda: self.kind.write(cg, left))
        # (one object for every reference to it: a local and a zip over it share its items)
        return cg.stash(self, lambda: f"iter({self.reconstruct_remaining(cg)})")

    def call_method(self, tx, name, args, kwargs):
        if name == "__next__":
            v = self.next(tx)
            if v is None:
                raise tx.user_exception(StopIteration())
            return v
        if name == "__iter__":
            return self
        if name == "__contains__" and len(args) == 1:
            # ``x in iterator`` takes items until one equals x, and leaves the rest
            while (v := self.next(tx)) is not None:
                if tx.values_equal(v, args[0]):
                    return ConstantValue(True)
            return ConstantValue(False)
        raise Unsupported(f"iterator.{name}()")


class _RangeItems:
    """A range's items as constants, made as they are read: a loop over ``range(10**6)``
    takes its steps, not a million values up front."""
    __slots__ = ("range",)

    def __init__(self, r: range):
        self.range = r

    def __len__(self) -> int:
        return len(self.range)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [ConstantValue(v) for v in self.range[i]]
        return ConstantValue(self.range[i])


class RangeIteratorValue(IteratorValue):
    """``iter(range(...))``: CPython's range iterator. Handed over at a graph break as the
    range of the numbers left (one constant, whatever the loop's length)."""

    def handed_over_items(self) -> int:
        return 0        # (the range left: one constant)

    def __init__(self, r: range):
        super().__init__(_RangeItems(r))

    def python_type(self):
        return type(iter(self.seq.range))

    def reconstruct_remaining(self, cg) -> str:
        r = self.seq.range
        return cg.constant_expr(r[len(r):] if self.exhausted else r[self.pos:])


class ContainerIteratorValue(IteratorValue):
    """An iterator over a dict (its keys, values or items) or a set, as CPython's: each step
    reads the container as it is then (a value stored meanwhile is the one seen), and a change
    of its size since the iterator was made raises eager's RuntimeError, at every later step."""

    def __init__(self, tx, container: Value, kind: str):
        super().__init__([])
        self.container, self.kind, self.tx = container, kind, tx
        self.size = len(container.items)
        self._keys: list | None = None

    def _message(self) -> str:
        if isinstance(self.container, SetValue):
            return "Set changed size during iteration"
        if issubclass(self.container.cls, collections.OrderedDict):
            return "OrderedDict mutated during iteration"
        return "dictionary changed size during iteration"

    def python_type(self):
        if isinstance(self.container, SetValue):
            return type(iter(set()))
        return type(iter(getattr({}, self.kind)()))

    def _check(self, tx) -> None:
        if len(self.container.items) != self.size:
            self.size = -1          # (CPython's iterator keeps raising)
            raise tx.user_exception(RuntimeError(self._message()))

    def _order(self) -> list:
        """The container's keys in iteration order, kept while they stay its keys (a step
        costs no pass over the container; a key deleted and another added reorders)."""
        c = self.container
        keys = self._keys
        if keys is None or len(keys) != len(c.items) or not all(k in c.items for k in keys[self.pos:self.pos + 1]):
            keys = self._keys = list(c._in_order()) if isinstance(c, SetValue) else list(c.items)
        return keys

    def _item(self, i: int) -> Value:
        c = self.container
        k = self._order()[i]
        if isinstance(c, SetValue):
            return c.items[k]
        key = self.tx.key_value(k) if isinstance(k, Value) or not _is_const_key(k) else ConstantValue(k)
        if self.kind == "keys":
            return key
        return c.items[k] if self.kind == "values" else TupleValue([key, c.items[k]])

    def next(self, tx) -> Value | None:
        if self.pos >= self.size and self.size >= 0 and isinstance(self.container, DictValue) and \
                issubclass(self.container.cls, collections.OrderedDict):
            return None     # (OrderedDict's iterator stops after its last key before any check)
        self._check(tx)
        if self.pos >= self.size:
            return None
        v = self._item(self.pos)
        self.pos += 1
        return v

    def unpack(self, tx):
        self._check(tx)
        items = [self._item(i) for i in range(self.pos, self.size)]
        self.pos = self.size
        return items

    def _items(self):
        # (what a break hands over: the items as they are now, after those taken)
        if self.size != len(self.container.items):
            return self.seq
        self.seq = [None] * self.pos + [self._item(i) for i in range(self.pos, self.size)]
        return self.seq


def _plain_lookup(cls: type, name: str) -> bool:
    """True when ``name`` is nowhere on ``cls`` and nothing of the class's own code takes part
    in looking it up (no ``__getattr__``, ``object``'s ``__getattribute__``): an instance
    without it in its ``__dict__`` raises AttributeError."""
    return (static_lookup(cls, name) is _MISSING and static_lookup(cls, "__getattr__") is _MISSING
            and static_lookup(cls, "__getattribute__") is static_lookup(dict, "__getattribute__"))


def _has_keys(tx, v) -> bool:
    """Whether ``dict.update`` reads ``v`` as a mapping (it has ``keys``) or as pairs."""
    try:
        return hasattr(v.python_type(), "keys")
    except Unsupported:
        return tx.hasattr(v, "keys")


def _abc_keys(v) -> bool:
    """``v.keys()`` is ``collections.abc.Mapping``'s: a KeysView iterating ``v`` itself."""
    try:
        cls = v.python_type()
    except Unsupported:          # (a value that cannot name its type: it is asked for keys())
        return False
    return isinstance(cls, type) and static_lookup(cls, "keys") is collections.abc.Mapping.keys
