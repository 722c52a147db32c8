"""Conformance: for loops over range/list/tuple/dict/enumerate/zip, nested loops,
break/continue on Python conditions, while loops on Python counters, loops accumulating
tensors and building lists."""
import os
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from _conformance import A, R, case, ids_unique, run_case  # noqa: E402


def for_range(x):
    out = x
    for i in range(4):
        out = out * 0.5 + i
    return out


def for_range_start_stop_step(x):
    out = torch.zeros_like(x)
    for i in range(1, 10, 3):
        out = out + x * i
    for i in range(5, 0, -2):
        out = out - i
    return out


def for_range_arg(x, n):
    out = x
    for _ in range(n):
        out = torch.sin(out)
    return out


def for_range_len(xs):
    out = xs[0]
    for i in range(1, len(xs)):
        out = out + xs[i] * i
    return out


def for_list_of_tensors(xs):
    out = 0
    for t in xs:
        out = out + t
    return out


def for_tuple_of_ints(x):
    out = x
    for k in (3, 1, 4):
        out = out * k
    return out


def for_list_of_mixed(x):
    out = x
    for v in [1, 2.5, x, None]:
        if v is None:
            continue
        out = out + v
    return out


def for_dict_keys(x, d):
    out = x
    for k in d:
        out = out + d[k]
    for k in d.keys():
        out = out * 2 if k == "a" else out
    return out


def for_dict_items(d):
    out = {}
    for k, v in d.items():
        out[k.upper()] = v * 2
    return out


def for_dict_values(d):
    total = None
    for v in d.values():
        total = v if total is None else total + v
    return total


def for_enumerate(xs):
    out = []
    for i, t in enumerate(xs):
        out.append(t * (i + 1))
    return out


def for_enumerate_start(x):
    out = x
    for i, k in enumerate([10, 20, 30], start=1):
        out = out + i * k
    return out


def for_zip(xs, ys):
    out = []
    for a, b in zip(xs, ys):
        out.append(a @ b)
    return out


def for_zip_three(x):
    out = x
    for a, b, c in zip([1, 2], (3, 4), range(5)):
        out = out + a * b - c
    return out


def for_over_tensor_rows(x):
    out = []
    for row in x:
        out.append(row.sum())
    return torch.stack(out)


def for_nested(x):
    out = x
    for i in range(3):
        for j in range(2):
            out = out + i * j
    return out


def for_nested_lists(grid):
    total = 0
    for row in grid:
        for t in row:
            total = total + t
    return total


def for_break(x):
    out = x
    for i in range(10):
        if i == 3:
            break
        out = out * 2
    return out


def for_continue(x):
    out = x
    for i in range(6):
        if i % 2 == 0:
            continue
        out = out + i
    return out


def for_break_else(x):
    out = x
    for i in range(3):
        out = out + i
    else:
        out = out * 10
    for i in range(3):
        if i == 1:
            break
    else:
        out = out - 1000
    return out


def for_break_on_shape(xs):
    out = xs[0]
    for t in xs[1:]:
        if t.shape != out.shape:
            break
        out = out + t
    return out


def for_nested_break(x):
    out = x
    for i in range(3):
        for j in range(3):
            if j > i:
                break
            out = out + (i - j)
    return out


def while_counter(x):
    i = 0
    out = x
    while i < 4:
        out = out + i
        i += 1
    return out, i


def while_break_continue(x):
    i = 0
    out = x
    while True:
        i += 1
        if i % 2 == 0:
            continue
        if i > 7:
            break
        out = out * 1.5
    return out


def while_pop_list(xs):
    xs = list(xs)
    out = 0
    while xs:
        out = out + xs.pop()
    return out


def while_nested(x):
    out = x
    i = 0
    while i < 2:
        j = 0
        while j < 3:
            out = out + i * j
            j += 1
        i += 1
    return out


