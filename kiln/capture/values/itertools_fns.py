"""``itertools`` called during capture.

Finite iterators (``chain``, ``chain.from_iterable``, ``islice``, ``accumulate``,
``zip_longest``, ``compress``, ``pairwise``, ``starmap``, ``takewhile``, ``dropwhile``,
``filterfalse``, ``tee``, ``groupby``) take their items as eager does, one ``next`` at a time,
when that can be seen: a source that is an iterator (``zip(it, it)``, ``tee(it)`` and then
``next(it)``, a generator) or a container that may change before the items are taken (a list
appended to after ``chain(xs)`` was made), or a function of the user's that they call
(``starmap``, ``accumulate``'s ``func``, the predicates, ``groupby``'s ``key``). Over tuples,
ranges and strings with no such function they are computed when they are created, over the
symbolic items of their inputs (tensors, symbolic sizes and Python values alike).
``product``, ``combinations`` and ``permutations`` read their inputs when created, as eager
does. Held across a graph break, a lazy one is handed over as a real one at its position
where its state can be written as code (``LazyItertoolsValue.rebuild``), a computed one as a
real one of its class where one can yield what is left (``TypedIteratorValue``); one whose
state cannot be written (a ``product`` part-way, a ``tee``'s buffer) runs the frame natively.
A loop over one that a break interrupts hands what is left over as a tuple when taking it
calls nothing (its sources are its own).

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
from .builtins import DerivedIteratorValue, _lazy_sources, _rows, handles, is_shared_iterator, reads_lazily
from .containers import IteratorValue, TupleValue, zip_kind
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


_TEE = type(itertools.tee(())[0])


class TypedIteratorValue(IteratorValue):
    """A finite itertools iterator computed at creation; ``type()`` answers its real class.
    Held across a graph break (or handed to code that runs natively), it becomes a real one of
    its class where one can yield what is left (``repeat``, ``chain``, ``islice``, ``tee``); another
    (``product``, ``accumulate``...) cannot be written as code, and the frame runs natively.
    A loop over it hands what is left over as a tuple (``reconstruct_remaining``): the loop
    cannot tell."""

    def __init__(self, items, cls, repeated=None):
        super().__init__(list(items))
        self.cls = cls
        self.repeated = repeated        # repeat(obj, n): obj

    def python_type(self):
        return self.cls

    def reconstruct(self, cg):
        left = len(self.seq) - self.pos
        if self.cls is itertools.repeat and self.repeated is not None:
            return cg.stash(self, lambda: f"{cg.bind(itertools.repeat)}({self.repeated.reconstruct(cg)}, {left})")
        if self.cls is itertools.chain:
            return cg.stash(self, lambda: f"{cg.bind(itertools.chain)}({self.reconstruct_remaining(cg)})")
        if self.cls is itertools.islice:
            return cg.stash(self, lambda: f"{cg.bind(itertools.islice)}({self.reconstruct_remaining(cg)}, None)")
        if self.cls is _TEE:
            return cg.stash(self, lambda: f"{cg.bind(itertools.tee)}({self.reconstruct_remaining(cg)}, 1)[0]")
        raise Unsupported(f"an itertools.{self.cls.__name__} iterator held across a graph break "
                          "(its state cannot be written as code)")


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


class LazyItertoolsValue(DerivedIteratorValue):
    """An itertools iterator taking its sources' items as it is asked for its own. At a graph
    break, ``rebuild(cg)`` writes the code of a real one that yields what is left (None: one
    whose state has no such code, and the frame runs natively)."""

    def __init__(self, cls: type, produce, rebuild=None, own_sources: bool = False):
        super().__init__(cls, produce, own_sources=own_sources)
        self.rebuild = rebuild

    def describe(self):
        return f"itertools.{self.cls.__name__} iterator"

    def reconstruct(self, cg):
        if self.rebuild is None or self.done:
            if self.done:
                return cg.stash(self, lambda: f"{cg.bind(iter)}(())")
            raise Unsupported(f"a lazy {self.describe()} held across a graph break")
        return cg.stash(self, lambda: self.rebuild(cg))


def _user_function(f: Value | None) -> bool:
    return f is not None and not (f.is_constant() and f.as_constant() is None)


def _items(get_tx, it):
    """The items of an iterator value, taken one at a time."""
    while (v := it.next(get_tx())) is not None:
        yield v


@handles(itertools.chain)
def _chain(tx, fn, args, kwargs):
    if kwargs:
        raise tx.user_exception(TypeError("chain() takes no keyword arguments"))
    if (its := _lazy_sources(tx, args)) is not None:
        return LazyItertoolsValue(   # (what is left of each source, in order)
            itertools.chain, lambda get_tx: (v for it in its for v in _items(get_tx, it)),
            rebuild=lambda cg: f"{cg.bind(itertools.chain)}({', '.join(it.reconstruct(cg) for it in its)})",
            own_sources=not any(is_shared_iterator(a) for a in args))
    return TypedIteratorValue([v for a in args for v in _finite(tx, a)], itertools.chain)


@handles(itertools.chain.from_iterable)
def _chain_from_iterable(tx, fn, args, kwargs):
    (outer,) = args
    if reads_lazily(outer) or any(reads_lazily(a) for a in _finite(tx, outer)):
        outer_it = tx.get_iter(outer)

        def produce(get_tx):
            for inner in _items(get_tx, outer_it):
                yield from _items(get_tx, get_tx().get_iter(inner))
        return LazyItertoolsValue(itertools.chain, produce)
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
    if reads_lazily(args[0]):
        it, state = tx.get_iter(args[0]), {"count": 0, "next": start or 0}

        def rebuild(cg):
            count, nxt = state["count"], state["next"]
            rest = "None" if stop is None else max(stop - count, 0)
            return f"{cg.bind(itertools.islice)}({it.reconstruct(cg)}, {max(nxt - count, 0)}, {rest}, {step or 1})"
        return LazyItertoolsValue(itertools.islice,
                                  lambda get_tx: _islice_items(get_tx, it, state, stop, step or 1), rebuild,
                                  own_sources=not is_shared_iterator(args[0]))
    items = _take(tx, args[0], stop)
    return TypedIteratorValue(items[slice(start, None, step)], itertools.islice)


def _islice_items(get_tx, it, state: dict, stop: int | None, step: int):
    """islice's items as CPython takes them: skip to the next index, stop before reading past
    ``stop`` (``state``: items read so far, and the index of the next one to yield)."""
    while True:
        while state["count"] < state["next"]:
            if it.next(get_tx()) is None:
                return
            state["count"] += 1
        if stop is not None and state["count"] >= stop:
            return
        v = it.next(get_tx())
        if v is None:
            return
        state["count"] += 1
        nxt = state["next"] + step
        state["next"] = nxt if stop is None else min(nxt, stop)
        yield v


@handles(itertools.accumulate)
def _accumulate(tx, fn, args, kwargs):
    func = args[1] if len(args) > 1 else kwargs.get("func")
    if not _user_function(func):
        func = None
    initial = kwargs.get("initial")
    if initial is not None and initial.is_constant() and initial.as_constant() is None:
        initial = None

    def produce(get_tx, items):
        acc = initial
        if acc is not None:
            yield acc
        for v in items:
            if acc is None:
                acc = v
            elif func is None:
                acc = get_tx().binary(operator.add, acc, v)
            else:
                acc = get_tx().call(func, [acc, v], {})
            yield acc
    if func is not None or reads_lazily(args[0]):
        it = tx.get_iter(args[0])
        return LazyItertoolsValue(itertools.accumulate, lambda get_tx: produce(get_tx, _items(get_tx, it)))
    return TypedIteratorValue(produce(lambda: tx, _finite(tx, args[0])), itertools.accumulate)


@handles(itertools.zip_longest)
def _zip_longest(tx, fn, args, kwargs):
    fill = kwargs.get("fillvalue", ConstantValue(None))
    if (its := _lazy_sources(tx, args)) is not None:
        def produce(get_tx):
            active = list(its)
            while True:
                row = []
                for i, it in enumerate(active):
                    v = it.next(get_tx()) if it is not None else None
                    if v is None and it is not None:
                        active[i] = None
                        if all(a is None for a in active):
                            return
                    row.append(fill if v is None else v)
                if not active:
                    return
                yield TupleValue(row)
        return LazyItertoolsValue(itertools.zip_longest, produce)
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
    return TypedIteratorValue([obj] * max(_int_arg(tx, times, "times"), 0), itertools.repeat, repeated=obj)


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
    if (its := _lazy_sources(tx, args)) is not None:
        data, selectors = its

        def produce(get_tx):
            while (d := data.next(get_tx())) is not None and (sel := selectors.next(get_tx())) is not None:
                if get_tx().truthy(sel):
                    yield d
        return LazyItertoolsValue(itertools.compress, produce, lambda cg: (
            f"{cg.bind(itertools.compress)}({data.reconstruct(cg)}, {selectors.reconstruct(cg)})"))
    data, selectors = (_finite(tx, a) for a in args)
    return TypedIteratorValue([d for d, s in zip(data, selectors) if tx.truthy(s)], itertools.compress)


if hasattr(itertools, "pairwise"):
    @handles(itertools.pairwise)
    def _pairwise(tx, fn, args, kwargs):
        if reads_lazily(args[0]):
            it = tx.get_iter(args[0])

            def produce(get_tx):
                prev = it.next(get_tx())
                if prev is None:
                    return
                for v in _items(get_tx, it):
                    yield TupleValue([prev, v])
                    prev = v
            return LazyItertoolsValue(itertools.pairwise, produce)
        items = _finite(tx, args[0])
        return TypedIteratorValue([TupleValue([a, b]) for a, b in zip(items, items[1:])], itertools.pairwise)


@handles(itertools.starmap)
def _starmap(tx, fn, args, kwargs):
    f, it = args[0], tx.get_iter(args[1])
    return LazyItertoolsValue(itertools.starmap, lambda get_tx: (
        get_tx().call(f, get_tx().unpack_iterable(t), {}) for t in _items(get_tx, it)),
        lambda cg: f"{cg.bind(itertools.starmap)}({f.reconstruct(cg)}, {it.reconstruct(cg)})")


@handles(itertools.filterfalse)
def _filterfalse(tx, fn, args, kwargs):
    pred = args[0]
    if _user_function(pred) or reads_lazily(args[1]):
        it = tx.get_iter(args[1])
        return LazyItertoolsValue(fn, lambda get_tx: (
            i for i in _items(get_tx, it)
            if not get_tx().truthy(get_tx().call(pred, [i], {}) if _user_function(pred) else i)),
            lambda cg: f"{cg.bind(fn)}({pred.reconstruct(cg)}, {it.reconstruct(cg)})")
    return TypedIteratorValue([i for i in _finite(tx, args[1]) if not tx.truthy(i)], fn)


@handles(itertools.tee)
def _tee(tx, fn, args, kwargs):
    n = _int_arg(tx, args[1] if len(args) > 1 else None, "n", 2)
    tee_type = type(itertools.tee([])[0])
    if reads_lazily(args[0]):
        source, buffer = tx.get_iter(args[0]), []

        def produce(get_tx):
            # every tee reads one buffer; the one ahead takes the next item from the source
            i = 0
            while True:
                if i == len(buffer):
                    v = source.next(get_tx())
                    if v is None:
                        return
                    buffer.append(v)
                yield buffer[i]
                i += 1
        return TupleValue([LazyItertoolsValue(tee_type, produce) for _ in range(n)])
    items = _finite(tx, args[0])
    return TupleValue([TypedIteratorValue(items, tee_type) for _ in range(n)])


class GroupByValue(IteratorValue):
    """``itertools.groupby(iterable, key)`` stepped as CPython steps it: each ``next`` skips
    what is left of the current group, reading the source and calling ``key`` one item at a
    time, and hands out a group iterator that reads on from the shared source; taking the next
    pair empties the group handed out before it. Held across a graph break it cannot be
    written as code, and the frame runs natively."""

    lazy = True

    def __init__(self, source: IteratorValue, key: Value | None):
        super().__init__([])
        self.source, self.key = source, key
        # CPython's state; None where CPython's pointer is NULL (no Value is None)
        self.currkey = self.tgtkey = self.currvalue = None
        self.currgrouper = None

    def python_type(self):
        return itertools.groupby

    def describe(self):
        return "itertools.groupby iterator"

    def step(self, tx) -> bool:
        v = self.source.next(tx)
        if v is None:
            return False
        key = v if self.key is None else tx.call(self.key, [v], {})
        self.currvalue, self.currkey = v, key
        return True

    def next(self, tx):
        self.currgrouper = None
        while True:
            if self.currkey is None:
                pass
            elif self.tgtkey is None or not tx.values_equal(self.tgtkey, self.currkey):
                break
            if not self.step(tx):
                return None
        self.tgtkey = self.currkey
        self.currgrouper = _GrouperValue(self, self.tgtkey)
        return TupleValue([self.currkey, self.currgrouper])

    def unpack(self, tx):
        return self.take_all(tx)

    def reconstruct_remaining(self, cg):
        raise Unsupported("an itertools.groupby iterator held across a graph break")

    reconstruct = reconstruct_remaining


class _GrouperValue(IteratorValue):
    """One group of a ``GroupByValue``: its items while the shared source's key stays the
    group's and no later group was asked for."""

    lazy = True

    def __init__(self, parent: GroupByValue, tgtkey: Value):
        super().__init__([])
        self.parent, self.tgtkey = parent, tgtkey

    def python_type(self):
        return _GROUPER

    def describe(self):
        return "itertools.groupby group"

    def next(self, tx):
        p = self.parent
        if p.currgrouper is not self:
            return None
        if p.currvalue is None and not p.step(tx):
            return None
        if not tx.values_equal(self.tgtkey, p.currkey):
            return None
        v, p.currvalue = p.currvalue, None
        return v

    def unpack(self, tx):
        return self.take_all(tx)

    def reconstruct_remaining(self, cg):
        raise Unsupported("an itertools.groupby group held across a graph break")

    reconstruct = reconstruct_remaining


