"""Constructs captured as one graph, without a break: environment reads,
itertools/functools, builtins, objects created inside the compiled function.

Each case compiles under ``fullgraph=True`` with a counting backend, runs twice on fresh
random inputs, compares with eager (outputs and input state), and asserts the graph count.
"""
from __future__ import annotations

import copy
import os

import pytest
import torch

import kiln
from kiln.testing import CompileCounter, assert_same


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def check(fn, make_args, graphs=1, calls=2):
    """Compile ``fn`` (fullgraph), call it ``calls`` times on fresh args, compare with eager."""
    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc, fullgraph=True)
    for _ in range(calls):
        args = make_args()
        e_args = copy.deepcopy(args)
        expected = fn(*e_args)
        actual = compiled(*args)
        assert_same(actual, expected)
        assert_same(args, e_args, path="inputs")
    assert cc.frame_count == graphs, f"{cc.frame_count} graphs, expected {graphs}"
    return cc, compiled


def r(*shape):
    return lambda: (torch.randn(*shape),)


# ------------------------------------------------------------------------ os.environ
ENV = "NO_BREAK_TEST_ENV_FLAG"


def env_get(x):
    if os.environ.get(ENV, "0") == "1":
        return x * 2
    return x + 1


def env_getitem(x):
    return x * len(os.environ[ENV])


def env_contains(x):
    return x + 1 if ENV in os.environ else x - 1


def env_not_contains(x):
    return x + 1 if ENV not in os.environ else x - 1


def env_getenv(x):
    v = os.getenv(ENV)
    return x + 1 if v is None else x * int(v)


def env_getenv_default(x):
    return x * int(os.getenv(ENV, default="3"))


def env_get_none_default(x):
    return x + (os.environ.get(ENV) is None)


@pytest.mark.parametrize("fn", [env_get, env_contains, env_not_contains, env_getenv,
                                env_getenv_default, env_get_none_default])
def test_environ_read_guards_on_value(fn, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    cc, compiled = check(fn, r(3))
    monkeypatch.setenv(ENV, "1")          # the guard on the variable fails: one new graph
    x = torch.randn(3)
    assert_same(compiled(x), fn(x))
    assert cc.frame_count == 2
    monkeypatch.setenv(ENV, "2")          # another value: another graph
    assert_same(compiled(x), fn(x))
    assert cc.frame_count == 3
    monkeypatch.delenv(ENV)               # absent again: the first entry still serves
    assert_same(compiled(x), fn(x))
    assert cc.frame_count == 3


def test_environ_getitem_and_missing_key(monkeypatch):
    monkeypatch.setenv(ENV, "abc")
    check(env_getitem, r(3))
    monkeypatch.delenv(ENV)
    compiled = kiln.compile(env_getitem, backend=CompileCounter())
    with pytest.raises(KeyError):         # the same error as eager
        compiled(torch.randn(3))


def test_environ_bound_to_a_global_name(monkeypatch):
    from os import environ

    def fn(x):
        return x * 2 if environ.get(ENV) == "on" else x + 1

    monkeypatch.setenv(ENV, "on")
    cc, compiled = check(fn, r(3))
    monkeypatch.setenv(ENV, "off")
    x = torch.randn(3)
    assert_same(compiled(x), fn(x))
    assert cc.frame_count == 2


def test_environ_write_breaks_and_stays_correct(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)

    def fn(x):
        y = x + 1
        os.environ[ENV] = "7"
        return y * int(os.environ[ENV])

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc)
    x = torch.randn(3)
    assert_same(compiled(x), x.add(1).mul(7))
    assert os.environ[ENV] == "7"
    assert cc.frame_count == 2              # the write runs natively, between two graphs
    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend=CompileCounter(), fullgraph=True)(torch.randn(3))


# ------------------------------------------------------------------ itertools / functools
import functools  # noqa: E402
import itertools  # noqa: E402
import operator  # noqa: E402


def it_chain(x, y):
    return [t * 2 for t in itertools.chain([x], (y, x + y), [])]


def it_chain_from_iterable(x, y):
    out = x
    for t in itertools.chain.from_iterable([[x, y], [y * 3]]):
        out = out + t
    return out


