"""Side effects: mutations of objects that existed before the call (lists, dicts, their
subclasses, attributes of objects and nn.Modules, buffers mutated in place, closure cells)
are applied after the graph runs and leave every object exactly as eager leaves it, with and
without graph breaks; a break sees the side effects that precede it; new objects built inside
and returned are rebuilt (identity preserved).

Each case runs compiled and eager (on deep copies) on fresh inputs three times and compares
the result, the final state of every argument (``_breaks.check``), what was printed, and the
number of graphs (the first call compiles ``frames``, warm calls nothing).
"""
import collections
import copy
import os
import sys

import pytest
import torch
from torch import nn

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from _breaks import A, R, Fresh, assert_same, case, check, fixed, ids_unique, pos  # noqa: E402

import kiln  # noqa: E402
from kiln.testing import CompileCounter  # noqa: E402


def S(template):
    """A fresh deep copy of ``template`` on every call: the same Python state each time (lists
    of the same length, the same counter values), so warm calls hit the same entries."""
    return Fresh(lambda: copy.deepcopy(template), f"S({template!r:.30})")


# =========================================================================== user types
class Box:
    def __init__(self, value=0.0):
        self.value = value
        self.count = 0
        self.items = []


class Stats(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("total", torch.zeros(4))
        self.calls = 0
        self.last = None

    def forward(self, x):
        y = self.lin(x)
        self.calls += 1
        self.total.add_(y.detach().sum(0))
        self.last = y.detach()
        return y


class StatsBreaks(Stats):
    def forward(self, x):
        y = self.lin(x)
        self.calls += 1
        print("calls", self.calls)
        self.total.add_(y.detach().sum(0))
        return y * 2


class BufferSwap(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(3))

    def forward(self, x):
        self.state = self.state + x
        return self.state * 2


class MyList(list):
    pass


class MyDict(dict):
    pass


class CountingList(list):
    def append(self, v):
        self.appended = getattr(self, "appended", 0) + 1
        super().append(v)


def print_len(xs):
    print("len", len(xs))


def add_to(xs, v):
    xs.append(v)
    print("added", len(xs))


# =========================================================================== lists
def list_append(x, xs):
    xs.append(x * 2)
    return x + 1


def list_append_break(x, xs):
    xs.append(x * 2)
    print("len", len(xs))
    xs.append(x * 3)
    return x + 1


def list_append_item_break(x, k, xs):
    xs.append(x + 1)
    n = k.item()
    xs.append(n)
    return x * n


def list_pop(x, xs):
    last = xs.pop()
    first = xs.pop(0)
    return x + last + first


def list_pop_break(x, xs):
    a = xs.pop()
    print("after pop", len(xs))
    b = xs.pop()
    return x * a + b


def list_setitem(x, xs):
    xs[0] = x * 2
    xs[-1] = 7
    return x


def list_setitem_break(x, xs):
    xs[0] = x * 2
    print_len(xs)
    xs[1] = xs[0] + 1
    return xs[1]


def list_extend_insert(x, xs):
    xs.extend([x, x + 1])
    xs.insert(0, "head")
    return len(xs)


def list_extend_insert_break(x, xs):
    xs.extend([x, x + 1])
    print("extended", len(xs))
    xs.insert(1, x * 5)
    return x - 1


def list_sort(x, xs):
    xs.sort()
    return x * xs[0]


def list_sort_reverse_break(x, xs):
    xs.sort(reverse=True)
    print("sorted", xs)
    xs.reverse()
    return x + xs[-1]


def list_del_remove_clear(x, xs, ys):
    del xs[0]
    xs.remove(3)
    ys.clear()
    return x + len(xs)


def list_slice_assign_break(x, xs):
    xs[1:3] = [x, x * 2, x * 3]
    print("sliced", len(xs))
    del xs[-1]
    return x + 1


def list_iadd(x, xs):
    xs += [x * 2]
    return x


def list_mutate_in_loop_break(x, xs):
    for i in range(3):
        xs.append(x + i)
        print("i", i, len(xs))
    return x


def list_nested_append(x, d):
    d["hist"].append(x.sum())
    d["hist"].append(x.max())
    return x * 2


def list_alias_two_args(x, a, b):
    a.append(x + 1)
    b.append(x + 2)
    print("lens", len(a), len(b))
    a.append(x + 3)
    return len(a), len(b)


def list_return_input(x, xs):
    xs.append(x)
    return xs


def list_mutation_seen_by_helper_break(x, xs):
    xs.append(1)
    add_to(xs, x * 2)
    xs.append(3)
    return x + len(xs)


def list_pop_then_break_then_push(x, stack):
    top = stack.pop()
    y = x * top
    print("stack", len(stack))
    stack.append(y)
    stack.append(top + 1)
    return y


def list_of_tensors_inplace_break(x, xs):
    xs[0].add_(1)
    print("inplace")
    xs[1].mul_(2)
    return xs[0] + xs[1] + x


def list_subclass_append_break(x, xs):
    xs.append(x + 1)
    print(type(xs).__name__, len(xs))
    xs.append(x + 2)
    return x


# =========================================================================== sets
def set_add_discard(x, s):
    s.add("a")
    s.discard("gone")
    return x * len(s)


def set_add_break(x, s):
    s.add(1)
    print("size", len(s))
    s.update({2, 3})
    s.remove(1)
    return x + len(s)


def set_returned_after_mutation(x, s):
    s |= {7}
    s.add(8)
    return s, x - 1


def set_ior_seen_through_alias(x):
    s = {1}
    t = s
    s |= {2, 3}
    s -= {1}
    return x * len(t)


# =========================================================================== dicts
def dict_set(x, d):
    d["a"] = x * 2
    d["n"] = d.get("n", 0) + 1
    return x + 1


def dict_set_break(x, d):
    d["a"] = x * 2
    print("keys", sorted(d))
    d["b"] = d["a"] + 1
    return x


def dict_update_pop_del(x, d):
    d.update({"u": x + 1, "v": 2})
    p = d.pop("p")
    del d["q"]
    return x * p


def dict_update_pop_del_break(x, d):
    d.update(u=x + 1)
    print("updated", len(d))
    p = d.pop("p")
    del d["q"]
    return x * p


def dict_setdefault_clear(x, d, e):
    d.setdefault("s", []).append(x)
    d.setdefault("t", 5)
    e.clear()
    return x


def dict_pop_default_break(x, d):
    a = d.pop("missing", 10)
    print("popped", a)
    d["seen"] = a
    return x + a


def dict_mutate_in_loop_break(x, d):
    for k in ("a", "b"):
        d[k] = x * len(k)
        print("set", k)
    return x


def dict_counter_accumulate(x, counts):
    counts["calls"] += 1
    counts["sum"] = counts["sum"] + x.sum()
    return x


def dict_subclass_break(x, d):
    d["k"] = x + 1
    print(type(d).__name__)
    d.update(z=3)
    return x


def ordered_dict_move(x, d):
    d["new"] = x
    d.move_to_end("a")
    return x + 1


def defaultdict_append_break(x, d):
    d["a"].append(x)
    print("dd", len(d))
    d["b"].append(x + 1)
    return x


def dict_item_value_break(x, k, d):
    n = k.item()
    d["n"] = n
    d["scaled"] = x * n
    return x


# =========================================================================== attributes
def obj_attr_set(x, box):
    box.value = box.value + 1
    box.count += 2
    box.tensor = x * 2
    return x


def obj_attr_set_break(x, box):
    box.count += 1
    print("count", box.count)
    box.count += 10
    box.t = x + box.count
    return box.t


def obj_attr_list_mutation(x, box):
    box.items.append(x)
    box.items = box.items + [x + 1]
    box.items.append(x + 2)
    return x


def obj_attr_replace_then_mutate_old(x, box):
    old = box.items
    box.items = [x]
    old.append(x + 1)
    return len(old)


def module_python_attr(x, m):
    return m(x)


def module_buffer_assign(x, m):
    return m(x)


def batchnorm_train(x, bn):
    y = bn(x)
    return y * 2


def batchnorm_train_break(x, bn):
    y = bn(x)
    print("mean", bn.running_mean.shape)
    return bn(y)


def module_attr_break(x, m):
    return m(x) + 1


def input_tensor_inplace_break(x, y):
    x.add_(1)
    print("x updated")
    y.mul_(x)
    return x + y


def setattr_builtin(x, box):
    setattr(box, "value", 3)
    setattr(box, "extra", x + 1)
    return x


# =========================================================================== closures
def make_counter_closure(break_inside):
    def make():
        count = 0
        hist = []

        def step(x):
            nonlocal count
            count += 1
            hist.append(count)
            if break_inside:
                print("count", count)
            count += 10
            return x * count

        def reset():
            nonlocal count
            count = 0
            hist.clear()

        return step, lambda: (count, list(hist)), reset

    return make


def make_cell_tensor_closure():
    def make():
        acc = torch.zeros(3)

        def step(x):
            nonlocal acc
            acc = acc + x
            print("acc")
            acc = acc * 2
            return acc + 1

        return step, lambda: acc.clone()

    return make


def make_nested_nonlocal():
    def make():
        total = 0

        def outer_writer(x):
            nonlocal total
            total += 1
            y = x * total
            print("total", total)
            total += 100
            return y

        def reset():
            nonlocal total
            total = 0

        return outer_writer, lambda: total, reset

    return make


# =========================================================================== new objects
def new_list_returned_twice(x):
    out = [x + 1]
    print("built")
    out.append(x * 2)
    return out, out


def new_dict_returned(x):
    d = {"a": x}
    d["b"] = x + 1
    return d


def new_objects_alias(x):
    inner = [x]
    outer = {"l": inner, "again": inner}
    inner.append(x + 1)
    return outer


def new_list_across_break(x):
    acc = []
    for i in range(2):
        acc.append(x * i)
        print("acc", len(acc))
    return acc


# =========================================================================== more shapes
def list_append_then_native_keyerror(x, xs, d):
    xs.append(x + 1)
    return x * d["missing"]


def list_sort_key_lambda(x, xs):
    xs.sort(key=lambda v: -v)
    return x + xs[0]


def dict_reinsert_moves_to_end(x, d):
    v = d.pop("a")
    d["a"] = v + 1
    return x * v


def del_attr_break(x, box):
    box.tmp = 1
    y = x + 1
    del box.tmp
    box.count += 1
    return y * 2


def element_object_attr(x, objs):
    objs[0].count += 1
    objs[1].value = x * 2
    print("objs")
    objs[0].items.append(x)
    return x


def new_obj_into_old_across_break(x, xs):
    a = []
    xs.append(a)
    print("stored")
    a.append(x * 2)
    return a


def od_set(x, d):
    d["new"] = x
    return x + 1


def obj_tensor_attr_read_after_break(x, box):
    box.t = x * 2
    print("set t")
    return box.t + 1


# regression (fixed): OrderedDict write-back kept its key order
ORDERED_DICT_BUG = ()


# =========================================================================== cases
CASES = ids_unique([
    # lists
    case(list_append, A(R(4), S([])), 1),
    case(list_append_break, A(R(4), S([1])), 2),
    case(list_append_item_break, A(R(4), fixed(2.0), S([])), 2),
    case(list_pop, A(R(4), S([1.0, 2.0, 3.0])), 1),
    case(list_pop_break, A(R(4), S([1.0, 2.0, 3.0])), 1),
    case(list_setitem, A(R(4), S([0, 1, 2])), 1),
    case(list_setitem_break, A(R(4), S([0, 1, 2])), 2),
    case(list_extend_insert, A(R(4), S(["x"])), 1),
    case(list_extend_insert_break, A(R(4), S(["x"])), 2),
    case(list_sort, A(R(4), S([3, 1, 2])), 1),
    case(list_sort_reverse_break, A(R(4), S([3, 1, 2])), 1),
    case(list_del_remove_clear, A(R(4), S([9, 3, 4]), S([1, 2])), 1),
    case(list_slice_assign_break, A(R(4), S([0, 1, 2, 3])), 2),
    case(list_iadd, A(R(4), S([1])), 1),
    case(list_mutate_in_loop_break, A(R(4), S([])), 3),
    case(list_nested_append, A(R(4), S({"hist": []})), 1),
    case(list_alias_two_args, A(R(4), S(["a"]), S(["b"])), 2, id="list_mutated_through_two_args"),
    case(list_return_input, A(R(4), S([1])), 0),
    case(list_mutation_seen_by_helper_break, A(R(4), S([])), 2),
    case(list_pop_then_break_then_push, A(R(4), S([2.0, 3.0])), 1, id="list_pop_break_push_order"),
    case(list_of_tensors_inplace_break, A(R(4), [R(4), R(4)]), 2),
    case(list_subclass_append_break, A(R(4), S(MyList([1]))), 2),
    # sets
    case(set_add_discard, A(R(4), S({"gone", "kept"})), 1),
    case(set_add_break, A(R(4), S({0})), 1),
    case(set_returned_after_mutation, A(R(4), S({1})), 1),
    case(set_ior_seen_through_alias, A(R(4)), 1),
    # dicts
    case(dict_set, A(R(4), S({"n": 1})), 1),
    case(dict_set_break, A(R(4), S({"z": 0})), 2),
    case(dict_update_pop_del, A(R(4), S({"p": 2.0, "q": 1})), 1),
    case(dict_update_pop_del_break, A(R(4), S({"p": 2.0, "q": 1})), 2),
    case(dict_setdefault_clear, A(R(4), S({}), S({"x": 1})), 0),
    case(dict_pop_default_break, A(R(4), S({"k": 1})), 1),
    case(dict_mutate_in_loop_break, A(R(4), S({})), 2),
    case(dict_counter_accumulate, A(R(4), S({"calls": 0, "sum": 0.0})), 1),
    case(dict_subclass_break, A(R(4), S(MyDict(a=1))), 1),
    case(ordered_dict_move, A(R(4), S(collections.OrderedDict(a=1, b=2))), 1, marks=ORDERED_DICT_BUG),
    case(defaultdict_append_break, A(R(4), S(collections.defaultdict(list))), 1),
    case(dict_item_value_break, A(R(4), fixed(3.0), S({})), 1),
    # attributes
    case(obj_attr_set, A(R(4), S(Box(1.0))), 1),
    case(obj_attr_set_break, A(R(4), S(Box(1.0))), 1),
    case(obj_attr_list_mutation, A(R(4), S(Box())), 1),
    case(obj_attr_replace_then_mutate_old, A(R(4), S(Box())), 1),
    case(module_python_attr, A(R(2, 4), S(Stats())), 1, id="module_attr_and_buffer_inplace"),
    case(module_buffer_assign, A(R(3), S(BufferSwap())), 1),
    case(batchnorm_train, A(R(8, 3), nn.BatchNorm1d(3)), 1, id="batchnorm_running_stats_persist"),
    case(batchnorm_train_break, A(R(8, 3), nn.BatchNorm1d(3)), 2, id="batchnorm_twice_across_break"),
    case(module_attr_break, A(R(2, 4), S(StatsBreaks())), 3),
    case(input_tensor_inplace_break, A(R(4), R(4)), 2),
    case(setattr_builtin, A(R(4), S(Box())), 1),
    # more shapes
    case(list_append_then_native_keyerror, A(R(4), S([]), S({})), 1, id="mutation_kept_when_native_part_raises"),
    case(list_sort_key_lambda, A(R(4), S([1, 3, 2])), 1),
    case(dict_reinsert_moves_to_end, A(R(4), S({"a": 2.0, "b": 1})), 1),
    case(del_attr_break, A(R(4), S(Box())), 2),
    case(element_object_attr, A(R(4), S([Box(), Box()])), 1),
    case(new_obj_into_old_across_break, A(R(4), S([0])), 1),
    case(od_set, A(R(4), S(collections.OrderedDict(a=1))), 1, id="ordered_dict_setitem", marks=ORDERED_DICT_BUG),
    case(obj_tensor_attr_read_after_break, A(R(4), S(Box())), 2),
])


@pytest.mark.parametrize("fn,make_args,frames,opts", CASES)
def test_side_effect_case(fn, make_args, frames, opts, capsys):
    check(fn, make_args, frames, capsys=capsys, **opts)


CLOSURE_CASES = [
    pytest.param(make_counter_closure(False), 1, id="nonlocal_counter_no_break"),
    pytest.param(make_counter_closure(True), 1, id="nonlocal_counter_break"),
    pytest.param(make_cell_tensor_closure(), 2, id="nonlocal_tensor_break"),
    pytest.param(make_nested_nonlocal(), 1, id="nonlocal_written_before_and_after_break"),
]


@pytest.mark.parametrize("make,frames", CLOSURE_CASES)
def test_closure_cell_case(make, frames, capsys):
    check(make=make, make_args=A(R(3)), frames=frames, capsys=capsys)


NEW_OBJECT_CASES = [
    pytest.param(new_list_returned_twice, 2, id="new_list_returned_twice"),
    pytest.param(new_dict_returned, 1, id="new_dict"),
    pytest.param(new_objects_alias, 1, id="new_objects_alias"),
    pytest.param(new_list_across_break, 2, id="new_list_built_across_breaks"),
]


@pytest.mark.parametrize("fn,frames", NEW_OBJECT_CASES)
def test_new_object_case(fn, frames, capsys):
    check(fn, A(R(4)), frames, capsys=capsys)


# =========================================================================== identity and order
def test_new_list_returned_twice_is_one_object(capsys):
    cf = kiln.compile(new_list_returned_twice, backend=CompileCounter())
    for _ in range(2):
        a, b = cf(torch.randn(4))
        assert a is b and len(a) == 2


def test_new_objects_keep_their_aliasing():
    cf = kiln.compile(new_objects_alias, backend=CompileCounter())
    for _ in range(2):
        out = cf(torch.randn(4))
        assert out["l"] is out["again"] and len(out["l"]) == 2


def test_returned_input_list_is_the_callers_list():
    cf = kiln.compile(list_return_input, backend=CompileCounter())
    for n in range(1, 4):
        xs = [0]
        out = cf(torch.randn(4), xs)
        assert out is xs and len(xs) == 2


def test_same_list_passed_twice_stays_one_list(capsys):
    cf = kiln.compile(list_alias_two_args, backend=CompileCounter())
    xs = []
    ys = []
    shared_e = []
    list_alias_two_args(torch.randn(4), shared_e, shared_e)
    e_out = capsys.readouterr().out
    shared = []
    got = cf(torch.randn(4), shared, shared)
    assert capsys.readouterr().out == e_out == "lens 2 2\n"
    assert got == (3, 3) and len(shared) == 3
    got = cf(torch.randn(4), xs, ys)
    assert got == (2, 1) and len(xs) == 2 and len(ys) == 1


def test_side_effects_before_a_break_are_visible_to_it(capsys):
    cnt = CompileCounter()
    cf = kiln.compile(list_append_break, backend=cnt)
    for _ in range(2):
        xs = [1]
        x = torch.randn(4)
        cf(x, xs)
        assert capsys.readouterr().out == "len 2\n"
        assert len(xs) == 3 and xs[0] == 1
        torch.testing.assert_close(xs[1], x * 2)
        torch.testing.assert_close(xs[2], x * 3)
    assert cnt.frame_count == 2
    # a longer list is a new guard value: the entry before the break recompiles, and the
    # continuation sees the longer list too
    xs = [1, 2]
    cf(torch.randn(4), xs)
    assert capsys.readouterr().out == "len 3\n" and len(xs) == 4


def test_mutation_order_list_pop_break_push(capsys):
    cf = kiln.compile(list_pop_then_break_then_push, backend=CompileCounter())
    stack = [2.0, 3.0]
    x = torch.randn(4)
    y = cf(x, stack)
    assert capsys.readouterr().out == "stack 1\n"
    assert stack[0] == 2.0 and stack[1] is y and stack[2] == 4.0


def test_list_subclass_override_runs_like_eager():
    """A user override of list.append runs exactly once per call, as in eager. (kiln breaks at
    each overridden append today: x + 1 | x + 2 | x * 2.)"""
    def fn(x, xs):
        xs.append(x + 1)
        xs.append(x + 2)
        return x * 2

    check(fn, A(R(4), S(CountingList())), 3)


def test_global_list_mutation_matches_eager(capsys):
    GLOBAL_LOG.clear()
    cnt = CompileCounter()
    cf = kiln.compile(appends_to_global, backend=cnt)
    for i in range(3):
        x = torch.randn(4)
        GLOBAL_LOG[:] = ["start"]
        saved = list(GLOBAL_LOG)
        expected = appends_to_global(x)
        e_state = list(GLOBAL_LOG)
        e_out = capsys.readouterr().out
        GLOBAL_LOG[:] = saved
        got = cf(x)
        assert capsys.readouterr().out == e_out
        assert_same(got, expected)
        assert_same(list(GLOBAL_LOG), e_state)
        assert cnt.frame_count == 2
    assert len(GLOBAL_LOG) == 3


GLOBAL_LOG = []


def appends_to_global(x):
    GLOBAL_LOG.append(x.sum())
    print("global", len(GLOBAL_LOG))
    GLOBAL_LOG.append(x.mean())
    return x


def test_module_python_attrs_and_buffers_across_calls():
    m = Stats()
    m_e = Stats()
    m_e.load_state_dict(m.state_dict())
    cf = kiln.compile(m, backend=CompileCounter())
    for i in range(3):
        x = torch.randn(2, 4)
        assert_same(cf(x), m_e(x.clone()))
        assert m.calls == m_e.calls == i + 1
        assert_same(m.total, m_e.total)
        assert_same(m.last, m_e.last)


def test_new_object_stored_into_old_list_keeps_identity_across_break(capsys):
    cf = kiln.compile(new_obj_into_old_across_break, backend=CompileCounter())
    for _ in range(2):
        xs = [0]
        x = torch.randn(4)
        a = cf(x, xs)
        assert xs[-1] is a and len(a) == 1
        torch.testing.assert_close(a[0], x * 2)


def alias_through_container(x, xs, d):
    d["l"].append(x)
    print("lens", len(xs), len(d["l"]))
    xs.append(x + 1)
    d["l"].append(x + 2)
    return len(xs)


def _aliased_args():
    xs = [0]
    return (torch.randn(4), xs, {"l": xs}), {}


def test_list_mutated_through_an_aliasing_dict(capsys):
    # x + 1, x + 2 after the break; the list is one object reachable from two arguments
    check(alias_through_container, _aliased_args, 1, capsys=capsys)


def test_list_mutated_through_an_aliasing_dict_identity(capsys):
    cf = kiln.compile(alias_through_container, backend=CompileCounter())
    (x, xs, d), _ = _aliased_args()
    assert cf(x, xs, d) == 4
    assert d["l"] is xs and len(xs) == 4
    assert capsys.readouterr().out == "lens 2 2\n"
