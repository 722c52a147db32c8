"""Conformance: calls (positional/keyword/defaults/*args/**kwargs), inlining user functions
and methods, closures (incl. nonlocal and closures inside inlined helpers), lambdas,
functools.partial, fixed-depth recursion, static/class methods, getattr/hasattr/isinstance,
and Python builtins (min/max/sum/len/range/enumerate/zip/reversed/sorted/map/filter/any/all)."""
import functools
import os
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from _conformance import A, R, case, fresh, ids_unique, run_case  # noqa: E402


# ----------------------------------------------------------------------------- helpers being inlined
def h_pos(a, b, c):
    return a * b + c


def h_defaults(a, b=2, c=None, *, scale=1.0):
    out = a * b
    if c is not None:
        out = out + c
    return out * scale


def h_varargs(*args):
    out = args[0]
    for a in args[1:]:
        out = out + a
    return out, len(args)


def h_varkw(x, **kwargs):
    out = x
    for k in sorted(kwargs):
        out = out * kwargs[k] if k.startswith("m") else out + kwargs[k]
    return out, sorted(kwargs)


def h_both(x, *args, alpha=1, **kwargs):
    return x * alpha + sum(args) + sum(kwargs.values()), len(args), tuple(kwargs)


def h_kwonly(x, *, k):
    return x + k


def h_posonly(x, y, /, z=1):
    return x - y + z


def h_mutates_list(xs, v):
    xs.append(v)
    return len(xs)


def h_returns_fn(k):
    def inner(t):
        return t * k
    return inner


def h_with_closure(x, n):
    def add_n(t):
        return t + n
    return add_n(x) * add_n(1)


def h_calls_h(x):
    return h_pos(x, 2, 3) + h_defaults(x, c=x)


class Point2:
    def __init__(self, x, y):
        self.x = x
        self.y = y

    def norm2(self):
        return self.x * self.x + self.y * self.y

    def scaled(self, k):
        return Point2(self.x * k, self.y * k)

    @property
    def total(self):
        return self.x + self.y


class Config:
    def __init__(self, scale=2.0, shift=1, act="relu"):
        self.scale = scale
        self.shift = shift
        self.act = act


class Ops:
    factor = 3

    @staticmethod
    def double(t):
        return t * 2

    @classmethod
    def triple(cls, t):
        return t * cls.factor

    def apply(self, t):
        return self.double(t) + self.triple(t)


class SubOps(Ops):
    factor = 5

    def apply(self, t):
        return super().apply(t) - 1


class Counter:
    def __init__(self):
        self.n = 0

    def bump(self, k=1):
        self.n += k
        return self.n


class CallableObj:
    def __init__(self, w):
        self.w = w

    def __call__(self, t):
        return t * self.w


def recurse_sum(x, depth):
    if depth == 0:
        return x
    return x + recurse_sum(x * 0.5, depth - 1)


def fib_like(x, n):
    if n <= 1:
        return x
    return fib_like(x, n - 1) + fib_like(x * 2, n - 2)


# ----------------------------------------------------------------------------- calls
def call_positional(x, y):
    return h_pos(x, y, 1)


def call_keyword(x, y):
    return h_pos(c=1, b=y, a=x) + h_pos(x, c=2, b=3)


def call_defaults(x):
    return h_defaults(x), h_defaults(x, 3), h_defaults(x, c=x, scale=0.5)


def call_star_args(x, y):
    xs = [x, y, x * y]
    out, n = h_varargs(*xs)
    out2, _ = h_varargs(x, *xs[1:])
    return out + n, out2


def call_star_kwargs(x):
    kw = {"b": 3, "scale": 2.0}
    return h_defaults(x, **kw)


def call_star_both(x, y):
    args = (x, y)
    kw = {"b": 4, "c": x}
    return h_pos(*args, 1) + h_defaults(*args[:1], **kw)


def call_varkw_receiver(x):
    return h_varkw(x, a=1, m=2.0, b=x)


def call_star_and_varkw_receiver(x):
    r1 = h_both(x, 1, 2, alpha=3, p=4, q=5)
    r2 = h_both(x, *(1, 2), **{"alpha": 2, "z": 1})
    return r1, r2


def call_kwonly_posonly(x, y):
    return h_kwonly(x, k=2) + h_posonly(x, y) + h_posonly(x, y, z=5)


def call_nested_helpers(x):
    return h_calls_h(x)