def it_product(x, y):
    return [a * b for a, b in itertools.product([x, y], [1.5, x])]


def it_product_repeat(x, y):
    return sum(a - b for a, b in itertools.product([x, y], repeat=2))


def it_combinations(x, y):
    return [a @ b.T for a, b in itertools.combinations([x, y, x + 1], 2)]


def it_combinations_with_replacement(x, y):
    return len(list(itertools.combinations_with_replacement([x, y], 2))) * x


def it_permutations(x, y):
    return [a - b for a, b in itertools.permutations([x, y, 2 * y], 2)]


def it_permutations_full(x, y):
    return [p[0] * p[1] for p in itertools.permutations([x, y])]


def it_islice(x, y):
    return list(itertools.islice([x, y, x * y, x + y, 0.5 * x], 1, None, 2))


def it_islice_stop(x, y):
    return sum(itertools.islice(iter([x, y, x * y]), 2))


def it_accumulate(x, y):
    return list(itertools.accumulate([x, y, x * y]))


def it_accumulate_func(x, y):
    return list(itertools.accumulate([x, y, y], torch.maximum, initial=torch.zeros_like(x)))


def it_accumulate_ints(x, y):
    offsets = list(itertools.accumulate([1, 2, 3], operator.mul))
    return x * offsets[-1] + y * offsets[0]


def it_zip_longest(x, y):
    return [a + (b if b is not None else 0) for a, b in itertools.zip_longest([x, y, x], [y])]


def it_zip_longest_fill(x, y):
    return [a * b for a, b in itertools.zip_longest([x], [y, x], fillvalue=2.0)]


def it_repeat(x, y):
    return list(itertools.repeat(x + y, 3))


def it_repeat_zip(x, y):
    return [a * b for a, b in zip([x, y], itertools.repeat(2.0))]


def it_count(x, y):
    for i, t in zip(itertools.count(1), [x, y, y]):
        x = x + t * i
    return x


def it_count_for_break(x, y):
    for i in itertools.count(2, 3):
        if i > 10:
            break
        x = x * i
    return x


def it_count_next(x, y):
    c = itertools.count(start=5)
    next(c)
    return x * next(c)


def it_cycle(x, y):
    return [a * b for a, b in zip(range(5), itertools.cycle([x, y]))]


def it_cycle_islice(x, y):
    return [t * 2 for t in itertools.islice(itertools.cycle([x, y, 3.0]), 7)]


def it_reduce(x, y):
    return functools.reduce(lambda a, b: a * b + 1, [x, y, x])


def it_reduce_initial(x, y):
    return functools.reduce(torch.add, [y, y], x)


def it_starmap_pairwise(x, y):
    return list(itertools.starmap(torch.mul, itertools.pairwise([x, y, x + y])))


def it_takewhile_compress(x, y):
    small = list(itertools.takewhile(lambda n: n < 3, [1, 2, 5, 1]))
    return list(itertools.compress([x, y, x - y], [1, 0, 1])), x * len(small)


ITERTOOLS_CASES = [it_chain, it_chain_from_iterable, it_product, it_product_repeat,
                   it_combinations, it_combinations_with_replacement, it_permutations,
                   it_permutations_full, it_islice, it_islice_stop, it_accumulate,
                   it_accumulate_func, it_accumulate_ints, it_zip_longest, it_zip_longest_fill,
                   it_repeat, it_repeat_zip, it_count, it_count_for_break, it_count_next,
                   it_cycle, it_cycle_islice, it_reduce, it_reduce_initial,
                   it_starmap_pairwise, it_takewhile_compress]


@pytest.mark.parametrize("fn", ITERTOOLS_CASES, ids=lambda f: f.__name__)
def test_itertools(fn):
    check(fn, lambda: (torch.randn(3, 3), torch.randn(3, 3)))


