"""Generators made in compiled code run lazily, as in eager: each ``next()`` runs the
generator's frame to its next ``yield``, so its effects interleave with its consumer's, and
nothing runs past the last item read. ``send``, ``throw``, ``close``, ``yield from`` (with
its value) and ``StopIteration.value`` are eager's; consumers with effects of their own
(``lst.extend(gen)``, ``any``/``all``, ``x in gen``, ``map``/``filter``/``enumerate`` over a
generator) take one item at a time. A generator still suspended at a graph break (or
returned, or stored) is made natively instead, in a capture of the frame again.
"""
import contextlib
import copy

import pytest
import torch

import kiln
from kiln.testing import assert_same

SETTINGS = [("eager", None), ("aot_eager", None), ("aot_eager", True)]


def check(make_fn, make_args, backend, dynamic, calls=3):
    """``make_fn()`` returns a function with state of its own: eager and kiln get one each."""
    fe, fk = make_fn(), make_fn()
    compiled = kiln.compile(fk, backend=backend, dynamic=dynamic)
    for call in range(calls):
        torch.manual_seed(call)
        args = make_args()
        e_args = copy.deepcopy(args)
        assert_same(compiled(*args), fe(*e_args))
        assert_same(list(args), list(e_args), path="args after the call")


def cm_reading_its_state():
    stack = []

    @contextlib.contextmanager
    def pushed(v):
        stack.append(v)
        try:
            yield v * 2
        finally:
            stack.pop()

    def f(x):
        with pushed(x) as z:
            y = stack[-1] * 2 + z
        return y, len(stack)
    return f


def cm_with_a_break_inside():
    state = {"scale": 1.0}

    @contextlib.contextmanager
    def scaled(k):
        old, state["scale"] = state["scale"], k
        try:
            yield
        finally:
            state["scale"] = old

    def f(x):
        with scaled(3.0):
            print("inside")               # a graph break inside the with body
            y = x * state["scale"]
        return y, state["scale"]
    return f


def cm_setting_grad_mode():
    @contextlib.contextmanager
    def no_grad():
        prev = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            yield
        finally:
            torch.set_grad_enabled(prev)

    def f(x):
        with no_grad():
            y = x * 2
        return y, x * 3
    return f


def generator_with_effects():
    state = {"n": 0}

    def gen(x):
        for _ in range(3):
            state["n"] += 1
            yield x * state["n"]

    def f(x):
        out = [v + state["n"] for v in gen(x)]
        return out, state["n"]
    return f


def generator_partly_consumed():
    log = []

    def gen(x):
        log.append("first")
        yield x
        log.append("second")
        yield x * 2

    def f(x):
        return next(gen(x)), list(log)
    return f


def generator_reading_what_the_consumer_changes():
    state = {"k": 1}

    def gen(x):
        for _ in range(3):
            yield x * state["k"]

    def f(x):
        out = []
        for v in gen(x):
            state["k"] += 1
            out.append(v)
        return out
    return f


def generator_reading_a_tensor_the_consumer_mutates():
    def gen(x):
        for i in range(3):
            yield x * i

    def f(x):
        out = []
        for v in gen(x):
            x.add_(1)
            out.append(v)
        return out
    return f


def pure_generator():
    def pairs(xs):
        for a, b in zip(xs, xs[1:]):
            yield a * b

    def f(x):
        return sum(pairs([x, x + 1, x + 2]))
    return f


CASES = [cm_reading_its_state, cm_with_a_break_inside, cm_setting_grad_mode, generator_with_effects,
         generator_partly_consumed, generator_reading_what_the_consumer_changes,
         generator_reading_a_tensor_the_consumer_mutates, pure_generator]


