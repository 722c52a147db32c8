"""Sources: where a value captured from the outside world came from.

A source renders to a Python expression that, evaluated in a guard function with the user's
own signature, yields the same object again for a later call. Objects that cannot be named
by an expression over the arguments (the function's globals dict, its closure cells) are
bound into the generated code's namespace by ``RenderContext.bind``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any


class RenderContext:
    """Collects the objects a rendered expression refers to (names ``___k0``, ``___k1``...)."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {}
        self._by_id: dict[int, str] = {}
        # parameter names that are not identifiers (pytest's "@py_assert1") -> aliases
        self.local_alias: dict[str, str] = {}
        # sources already read into a local of the code being generated (guard_cse.py)
        self.locals: dict["Source", str] = {}

    def with_locals(self) -> "RenderContext":
        """A view that binds into the same namespace and renders the sources in ``locals``
        (filled by the caller) as those local names."""
        view = RenderContext.__new__(RenderContext)
        view.__dict__.update(self.__dict__)
        view.locals = {}
        return view

    def bind(self, obj: Any, hint: str = "k") -> str:
        name = self._by_id.get(id(obj))
        if name is None:
            name = f"___{hint}{len(self.namespace)}"
            self.namespace[name] = obj
            self._by_id[id(obj)] = name
        return name

    def constant_expr(self, v: Any) -> str:
        """``v`` as a literal where its repr reads back as itself, else bound (a class or a
        typing construct as a dict key, a float that is not finite)."""
        if v is None or isinstance(v, (bool, int, str)) and type(v) in (bool, int, str):
            return repr(v)
        if type(v) is float and math.isfinite(v):
            return repr(v)
        if type(v) is tuple:
            inner = ", ".join(self.constant_expr(x) for x in v)
            return f"({inner}{',' if len(v) == 1 else ''})"
        return self.bind(v, "c")


class Source:
    def render(self, ctx: RenderContext) -> str:
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs):
        # every source renders as the local it was read into, when the code being generated
        # has one (``RenderContext.locals``): a chain read once serves every guard below it
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("render")
        if own is None or getattr(own, "_reads_locals", False):
            return

        def render(self, ctx, _own=own):
            known = getattr(ctx, "locals", None)
            if known:
                try:
                    name = known.get(self)
                except TypeError:        # (an unhashable source: never read into a local)
                    name = None
                if name is not None:
                    return name
            return _own(self, ctx)
        render._reads_locals = True
        render.__doc__ = own.__doc__
        cls.render = render

    def describe(self) -> str:
        """Readable name used in logs and explain output: ``L['x'].weight``."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.describe()


@dataclasses.dataclass(frozen=True)
class LocalSource(Source):
    """An argument of the compiled function."""
    name: str

    def render(self, ctx):
        return ctx.local_alias.get(self.name, self.name)

    def describe(self):
        return f"L[{self.name!r}]"


@dataclasses.dataclass(frozen=True, eq=False)
class GlobalSource(Source):
    """``globals_dict[name]`` of the function that read it (top-level or inlined)."""
    globals_dict: dict
    name: str

    def __eq__(self, other):
        return (isinstance(other, GlobalSource) and other.globals_dict is self.globals_dict
                and other.name == self.name)

    def __hash__(self):
        return hash((id(self.globals_dict), self.name))

    def render(self, ctx):
        return f"{ctx.bind(self.globals_dict, 'G')}[{self.name!r}]"

    def describe(self):
        mod = self.globals_dict.get("__name__", "?")
        return f"G[{self.name!r}]" if mod == "__main__" else f"G({mod})[{self.name!r}]"


@dataclasses.dataclass(frozen=True, eq=False)
class CellSource(Source):
    """The contents of a closure cell that existed before the call."""
    cell: Any
    name: str

    def __eq__(self, other):
        return isinstance(other, CellSource) and other.cell is self.cell

    def __hash__(self):
        return hash(id(self.cell))

    def render(self, ctx):
        return f"{ctx.bind(self.cell, 'cell')}.cell_contents"

    def describe(self):
        return f"Closure[{self.name!r}]"


@dataclasses.dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    name: str

    def render(self, ctx):
        b = self.base.render(ctx)
        if self.name.isidentifier() and (not self.name.startswith("__") or self.name.endswith("__")):
            return f"{b}.{self.name}"
        return f"getattr({b}, {self.name!r})"

    def describe(self):
        return f"{self.base.describe()}.{self.name}"


# How an item is read. Reads of list/dict *storage* go through the base class so that a
# subclass overriding __getitem__ is not called by the guard (list subclasses).
ITEM_INDEX = "index"        # base[key] on an exact tuple/list/dict
ITEM_LIST = "list"          # list.__getitem__(base, key)
ITEM_DICT = "dict"          # dict.__getitem__(base, key)
ITEM_TUPLE = "tuple"        # tuple.__getitem__(base, key)


@dataclasses.dataclass(frozen=True)
class ItemSource(Source):
    base: Source
    key: Any
    how: str = ITEM_INDEX

    def render(self, ctx):
        b = self.base.render(ctx)
        key = ctx.constant_expr(self.key)
        if self.how == ITEM_INDEX:
            return f"{b}[{key}]"
        getter = {ITEM_LIST: list.__getitem__, ITEM_DICT: dict.__getitem__,
                  ITEM_TUPLE: tuple.__getitem__}[self.how]
        return f"{ctx.bind(getter, self.how + '_getitem')}({b}, {key})"

    def describe(self):
        return f"{self.base.describe()}[{self.key!r}]"


@dataclasses.dataclass(frozen=True, eq=False)
class DictKeySource(Source):
    """The key at ``position`` of a dict keyed by tensors (an optimizer's ``state``, keyed by
    its parameters). A DICT_KEYS_IDENTITY guard holds that the dict's keys are these very
    objects, in this order, so the key renders as the object itself."""
    base: Source
    position: int
    key: Any

    def __eq__(self, other):
        return isinstance(other, DictKeySource) and other.base == self.base and \
            other.position == self.position and other.key is self.key

    def __hash__(self):
        return hash((self.base, self.position, id(self.key)))

    def render(self, ctx):
        return ctx.bind(self.key, "key")

    def describe(self):
        return f"list({self.base.describe()}.keys())[{self.position}]"


@dataclasses.dataclass(frozen=True, eq=False)
class DictItemSource(Source):
    """``base[key]`` where ``key`` is an object compared by identity (a tensor), the dict's key
    at ``position``: read through the dict's storage, described by the position (a tensor's
    repr is its data)."""
    base: Source
    position: int
    key: Any
    how: str = ITEM_INDEX

    def __eq__(self, other):
        return isinstance(other, DictItemSource) and other.base == self.base and \
            other.position == self.position and other.key is self.key and other.how == self.how

    def __hash__(self):
        return hash((self.base, self.position, id(self.key), self.how))

    def render(self, ctx):
        b = self.base.render(ctx)
        key = ctx.bind(self.key, "key")
        if self.how == ITEM_INDEX:
            return f"{b}[{key}]"
        return f"{ctx.bind(dict.__getitem__, 'dict_getitem')}({b}, {key})"

    def describe(self):
        return f"{self.base.describe()}[list({self.base.describe()}.keys())[{self.position}]]"


@dataclasses.dataclass(frozen=True)
class TypeSource(Source):
    """``type(base)``: a class attribute reached through an instance."""
    base: Source

    def render(self, ctx):
        return f"type({self.base.render(ctx)})"

    def describe(self):
        return f"type({self.base.describe()})"


def is_argument_rooted(source: Source | None) -> bool:
    """True when the source is read from the call's arguments (not a global or a cell)."""
    while isinstance(source, (AttrSource, ItemSource, TypeSource)):
        source = source.base
    return isinstance(source, LocalSource)


