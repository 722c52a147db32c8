"""Graph breaks: print, logging, warnings, C functions, .item()/.tolist()/bool(), branches and
loops on tensor data, comptime.graph_break(), breaks inside loops, with-blocks, try regions and
inlined helpers; mid-expression breaks (values and NULLs on the stack, keyword calls).

Every case runs compiled and eager on fresh inputs three times (``_breaks.check``): same
result, same argument state, same stdout, and exactly ``frames`` graphs compiled by the first
call (the graph before the break plus the graphs of the continuations) and none after.
"""
import functools
import logging
import math
import os
import sys
import time
import warnings

import numpy as np
import pytest
import torch
from torch import nn

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from _breaks import A, R, Fresh, all_breaks, case, check, fixed, ids_unique, neg, pos  # noqa: E402
from _breaks import assert_fails_on_tensor, assert_on_tensor  # noqa: E402

import kiln  # noqa: E402
from kiln import comptime  # noqa: E402
from kiln.testing import CompileCounter, assert_same  # noqa: E402

log = logging.getLogger("kiln.tests.graph_breaks")


# =========================================================================== helpers (inlined)
def print_and_return(v):
    print("print_and_return")
    return v


def shout(msg):
    print("shout:", msg)


def helper_prints(x):
    y = x * 3
    print("helper_prints")
    return y + 1


def helper_no_ops_prints(v):
    print("no ops here")
    return v


def mul(a, b):
    return a * b


def scale(t, factor=1.0, *, bias=0.0):
    return t * factor + bias


def raises_value_error(v):
    print("about to raise")
    raise ValueError(f"bad value {v}")


def raises_after_tensor_work(x):
    y = x * 2
    print("raising")
    if True:
        raise ValueError("from helper")
    return y


def nested_helper(x):
    return helper_prints(x) * 2


class Printer:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        y = x * self.k
        print("Printer.apply", self.k)
        return y - 1


class PrintingModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        print("PrintingModule.forward")
        return torch.relu(y)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = PrintingModule()
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.inner(x) + 1)


class ItemModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, k):
        h = self.lin(x)
        n = k.item()
        return h * n


# =========================================================================== basic unsupported calls
def print_middle(x):
    y = x + 1
    print("hello")
    return y * 2


def print_tensor(x):
    y = x * 2
    print(y)
    return y + 1


def print_tensor_and_shape(x):
    y = x.sum(0)
    print("shape", y.shape, "dtype", y.dtype)
    return y.exp()


def print_first(x):
    print("first")
    return x + 1


def print_last(x):
    y = torch.sin(x)
    print("last")
    return y


def print_with_sep_kwargs(x):
    y = x - 1
    print("a", "b", sep="-", end="!\n")
    return y.abs()


def print_fstring(x, n):
    y = x * n
    print(f"n={n} shape={tuple(y.shape)}")
    return y.relu()


def two_prints(x):
    a = x + 1
    print("one")
    b = a * 2
    print("two")
    return b - 3


def three_prints_no_ops_between(x):
    a = x + 1
    print("one")
    print("two")
    print("three")
    return a * 2


def logging_info(x):
    y = x + 1
    log.info("info %s", 3)
    return y * 2


def logging_warning(x):
    y = x.cos()
    log.warning("warning %d", 7)
    return y + 1


def logging_getlogger_debug(x):
    y = x + 2
    logging.getLogger("kiln.tests.other").debug("debug")
    return y / 2


def numpy_on_python_values(x):
    y = x + 1
    s = np.sqrt(16.0)
    return y * float(s)


def numpy_mid_expression(x):
    y = x - 1
    return y * float(np.float64(2.5)) + 1


def time_time(x):
    y = x + 1
    t0 = time.time()
    z = y * 2
    return z, isinstance(t0, float)


def comptime_break(x):
    y = x + 1
    comptime.graph_break()
    return y * 2


def comptime_break_twice(x):
    y = x + 1
    comptime.graph_break()
    z = y * 2
    comptime.graph_break()
    return z - 1


# =========================================================================== data-dependent values
def item_arith(x, k):
    n = k.item()
    return x * (n + 1) - n


def item_after_ops(x, k):
    y = x.sin()
    n = (k * 2).item()
    return y * n


def item_int_range(x, k):
    out = x
    for i in range(k.item()):
        out = out + i
    return out


def item_in_call_expr(x, k):
    y = mul(k.sum().item(), 2)
    return x + y


def item_in_builtin_call(x, k):
    y = max(k.item(), 2.0)
    return x * y


def item_keyword_arg(x, k):
    y = x * 2
    return scale(y, 2.0, bias=k.item())


def item_keyword_arg_first(x, k):
    y = x * 2
    z = scale(y, factor=k.item(), bias=1.0)
    return z + 1


def item_mid_binary(x, k):
    return x.sum() + k.item() * 3


def item_in_tuple_build(x, k):
    return (x + 1, k.item(), x - 1)


def item_in_list_build(x, k):
    return [x * 2, k.item() + 1]


def item_in_dict_build(x, k):
    return {"t": x.exp(), "n": k.item()}


def item_python_math(x, k):
    n = k.item()
    f = math.sqrt(n) + n ** 2
    return x * f


def item_method_on_result(x, k):
    n = k.item()
    return x * n.__abs__()


def tolist_len(x, k):
    vals = k.tolist()
    return x + len(vals)


def tolist_sum(x, k):
    vals = k.tolist()
    return x * sum(vals)


def tolist_iterate(x, k):
    out = x
    for v in k.tolist():
        out = out * v
    return out


def bool_any_true(x):
    if bool((x > 0).any()):
        return x + 1
    return x - 1