@pytest.mark.parametrize("backend,dynamic", SETTINGS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_generator_effects_match_eager(case, backend, dynamic):
    check(case, lambda: (torch.randn(3, requires_grad=case is cm_setting_grad_mode),), backend, dynamic)


def test_pure_generator_stays_in_one_graph():
    counter = kiln.testing.CompileCounter()
    f = kiln.compile(pure_generator(), backend=counter, fullgraph=True)
    x = torch.randn(3)
    assert_same(f(x), pure_generator()(x))
    assert counter.frame_count == 1


# -- lazy generators: each case compiled with fullgraph where eager needs no break --------------

def _effects_in_new_objects(x):
    log = []
    n = 0

    def gen():
        nonlocal n
        for i in range(3):
            n += 1
            log.append(i)
            yield x * i
    g = gen()
    first = next(g)
    return first, n, log


def _extend_reading_the_list(x):
    y = [1]
    y.extend(y[-1] + z for z in range(3))
    y += (y[-1] * 2 for _ in range(2))
    s = {1}
    s.update(len(s) + z for z in range(2))
    return x * y[-1], y, sorted(s)


def _yield_from_value(x):
    def inner():
        yield x
        return 5

    def outer():
        r = yield from inner()
        yield x * r
    return list(outer())


def _send(x):
    def gen():
        d = {}
        got = yield 1
        d[(yield "key")] = got
        yield d
    g = gen()
    next(g)
    g.send(x * 2)
    return g.send("k")


def _short_circuits(x):
    def bad(i):
        if i == 2:
            raise ValueError("past the deciding item")
        return i
    return x + any(bad(i) == 1 for i in range(4)), all(bad(i) != 1 for i in range(4)), 1 in (bad(i) for i in range(4))


def _lazy_map_filter_enumerate(x):
    log = []

    def gen():
        for i in range(5):
            log.append(i)
            yield i
    m = map(lambda v: x * v, gen())
    first = next(m)
    e = next(iter(enumerate(gen())))
    f = next(filter(lambda v: v > 1, gen()))
    return first, e, f, log


def _generator_type(x):
    import types

    def gen():
        yield x
    g = gen()
    return isinstance(g, types.GeneratorType), type(g) is types.GeneratorType, next(g) * 2


def _zip_with_an_endless_generator(x):
    def count():
        i = 0
        while True:
            yield i
            i += 1
    return [x * i for _, i in zip(range(3), count())]


LAZY_CASES = [_effects_in_new_objects, _extend_reading_the_list, _yield_from_value, _send, _short_circuits,
              _lazy_map_filter_enumerate, _generator_type, _zip_with_an_endless_generator]


@pytest.mark.parametrize("case", LAZY_CASES, ids=lambda c: c.__name__.strip("_"))
@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_generators_run_lazily_in_one_graph(case, backend, dynamic):
    counter = kiln.testing.CompileCounter()
    kiln.reset()
    f = kiln.compile(case, backend=counter, fullgraph=True, dynamic=dynamic)
    for call in range(2):
        x = torch.randn(3)
        assert_same(f(x.clone()), case(x.clone()))
    assert counter.frame_count == 1


def _throw_and_close(x):
    log = []

    def gen():
        try:
            yield 1
            yield 2
        except ValueError:
            yield 10
        finally:
            log.append("finally")
    g = gen()
    a = next(g)
    b = g.throw(ValueError)
    g.close()
    h = gen()
    next(h)
    h.close()
    return x * (a + b), log


def _stop_iteration_value(x):
    def gen():
        yield 1
        return 42
    g = gen()
    next(g)
    try:
        next(g)
    except StopIteration as e:
        return x + e.value


def _stop_iteration_inside(x):
    def gen():
        yield 1
        raise StopIteration
    try:
        return list(gen())
    except RuntimeError as e:
        return x + 1, str(e)


def _ignores_generator_exit(x):
    def gen():
        while True:
            try:
                yield x
            except GeneratorExit:
                pass
    g = gen()
    next(g)
    try:
        g.close()
    except RuntimeError as e:
        return x - 1, str(e)


def _dropped_while_suspended_in_try(x):
    log = []

    def gen():
        try:
            yield 1
            yield 2
        finally:
            log.append("closed")
    # (eager closes it at once, when its last reference goes; compiled, it is made natively
    # and closed by the end of the call: the handler runs, perhaps later in the call)
    first = next(gen())
    return x + first, log


def _break_inside_the_generator(x):
    def gen():
        yield x * 2
        print("between")
        yield x * 3
    out = x
    for v in gen():
        out = out + v
    return out


def _break_in_a_loop_over_a_generator(x):
    total = x
    for v in (x * i for i in range(3)):
        total = total + v
        print("in the loop")
    return total


def _returns_a_suspended_generator(x):
    g = (x * i for i in range(3))
    next(g)
    return g


def _throw_into_a_delegating_generator(x):
    log = []

    def inner():
        try:
            yield 1
            yield 2
        except ValueError:
            log.append("inner caught")     # (eager throws into the inner generator first)
            yield 3

    def outer():
        try:
            yield from inner()
        except ValueError:
            log.append("outer caught")
            yield 4
    g = outer()
    next(g)
    return x + g.throw(ValueError), log


NATIVE_CASES = [_throw_into_a_delegating_generator, _throw_and_close, _stop_iteration_value, _stop_iteration_inside, _ignores_generator_exit,
                _dropped_while_suspended_in_try, _break_inside_the_generator, _break_in_a_loop_over_a_generator]


@pytest.mark.parametrize("case", NATIVE_CASES, ids=lambda c: c.__name__.strip("_"))
@pytest.mark.parametrize("backend,dynamic", SETTINGS)
def test_generator_protocol_matches_eager(case, backend, dynamic, capsys):
    kiln.reset()
    f = kiln.compile(case, backend=backend, dynamic=dynamic)
    for call in range(2):
        x = torch.randn(3)
        expected = case(x.clone())
        out = capsys.readouterr().out
        assert_same(f(x.clone()), expected)
        assert capsys.readouterr().out == out


def test_a_returned_generator_is_a_real_generator_at_its_position():
    import types

    f = kiln.compile(_returns_a_suspended_generator, backend="aot_eager")
    x = torch.randn(3)
    g = f(x)
    assert isinstance(g, types.GeneratorType)
    assert_same(list(g), [x * 1, x * 2])


# -- map and filter compute their items as they are taken -------------------------------------

def _unconsumed_map(x, lst):
    map(lst.append, [1, 2])              # (eager calls nothing)
    return x + 1


def _any_of_a_map(x, lst):
    def check(v):
        lst.append(v)
        if v == 0:
            raise ValueError("past the deciding item")
        return v > 1
    return x + any(map(check, [1, 2, 0])), isinstance(map(abs, [1]), map)


def _common_maps(x, lst):
    return (torch.cat(list(map(lambda t: t * 2, [x, x + 1]))), tuple(map(int, ["1", "2"])),
            dict(zip("ab", map(float, [1, 2]))), list(filter(None, [0, 1, 2])))


@pytest.mark.parametrize("case", [_unconsumed_map, _any_of_a_map, _common_maps], ids=lambda c: c.__name__.strip("_"))
def test_map_and_filter_are_lazy(case):
    counter = kiln.testing.CompileCounter()
    kiln.reset()
    f = kiln.compile(case, backend=counter, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2)
        lk, le = [], []
        assert_same(f(x, lk), case(x, le))
        assert lk == le
    assert counter.frame_count == 1


def _loops_over_map_and_filter_with_a_break(x, xs):
    out = x
    for v in map(lambda t: t * 2, xs):
        out = out + v
        print("map loop")
    for i, v in enumerate(filter(None, [0, 1, 2, 0, 3])):
        out = out + v * i
        print("filter loop")
    return out


def test_a_map_live_at_a_break_is_handed_over_as_a_map(capsys):
    kiln.reset()
    f = kiln.compile(_loops_over_map_and_filter_with_a_break, backend="aot_eager")
    for _ in range(2):
        x = torch.randn(2)
        xs = [torch.randn(2), torch.randn(2)]
        expected = _loops_over_map_and_filter_with_a_break(x, xs)
        out = capsys.readouterr().out
        assert_same(f(x, xs), expected)
        assert capsys.readouterr().out == out


def test_a_generator_dropped_before_a_break_is_not_made_natively(capsys):
    # (``next(module.parameters())``, then a break: the suspended generator is dropped, as in
    # eager, and the frame is captured as two graphs around the break)
    lin = torch.nn.Linear(3, 3)

    def f(x):
        w = next(lin.parameters())
        y = x @ w
        print("a break")
        return y * 2

    counter = kiln.testing.CompileCounter()
    kiln.reset()
    compiled = kiln.compile(f, backend=counter)
    x = torch.randn(2, 3)
    assert_same(compiled(x), f(x))
    assert counter.frame_count == 2


def _delegating(log):
    def inner():
        try:
            yield 1
            yield 2
        finally:
            log.append("inner closed")

    def outer():
        yield from inner()
    return outer


def test_a_suspended_yield_from_is_made_natively_only_for_its_delegates_handlers(capsys):
    # (``next(self.parameters())`` in Hugging Face's ``self.dtype``: ``named_parameters`` is
    # ``yield from``; on Python 3.12 the yield inside it has a handler that hands throw() on,
    # which is not a try block of its own: the frame stays one graph, as on 3.11)
    def plain():
        yield from iter([1, 2, 3])

    def f(x):
        return x + next(plain())

    counter = kiln.testing.CompileCounter()
    kiln.reset()
    x = torch.randn(3)
    assert_same(kiln.compile(f, backend=counter)(x), f(x))
    assert counter.frame_count == 1
    report = kiln.explain(f)(x)
    assert report.graph_count == 1 and report.graph_break_count == 0

    # a delegate suspended in its own try block: eager runs its handler when the outer
    # generator is dropped; compiled, the handler runs too
    def g(x, log):
        return x + next(_delegating(log)())

    _same_handlers_run(g, x, ["inner closed"])

    # and a ``yield from`` inside the outer generator's own try block
    def h(x, log):
        def outer():
            try:
                yield from iter([1, 2])
            finally:
                log.append("outer closed")
        return x + next(outer())

    _same_handlers_run(h, x, ["outer closed"])


def _same_handlers_run(fn, x, ran: list) -> None:
    """``fn(x, log)`` compiled returns eager's result, and the handlers that log to ``log``
    ran as in eager (``ran``)."""
    kiln.reset()
    log_eager, log_kiln = [], []
    expected = fn(x, log_eager)
    assert_same(kiln.compile(fn, backend="aot_eager")(x, log_kiln), expected)
    assert log_kiln == log_eager == ran


class _CountsToTwo:
    def __init__(self):
        self.n = 0

    def __iter__(self):
        return self

    def __next__(self):
        self.n += 1
        if self.n > 2:
            raise StopIteration("done")
        return self.n


def test_yield_from_a_user_iterator_gives_its_stop_iteration_value():
    """``r = yield from it`` over an iterator object (not a generator): ``r`` is the value of
    the StopIteration its ``__next__`` raised."""
    def gen():
        r = yield from _CountsToTwo()
        yield r

    def f(x):
        return x + 1, list(gen())

    x = torch.zeros(2)
    got, expected = kiln.compile(f, backend="eager")(x), f(x)
    assert got[1] == expected[1] == [1, 2, "done"]
    torch.testing.assert_close(got[0], expected[0])