def test_itertools_over_symbolic_sizes():
    def fn(x):
        dims = list(itertools.accumulate(x.shape, operator.mul))
        pairs = list(itertools.product(range(2), [x.shape[0]]))
        return x.reshape(dims[-1]) * len(pairs), [d for d in itertools.islice(x.shape, 1, None)]

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc, fullgraph=True, dynamic=True)
    for n in (3, 4, 5):
        x = torch.randn(n, 2)
        assert_same(compiled(x), fn(x))
    assert cc.frame_count == 1


def test_infinite_iterator_across_a_graph_break(capsys):
    def fn(x):
        total = x
        for i in itertools.count(1):
            print("step", i)               # a graph break with count's iterator on the stack
            total = total * i
            if i == 3:
                return total

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc)
    x = torch.randn(3)
    assert_same(compiled(x), fn(x))
    assert capsys.readouterr().out == "step 1\nstep 2\nstep 3\n" * 2


def test_infinite_iterator_consumed_to_the_end_is_unsupported():
    with pytest.raises(kiln.Unsupported):
        kiln.compile(lambda x: list(itertools.count()) and x, backend=CompileCounter(),
                     fullgraph=True)(torch.randn(2))


# ------------------------------------------------------------------------------- builtins
import collections  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402


def fromkeys_dict(x, y):
    d = dict.fromkeys(["a", "b", "c"], x + 1)
    d["b"] = y
    return d, dict.fromkeys((1, 2))


def fromkeys_ordered(x, y):
    d = collections.OrderedDict.fromkeys("ab", 0)
    d.move_to_end("a")
    return d, x * len(d)


def fromkeys_defaultdict(x, y):
    d = collections.defaultdict.fromkeys(["k"], y)
    return d, d.default_factory is None, x - 1


def minmax_tensors(x, y):
    a, b = x.sum(), y.sum()
    return max(a, b) + min(a, b), max([a, b, a * 2]) * 2, min(x.sum(0)[0], y.mean(), x.sum(1)[1])


def minmax_numbers(x, y):
    return x * max(1, 2.5, x.shape[0]) + min(y.shape[1], 3)


def dict_view_compare(x, y):
    d, e = {"a": x, "b": y}, {"b": y, "a": x}
    f = {"a": x, "b": x}
    return (x + 1, d.keys() == e.keys(), d.items() == e.items(), d.keys() == {"a", "b"},
            d.keys() != {"a"}, d.values() == d.values(),
            d.keys() == f.keys())


def nested_no_grad(x, y):
    @torch.no_grad()
    def frozen(t):
        return t * 2

    return frozen(x) + y, frozen(y).requires_grad


def nested_enable_grad(x, y):
    @torch.enable_grad()
    def tracked(t):
        return t * 3

    with torch.no_grad():
        out = tracked(x)
        inner = x * 4
    return out + inner, out.requires_grad, inner.requires_grad


def storage_size(x, y):
    v = x[1:]
    fresh = y * 2
    return x + v.untyped_storage().size() + fresh.untyped_storage().nbytes() + len(y.untyped_storage())


BUILTIN_CASES = [fromkeys_dict, fromkeys_ordered, fromkeys_defaultdict, minmax_tensors,
                 minmax_numbers, dict_view_compare, storage_size]


@pytest.mark.parametrize("fn", BUILTIN_CASES, ids=lambda f: f.__name__)
def test_builtins(fn):
    check(fn, lambda: (torch.randn(3, 4), torch.randn(3, 4)))


@pytest.mark.parametrize("fn", [nested_no_grad, nested_enable_grad], ids=lambda f: f.__name__)
def test_grad_mode_decorators_on_nested_functions(fn):
    def make():
        return torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)

    cc, compiled = check(fn, make)
    x, y = make()
    out = compiled(x, y)[0]
    out.sum().backward()
    xe, ye = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    fn(xe, ye)[0].sum().backward()
    assert_same(x.grad, xe.grad)
    assert_same(y.grad, ye.grad)
    assert torch.is_grad_enabled()
    assert cc.frame_count == 1


def test_minmax_of_tensors_that_require_grad_breaks_and_stays_correct():
    def fn(x, y):
        return max(x.sum(), y.sum()) * 2

    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend=CompileCounter(), fullgraph=True)(
            torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True))
    compiled = kiln.compile(fn, backend=CompileCounter())
    for _ in range(3):
        x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        xe, ye = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
        compiled(x, y).backward()
        fn(xe, ye).backward()
        assert_same((x.grad, y.grad), (xe.grad, ye.grad))   # None for the one not chosen


