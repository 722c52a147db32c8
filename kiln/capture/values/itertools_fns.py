"""``itertools`` called during capture.

Finite iterators (``chain``, ``chain.from_iterable``, ``product``, ``combinations``,
``permutations``, ``islice``, ``accumulate``, ``zip_longest``, ``repeat(x, n)``,
``compress``, ``pairwise``, ``starmap``, ``takewhile``, ``dropwhile``, ``filterfalse``,
``tee``, ``groupby``) are computed when they
are created, over the symbolic items of their inputs (tensors, symbolic sizes and Python
values alike): the result is an iterator over a known list, like ``zip`` and ``map`` here.

Infinite ones (``count``, ``cycle``, ``repeat(x)``) are lazy: each ``next`` (a ``for`` loop
that breaks out, ``zip``, ``islice``, ``next()``) takes one item, and consuming one to its end
is Unsupported (eager would never finish). Held across a graph break, they are rebuilt as
real itertools objects at the same position.
"""
from __future__ import annotations

import itertools
import operator

from ...errors import Unsupported
from .base import ConstantValue, Value
from .builtins import DerivedIteratorValue, _lazy_sources, _rows, handles
from .containers import IteratorValue, TupleValue
from .symbolic import SymNodeValue, specialize


def _int_arg(tx, v: Value | None, what: str, default=None):
    """An int argument (count, length, bound): symbolic sizes are decided for this call."""
    if v is None:
        return default
    if isinstance(v, SymNodeValue):
        v = specialize(v)
    c = v.as_constant()
    if c is not None and not isinstance(c, int):
        raise tx.user_exception(TypeError(f"{what} must be an int, not {type(c).__name__}"))
    return c


class TypedIteratorValue(IteratorValue):
    """A finite itertools iterator computed at creation; ``type()`` answers its real class."""

    def __init__(self, items, cls):
        super().__init__(list(items))
        self.cls = cls

    def python_type(self):
        return self.cls


class InfiniteIteratorValue(IteratorValue):
    """``count(start, step)``, ``cycle(items)`` or ``repeat(obj)``: one item per ``next``."""

    infinite = True   # a graph break hands it over as a real iterator, never as a tuple

    def __init__(self, kind: str, state: list):
        super().__init__([])
        self.kind = kind
        self.state = state      # count: [current, step]; cycle: [items, index]; repeat: [obj]

    def python_type(self):
        return {"count": itertools.count, "cycle": itertools.cycle, "repeat": itertools.repeat}[self.kind]

    def describe(self):
        return f"itertools.{self.kind}"

    def next(self, tx):
        if self.kind == "count":
            cur, step = self.state
            self.state[0] = tx.binary(operator.add, cur, step)
            return cur
        if self.kind == "cycle":
            items, i = self.state
            if not items:
                return None
            self.state[1] = i + 1
            return items[i % len(items)]
        return self.state[0]

    def unpack(self, tx):
        if self.kind == "cycle" and not self.state[0]:
            return []
        raise Unsupported(f"consuming itertools.{self.kind} to its end (it never ends)")

    def reconstruct_remaining(self, cg):
        return self.reconstruct(cg)

    def reconstruct(self, cg):
        def build():
            if self.kind == "count":
                cur, step = self.state
                return f"{cg.bind(itertools.count)}({cur.reconstruct(cg)}, {step.reconstruct(cg)})"
            if self.kind == "repeat":
                return f"{cg.bind(itertools.repeat)}({self.state[0].reconstruct(cg)})"
            items, i = self.state
            body = ", ".join(v.reconstruct(cg) for v in items) + ("," if len(items) == 1 else "")
            return f"{cg.bind(_cycle_at)}(({body}), {i % len(items) if items else 0})"
        return cg.stash(self, build)


def _cycle_at(items: tuple, index: int):
    it = itertools.cycle(items)
    for _ in range(index):
        next(it)
    return it


def _finite(tx, v: Value) -> list[Value]:
    return tx.unpack_iterable(v)


def _take(tx, it: Value, n: int | None) -> list[Value]:
    """Up to ``n`` items (all when None) of an iterable, taking only what is needed."""
    if n is None:
        return _finite(tx, it)
    it = tx.get_iter(it)
    out = []
    while len(out) < n:
        v = it.next(tx)
        if v is None:
            break
        out.append(v)
    return out


@handles(itertools.chain)
def _chain(tx, fn, args, kwargs):
    if kwargs:
        raise tx.user_exception(TypeError("chain() takes no keyword arguments"))
    return TypedIteratorValue([v for a in args for v in _finite(tx, a)], itertools.chain)


