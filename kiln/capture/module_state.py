"""Skipping the guards an unchanged nn.Module tree already passed.

Most guards of a module-heavy model state facts about its modules: their types, that they
have no hooks, their ``training`` flags and hyperparameters (a convolution's stride, a
BatchNorm's eps), the keys of their ``_modules`` dicts, which objects their parameters
are. A ResNet-50 has about 2,600 such conditions, and checking them costs more per call
than launching its kernels. Yet between two calls of a model they almost never change.

CPython already counts changes: every dict carries a version number that changes when the
dict changes, and every class one that changes when the class (or a base) changes. After
an entry's guards pass, kiln records the versions of the dicts and classes those guards
read through (``snapshot``, in C: ``_module_state.c``). On the next call one C call
compares them (``unchanged``): if none changed, every value the covered guards read is the
same object as when they passed, so they pass again, and the tensor inputs read from the
tree are the same tensor objects. The entry then checks only the guards that are not
covered; every tensor input still goes through TensorGuards (a parameter's dtype, shape or
``requires_grad`` can change without any dict changing).

A guard is covered when its value is read from the recorded tree by dict reads only and
its fact cannot change while the object stays the same:

* the objects ("nodes") are nn.Modules reached from an argument through instance-dict
  attributes and ``_modules`` items, each with a TYPE_MATCH guard (the class is recorded
  too: ``__class__`` assignment and class changes are seen);
* reads: an instance-dict attribute (the C walk refuses a name that a data descriptor of
  the class would answer instead), an item of a recorded dict (``_modules``,
  ``_parameters``, ``_buffers``, the hook dicts), an item of a tuple so read, and the class
  dict of a node's class;
* facts: identity, the type of a value whose class is not a heap class (its ``__class__``
  cannot be reassigned), the value of an immutable constant, the length of a tuple, the
  keys and length of a recorded dict, no hooks on a node (its four hook dicts recorded), a
  name absent from a node's instance dict (a ``forward`` not set on the instance).

Everything else (globals, closures, function defaults, tensors, shapes, global state,
anything read from a list or a plain object) is checked on every call as before.

A snapshot holds the objects it recorded, so their addresses cannot be reused; it holds the
root module only weakly, and lets go of everything when the root dies or when a call finds
the tree changed (eager would not keep a module passed as an argument alive either).

An entry whose tree changes between most calls (a model that assigns an attribute in every
forward) stops recording after a few snapshots that were never used: recording costs about
as much as a check.

Without the C extension (a Python other than CPython 3.11/3.12, or no compiler at install),
``NATIVE`` is None and entries check every guard on every call.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from .guard_cse import hashable, states_a_constant
from .guards import _MODULE_HOOK_DICTS, Guard, GuardKind
from .sources import ITEM_DICT, ITEM_INDEX, ITEM_TUPLE, AttrSource, ItemSource, LocalSource, Source, TypeSource

try:
    from . import _module_state as NATIVE
except ImportError:          # (see the module docstring)
    NATIVE = None

_HEAP_TYPE = 1 << 9          # Py_TPFLAGS_HEAPTYPE: instances may have ``__class__`` reassigned
_MODULE_DICTS = ("_modules", "_parameters", "_buffers", *_MODULE_HOOK_DICTS)
_UNUSED_SNAPSHOTS = 4        # snapshots in a row that no call used: the entry stops taking them
OBJ, DICT = 0, 1             # plan kinds (``_module_state.c``)


class ModuleStateMemo:
    """An entry's plans (one per argument that is a module) and its last snapshot, with the
    tensors read from the tree when it was taken. The generated check reads ``state`` and
    calls ``unchanged``; ``record`` after all its guards passed."""
    __slots__ = ("plans", "state", "used", "unused", "__weakref__")

    def __init__(self, plans: tuple):
        self.plans = plans
        self.state = None      # (snapshot per plan, tensors) or None
        self.used = False      # a call was answered from ``state``
        self.unused = 0        # snapshots in a row that no call used

    unchanged = staticmethod(NATIVE.unchanged) if NATIVE is not None else staticmethod(lambda root, snap: False)

    def record(self, roots: tuple, tensors: tuple) -> None:
        """Take a snapshot of the trees ``roots`` (the guards just passed on them)."""
        self.unused = 0 if self.used else self.unused + 1
        self.used = False
        if self.unused > _UNUSED_SNAPSHOTS or NATIVE is None:
            self.plans = None
        if self.plans is None:
            self.state = None
            return
        try:
            forget = _forgetter(self)
            snaps = [NATIVE.snapshot(root, plan, forget) for root, plan in zip(roots, self.plans)]
        except Exception:        # (kiln's own failure: the entry checks every guard from now on)
            self.plans = self.state = None
            return
        self.state = None if None in snaps else (*snaps, tensors)

    def __repr__(self):
        return "<kiln ModuleStateMemo>"


def _forgetter(memo: ModuleStateMemo):
    """The callback of a snapshot's weak reference to its root: when the root dies, what the
    snapshot holds of its tree (its submodules, dicts and tensors) is let go at once."""
    ref = weakref.ref(memo)

    def forget(_):
        m = ref()
        if m is not None:
            m.state = None
    return forget


class Coverage:
    """Which guards and tensor inputs of an entry an unchanged module tree answers, and the
    plans that record it. ``roots``: the argument sources of the trees."""

    def __init__(self, roots: list[Source], plans: tuple, guards: set[int], tensors: list[int]):
        self.roots = roots
        self.plans = plans
        self.guards = guards        # indices into the guard list
        self.tensors = tensors      # indices into the tensor sources


def coverage(guards: list[Guard], tensor_sources: list[Source]) -> Coverage | None:
    """The guards and tensor inputs an unchanged module tree covers, or None (none are, or
    the C extension is missing)."""
    if NATIVE is None:
        return None
    types = {}
    for g in guards:
        if g.kind is GuardKind.TYPE_MATCH and hashable(g.source):
            types.setdefault(g.source, g.expected)
    tree = _Tree(types)
    covered = []
    for i, g in enumerate(guards):
        if _covers(g, tree, types):
            covered.append(i)
    tensors = [i for i, s in enumerate(tensor_sources) if tree.role(s) is not None]
    if not covered and not tensors:
        return None
    # what the plans must record: every read of a covered guard's value (and its hook dicts)
    for i in covered:
        g = guards[i]
        tree.use(g.source)
        if g.kind is GuardKind.ALIAS_MATCH:
            tree.use(g.expected)
        if g.kind is GuardKind.NO_HOOKS:
            for h in _MODULE_HOOK_DICTS:
                tree.use(AttrSource(g.source, h))
    for i in tensors:
        tree.use(tensor_sources[i])
    roots = [r for r in tree.roots if r in tree.used]
    if not roots:
        return None
    return Coverage(roots, tuple(tree.plan(r) for r in roots), set(covered), tensors)


# roles of a source in the tree
NODE, DICT_ROLE, VALUE, CLASS, CLASS_DICT = "node", "dict", "value", "class", "class dict"


class _Tree:
    def __init__(self, types: dict):
        self.types = types
        self.roots: list[Source] = []
        self.used: set[Source] = set()
        self.items: dict[Source, dict] = {}     # a node or dict -> {name or key: child source}
        self._roles: dict = {}

    def role(self, s: Any) -> str | None:
        if not hashable(s):
            return None
        if s not in self._roles:
            self._roles[s] = self._role(s)
        return self._roles[s]

    def _is_module_node(self, s: Source) -> bool:
        t = self.types.get(s)
        return isinstance(t, type) and issubclass(t, torch.nn.Module) and \
            t.__getattribute__ is object.__getattribute__

    def _role(self, s: Source) -> str | None:
        if isinstance(s, LocalSource):
            if self._is_module_node(s):
                if s not in self.roots:
                    self.roots.append(s)
                return NODE
            return None
        if isinstance(s, TypeSource):
            return CLASS if self.role(s.base) == NODE else None
        if isinstance(s, AttrSource):
            base = self.role(s.base)
            if base == CLASS and s.name == "__dict__":
                return CLASS_DICT
            if base != NODE or s.name.startswith("__"):
                return None
            if s.name in _MODULE_DICTS:
                return DICT_ROLE
            if _computed_by_class(self.types[s.base], s.name):
                return None        # (a method or property: the read runs code, every call)
            return NODE if self._is_module_node(s) else VALUE
        if isinstance(s, ItemSource):
            base = self.role(s.base)
            if base == CLASS_DICT and type(s.key) is str and s.how in (ITEM_INDEX, ITEM_DICT):
                return VALUE
            if base == DICT_ROLE and type(s.key) in (str, int) and s.how in (ITEM_INDEX, ITEM_DICT):
                return NODE if self._is_module_node(s) else VALUE
            if base == VALUE and self.types.get(s.base) is tuple and type(s.key) is int \
                    and s.how in (ITEM_INDEX, ITEM_TUPLE):
                return VALUE       # (an item of a tuple read from the tree: kept by the tuple)
            return None
        return None

    def use(self, s: Source) -> None:
        """Record the reads from a root down to ``s`` in the plans."""
        while isinstance(s, Source) and s not in self.used:
            self.used.add(s)
            base = getattr(s, "base", None)
            role = self.role(s)
            if isinstance(s, AttrSource) and self.role(base) == NODE:
                self.items.setdefault(base, {})[s.name] = s
            elif isinstance(s, ItemSource) and self.role(base) == DICT_ROLE:
                self.items.setdefault(base, {})[s.key] = s
            if role == NODE and isinstance(s, LocalSource):
                return
            s = base

    def plan(self, s: Source):
        role = self.role(s)
        if role == NODE:
            kids = self.items.get(s, {})
            return (OBJ, self.types[s], tuple((k, self.plan(c)) for k, c in kids.items()))
        if role == DICT_ROLE:
            kids = self.items.get(s, {})
            return (DICT, tuple((k, self.plan(c)) for k, c in kids.items()))
        return None        # a value: its container's version stands for it


def _covers(g: Guard, tree: _Tree, types: dict) -> bool:
    role = tree.role(g.source)
    if role is None or role == CLASS_DICT:
        return False
    k = g.kind
    if k is GuardKind.ID_MATCH:
        return True
    if k is GuardKind.TYPE_MATCH:
        return role == NODE or (role != CLASS and isinstance(g.expected, type) and not g.expected.__flags__ & _HEAP_TYPE)
    if k is GuardKind.EQUALS_MATCH:
        return states_a_constant(g, on_tuple=False)     # (an immutable constant)
    if k is GuardKind.LENGTH_MATCH:
        return role == DICT_ROLE or types.get(g.source) is tuple
    if k is GuardKind.DICT_KEYS:
        return role == DICT_ROLE
    if k is GuardKind.NO_HOOKS:
        return role == NODE
    if k is GuardKind.NOT_IN_INSTANCE_DICT:
        return role == NODE         # (its instance dict's version is recorded)
    if k is GuardKind.ALIAS_MATCH:
        return isinstance(g.expected, Source) and tree.role(g.expected) not in (None, CLASS_DICT)
    return False


def _computed_by_class(cls: type, name: str) -> bool:
    """Whether ``cls`` has a descriptor named ``name`` (a method, a property, a slot): then
    reading the attribute calls it, or may (the C walk refuses a data descriptor anyway)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return hasattr(type(klass.__dict__[name]), "__get__")
    return False