def test_minmax_of_a_tensor_and_a_number_breaks_and_stays_correct():
    def fn(x):
        return max(x.sum(), 0.0)

    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend=CompileCounter(), fullgraph=True)(torch.randn(3))
    compiled = kiln.compile(fn, backend=CompileCounter())
    for x in (torch.ones(3), -torch.ones(3)):
        assert_same(compiled(x), fn(x))      # a tensor, or the float 0.0, as eager


def test_dict_views_returned():
    def fn(x, y):
        d = {"a": x + 1, "b": y}
        return d.keys(), d.values(), d.items(), d

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc, fullgraph=True)
    x, y = torch.randn(2), torch.randn(2)
    keys, values, items, d = compiled(x, y)
    ek, ev, ei, ed = fn(x, y)
    assert type(keys) is type(ek) and type(values) is type(ev) and type(items) is type(ei)
    assert list(keys) == ["a", "b"]
    assert_same(list(values), list(ev))
    assert_same(dict(items), ed)
    d["c"] = 1                                   # views of the returned dict itself, as eager
    assert "c" in keys and len(values) == 3
    assert cc.frame_count == 1


def test_storage_size_of_an_input_is_guarded():
    def fn(x):
        return x * x.untyped_storage().size()

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc, fullgraph=True)
    small = torch.randn(4)
    big_view = torch.randn(10)[:4]              # same size and stride, a bigger storage
    assert_same(compiled(small), fn(small))
    assert_same(compiled(big_view), fn(big_view))
    assert cc.frame_count == 2
    again = torch.randn(4)                     # the first storage size again: no new graph
    assert_same(compiled(again), fn(again))
    assert cc.frame_count == 2


GLOBAL_TOTAL = 0


def bump_and_read_global(x):
    global GLOBAL_TOTAL
    GLOBAL_TOTAL = GLOBAL_TOTAL + 1
    return x + GLOBAL_TOTAL


def global_tensor_assign(x):
    global GLOBAL_TENSOR
    GLOBAL_TENSOR = x * 2
    return GLOBAL_TENSOR + 1


def test_global_assignments_are_visible_after_the_call():
    global GLOBAL_TOTAL
    GLOBAL_TOTAL = 0
    cc = CompileCounter()
    compiled = kiln.compile(bump_and_read_global, backend=cc, fullgraph=True)
    for i in range(1, 4):
        x = torch.randn(3)
        assert_same(compiled(x), x + (2 * i - 1))
        assert GLOBAL_TOTAL == 2 * i - 1
        assert_same(bump_and_read_global(x), x + 2 * i)
    # the value read is guarded: the second call recompiles, with GLOBAL_TOTAL now dynamic
    assert cc.frame_count == 2

    compiled = kiln.compile(global_tensor_assign, backend=(cc := CompileCounter()), fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        assert_same(compiled(x), x * 2 + 1)
        assert_same(GLOBAL_TENSOR, x * 2)
    assert cc.frame_count == 1


def test_module_attribute_assignment_is_written_back():
    sys.path.insert(0, os.path.dirname(__file__))
    try:
        import _import_pkg
    finally:
        sys.path.pop(0)

    def fn(x):
        _import_pkg.NEW_ATTR = x.sum()
        return x + _import_pkg.NEW_ATTR

    compiled = kiln.compile(fn, backend=CompileCounter(), fullgraph=True)
    try:
        x = torch.randn(3)
        assert_same(compiled(x), x + x.sum())
        assert_same(_import_pkg.NEW_ATTR, x.sum())
    finally:
        del _import_pkg.NEW_ATTR


@functools.lru_cache(maxsize=None)
def cached_table(n, scale=1.0):
    return tuple(i * scale for i in range(n))


def test_lru_cache_called_with_constants_fills_the_cache():
    def fn(x):
        t = cached_table(3, scale=2.0)
        return x * t[-1] + len(cached_table(2))

    cached_table.cache_clear()
    cc, compiled = check(fn, r(3))
    assert cached_table.cache_info().currsize == 2      # eager's calls filled it: same keys
    assert cc.frame_count == 1


def test_lru_cache_called_with_tensors_runs_natively():
    @functools.lru_cache
    def scaled(t):
        return t * 2

    def fn(x):
        return scaled(x) + 1

    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend=CompileCounter(), fullgraph=True)(torch.randn(3))
    compiled = kiln.compile(fn, backend=CompileCounter())
    x = torch.randn(3)
    assert_same(compiled(x), fn(x))