@handles(itertools.chain.from_iterable)
def _chain_from_iterable(tx, fn, args, kwargs):
    (outer,) = args
    return TypedIteratorValue([v for a in _finite(tx, outer) for v in _finite(tx, a)], itertools.chain)


@handles(itertools.product)
def _product(tx, fn, args, kwargs):
    repeat = _int_arg(tx, kwargs.get("repeat"), "repeat", 1)
    pools = [_finite(tx, a) for a in args] * repeat
    return TypedIteratorValue([TupleValue(list(t)) for t in itertools.product(*pools)], itertools.product)


@handles(itertools.combinations, itertools.permutations, itertools.combinations_with_replacement)
def _combinatorics(tx, fn, args, kwargs):
    items = _finite(tx, args[0])
    r = args[1] if len(args) > 1 else kwargs.get("r")
    r = _int_arg(tx, r, "r", None)
    if r is None and fn is not itertools.permutations:
        raise tx.user_exception(TypeError(f"{fn.__name__}() missing required argument 'r'"))
    # the positions, combined by itertools itself: the items may be tensors
    idx = fn(range(len(items)), r) if r is not None else fn(range(len(items)))
    return TypedIteratorValue([TupleValue([items[i] for i in t]) for t in idx], fn)


@handles(itertools.islice)
def _islice(tx, fn, args, kwargs):
    if kwargs or not 2 <= len(args) <= 4:
        raise tx.user_exception(TypeError("islice() takes 2 to 4 positional arguments"))
    bounds = [_int_arg(tx, a, "islice bound") for a in args[1:]]
    start, stop, step = slice(*bounds).start, slice(*bounds).stop, slice(*bounds).step
    if any(b is not None and b < 0 for b in (start, stop)) or step is not None and step < 1:
        raise tx.user_exception(ValueError("Indices for islice() must be None or an int >= 0."))
    items = _take(tx, args[0], stop)
    return TypedIteratorValue(items[slice(start, None, step)], itertools.islice)


@handles(itertools.accumulate)
def _accumulate(tx, fn, args, kwargs):
    items = _finite(tx, args[0])
    func = args[1] if len(args) > 1 else kwargs.get("func")
    if func is not None and func.is_constant() and func.as_constant() is None:
        func = None
    out = []
    acc = kwargs.get("initial")
    if acc is not None and acc.is_constant() and acc.as_constant() is None:
        acc = None
    if acc is not None:
        out.append(acc)
    for v in items:
        if acc is None:
            acc = v
        elif func is None:
            acc = tx.binary(operator.add, acc, v)
        else:
            acc = tx.call(func, [acc, v], {})
        out.append(acc)
    return TypedIteratorValue(out, itertools.accumulate)


@handles(itertools.zip_longest)
def _zip_longest(tx, fn, args, kwargs):
    fill = kwargs.get("fillvalue", ConstantValue(None))
    seqs = [_finite(tx, a) for a in args]
    n = max((len(s) for s in seqs), default=0)
    rows = [TupleValue([s[i] if i < len(s) else fill for s in seqs]) for i in range(n)]
    return TypedIteratorValue(rows, itertools.zip_longest)


@handles(itertools.repeat)
def _repeat(tx, fn, args, kwargs):
    obj = args[0] if args else kwargs["object"]
    times = args[1] if len(args) > 1 else kwargs.get("times")
    if times is None:
        return InfiniteIteratorValue("repeat", [obj])
    return TypedIteratorValue([obj] * max(_int_arg(tx, times, "times"), 0), itertools.repeat)


@handles(itertools.count)
def _count(tx, fn, args, kwargs):
    start = args[0] if args else kwargs.get("start", ConstantValue(0))
    step = args[1] if len(args) > 1 else kwargs.get("step", ConstantValue(1))
    return InfiniteIteratorValue("count", [start, step])


@handles(itertools.cycle)
def _cycle(tx, fn, args, kwargs):
    return InfiniteIteratorValue("cycle", [_finite(tx, args[0]), 0])


@handles(itertools.compress)
def _compress(tx, fn, args, kwargs):
    data, selectors = (_finite(tx, a) for a in args)
    return TypedIteratorValue([d for d, s in zip(data, selectors) if tx.truthy(s)], itertools.compress)


if hasattr(itertools, "pairwise"):
    @handles(itertools.pairwise)
    def _pairwise(tx, fn, args, kwargs):
        items = _finite(tx, args[0])
        return TypedIteratorValue([TupleValue([a, b]) for a, b in zip(items, items[1:])], itertools.pairwise)


