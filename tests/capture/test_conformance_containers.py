"""Conformance: tuples, lists, dicts, sets, comprehensions, container methods, unpacking,
returning containers of tensors, user subclasses of list/dict, namedtuple, OrderedDict."""
import collections
import copy
import os
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from _conformance import A, R, case, fresh, ids_unique, run_case  # noqa: E402

Point = collections.namedtuple("Point", ["x", "y"])
Triple = collections.namedtuple("Triple", "a b c")


class MyList(list):
    def total(self):
        out = self[0]
        for v in self[1:]:
            out = out + v
        return out

    def append(self, v):  # overridden: appends twice
        super().append(v)
        super().append(v)

    def __deepcopy__(self, memo):  # the default deepcopy would go through the overridden append
        return type(self)(copy.deepcopy(list(self), memo))


class ScaledList(list):
    def __getitem__(self, i):
        return super().__getitem__(i) * 10


class MyDict(dict):
    def __getitem__(self, k):
        return dict.__getitem__(self, k) + 1

    def total(self):
        vals = list(self.values())
        return vals[0] + vals[1]


# ----------------------------------------------------------------------------- tuples
def tuple_build_index(x, y):
    t = (x, y, 2)
    return t[0] + t[1] * t[2], t[-1], len(t)


def tuple_slice(x):
    t = (x, x + 1, x + 2, x + 3, x + 4)
    return t[1:3], t[::-2], t[-2:], t[:-3], t[::2]


def tuple_concat_repeat(x):
    t = (x,) + (x * 2,)
    u = (1, 2) * 2
    return t, u, t + (3,)


def tuple_methods(x):
    t = (1, 2, 2, 3)
    return x * t.count(2) + t.index(3)


def tuple_from_list(x, xs):
    t = tuple(xs)
    return x + t[0] * t[1], t


def tuple_input_nested(t):
    (a, (b, c)) = t
    return a + b * c


# ----------------------------------------------------------------------------- lists
def list_build_index(x, y):
    xs = [x, y, x * y]
    return xs[0] + xs[-1] - xs[1], len(xs)


def list_slicing(x):
    xs = [x * i for i in range(6)]
    return xs[1:4], xs[::2], xs[::-1], xs[-3:-1], xs[5:1:-2], xs[:]


def list_setitem(x):
    xs = [x, x, x]
    xs[1] = x * 2
    xs[-1] = x - 5
    return xs


def list_slice_assign_and_del(x):
    xs = [x, x + 1, x + 2, x + 3]
    xs[1:3] = [x * 10]
    del xs[0]
    return xs


def list_methods_append_extend_pop_insert(x):
    xs = [x]
    xs.append(x + 1)
    xs.extend([x + 2, x + 3])
    last = xs.pop()
    first = xs.pop(0)
    xs.insert(1, last * 2)
    xs.insert(0, first)
    return xs


def list_methods_ints(x):
    xs = [3, 1, 4, 1, 5, 9, 2, 6]
    xs.reverse()
    idx = xs.index(4)
    cnt = xs.count(1)
    ys = list(xs)
    ys.sort()
    zs = xs.copy()
    zs.sort(reverse=True)
    zs.remove(9)
    return x * idx + cnt, xs, ys, zs


def list_sort_key(x):
    xs = [(2, "b"), (1, "z"), (3, "a")]
    xs.sort(key=lambda p: p[1])
    return x + xs[0][0], xs


def list_clear_and_reuse(x):
    xs = [1, 2]
    xs.clear()
    xs.append(x + 1)
    return xs, len(xs)


def list_concat_repeat(x):
    xs = [x] + [x + 1]
    ys = [0] * 3
    ys[1] = 5
    return xs * 2, ys


def list_len_in(x, k):
    xs = [1, 2, 3, 4]
    return x * len(xs) + (k in xs) + (k not in xs), k in xs


def list_input_read(xs):
    return xs[0] + xs[1] * xs[2]


def list_input_mutation(x, xs):
    xs.append(x * 2)
    xs[0] = xs[0] + 1
    return x.sum()


def list_of_lists(x):
    grid = [[x * (i + j) for j in range(2)] for i in range(3)]
    return grid[2][1] - grid[1][0], grid


def list_comprehension_cond(x):
    return [x + i for i in range(6) if i % 2 == 0]


def list_comprehension_over_tensors(xs):
    return [t * 2 for t in xs if t.dim() == 2]


def list_constructor(x):
    xs = list(range(4))
    ys = list((x, x + 1))
    return x * sum(xs), xs, ys


# ----------------------------------------------------------------------------- dicts
def dict_build_index(x, y):
    d = {"a": x, "b": y, 3: 7}
    return d["a"] * d[3] + d["b"], len(d)


