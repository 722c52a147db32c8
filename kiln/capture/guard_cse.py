"""An entry's guard check as straight-line code: each shared access path read once.

The guards of a module-heavy model mostly read the same attribute chains again and again. A
ResNet-50 has about 2,600 guard conditions over 160 submodules, such as

    type(m._modules['layer1']._modules['0']._modules['conv1'].stride[0]) is int

Rendered as one ``and`` chain, every condition walks its whole chain from the argument, and
the check costs about 1 ms a call: more than Inductor's kernels take to launch.

Here, a source that two or more guards (or tensor inputs) read through is read once into a
local (``___r0 = m._modules['layer1']``), right before the first guard that reads it. That
is the point where the chain evaluated it, and every guard before it has passed. A condition
that two guards state alike (a TYPE_MATCH and an EQUALS_MATCH on one value) is checked once.
The check raises and fails exactly where the chain did; the ``try`` around the prelude turns
any exception into a miss, as before. ``GuardProgram.exprs`` (one expression per guard)
still serves failure reasons and packages.

A tuple of plain constants (a convolution's ``stride``, ``padding``, ``dilation``) costs six
conditions and two reads: its type, its length, and a type and a value per item. A tuple
cannot change, and neither can the ints, floats and strings in it, so once a tuple object
has passed, the same object passes again. Such a tuple is checked in full only when it is
not the object that passed last (``IdentityMemo``)::

    ___r16 = ___r9.stride
    if ___r16 is not ___memo7.last:
        if not (type(___r16) is ___t10 and ___len11(___r16) == 2 and type(___r16[0]) is int ...):
            return ___MISS
        ___memo7.last = ___r16

A new tuple equal to the old one still passes (the full check), and becomes the one
remembered.
"""
from __future__ import annotations

from collections import Counter

from .guards import Guard, GuardKind
from .sources import CellSource, GlobalSource, ItemSource, RenderContext, Source

LOCAL_PREFIX = "___r"

# types whose instances cannot change (a tuple of these cannot either)
_IMMUTABLE = (int, float, str, bool, type(None), complex, bytes)
_VALUE_KINDS = (GuardKind.TYPE_MATCH, GuardKind.EQUALS_MATCH, GuardKind.LENGTH_MATCH)


class IdentityMemo:
    """The constant tuple that passed its check last (held strongly: a tuple of constants is
    small, and holding it keeps its address from being reused by another object)."""
    __slots__ = ("last",)

    def __init__(self):
        self.last = _NOTHING

    def __repr__(self):
        return "<kiln IdentityMemo>"


_NOTHING = object()


def _path(source: Source | None) -> list[Source]:
    """The sources a read of ``source`` evaluates, outermost first, that are worth a local:
    everything but a plain argument or an object bound into the namespace."""
    out = []
    while isinstance(source, Source):
        base = getattr(source, "base", None)
        if (isinstance(base, Source) or isinstance(source, (GlobalSource, CellSource))) and hashable(source):
            out.append(source)
        source = base
    out.reverse()
    return out


def _reads(guard: Guard) -> list[Source]:
    reads = _path(guard.source)
    if guard.kind is GuardKind.ALIAS_MATCH and isinstance(guard.expected, Source):
        reads += _path(guard.expected)
    return reads


def _ancestors(source: Source):
    base = getattr(source, "base", None)
    while isinstance(base, Source):
        yield base
        base = getattr(base, "base", None)


def constant_tuples(guards: list[Guard], tensor_sources: list[Source]) -> dict[Source, list[int]]:
    """Sources that hold a tuple of constants, each with the indices of the guards that only
    state its value (its type and length; its items' types, values and lengths, nested tuples
    included). A source qualifies when every guard on it or on a value read from it is such a
    guard on an exact tuple or an immutable constant, and nothing else (a tensor input, an
    alias check) reads through it; the outermost qualifying source wins."""
    on: dict = {}
    for i, g in enumerate(guards):
        if g.source is not None and hashable(g.source):
            on.setdefault(g.source, []).append(i)
    tuples = {s for s, idx in on.items()
              if any(guards[i].kind is GuardKind.TYPE_MATCH and guards[i].expected is tuple for i in idx)}
    if not tuples:
        return {}
    # (a root read from a longer-lived object: ``*args`` and a tuple the caller builds are new
    # objects on every call, and the memo would only add work)
    roots = {s for s in tuples if _path(s)}
    spoiled: set = set()         # tuples something other than a value guard reads through
    members: dict = {}
    for i, g in enumerate(guards):
        src = g.source
        # the tuples this guard's value is read from (itself included), innermost first
        under = [a for a in (src, *_ancestors(src)) if a in tuples] if hashable(src) else []
        if g.kind is GuardKind.ALIAS_MATCH and isinstance(g.expected, Source):
            spoiled.update(a for a in _ancestors(g.expected) if a in tuples)
            spoiled.update(under)
            continue
        if not under:
            continue
        if not states_a_constant(g, src in tuples) or not _read_through_tuples(src, under[-1], tuples):
            spoiled.update(under)
            continue
        for a in under:
            members.setdefault(a, []).append(i)
    for s in tensor_sources:
        if hashable(s):
            spoiled.update(a for a in _ancestors(s) if a in tuples)
    groups = {}
    for root, idx in members.items():
        if root not in roots or root in spoiled or \
                any(a in members and a in roots and a not in spoiled for a in _ancestors(root)):
            continue
        groups[root] = idx
    return groups


