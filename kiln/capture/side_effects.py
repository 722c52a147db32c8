"""Side effects on objects that existed before the call.

During capture, mutations of pre-existing lists and dicts, attribute stores on pre-existing
objects and writes to pre-existing closure cells are applied to their symbolic values (so the
rest of the capture sees them) and recorded here. After the graph has run, the transformed
code writes the final state back, so the objects end exactly as eager would leave them.
Containers and objects created inside the frame need nothing: they are rebuilt if returned.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .values.base import Value
from .values.containers import DictValue, IteratorValue, ListValue, SetValue, store_items

if TYPE_CHECKING:  # pragma: no cover
    from .codegen import EntryCodegen


class SideEffects:
    def __init__(self) -> None:
        self.containers: list[Value] = []          # ListValue / DictValue / SetValue with a source
        self.attrs: dict[tuple[int, str], tuple[Value, str, Value]] = {}
        self.cells: dict[int, tuple[object, str, Value]] = {}
        # module globals assigned (STORE_GLOBAL, module.attr = v): (globals dict, name) -> value
        self.globals: dict[tuple[int, str], tuple[dict, str, Value]] = {}

        # while a higher-order op's body is traced (``watching``): every mutable value written
        # (a container, an iterator, a cell the frame made), existing before the body or not
        self.watching = 0
        self.written: list[Value] = []

    def mutated(self, container: Value) -> None:
        if self.watching:
            self.written.append(container)
        if container.source is not None and all(c is not container for c in self.containers):
            self.containers.append(container)

    def wrote(self, value: Value) -> None:
        """A write to a value of the frame's own (a cell it made), not written back."""
        if self.watching:
            self.written.append(value)

    def store_attr(self, obj: Value, name: str, value: Value, setter=setattr) -> None:
        """``obj.name = value`` as ``setter`` (``object.__setattr__``, ``nn.Module.__setattr__``)
        stores it: the class's own ``__setattr__`` already ran during capture, so the write
        back calls only the storage step, never the user's hook a second time."""
        self.attrs[(id(obj), name)] = (obj, name, value, setter)

    def attr_value(self, obj: Value, name: str) -> Value | None:
        hit = self.attrs.get((id(obj), name))
        return hit[2] if hit is not None else None

    def stores_on(self, obj: Value) -> bool:
        """Whether this capture set or deleted an attribute of ``obj`` (not yet written back)."""
        return any(entry[0] is obj for entry in self.attrs.values())

    def store_cell(self, cell, name: str, value: Value, cell_value: Value | None = None) -> None:
        self.cells[id(cell)] = (cell_value, name, value)

    def cell_value(self, cell) -> Value | None:
        hit = self.cells.get(id(cell))
        return hit[2] if hit is not None else None

    def store_global(self, fn_globals: dict, name: str, value: Value) -> None:
        self.globals[(id(fn_globals), name)] = (fn_globals, name, value)

    def take_globals(self, fn_globals: dict) -> list[tuple[str, Value]]:
        """The pending stores to the globals ``fn_globals``, removed from here (the dict itself
        is now a value of the capture, which holds them)."""
        taken = [(name, value) for (i, name), (_g, _n, value) in self.globals.items() if i == id(fn_globals)]
        for name, _ in taken:
            del self.globals[(id(fn_globals), name)]
        return taken

    def global_value(self, fn_globals: dict, name: str) -> Value | None:
        hit = self.globals.get((id(fn_globals), name))
        return hit[2] if hit is not None else None

    def count(self) -> tuple:
        """How many effects of each kind are recorded (changes when one is added)."""
        return (len(self.containers), len(self.attrs), len(self.cells), len(self.globals))

    def __bool__(self) -> bool:
        return bool(self.containers or self.attrs or self.cells or self.globals)

    def describe(self) -> list[str]:
        out = [f"mutate {c.source.describe()}" for c in self.containers]
        out += [f"set {o.source.describe()}.{n}" for o, n, _, _ in self.attrs.values()]
        out += [f"set closure cell {n}" for _, n, _ in self.cells.values()]  # noqa: E501
        out += [f"set global {g.get('__name__', '?')}.{n}" for g, n, _ in self.globals.values()]
        return out

    def codegen(self, cg: "EntryCodegen") -> tuple[list[str], list[str]]:
        """(prepare, apply): statements that evaluate every final state into locals, and
        statements that then write them back. All reads happen before any write, so a value
        read through a container (``xs[2]``) is read before that container changes."""
        prepare, apply = [], []

        def temp(expr: str) -> str:
            name = f"___eff{len(prepare)}"
            prepare.append(f"{name} = {expr}")
            return name

        advances = []       # (after the containers: an iterator over a list that grew)
        for c in self.containers:
            target = temp(cg.source_expr(c.source))
            if isinstance(c, IteratorValue):   # a real iterator: consume what the capture did
                advances.append(f"{cg.bind(_advance)}({target}, {c.pos - c.start}, {c.exhausted})")
                continue
            if isinstance(c, ListValue):
                items = temp("[" + ", ".join(i.reconstruct(cg) for i in c.items) + "]")
                apply.append(f"{cg.bind(list.__setitem__)}({target}, slice(None), {items})")
            elif isinstance(c, DictValue):
                body = temp("{" + ", ".join(f"{cg.key_expr(k)}: {v.reconstruct(cg)}"
                                            for k, v in c.items.items()) + "}")
                apply.append(f"{cg.bind(_dict_replace)}({target}, {body})")
            elif isinstance(c, SetValue):
                body = temp("[" + ", ".join(v.reconstruct(cg) for v in c.members()) + "]")
                apply.append(f"{cg.bind(_set_replace)}({target}, {body})")
        apply += advances
        for obj, name, value, setter in self.attrs.values():
            target, v = temp(cg.source_expr(obj.source)), temp(value.reconstruct(cg))
            apply.append(f"{cg.bind(setter)}({target}, {name!r}, {v})")
        for cell_value, _name, value in self.cells.values():
            target, v = temp(cell_value.reconstruct(cg)), temp(value.reconstruct(cg))
            apply.append(f"{target}.cell_contents = {v}")
        for fn_globals, name, value in self.globals.values():
            if value is DELETED_GLOBAL:
                apply.append(f"{cg.bind(fn_globals, 'G')}.pop({name!r}, None)")
                continue
            v = temp(value.reconstruct(cg))
            apply.append(f"{cg.bind(fn_globals, 'G')}[{name!r}] = {v}")
        return prepare, apply


class _DeletedGlobal(Value):
    """What a global deleted in the capture (``del G``) holds until it is written back."""

    def describe(self):
        return "<deleted global>"


DELETED_GLOBAL = _DeletedGlobal()


def _advance(it, n: int, exhaust: bool = False) -> None:
    for _ in range(n):
        next(it)
    if exhaust:     # (the capture saw it end: it stays ended, whatever is appended later)
        next(it, None)


def _set_replace(s: set, new: list) -> None:
    set.clear(s)
    set.update(s, new)


def _dict_replace(d: dict, new: dict) -> None:
    # Bypass user overrides (the captured program already ran them symbolically), but keep
    # the storage class's own bookkeeping: OrderedDict keeps a linked list beside the dict.
    import collections

    base = collections.OrderedDict if isinstance(d, collections.OrderedDict) else dict
    base.clear(d)
    store_items(base, d, new)