def call_inner_mutates_list(x):
    xs = [x]
    n = h_mutates_list(xs, x + 1)
    return xs[0] + xs[1] * n


# ----------------------------------------------------------------------------- objects and methods
def obj_attrs_read(x, cfg):
    y = x * cfg.scale + cfg.shift
    if cfg.act == "relu":
        y = torch.relu(y)
    return y


def obj_tensor_attrs(p):
    return p.norm2() + p.total


def obj_method_returns_obj(p):
    q = p.scaled(2)
    return q.x - q.y, q.norm2()


def obj_built_inside(x, y):
    p = Point2(x, y)
    return p.norm2() * p.total


def obj_mutated_attr(x, ctr):
    k = ctr.bump()
    k = ctr.bump(2)
    return x * k


def obj_setattr_inside(x):
    p = Point2(x, 1)
    p.y = x * 3
    p.z = 5
    return p.total + p.z


def obj_static_class_methods(x):
    return Ops.double(x) + Ops.triple(x) + Ops().apply(x) + SubOps().apply(x) + SubOps.triple(x)


def obj_callable_instance(x, f):
    return f(x) + f(x + 1)


def obj_bound_method_value(x, p):
    m = p.norm2
    return m() + x


# ----------------------------------------------------------------------------- closures
def closure_created_inside(x):
    k = 3

    def inner(t):
        return t * k + x

    return inner(x) + inner(1)


def closure_over_argument(x, n):
    def add(t):
        return t + n * x
    return add(x * 2)


def closure_nonlocal(x):
    count = 0
    acc = x

    def step(t):
        nonlocal count, acc
        count += 1
        acc = acc + t
        return acc

    step(x)
    step(x * 2)
    return acc * count, count


def closure_in_inlined_helper(x):
    return h_with_closure(x, 5) + h_with_closure(x, 2)


def closure_returned_from_helper(x):
    f = h_returns_fn(3)
    g = h_returns_fn(x)
    return f(x) + g(2)


def closure_late_binding(x):
    fns = []
    for i in range(3):
        fns.append(lambda t, i=i: t + i)
    late = [lambda t: t * i for i in range(3)]
    return [f(x) for f in fns] + [f(x) for f in late]


def closure_nested_two_levels(x):
    a = 2

    def outer(t):
        b = 3

        def inner(u):
            return u * a + b

        return inner(t) + inner(x)

    return outer(x)


def closure_cell_modified_after_def(x):
    k = 1

    def f(t):
        return t * k

    k = 10
    return f(x)


def _make_outer_closure():
    outer_t = torch.linspace(-1, 1, 12).reshape(3, 4)
    outer_n = 4

    def compiled_closure(x):
        return x * outer_n + outer_t

    return compiled_closure


compiled_closure = _make_outer_closure()


def _make_counter_closure():
    outer_w = torch.ones(4) * 0.5

    def with_nonlocal_read(x, scale=2):
        def inner(t):
            return t @ outer_w
        return inner(x) * scale

    return with_nonlocal_read


closure_compiled_fn_default = _make_counter_closure()


# ----------------------------------------------------------------------------- lambdas / partial
def lambda_simple(x):
    f = lambda t: t * 2 + 1  # noqa: E731
    g = lambda t, k=3: t - k  # noqa: E731
    return f(x) + g(x) + g(x, k=1)


def lambda_passed_in(x, f):
    return f(x) * 2


def lambda_in_sorted_and_map(x):
    ks = sorted([3, -1, 2], key=lambda v: -v)
    ys = list(map(lambda k: x * k, ks))
    return ys


def partial_torch_fn(x, y):
    add2 = functools.partial(torch.add, alpha=2)
    s = functools.partial(torch.sum, dim=1)
    return add2(x, y), s(x)


def partial_user_fn(x):
    f = functools.partial(h_defaults, b=5)
    g = functools.partial(h_pos, x, 2)
    return f(x, c=1) + g(3)


def partial_passed_in(x, f):
    return f(x)


def partial_of_partial(x):
    f = functools.partial(h_defaults, scale=3.0)
    g = functools.partial(f, b=2)
    return g(x) + g(x, c=x)


# ----------------------------------------------------------------------------- recursion
def recursion_fixed_depth(x):
    return recurse_sum(x, 3)


def recursion_branching(x):
    return fib_like(x, 4)


# ----------------------------------------------------------------------------- getattr / hasattr / isinstance
def getattr_builtin(x, cfg):
    s = getattr(cfg, "scale")
    m = getattr(cfg, "missing", 7)
    return x * s + m