class _Recorder:
    """A logger-like object: hashed and compared by identity, as lru_cache keys it."""

    def __init__(self):
        self.lines = []

    def warn(self, msg):
        self.lines.append(msg)


@functools.lru_cache(None)
def warning_once(logger, msg):
    logger.warn(msg)       # (transformers' logger.warning_once: lru_cache over (logger, message))


def test_lru_cache_keyed_by_an_objects_identity_runs_once_and_does_not_break():
    """``logger.warning_once(msg)`` inside a forward (transformers' ``loss_function``): the
    cache is keyed by the logger's identity, so the call is made once, at capture, as eager
    makes it on its first call, and the graph does not break. Another logger is a new key:
    its identity guard fails and it is called (and captured) again."""
    log, other = _Recorder(), _Recorder()
    warning_once.cache_clear()

    def fn(x, logger):
        warning_once(logger, "the default loss is used")
        return x * 2

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc, fullgraph=True)
    for _ in range(3):
        x = torch.randn(3)
        assert_same(compiled(x, log), x * 2)
    assert log.lines == ["the default loss is used"] and cc.frame_count == 1
    compiled(torch.randn(3), other)
    assert other.lines == ["the default loss is used"] and cc.frame_count == 2


# ------------------------------------------------------------ objects created inside
def new_softmax(x, y):
    return torch.nn.Softmax(dim=-1)(x) + torch.nn.ReLU()(y)


def new_modules_chain(x, y):
    seq = [torch.nn.GELU(approximate="tanh"), torch.nn.Flatten(0, 1), torch.nn.Identity()]
    for m in seq:
        x = m(x)
    return x, torch.nn.functional.softmax(y, dim=0), isinstance(seq[0], torch.nn.Module)


def new_dropout_eval(x, y):
    d = torch.nn.Dropout(p=0.5)
    d.eval()                                     # a change made inside: stays inside
    return d(x) + y


def new_namedtuple(x, y):
    Pair = collections.namedtuple("Pair", ["first", "second"])
    p = Pair(x * 2, second=y)
    q = p._replace(first=y)
    # (p itself is an instance of a class eager makes anew per call: returned as tuple(p))
    return p.first + q.first, tuple(p), type(p).__name__, Pair._fields, p.second is q.second


def new_namedtuple_defaults(x, y):
    Cfg = collections.namedtuple("Cfg", "scale shift", defaults=(1.0,))
    c = Cfg(3.0)
    return x * c.scale + c.shift


def new_distribution(x, y):
    d = torch.distributions.Normal(y, torch.ones_like(y) * 2, validate_args=False)
    return d.log_prob(x), d.mean, d.stddev, d.entropy()


def new_categorical(x, y):
    d = torch.distributions.Categorical(logits=x, validate_args=False)
    return d.probs, d.entropy()


class Plain:
    def __init__(self, v):
        self.v = v


class Valued:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Valued) and self.v == other.v


def new_objects_identity(x, y):
    a, b, c = Plain(1), Plain(1), Valued(2)
    same = a
    return (x + 1, a is b, a is same, a == b, a == same, a != b, c == Valued(2),
            c == Valued(3), c is Valued(2), a is None, a == 1)


OBJECT_CASES = [new_softmax, new_modules_chain, new_dropout_eval, new_namedtuple,
                new_namedtuple_defaults, new_distribution, new_categorical, new_objects_identity]