_GROUPER = type(next(itertools.groupby([0]))[1])


@handles(itertools.groupby)
def _groupby(tx, fn, args, kwargs):
    iterable = args[0] if args else kwargs["iterable"]
    key = args[1] if len(args) > 1 else kwargs.get("key")
    if key is not None and key.is_constant() and key.as_constant() is None:
        key = None
    return GroupByValue(tx.get_iter(iterable), key)


@handles(itertools.takewhile, itertools.dropwhile)
def _while(tx, fn, args, kwargs):
    pred, it = args[0], tx.get_iter(args[1])
    decided = []        # (once the predicate was false: takewhile has ended, dropwhile passes all)

    def produce(get_tx):
        for v in _items(get_tx, it):
            if not get_tx().truthy(get_tx().call(pred, [v], {})):
                decided.append(True)
                if fn is itertools.dropwhile:
                    yield v
                    yield from _items(get_tx, it)
                return
            if fn is itertools.takewhile:
                yield v

    def rebuild(cg):
        if decided:     # (dropwhile: the source's rest)
            return f"{cg.bind(iter)}({it.reconstruct(cg)})"
        return f"{cg.bind(fn)}({pred.reconstruct(cg)}, {it.reconstruct(cg)})"
    return LazyItertoolsValue(fn, produce, rebuild)


