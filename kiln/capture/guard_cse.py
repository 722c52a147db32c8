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
"""
from __future__ import annotations

from collections import Counter

from .guards import Guard, GuardKind
from .sources import CellSource, GlobalSource, RenderContext, Source

LOCAL_PREFIX = "___r"


def _path(source: Source | None) -> list[Source]:
    """The sources a read of ``source`` evaluates, outermost first, that are worth a local:
    everything but a plain argument or an object bound into the namespace."""
    out = []
    while isinstance(source, Source):
        base = getattr(source, "base", None)
        if (isinstance(base, Source) or isinstance(source, (GlobalSource, CellSource))) and _hashable(source):
            out.append(source)
        source = base
    out.reverse()
    return out


def _reads(guard: Guard) -> list[Source]:
    reads = _path(guard.source)
    if guard.kind is GuardKind.ALIAS_MATCH and isinstance(guard.expected, Source):
        reads += _path(guard.expected)
    return reads


def straight_line(guards: list[Guard], tensor_sources: list[Source], ctx: RenderContext,
                  miss: str = "___MISS") -> tuple[list[str], list[str], list[str]]:
    """(statements, tensor expressions, guard expressions): statements that return ``miss``
    unless every guard holds; the expressions that read the tensor inputs afterwards (over the
    locals the statements bound); and each guard's condition as the statements state it."""
    reads = [_reads(g) for g in guards]
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

    def read(path: list[Source]) -> None:
        for s in path:
            if s not in view.locals and uses[s] >= 2:
                flush()      # (the guards before this read must hold before it runs)
                expr = s.render(view)
                name = f"{LOCAL_PREFIX}{len(view.locals)}"
                lines.append(f"{name} = {expr}")
                view.locals[s] = name

    for g, path in zip(guards, reads):
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


def _hashable(source: Source) -> bool:
    try:
        hash(source)
        return True
    except TypeError:       # (a source keyed by an unhashable value: read where it is used)
        return False