@pytest.mark.parametrize("fn", OBJECT_CASES, ids=lambda f: f.__name__)
def test_objects_created_inside(fn):
    check(fn, lambda: (torch.randn(3, 4), torch.randn(3, 4)))


def test_new_module_returned_is_a_new_object_per_call():
    def fn(x):
        m = torch.nn.Softmax(dim=0)
        return m(x), m

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc, fullgraph=True)
    (o1, m1), (o2, m2) = compiled(torch.randn(3)), compiled(torch.randn(3))
    assert type(m1) is torch.nn.Softmax and m1.dim == 0 and m1 is not m2
    assert cc.frame_count == 1


def test_new_module_with_parameters_is_unsupported():
    def fn(x):
        return torch.nn.Linear(3, 3)(x)

    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend=CompileCounter(), fullgraph=True)(torch.randn(3))
    torch.manual_seed(0)
    expected = fn(torch.ones(3))
    torch.manual_seed(0)
    assert_same(kiln.compile(fn, backend=CompileCounter())(torch.ones(3)), expected)


# A module class of the user's, created inside (transformers' ACT2FN["gelu"] builds a new
# GELUActivation on every call): its __init__ only configures the module, so it is built at
# capture, as torch.nn's are.
class _Gelu(torch.nn.Module):
    def __init__(self, use_python: bool = False):
        super().__init__()
        self.act = self._python if use_python else torch.nn.functional.gelu

    def _python(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / 1.4142135623730951))

    def forward(self, x):
        return self.act(x)


class _Scaled(torch.nn.GELU):
    def __init__(self, k):
        super().__init__(approximate="tanh")
        self.k = k

    def forward(self, x):
        return super().forward(x) * self.k


class _Instantier(dict):
    def __getitem__(self, key):
        cls, kwargs = super().__getitem__(key)
        return cls(**kwargs)


_ACT = _Instantier({"gelu": (_Gelu, {}), "gelu_python": (_Gelu, {"use_python": True}),
                    "scaled": (_Scaled, {"k": 3.0})})


def new_user_modules(x, y):
    return _ACT["gelu"](x) + _ACT["gelu_python"](y) + _ACT["scaled"](x) + _Gelu()(y)


def test_user_module_created_inside_is_captured():
    check(new_user_modules, lambda: (torch.randn(3, 4), torch.randn(3, 4)))


def test_user_module_created_inside_and_returned_is_new_per_call():
    def fn(x):
        m = _Scaled(2.0)
        return m(x), m

    cc = CompileCounter()
    compiled = kiln.compile(fn, backend=cc, fullgraph=True)
    (o1, m1), (o2, m2) = compiled(torch.randn(3)), compiled(torch.randn(3))
    assert type(m1) is _Scaled and m1.k == 2.0 and m1.approximate == "tanh" and m1 is not m2
    assert cc.frame_count == 1


_made: list = []


class _Registers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _made.append(self)          # a write to a list that existed before: not only configuring

    def forward(self, x):
        return x * 2


class _Counts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1             # state on the module: eager starts from a new one each call
        return x * self.calls


class _Drawn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.rand(())   # a random draw on every call, in eager

    def forward(self, x):
        return x * self.scale


@pytest.mark.parametrize("cls", [_Registers, _Counts, _Drawn], ids=lambda c: c.__name__)
def test_user_module_whose_init_does_more_breaks_and_matches_eager(cls):
    def fn(x):
        return cls()(x) + 1

    with pytest.raises(kiln.Unsupported):
        kiln.compile(fn, backend=CompileCounter(), fullgraph=True)(torch.randn(3))
    _made.clear()
    compiled = kiln.compile(fn, backend=CompileCounter())
    for _ in range(2):
        x = torch.randn(3)
        torch.manual_seed(0)
        expected = fn(x)
        torch.manual_seed(0)
        assert_same(compiled(x), expected)
    if cls is _Registers:
        assert len(_made) == 4      # (eager's two calls and the compiled function's two)


_SCALE = 1.0