def getattr_torch_fn(x, name):
    return getattr(torch, name)(x)


def getattr_tensor_method(x):
    return getattr(x, "sum")(1) + getattr(x, "T").sum(0).sum()


def hasattr_checks(x, cfg):
    out = x
    if hasattr(cfg, "scale"):
        out = out * cfg.scale
    if hasattr(cfg, "nope"):
        out = out + 100
    if hasattr(x, "shape"):
        out = out + 1
    return out


def setattr_delattr_obj(x):
    p = Point2(x, x)
    setattr(p, "w", 4)
    delattr(p, "y")
    return p.x * p.w, hasattr(p, "y")


def isinstance_tuples(x, v):
    out = x
    if isinstance(v, (int, float)):
        out = out + v
    if isinstance(x, (list, torch.Tensor)):
        out = out * 2
    if isinstance(v, (str, bytes)):
        out = out - 1000
    return out


def isinstance_user_classes(x, o):
    if isinstance(o, SubOps):
        return o.apply(x)
    if isinstance(o, Ops):
        return x
    return -x


def issubclass_check(x):
    return x + issubclass(SubOps, Ops) + issubclass(bool, int)


# ----------------------------------------------------------------------------- builtins
def builtins_min_max_sum(x):
    xs = [4, 1, 7]
    return x * min(xs) + max(xs) + sum(xs) + sum(xs, 10) + max(1, 2, 3) + min(xs, key=lambda v: -v)


def builtins_len_variants(x, xs, d):
    return x * (len(xs) + len(d) + len("abc") + len(range(5)) + len(x.shape))


def builtins_range(x):
    a = list(range(4))
    b = list(range(2, 6))
    c = list(range(10, 0, -3))
    return x * sum(a) + sum(b) - sum(c), a, b, c, range(5)[2], len(range(1, 10, 2))


def builtins_enumerate(xs):
    out = []
    for i, t in enumerate(xs):
        out.append(t * i)
    for i, t in enumerate(xs, start=10):
        out.append(t + i)
    return out, list(enumerate([5, 6], 1))


def builtins_zip(xs, ys):
    pairs = [a * b for a, b in zip(xs, ys)]
    triples = [a + b + c for a, b, c in zip(xs, ys, [1, 2, 3])]
    return pairs, triples, list(zip([1, 2], "ab"))


def builtins_reversed_sorted(x):
    xs = [3, 1, 2]
    r = list(reversed(xs))
    s = sorted(xs)
    s2 = sorted(xs, reverse=True)
    out = x
    for k in reversed(range(3)):
        out = out * 2 + k
    return out, r, s, s2


def builtins_map_filter(x):
    ks = list(filter(lambda v: v % 2 == 1, range(6)))
    ys = list(map(lambda k: x + k, ks))
    zs = list(map(lambda a, b: a * b, ys, [1, 2, 3]))
    return zs


def builtins_any_all(x, xs):
    out = x
    if any(v > 2 for v in xs):
        out = out + 1
    if all(v > 0 for v in xs):
        out = out * 2
    return out, any([]), all([])


def builtins_tensor_reductions_python(xs):
    return sum(xs), max(len(xs), 2)


def builtins_iter_next(x):
    it = iter([x, x * 2, x * 3])
    a = next(it)
    b = next(it)
    return a + b, next(it, None) is not None


def builtins_id_type_equality(x):
    t = type(x)
    return x * (t is torch.Tensor) + (type(3) is int)


def call_tensor_bound_method(m, y):
    # a tensor's bound method as an argument (a continuation gets one from the stack of a
    # call that a graph break interrupted)
    return m(y) * 2 + m.__self__