def dict_constructors(x):
    d1 = dict(a=1, b=2)
    d2 = dict(zip(["p", "q"], [x, x * 2]))
    d3 = dict([("k", 3)])
    d4 = {**d1, "c": 5}
    return d2["q"] + d1["b"] + d3["k"] + d4["c"], d4


def dict_get(x):
    d = {"a": x, "b": 2}
    return d.get("a") * d.get("b", 0) + d.get("zz", 10), d.get("missing")


def dict_items_keys_values(d):
    ks = list(d.keys())
    vs = list(d.values())
    out = {k + "_2": v * 2 for k, v in d.items()}
    return ks, vs[0] + vs[1], out


def dict_update_setdefault_pop(x):
    d = {"a": x}
    d.update({"b": x + 1})
    d.update(c=x + 2)
    v = d.setdefault("a", x * 100)
    w = d.setdefault("e", x * 3)
    p = d.pop("b")
    q = d.pop("zz", None)
    del d["c"]
    return d, v + w + p, q


def dict_setitem_order(x):
    d = {}
    d["z"] = x
    d["a"] = x + 1
    d["z"] = x * 2  # keeps insertion position
    return d, list(d)


def dict_in_len(x, key):
    d = {"a": 1, "b": 2}
    return x + len(d) + (key in d) + ("c" not in d)


def dict_input_mutation(x, d):
    d["new"] = x * 2
    d["a"] = d["a"] + 1
    return x + 1


def dict_int_keys(x):
    d = {i: x * i for i in range(3)}
    return d[0] + d[1] + d[2], sorted(d.keys())


def dict_merge_operator(x):
    a = {"p": x, "q": 1}
    b = {"q": 2, "r": x * 3}
    c = a | b
    a |= {"s": 4}
    return c, a


def dict_copy_independent(x):
    d = {"a": x}
    e = d.copy()
    e["a"] = x + 1
    return d["a"], e["a"]


def dict_nested(x):
    d = {"outer": {"inner": x, "n": 2}, "l": [x, 3]}
    return d["outer"]["inner"] * d["outer"]["n"] + d["l"][0] * d["l"][1], d


def defaultdict_usage(x):
    d = collections.defaultdict(list)
    d["a"].append(x)
    d["a"].append(x + 1)
    d["b"].append(x * 2)
    return d["a"][0] + d["a"][1] + d["b"][0], len(d)


# ----------------------------------------------------------------------------- sets
def set_build_add_union(x):
    s = {1, 2}
    s.add(3)
    s.add(2)
    t = s.union({5, 6})
    u = s | {7}
    return x * len(s) + len(t) + len(u), t


def set_ops(x):
    a = {1, 2, 3, 4}
    b = {3, 4, 5}
    return x + len(a & b) + len(a - b) + len(a ^ b), a & b, sorted(a | b)


def set_membership(x, k):
    s = {1, 3, 5}
    s.discard(3)
    return x * (k in s) + (3 not in s)


def set_comprehension(x):
    s = {i % 3 for i in range(10)}
    return x * len(s), s


def set_from_list_dedup(x):
    xs = [1, 2, 2, 3, 3, 3]
    return x + len(set(xs)), sorted(set(xs)), frozenset(xs)


# ----------------------------------------------------------------------------- unpacking
def unpack_tuple(x, y):
    a, b = x, y
    b, a = a, b
    return a - b


def unpack_starred(xs):
    a, *rest = xs
    *init, last = xs
    first, *mid, end = xs
    return a + last, rest, init, mid, len(mid)


def unpack_nested(x):
    (a, b), (c, (d, e)) = (x, x + 1), (x + 2, (x + 3, 4))
    return a + b + c + d + e


def unpack_tensor_rows(x):
    a, b, c = x
    return a + b * c


def unpack_dict_keys(x):
    k1, k2 = {"p": x, "q": 1}
    return x + len(k1 + k2), k1, k2


def unpack_call_result(x):
    def two(t):
        return t + 1, t - 1

    p, m = two(x)
    return p * m


def unpack_in_for(x):
    pairs = [(1, x), (2, x * 2)]
    out = x
    for k, v in pairs:
        out = out + k * v
    return out


def unpack_starred_in_call_and_literal(x, xs):
    ys = [*xs, x]
    t = (*xs, *xs)
    d = {**{"a": x}, "b": 2}
    return torch.stack([*ys]), len(t), d


# ----------------------------------------------------------------------------- returning containers
def return_list(x):
    return [x, x + 1, x * 2]


def return_dict(x, y):
    return {"sum": x + y, "diff": x - y, "n": 3}