class _ReadsGlobal(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k = _SCALE

    def forward(self, x):
        return x * self.k


def test_user_module_reading_what_the_call_changed_matches_eager():
    # the call sets the global its __init__ reads: built at capture, it would see the old value
    def fn(x):
        global _SCALE
        _SCALE = _SCALE + 1.0
        return _ReadsGlobal()(x)

    global _SCALE
    compiled = kiln.compile(fn, backend=CompileCounter())
    _SCALE = 1.0
    expected = [fn(torch.ones(2)) for _ in range(2)]
    _SCALE = 1.0
    assert_same([compiled(torch.ones(2)) for _ in range(2)], expected)
    assert _SCALE == 3.0


def torch_assert_on_sizes(x, y):
    # timm checks input sizes with torch._assert, which asks has_torch_function first
    torch._assert(x.shape[-1] == y.shape[-1], "sizes differ")
    torch._assert(x.dim() == 2, "2-d only")
    return x + y


def test_torch_assert_is_captured():
    check(torch_assert_on_sizes, lambda: (torch.randn(3, 4), torch.randn(3, 4)))


def test_torch_assert_that_fails_raises_as_eager():
    compiled = kiln.compile(torch_assert_on_sizes, backend=CompileCounter())
    with pytest.raises(AssertionError, match="sizes differ"):
        compiled(torch.randn(3, 4), torch.randn(3, 5))


class _Logged(torch.Tensor):
    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_has_torch_function_of_a_tensor_subclass_runs_its_override():
    def fn(x):
        torch._assert(x, "never")
        return x + 1

    x = torch.ones(1).as_subclass(_Logged)
    _Logged.seen.clear()
    expected = fn(x)
    eager_seen = list(_Logged.seen)
    _Logged.seen.clear()
    assert_same(kiln.compile(fn, backend=CompileCounter())(x), expected)
    assert torch._assert in eager_seen and torch._assert in _Logged.seen


def typing_constructs(x, y):
    # timm's CrossViT: torch.jit.annotate(List[torch.Tensor], []); torch's pytree: list[Any]
    from typing import Any, Dict, List, Optional

    out = torch.jit.annotate(List[torch.Tensor], [])
    out.append(x + y)
    kinds = (list[Any], Dict[str, Optional[torch.Tensor]])
    return out[0] * 2, kinds[0] is not None, List[torch.Tensor] == List[torch.Tensor]


def test_typing_constructs_are_built_at_capture():
    check(typing_constructs, lambda: (torch.randn(3), torch.randn(3)))


def test_validated_distribution_breaks_at_its_data_check():
    # validation reads the parameters' values (a ValueError if invalid): a break, as eager
    def fn(x, scale):
        return torch.distributions.Normal(x, scale, validate_args=True).log_prob(x)

    compiled = kiln.compile(fn, backend=CompileCounter())
    x = torch.randn(3)
    assert_same(compiled(x, torch.ones(3)), fn(x, torch.ones(3)))
    with pytest.raises(ValueError):
        compiled(x, -torch.ones(3))


# ------------------------------------------------------------------------ more variants
def keys_view_set_operations(x, y):
    d, e = {"a": x, "b": y}, {"b": 1, "c": 2}
    return (x + 1, d.keys() | {"z"}, d.keys() & e.keys(), d.keys() - {"a"}, d.keys() ^ e.keys(),
            {"b", "q"} & d.keys(), sorted(d.keys() | e.keys()))


def bare_no_grad_decorator(x, y):
    @torch.no_grad
    def frozen(t):
        return t * 2

    return frozen(x) + y


def new_sequential_of_new_modules(x, y):
    seq = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())
    return seq(x) + y, len(seq)


def it_filterfalse_tee(x, y):
    a, b = itertools.tee([x, y, x + y])
    kept = list(itertools.filterfalse(lambda n: n % 2, range(5)))
    return [p * q for p, q in zip(a, b)], list(a), x * len(kept)


MORE_CASES = [keys_view_set_operations, bare_no_grad_decorator, new_sequential_of_new_modules,
              it_filterfalse_tee]


@pytest.mark.parametrize("fn", MORE_CASES, ids=lambda f: f.__name__)
def test_more_variants(fn):
    check(fn, lambda: (torch.randn(3, 4, requires_grad=fn is bare_no_grad_decorator),
                       torch.randn(3, 4)))