@handles(zip)
def _zip(tx, fn, args, kwargs):
    """zip() as eager steps it: one item from each iterator in turn, stopping at the first
    that is exhausted (so an infinite ``count``/``cycle`` beside a list is bounded by it)."""
    strict = kwargs.get("strict", ConstantValue(False)).as_constant()
    lazy = _lazy_sources(tx, args)
    if lazy is not None:        # (an iterator: each row taken as the consumer asks for it)
        if strict:
            return LazyItertoolsValue(zip, lambda get_tx: _strict_rows(get_tx, lazy), lambda cg: (
                f"{cg.bind(zip)}({', '.join(it.reconstruct(cg) for it in lazy)}, strict=True)"))
        return DerivedIteratorValue(zip, lambda get_tx: (TupleValue(row) for row in _rows(get_tx, lazy)),
                                    sources=lazy, own_sources=not any(is_shared_iterator(a) for a in args))
    # (iterables only: each is read whole, so that a generator a user __iter__ makes is
    # finished, not left suspended for a later graph break to hand over)
    seqs = [_finite(tx, a) for a in args]
    its = [IteratorValue(s) for s in seqs]
    return IteratorValue(list(_strict_rows(lambda: tx, its) if strict else
                              (TupleValue(row) for row in _rows(lambda: tx, its))),
                         kind=None if strict else zip_kind(len(args)))


def _strict_rows(get_tx, its):
    """zip(strict=True)'s rows, and CPython's ValueError where the lengths differ."""
    def plural(i):
        return " " if i == 1 else "s 1-"
    while its:
        row = []
        for i, it in enumerate(its):
            v = it.next(get_tx())
            if v is None:
                if i:
                    raise get_tx().user_exception(ValueError(
                        f"zip() argument {i + 1} is shorter than argument{plural(i)}{i}"))
                for j, other in enumerate(its[1:], 1):
                    if other.next(get_tx()) is not None:
                        raise get_tx().user_exception(ValueError(
                            f"zip() argument {j + 1} is longer than argument{plural(j)}{j}"))
                return
            row.append(v)
        yield TupleValue(row)