def bool_all(x):
    y = x * 2
    if bool((y > 0).all()):
        y = y + 10
    return y


def if_tensor_true(x):
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def if_tensor_false(x):
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def if_tensor_no_else(x):
    y = x + 1
    if (y > 0).all():
        y = y * 3
    return y.sum()


def if_tensor_elif(x):
    s = x.sum()
    if s > 100:
        r = x + 100
    elif s > 0:
        r = x * 2
    else:
        r = x - 1
    return r


def if_not_tensor(x):
    if not (x < 0).any():
        return x.exp()
    return x


def ternary_tensor(x):
    y = x + 1
    z = y * 2 if y.mean() > 0 else y * 3
    return z


def and_of_tensors(x):
    y = x + 1
    if (y > 0).all() and (y < 100).all():
        return y * 2
    return y


def return_in_branches_after_ops(x, y):
    a = x @ y
    if a.sum() > 0:
        b = a.relu()
        return b + 1
    return a


def item_compare_python(x, k):
    if k.item() > 2:
        return x + 1
    return x - 1


def while_tensor_condition(x):
    while x.sum() < 2:
        x = x + 1
    return x


def while_tensor_two_iters(x):
    n = 0
    while x.max() < 3:
        x = x + 1
        n += 1
    return x, n


def data_dependent_nonzero(x):
    idx = torch.nonzero(x > 0)
    return x + 1, idx


# =========================================================================== mid-expression breaks
def value_on_stack_add(x):
    a = x * 2
    return a + print_and_return(x + 1)


def value_on_stack_nested(x):
    a = x * 2
    return mul(a, print_and_return(x + 1)) - 1


def call_arg_helper_breaks(x):
    return torch.add(x, helper_prints(x), alpha=2)


def kwarg_call_helper_breaks(x):
    return scale(x, factor=2.0, bias=helper_prints(x))


def method_call_arg_breaks(x):
    return x.add(print_and_return(x.sin()))


def list_build_break(x):
    return [x + 1, print_and_return(x * 2), x - 3]


def dict_build_break(x):
    return {"a": x + 1, "b": print_and_return(x * 2)}


def fstring_item(x, k):
    s = f"value={k.item()}"
    return x + 1, s


def comparison_chain_break(x, k):
    y = x + 1
    ok = 0 < k.item() < 10
    return y, ok


def subscript_break(x, k):
    xs = [x, x + 1, x + 2]
    return xs[int(k.item())] * 2


# =========================================================================== loops
def for_range_print(x):
    for i in range(3):
        x = x + i
        print("iter", i)
    return x * 2


def for_list_print(x, ws):
    acc = x
    for w in ws:
        acc = acc * w
        print("w")
    return acc


def for_dict_items_print(x, d):
    acc = x
    for k, v in d.items():
        acc = acc + v
        print("key", k)
    return acc


def for_enumerate_print(xs):
    acc = 0
    for i, t in enumerate(xs):
        acc = acc + t * i
        print("i", i)
    return acc


def for_zip_print(xs, ys):
    out = []
    for a, b in zip(xs, ys):
        out.append(a * b)
        print("zip")
    return out


def nested_loops_print(x):
    for i in range(2):
        for j in range(2):
            x = x + i * 10 + j
            print(i, j)
    return x


def nested_loops_break_outer_only(x):
    for i in range(2):
        for j in range(3):
            x = x * 1.5 + j
        print("outer", i)
    return x


def loop_break_on_tensor(x):
    out = x
    for i in range(5):
        out = out + 1
        if out.sum() > 0:
            break
    return out, i


def loop_continue_on_tensor(x):
    out = x
    for i in range(3):
        if (x[i] > 0).item():
            continue
        out = out * 2
    return out


def loop_item_accumulate(x, k):
    total = 0.0
    for i in range(3):
        total += k[i].item()
    return x * total


def loop_print_no_ops(x):
    for i in range(3):
        print(i)
    return x + 1


def loop_break_then_after(x):
    y = x + 1
    for i in range(2):
        print("loop", i)
    return y * 2


def loop_over_tensor_print(x):
    acc = torch.zeros(3)
    for row in x:
        acc = acc + row
        print("row")
    return acc


def for_else_print(x):
    for i in range(2):
        x = x + 1
    else:
        print("else")
    return x


def list_comprehension_then_break(x):
    ys = [x * i for i in range(3)]
    print("after comprehension")
    return sum(ys)


def while_python_counter_print(x):
    i = 0
    while i < 3:
        x = x * 2
        print("while", i)
        i += 1
    return x


# =========================================================================== with-blocks
def no_grad_print(x):
    with torch.no_grad():
        y = x * 2
        print("in no_grad")
        z = y + 1
    return z, x * 3


def enable_grad_print(x):
    with torch.enable_grad():
        y = x * 2
        print("in enable_grad")
        z = y.sum()
    return z


def nested_grad_modes_print(x):
    with torch.enable_grad():
        a = x * 2
        with torch.no_grad():
            b = a + 1
            print("inner no_grad")
            c = b * 3
        d = a + c
    return d, c


def no_grad_break_after_block(x):
    with torch.no_grad():
        y = x * 2
    print("after block")
    return y + x