def test_new_sequential_returned_is_rebuilt_per_call():
    def fn(x):
        seq = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Softmax(dim=0))
        return seq(x), seq

    compiled = kiln.compile(fn, backend=CompileCounter(), fullgraph=True)
    (o1, s1), (o2, s2) = compiled(torch.randn(3)), compiled(torch.randn(3))
    assert s1 is not s2 and s1[0] is not s2[0]
    assert [type(m) for m in s1] == [torch.nn.ReLU, torch.nn.Softmax] and s1[1].dim == 0


def test_minmax_of_tensors_refuses_what_would_tell_a_select_from_the_object():
    def of_inputs(x, y):
        return max(x, y)                     # eager returns the caller's own tensor

    def written_after(x, y):
        a, b = x.sum(), y.sum()
        m = max(a, b)
        m.add_(1)                            # eager writes a or b too
        return a, b, m

    def returned_with_candidates(x, y):
        a, b = x.sum(), y.sum()
        return a, max(a, b)                  # eager's second output may be the first

    def compared(x, y):
        a, b = x.sum(), y.sum()
        return max(a, b) is a

    def break_after(x, y):
        a, b = x.sum(), y.sum()
        m = max(a, b)
        print("", end="")                    # a continuation would get a copy, not a or b
        m.add_(1)
        return a, b

    for fn in (of_inputs, written_after, returned_with_candidates, compared, break_after):
        with pytest.raises(kiln.Unsupported):
            kiln.compile(fn, backend=CompileCounter(), fullgraph=True)(torch.randn(1), torch.randn(1))
        compiled = kiln.compile(fn, backend=CompileCounter())
        x, y = torch.randn(1), torch.randn(1)
        got, expected = compiled(x, y), fn(x, y)
        assert_same(got, expected)
        if fn is of_inputs:
            assert got is x or got is y
        if fn is returned_with_candidates:
            assert (got[1] is got[0]) == (expected[1] is expected[0])


def it_groupby(x, y):
    out = [(k, [t * 2 for t in g]) for k, g in itertools.groupby([x, x, y, x], key=lambda t: t is x)]
    firsts = [k for k, _ in itertools.groupby("aabccc")]
    lazy = [(k, list(g)) for k, g in list(itertools.groupby([1, 1, 2, 3, 3]))]   # emptied groups
    sizes = [len(list(g)) for _, g in itertools.groupby([3, 3, 1, 1, 1], key=lambda n: n % 2)]
    return out, firsts, lazy, sizes


def test_itertools_groupby():
    check(it_groupby, lambda: (torch.randn(3), torch.randn(3)))


class _ReadsModuleState(torch.nn.Module):
    """An __init__ that reads what nn.Module.__init__ set (LazyModuleMixin registers hooks)."""
    def __init__(self):
        super().__init__()
        self.hooks = self._forward_pre_hooks
        self.register_forward_pre_hook(lambda module, args: None)


def test_a_new_module_whose_init_reads_nn_module_state_is_built_as_eager():
    def f(x):
        try:
            _ReadsModuleState()
        except AttributeError:          # (eager never gets here)
            return x - 100
        return x + 1

    x = torch.ones(2)
    assert_same(kiln.compile(f, backend="aot_eager")(x), f(x))
    with pytest.raises(kiln.Unsupported, match="nn.Module.__init__ sets"):
        kiln.compile(f, backend="aot_eager", fullgraph=True)(x)


@torch.jit.script
def _scripted_scale(q: torch.Tensor, factor: int):
    return torch.sqrt(torch.tensor(q.size(-1), dtype=torch.float) * factor)


def test_a_torch_jit_script_function_is_traced_through_its_python_original():
    """(DeBERTa's ``scaled_size_sqrt``) torch keeps the Python function beside the scripted one."""
    def f(x):
        return x / _scripted_scale(x, 2)

    counter = CompileCounter()
    x = torch.randn(3, 4)
    assert_same(kiln.compile(f, backend=counter, fullgraph=True)(x), f(x))
    assert counter.frame_count == 1