def loop_accumulate_tensor(x, w):
    h = x
    for _ in range(3):
        h = torch.tanh(h @ w)
    return h


def loop_build_list_and_cat(x):
    parts = []
    for i in range(4):
        parts.append(x * i)
    return torch.cat(parts, dim=0), len(parts)


def loop_build_dict(x):
    d = {}
    for i, name in enumerate(["a", "b", "c"]):
        d[name] = x + i
    return d


def loop_accumulate_python_and_tensor(x):
    total = 0
    acc = torch.zeros_like(x)
    for i in range(5):
        total += i
        acc += x * i
    return acc, total


def loop_inplace_on_input(x):
    for i in range(3):
        x.add_(i)
    return x.sum()


def loop_list_comprehension_nested(x):
    return [[x[i, j] * 2 for j in range(2)] for i in range(2)]


def loop_over_shape(x):
    out = x
    for d in x.shape:
        out = out * d
    return out


def loop_over_string(x):
    out = x
    for ch in "abc":
        if ch == "b":
            out = out + 1
    return out


def loop_sum_generator(xs):
    return sum(t * 2 for t in xs)


def loop_chunks(x):
    outs = []
    for c in x.chunk(2, dim=1):
        outs.append(c.mean())
    return outs


CASES = ids_unique([
    case(for_range, A(R(3, 4))),
    case(for_range_start_stop_step, A(R(3, 4))),
    case(for_range_arg, A(R(3, 4), 3)),
    case(for_range_len, A([R(3), R(3), R(3)])),
    case(for_list_of_tensors, A([R(3, 4), R(3, 4), R(4)])),
    case(for_tuple_of_ints, A(R(3, 4))),
    case(for_list_of_mixed, A(R(3, 4))),
    case(for_dict_keys, A(R(3, 4), {"a": R(3, 4), "b": R(4)})),
    case(for_dict_items, A({"a": R(3, 4), "b": R(2)})),
    case(for_dict_values, A({"a": R(3, 4), "b": R(3, 4), "c": R(3, 4)})),
    case(for_enumerate, A([R(3), R(3), R(3)])),
    case(for_enumerate_start, A(R(3, 4))),
    case(for_zip, A([R(3, 4), R(2, 3)], [R(4, 2), R(3, 3)]), rtol=1e-4, atol=1e-5),
    case(for_zip_three, A(R(3, 4))),
    case(for_over_tensor_rows, A(R(3, 4))),
    case(for_nested, A(R(3, 4))),
    case(for_nested_lists, A([[R(3), R(3)], [R(3)]])),
    case(for_break, A(R(3, 4))),
    case(for_continue, A(R(3, 4))),
    case(for_break_else, A(R(3, 4))),
    case(for_break_on_shape, A([R(3, 4), R(3, 4), R(2, 4), R(3, 4)])),
    case(for_nested_break, A(R(3, 4))),
    case(while_counter, A(R(3, 4))),
    case(while_break_continue, A(R(3, 4))),
    case(while_pop_list, A([R(3), R(3), R(3)])),
    case(while_nested, A(R(3, 4))),
    case(loop_accumulate_tensor, A(R(3, 4), R(4, 4)), rtol=1e-4, atol=1e-5),
    case(loop_build_list_and_cat, A(R(3, 4))),
    case(loop_build_dict, A(R(3, 4))),
    case(loop_accumulate_python_and_tensor, A(R(3, 4))),
    case(loop_inplace_on_input, A(R(3, 4))),
    case(loop_list_comprehension_nested, A(R(3, 4))),
    case(loop_over_shape, A(R(3, 4))),
    case(loop_over_string, A(R(3, 4))),
    case(loop_sum_generator, A([R(3), R(3)])),
    case(loop_chunks, A(R(3, 4))),
])


@pytest.mark.parametrize("fn,make_args,opts", CASES)
def test_loops(fn, make_args, opts):
    run_case(fn, make_args, opts)