@dataclasses.dataclass(frozen=True, eq=False)
class ConstSource(Source):
    """An object bound into the generated code by identity (used for objects reached through
    already-guarded paths, e.g. a function's ``__defaults__``)."""
    obj: Any

    def __eq__(self, other):
        return isinstance(other, ConstSource) and other.obj is self.obj

    def __hash__(self):
        return hash(id(self.obj))

    def render(self, ctx):
        return ctx.bind(self.obj, "k")

    def describe(self):
        return f"<{type(self.obj).__name__} {getattr(self.obj, '__qualname__', '')}>"


class CaptureObjectSource(ConstSource):
    """An object this capture built (a parameterless ``torch.nn`` module made in the compiled
    function): nothing outside the compiled code can reach or change it, so nothing read
    through it is guarded (a guard could only check the capture's own object again)."""


@dataclasses.dataclass(frozen=True)
class ReduceSource(Source):
    """``base.__reduce__()``: how a list/tuple/range iterator names its sequence and position."""
    base: Source

    def render(self, ctx):
        return f"{self.base.render(ctx)}.__reduce__()"

    def describe(self):
        return f"{self.base.describe()}.__reduce__()"


SIZE, STRIDE, STORAGE_OFFSET, IS_VIEW = "size", "stride", "storage_offset", "_is_view"


@dataclasses.dataclass(frozen=True)
class TensorPropertySource(Source):
    """A size, stride or storage offset of a tensor input (where a shape symbol is read), or
    whether it is a view."""
    base: Source
    prop: str                   # SIZE | STRIDE | STORAGE_OFFSET | IS_VIEW
    idx: int | None = None

    def render(self, ctx):
        b = self.base.render(ctx)
        return f"{b}.{self.prop}({'' if self.idx is None else self.idx})"

    def describe(self):
        if self.idx is None:
            return f"{self.base.describe()}.{self.prop}()"
        return f"{self.base.describe()}.{self.prop}()[{self.idx}]"


def _remember_hash(cls: type) -> None:
    """A source is hashed again and again while an entry's check is generated (every guard
    of a ResNet-50 looks up its whole access chain): the generated ``__hash__`` of a chain
    hashes every link below it each time. The hash of a frozen source cannot change, so it
    is computed once and kept on the instance."""
    computed = cls.__hash__

    def __hash__(self):
        try:
            return self.__dict__["_hash"]
        except KeyError:
            h = computed(self)        # (raises for an unhashable key: not kept, raised again)
            object.__setattr__(self, "_hash", h)
            return h
    cls.__hash__ = __hash__


for _cls in (LocalSource, AttrSource, ItemSource, TypeSource, ReduceSource, TensorPropertySource):
    _remember_hash(_cls)