@handles(itertools.starmap)
def _starmap(tx, fn, args, kwargs):
    f, items = args[0], _finite(tx, args[1])
    return TypedIteratorValue([tx.call(f, tx.unpack_iterable(t), {}) for t in items], itertools.starmap)


@handles(itertools.filterfalse)
def _filterfalse(tx, fn, args, kwargs):
    pred, items = args[0], _finite(tx, args[1])
    if pred.is_constant() and pred.as_constant() is None:
        return TypedIteratorValue([i for i in items if not tx.truthy(i)], fn)
    return TypedIteratorValue([i for i in items if not tx.truthy(tx.call(pred, [i], {}))], fn)


@handles(itertools.tee)
def _tee(tx, fn, args, kwargs):
    items = _finite(tx, args[0])
    n = _int_arg(tx, args[1] if len(args) > 1 else None, "n", 2)
    return TupleValue([TypedIteratorValue(items, type(itertools.tee([])[0])) for _ in range(n)])


class GroupByValue(IteratorValue):
    """``itertools.groupby(items, key)``: (key, group) pairs. As in eager, taking the next
    pair empties the group handed out before it (they share one underlying iterator)."""

    def __init__(self, groups: list):
        super().__init__([])
        self.groups = groups        # [(key value, [item values])]
        self.current = None

    def python_type(self):
        return itertools.groupby

    def next(self, tx):
        if self.current is not None:
            self.current.pos = len(self.current.seq)
        if self.pos >= len(self.groups):
            return None
        key, members = self.groups[self.pos]
        self.pos += 1
        self.current = TypedIteratorValue(members, type(next(itertools.groupby([0]))[1]))
        return TupleValue([key, self.current])

    def unpack(self, tx):
        out = []
        while (v := self.next(tx)) is not None:
            out.append(v)
        return out

    def reconstruct_remaining(self, cg):
        raise Unsupported("an itertools.groupby iterator held across a graph break")

    reconstruct = reconstruct_remaining


@handles(itertools.groupby)
def _groupby(tx, fn, args, kwargs):
    items = _finite(tx, args[0] if args else kwargs["iterable"])
    key = args[1] if len(args) > 1 else kwargs.get("key")
    if key is not None and key.is_constant() and key.as_constant() is None:
        key = None
    groups = []
    for item in items:
        k = item if key is None else tx.call(key, [item], {})
        if groups and tx.values_equal(groups[-1][0], k):
            groups[-1][1].append(item)
        else:
            groups.append((k, [item]))
    return GroupByValue(groups)


@handles(itertools.takewhile, itertools.dropwhile)
def _while(tx, fn, args, kwargs):
    pred, items = args[0], _finite(tx, args[1])
    n = 0
    while n < len(items) and tx.truthy(tx.call(pred, [items[n]], {})):
        n += 1
    kept = items[:n] if fn is itertools.takewhile else items[n:]
    return TypedIteratorValue(kept, fn)


@handles(zip)
def _zip(tx, fn, args, kwargs):
    """zip() as eager steps it: one item from each iterator in turn, stopping at the first
    that is exhausted (so an infinite ``count``/``cycle`` beside a list is bounded by it)."""
    strict = kwargs.get("strict", ConstantValue(False)).as_constant()
    lazy = _lazy_sources(tx, args)
    if lazy is not None:        # (a generator: each row taken as the consumer asks for it)
        if strict:
            raise Unsupported("zip(strict=True) over a generator")
        return DerivedIteratorValue(zip, lambda get_tx: (TupleValue(row) for row in _rows(get_tx, lazy)),
                                    sources=lazy)
    if not any(isinstance(a, InfiniteIteratorValue) for a in args):
        seqs = [_finite(tx, a) for a in args]
        if strict and len({len(s) for s in seqs}) > 1:
            raise tx.user_exception(ValueError("zip() arguments have different lengths"))
        return IteratorValue([TupleValue(list(t)) for t in zip(*seqs)])
    if all(isinstance(a, InfiniteIteratorValue) for a in args):
        raise Unsupported("zip() of iterators that never end")
    its = [tx.get_iter(a) for a in args]
    rows = []
    while True:
        row = []
        for it in its:
            v = it.next(tx)
            if v is None:
                if strict and (row or any(o.next(tx) is not None for o in its[1:])):
                    raise tx.user_exception(ValueError("zip() arguments have different lengths"))
                return IteratorValue(rows)
            row.append(v)
        rows.append(TupleValue(row))