def return_nested_tuples(x):
    return (x, (x + 1, (x + 2, x + 3)), ((x * 2,),))


def return_mixed(x):
    return x * 2, 3, 2.5, None, "tag", True, [x, None, 1], {"t": x + 1, "s": "v", "n": None}


def return_empty_containers(x):
    return x + 1, [], {}, ()


def return_input_container(xs):
    xs2 = list(xs)
    xs2.append(xs[0] * 2)
    return xs2, xs


# ----------------------------------------------------------------------------- user list/dict subclasses
def mylist_method(xs):
    return xs.total() * 2


def mylist_build_inside(x):
    xs = MyList([x, x + 1])
    xs.append(x * 3)  # overridden: appended twice
    return xs.total(), len(xs)


def mylist_return(x):
    xs = MyList([x, x + 1])
    xs.append(x * 2)
    return xs


def mylist_iterate(xs):
    out = 0
    for v in xs:
        out = out + v
    return out, len(xs)


def scaled_list_getitem(xs):
    return xs[0] + xs[1]


def scaled_list_getitem_tensors(xs, x):
    return x * xs[0] + xs[1]


def mydict_getitem(d, x):
    return x * d["a"] + d["b"]


def mydict_tensor_values(d):
    return d["p"] * 2 + d.total()


def mydict_build_inside(x):
    d = MyDict(a=x, b=2)
    d["c"] = x * 3
    return d["a"] + d["c"], len(d), "c" in d


def mydict_items(d):
    return {k: v * 2 for k, v in d.items()}


# ----------------------------------------------------------------------------- namedtuple / OrderedDict
def namedtuple_build(x, y):
    p = Point(x, y)
    return p.x * p.y + p[0], p


def namedtuple_input(p):
    return p.x + p.y * 2, p.y.shape


def namedtuple_unpack_replace(x):
    t = Triple(x, 2, 3)
    a, b, c = t
    t2 = t._replace(b=5)
    return a * b + c + t2.b, t2, t._fields


def namedtuple_kwargs(x):
    p = Point(y=x * 2, x=x)
    return p.y - p.x


def ordereddict_build(x):
    d = collections.OrderedDict()
    d["b"] = x
    d["a"] = x * 2
    d.move_to_end("b")
    return d, list(d.keys())


def ordereddict_input(d):
    out = []
    for k, v in d.items():
        out.append(v + len(k))
    return out