CASES = ids_unique([
    # calls
    case(call_tensor_bound_method, A(fresh(lambda: torch.randn(3).add), R(3))),
    case(call_positional, A(R(3, 4), R(3, 4))),
    case(call_keyword, A(R(3, 4), R(3, 4))),
    case(call_defaults, A(R(3, 4))),
    case(call_star_args, A(R(3, 4), R(3, 4))),
    case(call_star_kwargs, A(R(3, 4))),
    case(call_star_both, A(R(3, 4), R(3, 4))),
    case(call_varkw_receiver, A(R(3, 4))),
    case(call_star_and_varkw_receiver, A(R(3, 4))),
    case(call_kwonly_posonly, A(R(3, 4), R(3, 4))),
    case(call_nested_helpers, A(R(3, 4))),
    case(call_inner_mutates_list, A(R(3, 4))),
    case(h_defaults, A(R(3, 4), b=3, c=None, scale=2.0), id="call_compiled_with_kwargs"),
    case(h_both, A(R(3, 4), 1, 2, alpha=2, extra=3), id="call_compiled_varargs_varkw"),
    # objects
    case(obj_attrs_read, A(R(3, 4), Config(scale=1.5, shift=2, act="relu"))),
    case(obj_tensor_attrs, A(fresh(lambda: Point2(torch.randn(3), torch.randn(3))))),
    case(obj_method_returns_obj, A(fresh(lambda: Point2(torch.randn(3), torch.randn(3))))),
    case(obj_built_inside, A(R(3, 4), R(3, 4))),
    case(obj_mutated_attr, A(R(3, 4), fresh(Counter))),
    case(obj_setattr_inside, A(R(3, 4))),
    case(obj_static_class_methods, A(R(3, 4))),
    case(obj_callable_instance, A(R(3, 4), fresh(lambda: CallableObj(torch.randn(4))))),
    case(obj_bound_method_value, A(R(3), fresh(lambda: Point2(torch.randn(3), torch.randn(3))))),
    # closures
    case(closure_created_inside, A(R(3, 4))),
    case(closure_over_argument, A(R(3, 4), 3)),
    case(closure_nonlocal, A(R(3, 4))),
    case(closure_in_inlined_helper, A(R(3, 4))),
    case(closure_returned_from_helper, A(R(3, 4))),
    case(closure_late_binding, A(R(3, 4))),
    case(closure_nested_two_levels, A(R(3, 4))),
    case(closure_cell_modified_after_def, A(R(3, 4))),
    case(compiled_closure, A(R(3, 4)), id="compiled_fn_is_closure"),
    case(closure_compiled_fn_default, A(R(3, 4)), id="compiled_closure_with_default", rtol=1e-4, atol=1e-5),
    # lambdas / partial
    case(lambda_simple, A(R(3, 4))),
    case(lambda_passed_in, A(R(3, 4), lambda t: torch.sin(t) + 1)),
    case(lambda_in_sorted_and_map, A(R(3, 4))),
    case(partial_torch_fn, A(R(3, 4), R(3, 4))),
    case(partial_user_fn, A(R(3, 4))),
    case(partial_passed_in, A(R(3, 4), functools.partial(torch.clamp, min=-0.5, max=0.5))),
    case(partial_of_partial, A(R(3, 4))),
    case(lambda t: t.cos() * 2, A(R(3, 4)), id="compiled_fn_is_lambda"),
    case(functools.partial(h_pos, b=2, c=1), A(R(3, 4)), id="compiled_fn_is_partial"),
    # recursion
    case(recursion_fixed_depth, A(R(3, 4))),
    case(recursion_branching, A(R(3, 4))),
    # getattr / hasattr / isinstance
    case(getattr_builtin, A(R(3, 4), Config())),
    case(getattr_torch_fn, A(R(3, 4), "tanh")),
    case(getattr_tensor_method, A(R(3, 4))),
    case(hasattr_checks, A(R(3, 4), Config())),
    case(setattr_delattr_obj, A(R(3, 4))),
    case(isinstance_tuples, A(R(3, 4), 2.5)),
    case(isinstance_user_classes, A(R(3, 4), SubOps())),
    case(issubclass_check, A(R(3, 4))),
    # builtins
    case(builtins_min_max_sum, A(R(3, 4))),
    case(builtins_len_variants, A(R(3, 4), [1, 2], {"a": 1})),
    case(builtins_range, A(R(3, 4))),
    case(builtins_enumerate, A([R(3), R(3), R(3)])),
    case(builtins_zip, A([R(3), R(3), R(3)], [R(3), R(3), R(3)])),
    case(builtins_reversed_sorted, A(R(3, 4))),
    case(builtins_map_filter, A(R(3, 4))),
    case(builtins_any_all, A(R(3, 4), [1, 3])),
    case(builtins_tensor_reductions_python, A([R(3), R(3)])),
    case(builtins_iter_next, A(R(3, 4))),
    case(builtins_id_type_equality, A(R(3, 4))),
])


@pytest.mark.parametrize("fn,make_args,opts", CASES)
def test_calls(fn, make_args, opts):
    run_case(fn, make_args, opts)