def autocast_print(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = a @ b
        print("in autocast")
        z = y @ b
    return z, y.dtype


def autocast_item(a, b, k):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = a @ b
        n = k.item()
        z = (y * n) @ b
    return z


def set_grad_enabled_print(x):
    with torch.set_grad_enabled(False):
        y = x * 2
        print("set_grad_enabled")
        z = y * 3
    return z, x * 2


def no_grad_loop_print(x):
    with torch.no_grad():
        for i in range(2):
            x = x + 1
            print("ng", i)
        y = x * 2
    return y


# =========================================================================== try regions
_TABLE = {"a": 1.0, "b": 2.0}


def try_keyerror_missing_key(x):
    y = x + 1
    try:
        z = y * _TABLE["missing"]
    except KeyError:
        z = y * 2
    return z


def try_key_present(x):
    y = x + 1
    try:
        z = y * _TABLE["b"]
    except KeyError:
        z = y * 2
    return z


def try_user_valueerror(x):
    y = x + 1
    try:
        raises_value_error(3)
        z = y
    except ValueError as e:
        print("caught", e)
        z = y * 2
    return z + 1


def try_helper_raises_after_ops(x):
    try:
        y = raises_after_tensor_work(x)
    except ValueError:
        y = x - 1
    return y * 2


def try_no_raise_print(x):
    y = x + 1
    try:
        print("no raise")
        z = y * 2
    except RuntimeError:
        z = y
    return z


def try_finally_print(x):
    y = x + 1
    try:
        print("in try")
        y = y * 2
    finally:
        print("finally")
        y = y + 3
    return y


def try_finally_item(x, k):
    out = x
    try:
        out = out * k.item()
    finally:
        out = out + 1
    return out


def try_except_else_print(x):
    try:
        y = x * 2
        print("try")
    except Exception:
        y = x
    else:
        y = y + 1
    return y


def try_uncaught_propagates(x):
    y = x + 1
    try:
        raises_value_error(1)
    except KeyError:
        y = y * 100
    return y


def try_nested_print(x):
    try:
        try:
            y = x + 1
            raises_value_error(2)
        finally:
            print("inner finally")
    except ValueError:
        y = x - 1
    return y


def try_in_loop_print(x):
    for i in range(2):
        try:
            x = x + 1
            print("try", i)
        except Exception:
            pass
    return x


# =========================================================================== inlined helpers that break
def calls_helper_prints(x):
    a = x + 1
    b = helper_prints(a)
    return b * 2


def calls_helper_no_ops(x):
    a = x + 1
    b = helper_no_ops_prints(a)
    return b * 2


def calls_shout(x):
    y = x.exp()
    shout("hi")
    return y - 1


def calls_nested_helper(x):
    return nested_helper(x + 1) - 1


def calls_helper_twice(x):
    a = helper_prints(x)
    b = helper_prints(a)
    return a + b


def calls_method_printer(x, p):
    return p.apply(x + 1) * 2


def calls_module_printing(x, m):
    return m(x) * 2


def calls_item_module(x, k, m):
    return m(x, k) + 1


def module_with_printing_child(x, m):
    return m(x).sum(0)


def calls_lambda_prints(x):
    f = lambda v: print_and_return(v) + 1  # noqa: E731
    return f(x * 2)


def calls_helper_in_loop(x):
    for _ in range(2):
        x = helper_prints(x)
    return x


# =========================================================================== cells / closures
def creates_closure_and_breaks(x):
    scale_ = 2.0

    def inner(t):
        return t * scale_

    y = inner(x)
    print("closure frame")
    return y + 1


def make_closure_reader(k):
    def fn(x):
        y = x * k
        print("closure", k)
        return y + k

    return fn


closure_reader = make_closure_reader(3.0)


# =========================================================================== more shapes
def varargs_kwargs(*args, **kwargs):
    y = args[0] + kwargs["b"]
    print("varargs", len(args), sorted(kwargs))
    return y * args[1]


def kwonly_defaults(x, scale_=2.0, *, shift=1.0):
    y = x * scale_
    print("kwonly")
    return y + shift


def deleted_local(x):
    tmp = x + 1
    y = tmp * 2
    del tmp
    print("deleted")
    return y - 1


def maybe_unbound_local(x, flag):
    if flag:
        z = x + 1
    print("maybe unbound")
    return x * 2, z


def unbound_but_unused(x, flag):
    if flag:
        z = x + 1
    print("unbound unused")
    return x * 2


def listcomp_item(x, ks):
    vals = [k.item() for k in ks]
    return x * sum(vals)


def listcomp_print(xs):
    return [print_and_return(t * 2) for t in xs]


def genexpr_item(x, ks):
    return x * sum(k.item() for k in ks)


def and_kept_as_value(x):
    # ``a and b`` on tensors, its value kept (3.11: JUMP_IF_FALSE_OR_POP breaks the graph with
    # the tested value on the stack on one path only)
    ok = x.sum() > 0 and x.max() > 0
    return x * 2 if ok else x


def or_returned(x):
    return (x.sum() < 0) or (x * 3)


def chained_comparison_value(x):
    return 0 < x.sum() < 100


def chained_comparison_in_call_args(x):
    return torch.add(x, 0 < x.sum() < 100)


def branch_inside_call_args(x, y):
    # a branch on a tensor while a call's NULL and callable are on the stack: the
    # continuations get the NULL (it used to make the frame run eagerly)
    return torch.add(x, y if x.sum() > 0 else -y) * 2


def conditional_list_into_call(x):
    return torch.stack([x, x * 2] if x.sum() > 0 else [x, -x]).sum(0)


def recursive_breaks(x, n):
    if n == 0:
        print("bottom")
        return x
    return recursive_breaks(x * 2, n - 1) + 1


class Recorder:
    def __init__(self):
        self.events = []

    def __enter__(self):
        self.events.append("enter")
        return self

    def __exit__(self, *exc):
        self.events.append("exit")
        return False


def user_context_manager_print(x, rec):
    with rec as r:
        y = x + 1
        print("in user cm", r.events)
        z = y * 2
    return z, list(rec.events)


def assert_on_tensor_rewritten(x):
    # pytest rewrites this assert (this is a test module): the frame gets "@py_assert<N>" locals
    y = x * 2
    assert (y > 0).all(), "must be positive"
    return y + 1


def while_true_break_on_tensor(x):
    i = 0
    while True:
        x = x * 2
        i += 1
        if x.sum() > 10:
            break
    return x, i


COMPILED_PRINT_MIDDLE = kiln.compile(print_middle, backend="eager")


def calls_compiled_fn(x):
    return COMPILED_PRINT_MIDDLE(x) + 1


def method_breaks(self_obj, x):
    return self_obj.apply(x)


def break_in_else_branch_of_python_if(x, flag):
    if flag:
        y = x + 1
    else:
        y = x - 1
        print("else branch")
    return y * 3


def break_then_return_constant(x):
    y = x + 1
    print("constant")
    return 42


def print_in_nested_tuple_unpack(x):
    a, (b, c) = x + 1, (print_and_return(x * 2), x * 3)
    return a + b + c


def autocast_print_before_ops(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        print("before ops")
        y = a @ b
    return y


def no_grad_print_first(x):
    with torch.no_grad():
        print("first in no_grad")
        y = x * 2
    return y


# ======================================= regressions: bugs found by this suite and fixed
# (a break in a keyword-argument call, autocast guards built inside the block, graphs with
# only mode toggles, locals that are not identifiers, set_grad_enabled's __exit__)
KW_NAMES_BUG = AUTOCAST_GUARD_BUG = STATE_ONLY_GRAPH_BUG = BAD_LOCAL_NAME_BUG = SET_GRAD_ENABLED_BUG = ()


# =========================================================================== cases
CASES = ids_unique([
    # basic unsupported calls
    case(print_middle, A(R(4)), 2),
    case(print_tensor, A(R(3)), 2),
    case(print_tensor_and_shape, A(R(2, 3)), 2),
    case(print_first, A(R(4)), 1, id="print_first_no_graph_before"),
    case(print_last, A(R(4)), 1, id="print_last_no_graph_after"),
    case(print_with_sep_kwargs, A(R(4)), 2),
    case(print_fstring, A(R(2, 2), 3), 2),
    case(two_prints, A(R(4)), 3),
    case(three_prints_no_ops_between, A(R(4)), 2),
    case(logging_info, A(R(4)), 2),
    case(logging_warning, A(R(4)), 2),
    case(logging_getlogger_debug, A(R(4)), 2),
    # NumPy on constants is computed at capture time (tests/capture/numpy/test_numpy.py): no break
    case(numpy_on_python_values, A(R(4)), 1),
    case(numpy_mid_expression, A(R(4)), 1),
    case(comptime_break, A(R(4)), 2),
    case(comptime_break_twice, A(R(4)), 3),
    # data-dependent values (values fixed across calls so nothing respecializes)
    case(item_arith, A(R(4), fixed(2.0)), 1, id="item_then_python_arith"),
    case(item_after_ops, A(R(4), fixed(1.5)), 2),
    case(item_int_range, A(R(4), fixed(3)), 1, id="item_as_range_bound"),
    case(item_in_call_expr, A(R(4), fixed([1.0, 2.0])), 2, id="break_inside_call_args"),
    case(item_in_builtin_call, A(R(4), fixed(3.0)), 1),
    case(item_keyword_arg, A(R(4), fixed(0.5)), 1, id="kwarg_call_with_item_value", marks=KW_NAMES_BUG),
    case(item_keyword_arg_first, A(R(4), fixed(0.5)), 2, marks=KW_NAMES_BUG),
    case(item_mid_binary, A(R(4), fixed(2.0)), 2, id="item_with_tensor_on_stack"),
    case(item_in_tuple_build, A(R(4), fixed(7)), 2),
    case(item_in_list_build, A(R(4), fixed(7)), 1),
    case(item_in_dict_build, A(R(4), fixed(7)), 1),
    case(item_python_math, A(R(4), fixed(4.0)), 1),
    case(item_method_on_result, A(R(4), fixed(-2.0)), 1),
    case(tolist_len, A(R(4), fixed([1.0, 2.0, 3.0])), 1),
    case(tolist_sum, A(R(4), fixed([1.0, 2.0, 3.0])), 1),
    case(tolist_iterate, A(R(4), fixed([2.0, 3.0])), 1),
    case(bool_any_true, A(pos(4)), 2, id="bool_any"),
    case(bool_all, A(pos(4)), 2),
    case(if_tensor_true, A(pos(4)), 2),
    case(if_tensor_false, A(neg(4)), 2),
    case(if_tensor_no_else, A(pos(4)), 2),
    case(if_tensor_elif, A(pos(4)), 3),
    case(if_not_tensor, A(pos(4)), 2),
    case(ternary_tensor, A(pos(4)), 2),
    case(and_of_tensors, A(pos(4)), 3),
    case(and_kept_as_value, A(pos(4)), None),
    case(and_kept_as_value, A(neg(4)), None, id="and_kept_as_value_false"),
    case(or_returned, A(pos(4)), None),
    case(chained_comparison_value, A(pos(4)), None),
    case(chained_comparison_in_call_args, A(pos(4)), None),
    case(return_in_branches_after_ops, A(pos(3, 3), pos(3, 3)), 2),
    case(item_compare_python, A(R(4), fixed(5)), 1),
    case(while_tensor_condition, A(Fresh(lambda: torch.rand(4) * 0.1, "small")), 2),
    case(while_tensor_two_iters, A(Fresh(lambda: torch.rand(4) * 0.5, "small")), 4),
    case(data_dependent_nonzero, A(pos(4)), 2),
    # mid-expression
    case(value_on_stack_add, A(R(4)), 2, id="value_on_stack_add_helper_prints"),
    case(value_on_stack_nested, A(R(4)), 2),
    case(call_arg_helper_breaks, A(R(4)), 3, id="kwarg_alpha_call_around_breaking_helper", marks=KW_NAMES_BUG),
    case(kwarg_call_helper_breaks, A(R(4)), 2, id="breaking_helper_as_keyword_arg", marks=KW_NAMES_BUG),
    case(method_call_arg_breaks, A(R(4)), 2),
    case(list_build_break, A(R(4)), 2),
    case(dict_build_break, A(R(4)), 1),
    case(fstring_item, A(R(4), fixed(3)), 1),
    case(comparison_chain_break, A(R(4), fixed(3)), 1),
    case(subscript_break, A(R(4), fixed(2)), 2),
    # loops
    case(for_range_print, A(R(4)), 4),
    case(for_list_print, A(R(4), [2.0, 3.0, 4.0]), 3),
    case(for_dict_items_print, A(R(4), {"a": 1.0, "b": 2.0}), 2),
    case(for_enumerate_print, A([R(2), R(2), R(2)]), 3),
    case(for_zip_print, A([R(2), R(2)], [R(2), R(2)]), 2),
    case(nested_loops_print, A(R(4)), 4),
    case(nested_loops_break_outer_only, A(R(4)), 2),
    case(loop_break_on_tensor, A(pos(4)), 1),
    case(loop_continue_on_tensor, A(pos(4)), 3),
    case(loop_item_accumulate, A(R(4), fixed([1.0, 2.0, 3.0])), 4),
    case(loop_print_no_ops, A(R(4)), 1),
    case(loop_break_then_after, A(R(4)), 2),
    case(loop_over_tensor_print, A(R(2, 3)), 2),
    case(for_else_print, A(R(4)), 1),
    case(list_comprehension_then_break, A(R(4)), 2),
    case(while_python_counter_print, A(R(4)), 3),
    # with-blocks
    case(no_grad_print, A(R(4, requires_grad=True)), 2),
    case(enable_grad_print, A(R(4, requires_grad=True)), 2),
    case(nested_grad_modes_print, A(R(4, requires_grad=True)), 2),
    case(no_grad_break_after_block, A(R(4, requires_grad=True)), 2),
    case(autocast_print, A(R(4, 4), R(4, 4)), 2, marks=AUTOCAST_GUARD_BUG, rtol=1e-2, atol=1e-2),
    case(autocast_item, A(R(4, 4), R(4, 4), fixed(2.0)), 2, marks=AUTOCAST_GUARD_BUG, rtol=1e-2, atol=1e-2),
    case(set_grad_enabled_print, A(R(4, requires_grad=True)), 2, marks=SET_GRAD_ENABLED_BUG),
    case(no_grad_loop_print, A(R(4, requires_grad=True)), 3),
    # try regions
    case(try_key_present, A(R(4)), 1),
    case(try_no_raise_print, A(R(4)), 2),
    case(try_finally_print, A(R(4)), 3),
    case(try_finally_item, A(R(4), fixed(3.0)), 1),
    case(try_except_else_print, A(R(4)), 2),
    case(try_in_loop_print, A(R(4)), 2),
    # inlined helpers that break
    case(calls_helper_prints, A(R(4)), 4),
    case(calls_helper_no_ops, A(R(4)), 2),
    case(calls_shout, A(R(4)), 2),
    case(calls_nested_helper, A(R(4)), 5),
    case(calls_helper_twice, A(R(4)), 3, id="helper_breaking_twice_compiled_once"),
    case(calls_method_printer, A(R(4), Printer(2.0)), 4),
    case(calls_module_printing, A(R(2, 4), PrintingModule()), 3),
    case(calls_item_module, A(R(2, 4), fixed(2.0), ItemModule()), 3),
    case(module_with_printing_child, A(R(2, 4), Outer()), 4),
    case(calls_lambda_prints, A(R(4)), 2),
    case(calls_helper_in_loop, A(R(4)), 2),
    case(closure_reader, A(R(4)), 2, id="closure_reader_breaks"),
    # the callee keeps its own backend ("eager"): only the + 1 after it is counted here
    case(calls_compiled_fn, A(R(4)), 1, id="calls_a_kiln_compiled_function_that_breaks"),
    # more shapes
    case(varargs_kwargs, A(R(4), 3.0, b=R(4)), 2),
    case(kwonly_defaults, A(R(4), shift=2.0), 2),
    case(deleted_local, A(R(4)), 2),
    case(maybe_unbound_local, A(R(4), True), 2, id="maybe_unbound_local_bound"),
    case(maybe_unbound_local, A(R(4), False), 1, id="maybe_unbound_local_raises_unboundlocalerror",
         expect_raise=UnboundLocalError),
    case(unbound_but_unused, A(R(4), False), 1),
    case(listcomp_item, A(R(4), [fixed(1.0), fixed(2.0)]), 1, id="break_inside_list_comprehension"),
    # the comprehension's continuation (the list being built handed over) is compiled too;
    # on 3.12 the comprehension is inlined (PEP 709): tests/capture/test_comprehension_breaks.py
    case(listcomp_print, A([R(2), R(2)]), 2, id="helper_break_inside_list_comprehension"),
    case(genexpr_item, A(R(4), [fixed(1.0), fixed(2.0)]), 1, id="break_inside_generator_expression",
         marks=BAD_LOCAL_NAME_BUG),
    case(branch_inside_call_args, A(pos(3), R(3)), 2, id="branch_inside_call_args_true"),
    case(branch_inside_call_args, A(neg(3), R(3)), 2, id="branch_inside_call_args_false"),
    case(conditional_list_into_call, A(pos(3)), 2, id="conditional_list_into_call_true"),
    case(conditional_list_into_call, A(neg(3)), 2, id="conditional_list_into_call_false"),
    case(recursive_breaks, A(R(4), 2), 3),
    case(user_context_manager_print, A(R(4), Fresh(Recorder, "Recorder()")), 2),
    case(assert_on_tensor, A(pos(4)), 2),
    case(assert_fails_on_tensor, A(pos(4)), 1, id="assert_on_tensor_fails", expect_raise=AssertionError),
    case(assert_on_tensor_rewritten, A(pos(4)), 2, id="assert_rewritten_by_pytest", marks=BAD_LOCAL_NAME_BUG),
    case(while_true_break_on_tensor, A(Fresh(lambda: torch.rand(4) * 0.1 + 0.5, "0.5+rand/10")), 3),
    case(method_breaks, A(Printer(3.0), R(4)), 2),
    case(break_in_else_branch_of_python_if, A(R(4), False), 2),
    case(break_then_return_constant, A(R(4)), 1),
    case(print_in_nested_tuple_unpack, A(R(4)), 2),
    case(autocast_print_before_ops, A(R(4, 4), R(4, 4)), None, id="autocast_print_before_ops_correct",
         rtol=1e-2, atol=1e-2),
    case(autocast_print_before_ops, A(R(4, 4), R(4, 4)), 1, id="autocast_print_before_ops_one_graph",
         marks=STATE_ONLY_GRAPH_BUG, rtol=1e-2, atol=1e-2),
    case(no_grad_print_first, A(R(4, requires_grad=True)), None, id="no_grad_print_first_correct"),
    case(no_grad_print_first, A(R(4, requires_grad=True)), 1, id="no_grad_print_first_one_graph",
         marks=STATE_ONLY_GRAPH_BUG),
])


@pytest.mark.parametrize("fn,make_args,frames,opts", CASES)
def test_graph_break_case(fn, make_args, frames, opts, capsys):
    check(fn, make_args, frames, capsys=capsys, **opts)


# =========================================================================== exceptions raised by the native part
# A native instruction (or a callee that runs as its own compiled function) raising inside a
# try region of the break function must reach the user's handler exactly as in eager.
RAISING_TRY_CASES = {
    # name: (function, graphs compiled by the first call)
    "try_native_keyerror_handled": (try_keyerror_missing_key, 1),
    "try_user_fn_valueerror_handled": (try_user_valueerror, 1),
    "try_helper_raises_after_ops": (try_helper_raises_after_ops, 1),
    "try_uncaught_propagates": (try_uncaught_propagates, 1),
    "try_nested_finally_then_except": (try_nested_print, 1),
}

_RAISING_SCRIPT = r"""
import contextlib, io, sys
sys.path.insert(0, {here!r})
import test_graph_breaks as T
from _breaks import A, R, check
for name in sys.argv[1:]:
    fn, frames = T.RAISING_TRY_CASES[name]
    sink = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    with contextlib.redirect_stdout(sink):
        for _ in range(5):
            check(fn, A(R(4)), frames)
    sink.seek(0)
    sink.read()
    print("OK", name, flush=True)
"""


def _run_raising_cases(names):
    import subprocess

    script = _RAISING_SCRIPT.format(here=_HERE)
    proc = subprocess.run([sys.executable, "-X", "dev", "-c", script, *names], capture_output=True,
                          text=True, timeout=120)
    return proc


def test_native_exception_reaches_user_handler_as_in_eager():
    names = list(RAISING_TRY_CASES)
    proc = _run_raising_cases(names)
    done = [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("OK ")]
    assert proc.returncode == 0 and done == names, (
        f"rc={proc.returncode}, finished {done}\n{proc.stderr[-3000:]}")


def _exception_table_depths(code):
    import dis

    return [e.depth for e in dis._parse_exception_table(code)]


def test_break_function_exception_table_depths_are_sane(capsys):
    # try_no_raise_print never raises, so running it is safe even with the bug
    cf, _ = check(try_no_raise_print, A(R(4)), 2, capsys=capsys)
    (entry,) = cf.entries
    bound = dict(zip(entry.fn.__code__.co_freevars, (c.cell_contents for c in entry.fn.__closure__)))
    break_fn = bound["___break"]   # kiln's values are bound in the entry's closure
    code = break_fn.__code__
    depths = _exception_table_depths(code)
    assert depths, "the break function keeps the try region"
    assert all(d <= code.co_stacksize for d in depths), f"depths {depths} > co_stacksize {code.co_stacksize}"


# =========================================================================== other break behaviour
COUNTER = 0


def bump_global(x):
    global COUNTER
    COUNTER += 1              # captured (written back after the graph), then a break:
    print("bumped")
    return x * 2


def calls_untraceable_helper(x):
    y = x + 1
    z = bump_global(y)
    return z - 1


def test_untraceable_user_function_runs_as_its_own_compiled_function(capsys):
    global COUNTER
    COUNTER = 0
    cnt = CompileCounter()
    cf = kiln.compile(calls_untraceable_helper, backend=cnt)
    for i in range(3):
        x = torch.randn(4)
        before = COUNTER
        expected = calls_untraceable_helper(x.clone())
        assert COUNTER == before + 1
        got = cf(x)
        assert COUNTER == before + 2, "the global write runs exactly once per compiled call"
        torch.testing.assert_close(got, expected)
        # y = x + 1 | bump_global: (global store, print) then x * 2 | z - 1
        assert cnt.frame_count == 3
    assert capsys.readouterr().out == "bumped\n" * 6
    (entry,) = cf.entries
    assert "print" in entry.graph_break.construct


def warns_then_computes(x):
    y = x + 1
    warnings.warn("careful with x", UserWarning)
    return y * 2


def test_warnings_warn_breaks_and_still_warns():
    cnt = CompileCounter()
    cf = kiln.compile(warns_then_computes, backend=cnt)
    for _ in range(3):
        x = torch.randn(4)
        with pytest.warns(UserWarning, match="careful with x"):
            expected = warns_then_computes(x)
        with pytest.warns(UserWarning, match="careful with x") as rec:
            got = cf(x)
        assert len(rec) == 1
        torch.testing.assert_close(got, expected)
        assert cnt.frame_count == 2
    assert "warn" in cf.entries[0].graph_break.construct


def test_time_time_breaks_and_results_match():
    cnt = CompileCounter()
    cf = kiln.compile(time_time, backend=cnt)
    x = torch.randn(4)
    got = cf(x)
    expected = time_time(x)
    torch.testing.assert_close(got[0], expected[0])
    assert got[1] is True
    assert cnt.frame_count == 2            # y = x + 1 | z = y * 2
    assert "time.time" in cf.entries[0].graph_break.construct


def test_time_time_warm_calls_compile_nothing():
    cnt = CompileCounter()
    cf = kiln.compile(time_time, backend=cnt)
    for _ in range(3):
        cf(torch.randn(4))
    assert cnt.frame_count == 2


def test_tolist_unread_elements_do_not_respecialize():
    cnt = CompileCounter()
    cf = kiln.compile(tolist_len, backend=cnt)
    for _ in range(3):
        x, k = torch.randn(4), torch.randn(3)
        torch.testing.assert_close(cf(x, k), tolist_len(x, k))
    assert cnt.frame_count == 1


def test_item_value_specializes_the_continuation():
    """A Python number produced at a break is a constant of the continuation: a new value
    compiles a new entry of the continuation, a value seen before reuses its entry."""
    cnt = CompileCounter()
    cf = kiln.compile(item_arith, backend=cnt)
    seen = []
    for v in (2.0, 3.0, 2.0, 3.0, 2.0):
        x, k = torch.randn(4), torch.tensor(v)
        torch.testing.assert_close(cf(x, k), item_arith(x, k))
        seen.append(cnt.frame_count)
    assert seen == [1, 2, 2, 2, 2]
    (entry,) = cf.entries
    (cont,) = entry.resumes
    assert len(cont.entries) == 2
    assert any("2.0" in r for r in cont.recompile_reasons)


def test_item_bool_changes_branch_and_compiles_the_other_side():
    cnt = CompileCounter()
    cf = kiln.compile(if_tensor_true, backend=cnt)
    xs = [torch.rand(4) + 0.5, -torch.rand(4) - 0.5, torch.rand(4) + 0.5, -torch.rand(4) - 0.5]
    counts = []
    for x in xs:
        torch.testing.assert_close(cf(x), if_tensor_true(x))
        counts.append(cnt.frame_count)
    # the graph before the branch, then one continuation per side, each compiled once
    assert counts == [2, 3, 3, 3]
    (entry,) = cf.entries
    assert len(entry.resumes) == 2


def test_new_shape_recompiles_both_sides_of_a_break(capsys):
    cnt = CompileCounter()
    cf = kiln.compile(print_middle, backend=cnt)
    for shape, frames in (((4,), 2), ((4,), 2), ((2, 3), 4), ((2, 3), 4), ((4,), 4)):
        x = torch.randn(*shape)
        torch.testing.assert_close(cf(x), print_middle(x))
        assert cnt.frame_count == frames
    assert len(cf.entries) == 2


def test_frame_with_cells_breaks_or_runs_eagerly_correctly(capsys):
    cnt = CompileCounter()
    cf = kiln.compile(creates_closure_and_breaks, backend=cnt)
    for _ in range(3):
        x = torch.randn(4)
        expected = creates_closure_and_breaks(x)
        e_out = capsys.readouterr().out
        torch.testing.assert_close(cf(x), expected)
        assert capsys.readouterr().out == e_out == "closure frame\n"
    (entry,) = cf.entries
    if entry.is_eager:     # the documented limitation: the frame creates closures over its locals
        assert "closure" in str(entry.eager_reason)
        assert cnt.frame_count == 0
    else:                  # cells travel across the break
        assert "print" in entry.graph_break.construct
        assert cnt.frame_count == 2


def only_leaves_no_grad_after_break(x):
    with torch.no_grad():
        y = x * 2
        print("inside")
    return y


def test_leaving_no_grad_after_break_compiles_no_graph(capsys):
    check(only_leaves_no_grad_after_break, A(R(4, requires_grad=True)), 1, capsys=capsys)


def test_leaving_no_grad_after_break_is_correct(capsys):
    cnt = CompileCounter()
    cf = kiln.compile(only_leaves_no_grad_after_break, backend=cnt)
    for _ in range(2):
        x = torch.randn(4, requires_grad=True)
        y = cf(x)
        assert not y.requires_grad and torch.is_grad_enabled()
        torch.testing.assert_close(y, x.detach() * 2)


def test_graph_break_entry_records_reason_and_location(capsys):
    cf, _ = check(two_prints, A(R(4)), 3, capsys=capsys)
    (entry,) = cf.entries
    gb = entry.graph_break
    assert not entry.is_eager and entry.eager_reason is None
    assert "print()" in gb.construct
    assert gb.filename == __file__ or gb.filename.endswith("test_graph_breaks.py")
    first = two_prints.__code__.co_firstlineno
    assert gb.lineno == first + 2
    assert gb.source_line.strip() == 'print("one")'
    assert entry.graph_module is not None
    (cont,) = entry.resumes
    (centry,) = cont.entries
    assert centry.graph_break.lineno == first + 4
    assert centry.graph_break.source_line.strip() == 'print("two")'


def test_graph_break_inside_helper_is_located_in_the_helper(capsys):
    cf, _ = check(calls_helper_prints, A(R(4)), 4, capsys=capsys)
    gb = cf.entries[0].graph_break
    assert gb.lineno == helper_prints.__code__.co_firstlineno + 2
    assert gb.source_line.strip() == 'print("helper_prints")'


def test_graph_breaks_log_line(capsys):
    kiln.set_logs("graph_breaks")
    cf = kiln.compile(print_middle, backend=CompileCounter())
    cf(torch.randn(4))
    err = capsys.readouterr().err
    line = print_middle.__code__.co_firstlineno + 2
    assert "[kiln:graph_breaks] graph break in print_middle: print()" in err
    assert f"test_graph_breaks.py:{line}" in err
    cf(torch.randn(4))
    assert "[kiln:graph_breaks]" not in capsys.readouterr().err   # warm: no capture, no log


def test_graph_breaks_log_off_by_default(capsys):
    cf = kiln.compile(print_middle, backend=CompileCounter())
    cf(torch.randn(4))
    assert "[kiln:" not in capsys.readouterr().err


def test_fullgraph_refuses_to_break():
    cf = kiln.compile(item_after_ops, fullgraph=True, backend=CompileCounter())
    with pytest.raises(kiln.Unsupported, match=r"item\(\)") as info:
        cf(torch.randn(4), torch.tensor(2.0))
    assert info.value.lineno == item_after_ops.__code__.co_firstlineno + 2


def test_comptime_graph_break_counts_like_a_real_break(capsys):
    cf, cnt = check(comptime_break_twice, A(R(4)), 3, capsys=capsys)
    assert [b.construct for b in all_breaks(cf)] == ["comptime.graph_break()"] * 2


def generator_frame(x):
    yield x + 1
    yield x * 2


def test_eager_frame_entry_records_reason(capsys):
    kiln.set_logs("graph_breaks")
    cnt = CompileCounter()
    cf = kiln.compile(generator_frame, backend=cnt)
    for _ in range(2):
        x = torch.randn(3)
        got = list(cf(x))
        assert len(got) == 2
        torch.testing.assert_close(got[1], x * 2)
    (entry,) = cf.entries
    assert entry.is_eager and entry.graph_break is None and entry.graph_module is None
    assert "generator" in str(entry.eager_reason)
    assert cnt.frame_count == 0
    err = capsys.readouterr().err
    assert "[kiln:graph_breaks] generator_frame runs eagerly: " in err
    assert err.count("[kiln:graph_breaks]") == 1          # logged once, at capture


def comptime_print_then_break(x):
    y = x + 1
    comptime.print("comptime ran")
    print("real print")
    return y * 2


def test_comptime_before_a_break_runs_once(capsys):
    cf = kiln.compile(comptime_print_then_break, backend=CompileCounter())
    cf(torch.randn(2))
    out = capsys.readouterr().out
    assert out.count("comptime ran") == 1 and out.count("real print") == 1


class _LossHead(torch.nn.Module):
    """A module whose loss comes through a property that breaks the graph (transformers'
    ``loss_function`` logs through a call the capture cannot take)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    @property
    def loss_fn(self):
        _native_only(torch.ones(1))
        return torch.nn.functional.cross_entropy

    def forward(self, x, y):
        h = self.lin(x).relu()
        return self.loss_fn(h, y) * 2, h


@functools.lru_cache(None)
def _native_only(t):
    return None      # (an lru_cache called with a tensor: runs natively, a graph break)


def test_a_break_inside_a_property_read_compiles_the_call_it_feeds():
    """Only the property read runs natively: the call it feeds (the loss) and the rest of the
    frame are a compiled continuation, as torch.compile resumes after the read."""
    m = _LossHead()
    cc = CompileCounter()
    compiled = kiln.compile(m, backend=cc)
    for _ in range(2):
        x, y = torch.randn(3, 4), torch.randint(0, 4, (3,))
        assert_same(compiled(x, y), m(x, y))
    assert cc.frame_count == 2
    ops = [str(n.target) for n in cc.graphs[1].graph.nodes if n.op == "call_function"]
    assert any("cross_entropy" in o for o in ops), ops


def test_a_continuation_that_cannot_take_back_its_stack_runs_as_it_is(capsys):
    # The continuation after ``print`` takes the loop's iterator back; rebuilding it over a set
    # of non-constant values breaks inside the continuation's prologue, where the stack slots
    # it has not pushed yet are still its parameters: that continuation runs as it is (an
    # internal UnboundLocalError reached the user before; CPython's test_collections).
    def f(x):
        out = []
        for s in [{False, True}, {object()}]:
            fs = frozenset(s)
            out.append(print(len(fs)))
            x = x + len(fs)
        return x, out

    x = torch.randn(3)
    expected = f(x)
    eager_out = capsys.readouterr().out
    kiln.reset()
    got = kiln.compile(f, backend="aot_eager")(x)
    assert_same(got, expected)
    assert capsys.readouterr().out == eager_out == "2\n1\n"