CASES = ids_unique([
    # tuples
    case(tuple_build_index, A(R(3, 4), R(3, 4))),
    case(tuple_slice, A(R(3, 4))),
    case(tuple_concat_repeat, A(R(3, 4))),
    case(tuple_methods, A(R(3, 4))),
    case(tuple_from_list, A(R(3, 4), [2, 3])),
    case(tuple_input_nested, A((R(3, 4), (R(3, 4), R(4))))),
    # lists
    case(list_build_index, A(R(3, 4), R(3, 4))),
    case(list_slicing, A(R(3, 4))),
    case(list_setitem, A(R(3, 4))),
    case(list_slice_assign_and_del, A(R(3, 4))),
    case(list_methods_append_extend_pop_insert, A(R(3, 4))),
    case(list_methods_ints, A(R(3, 4))),
    case(list_sort_key, A(R(3, 4))),
    case(list_clear_and_reuse, A(R(3, 4))),
    case(list_concat_repeat, A(R(3, 4))),
    case(list_len_in, A(R(3, 4), 3)),
    case(list_input_read, A([R(3, 4), R(3, 4), R(4)])),
    case(list_input_mutation, A(R(3, 4), [R(2), R(2)])),
    case(list_of_lists, A(R(3, 4))),
    case(list_comprehension_cond, A(R(3, 4))),
    case(list_comprehension_over_tensors, A([R(3, 4), R(4), R(2, 2)])),
    case(list_constructor, A(R(3, 4))),
    # dicts
    case(dict_build_index, A(R(3, 4), R(3, 4))),
    case(dict_constructors, A(R(3, 4))),
    case(dict_get, A(R(3, 4))),
    case(dict_items_keys_values, A({"a": R(3, 4), "b": R(3, 4)})),
    case(dict_update_setdefault_pop, A(R(3, 4))),
    case(dict_setitem_order, A(R(3, 4))),
    case(dict_in_len, A(R(3, 4), "b")),
    case(dict_input_mutation, A(R(3, 4), {"a": R(3, 4)})),
    case(dict_int_keys, A(R(3, 4))),
    case(dict_merge_operator, A(R(3, 4))),
    case(dict_copy_independent, A(R(3, 4))),
    case(dict_nested, A(R(3, 4))),
    case(defaultdict_usage, A(R(3, 4))),
    # sets
    case(set_build_add_union, A(R(3, 4))),
    case(set_ops, A(R(3, 4))),
    case(set_membership, A(R(3, 4), 5)),
    case(set_comprehension, A(R(3, 4))),
    case(set_from_list_dedup, A(R(3, 4))),
    # unpacking
    case(unpack_tuple, A(R(3, 4), R(3, 4))),
    case(unpack_starred, A([R(2), R(2), R(2), R(2)])),
    case(unpack_nested, A(R(3, 4))),
    case(unpack_tensor_rows, A(R(3, 4))),
    case(unpack_dict_keys, A(R(3, 4))),
    case(unpack_call_result, A(R(3, 4))),
    case(unpack_in_for, A(R(3, 4))),
    case(unpack_starred_in_call_and_literal, A(R(3, 4), (R(3, 4), R(3, 4)))),
    # returning containers
    case(return_list, A(R(3, 4))),
    case(return_dict, A(R(3, 4), R(3, 4))),
    case(return_nested_tuples, A(R(3, 4))),
    case(return_mixed, A(R(3, 4))),
    case(return_empty_containers, A(R(3, 4))),
    case(return_input_container, A([R(3, 4), R(3, 4)])),
    # user subclasses of list / dict
    case(mylist_method, A(fresh(lambda: MyList([torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)])))),
    case(mylist_build_inside, A(R(3, 4))),
    case(mylist_return, A(R(3, 4))),
    case(mylist_iterate, A(fresh(lambda: MyList([torch.randn(3), torch.randn(3)])))),
    case(scaled_list_getitem, A(fresh(lambda: ScaledList([torch.randn(3), torch.randn(3)])))),
    case(scaled_list_getitem_tensors, A(ScaledList([2, 3]), R(3, 4))),
    case(mydict_getitem, A(MyDict(a=2, b=5), R(3, 4))),
    case(mydict_tensor_values, A(fresh(lambda: MyDict(p=torch.randn(3), q=torch.randn(3))))),
    case(mydict_build_inside, A(R(3, 4))),
    case(mydict_items, A(fresh(lambda: MyDict(a=torch.randn(2), b=torch.randn(2))))),
    # namedtuple / OrderedDict
    case(namedtuple_build, A(R(3, 4), R(3, 4))),
    case(namedtuple_input, A(fresh(lambda: Point(torch.randn(3, 4), torch.randn(3, 4))))),
    case(namedtuple_unpack_replace, A(R(3, 4))),
    case(namedtuple_kwargs, A(R(3, 4))),
    case(ordereddict_build, A(R(3, 4))),
    case(ordereddict_input, A(fresh(lambda: collections.OrderedDict(
        [("zz", torch.randn(3)), ("a", torch.randn(3))])))),
])


@pytest.mark.parametrize("fn,make_args,opts", CASES)
def test_containers(fn, make_args, opts):
    run_case(fn, make_args, opts)


class _CallsDict(type):
    __call__ = dict         # as typing's TypedDict metaclass: calling the class builds a dict


class _MadeAsDict(dict, metaclass=_CallsDict):
    pass


class _PlainList(list):
    pass


class _PlainTuple(tuple):
    pass


def _construct(make):
    def f(x):
        try:
            made = make()
            return x + 1, type(made).__name__, repr(made)
        except TypeError as e:
            return x - 1, type(e).__name__, str(e)
    return f


@pytest.mark.parametrize("make", [
    lambda: _MadeAsDict(a=1),
    lambda: __import__("typing").TypedDict("Emp", {"name": str})(name="Jim"),
    lambda: _PlainList([1], [2]),
    lambda: _PlainList(x=1),
    lambda: _PlainTuple((1,), (2,)),
    lambda: _PlainTuple(x=1),
    lambda: Point(1, 2, 3),
    lambda: Point(1, x=2),
    lambda: Point(1, z=2),
], ids=["metaclass_call_is_dict", "typeddict", "list_two_args", "list_kwarg", "tuple_two_args",
        "tuple_kwarg", "namedtuple_extra", "namedtuple_repeated", "namedtuple_unknown"])
def test_construction_is_what_the_class_does(make):
    """A metaclass whose __call__ is a class is called without the class (TypedDict builds a
    dict); a list/tuple subclass or a namedtuple given arguments its base refuses raises
    eager's TypeError instead of dropping them."""
    import kiln
    from kiln.testing import CompileCounter

    x = torch.zeros(2)
    expected = _construct(make)(x)
    counter = CompileCounter()
    got = kiln.compile(_construct(make), backend=counter)(x)
    assert got[1:] == expected[1:]
    torch.testing.assert_close(got[0], expected[0])
    assert counter.frame_count == 1