def states_a_constant(g: Guard, on_tuple: bool) -> bool:
    if g.kind not in _VALUE_KINDS:
        return False
    if g.kind is GuardKind.TYPE_MATCH:
        return g.expected is tuple if on_tuple else g.expected in _IMMUTABLE
    if g.kind is GuardKind.EQUALS_MATCH:
        return type(g.expected) in _IMMUTABLE or (type(g.expected) is tuple and _all_immutable(g.expected))
    return on_tuple           # LENGTH_MATCH: of a tuple only


def _all_immutable(t: tuple) -> bool:
    return all(type(x) in _IMMUTABLE or (type(x) is tuple and _all_immutable(x)) for x in t)


def _read_through_tuples(source: Source, root: Source, tuples: set) -> bool:
    """Every read from ``root`` down to ``source`` is an item of a tuple (a value kept by it)."""
    while source != root:
        if not isinstance(source, ItemSource) or source.base not in tuples:
            return False
        source = source.base
    return True


def _implied_types(guards: list[Guard]) -> dict[int, int]:
    """TYPE_MATCH guards (index -> the index of the guard that implies them) that an identity
    check on the same value implies: EQUALS_MATCH on True, False or None renders ``x is v``."""
    singletons: dict = {}
    for j, g in enumerate(guards):
        if g.kind is GuardKind.EQUALS_MATCH and (g.expected is None or type(g.expected) is bool) \
                and g.source is not None and hashable(g.source):
            singletons.setdefault(g.source, j)
    out = {}
    for i, g in enumerate(guards):
        if g.kind is GuardKind.TYPE_MATCH and hashable(g.source) and g.source in singletons:
            j = singletons[g.source]
            if g.expected is type(guards[j].expected):
                out[i] = j
    return out


def straight_line(guards: list[Guard], tensor_sources: list[Source], ctx: RenderContext,
                  miss: str = "___MISS") -> tuple[list[str], list[str], list[str]]:
    """(statements, tensor expressions, guard expressions): statements that return ``miss``
    unless every guard holds; the expressions that read the tensor inputs afterwards (over the
    locals the statements bound); and each guard's condition as the statements state it."""
    groups = constant_tuples(guards, tensor_sources)
    in_group = {i: root for root, idx in groups.items() for i in idx}
    implied = _implied_types(guards)
    reads = [_reads(g) if i not in in_group else _path(in_group[i]) for i, g in enumerate(guards)]
    for i, j in implied.items():        # (read by the guard that implies it)
        reads[i] = []
    tensor_reads = [_path(s) for s in tensor_sources]
    uses: Counter = Counter()
    for r in (*reads, *tensor_reads):
        uses.update(set(r))
    view = ctx.with_locals()
    lines: list[str] = []
    group: list[str] = []
    stated: set[str] = set()
    as_stated: list[str] = []

    def flush() -> None:
        if group:
            lines.append(f"if not ({' and '.join(group)}):")
            lines.append(f"    return {miss}")
            group.clear()

    def read(path: list[Source], always: Source | None = None) -> None:
        for s in path:
            if s not in view.locals and (uses[s] >= 2 or s is always):
                flush()      # (the guards before this read must hold before it runs)
                expr = s.render(view)
                name = f"{LOCAL_PREFIX}{len(view.locals)}"
                lines.append(f"{name} = {expr}")
                view.locals[s] = name

    stated_as: dict[int, str] = {}
    for i, (g, path) in enumerate(zip(guards, reads)):
        root = in_group.get(i)
        if root is not None:
            if i not in stated_as:       # the tuple's first guard: its whole check, here
                read(path, always=root)
                flush()
                local, parts = view.locals[root], []
                for j in groups[root]:
                    mine = guards[j].render_parts(view)
                    stated_as[j] = " and ".join(mine)
                    parts += [p for p in mine if p not in parts]
                memo = ctx.bind(IdentityMemo(), "memo")
                lines += [f"if {local} is not {memo}.last:", f"    if not ({' and '.join(parts)}):",
                          f"        return {miss}", f"    {memo}.last = {local}"]
            as_stated.append(stated_as[i])
            continue
        if i in implied:      # ``x is False`` says ``type(x) is bool``: stated once, as the former
            read(reads[implied[i]])
            parts = guards[implied[i]].render_parts(view)
            as_stated.append(" and ".join(parts))
            for part in parts:
                if part not in stated:
                    stated.add(part)
                    group.append(part)
            continue
        read(path)
        parts = g.render_parts(view)
        as_stated.append(" and ".join(parts))
        for part in parts:
            if part not in stated:
                stated.add(part)
                group.append(part)
    flush()
    tensor_exprs = []
    for s, path in zip(tensor_sources, tensor_reads):
        read(path)
        tensor_exprs.append(s.render(view))
    return lines, tensor_exprs, as_stated


def hashable(source: Source) -> bool:
    try:
        hash(source)
        return True
    except TypeError:       # (a source keyed by an unhashable value: read where it is used)
        return False
