"""Conformance: locals, globals, builtins, constants, arithmetic, comparisons, boolean
logic, identity/membership, static if/else, ternaries, f-strings, augmented assignment,
del, assert."""
import math
import operator
import os
import sys

import pytest
import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from _conformance import A, R, case, ids_unique, run_case  # noqa: E402

# ----------------------------------------------------------------------------- globals
G_TENSOR = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 10
G_INT = 3
G_FLOAT = 0.25
G_LIST = [1, 2, 3]
G_DICT = {"a": 2, "b": -1}
G_TUPLE = (2, 4)
G_DTYPE = torch.float32
G_STR = "mode_b"
G_FLAG = False


def g_helper(t, k=2):
    return t * k + 1


# ----------------------------------------------------------------------------- locals / constants
def locals_simple(x, y):
    a = x + y
    b = a * 2
    c = b - x
    return c


def locals_rebind(x):
    y = x
    y = y + 1
    y = y * y
    return y, x


def constants_python(x):
    return x * 3 + 2.5 - int(True) + (False + 1)


def constant_none_return(x):
    return x + 1, None


def constants_math(x):
    return x * math.pi + math.e - math.sqrt(4.0) + (math.inf > 1e308)


def constants_int_float_mix(x):
    a = 7
    b = 2.0
    return x * (a / b) + a // 2 + a % 3


def global_tensor(x):
    return x + G_TENSOR


def global_int_float(x):
    return x * G_INT + G_FLOAT


def global_function(x):
    return g_helper(x) + g_helper(x, k=G_INT)


def global_containers(x):
    return x * G_LIST[1] + G_DICT["a"] - G_TUPLE[0] + len(G_LIST)


def global_dtype(x):
    return x.to(G_DTYPE) + 1


def global_str_branch(x):
    if G_STR == "mode_a":
        return x - 1
    elif G_STR == "mode_b":
        return x + 1
    return x


def global_flag_branch(x):
    if G_FLAG:
        return torch.sin(x)
    return torch.cos(x)


def global_module_attr(x):
    return torch.nn.functional.relu(x) * math.tau


# ----------------------------------------------------------------------------- tensor arithmetic
def t_add(x, y):
    return x + y


def t_sub(x, y):
    return x - y


def t_mul(x, y):
    return x * y


def t_truediv(x, y):
    return x / (y.abs() + 1)


def t_floordiv(x):
    return (x * 10) // 3


def t_mod(x):
    return x % 1.5


def t_pow(x):
    return x ** 2 + 2 ** x + x.abs() ** 0.5


def t_matmul(x, y):
    return x @ y


def t_unary(x):
    return -x, +x, abs(x)


def t_reverse_ops(x):
    return 1 - x, 2 / (x.abs() + 1), 3 * x, 4 + x, 2 ** x


def t_compare_ops(x, y):
    return x < y, x <= y, x > y, x >= y, x == y, x != y


def t_bool_tensor_ops(x, y):
    a = x > 0
    b = y > 0
    return a & b, a | b, a ^ b, ~a


def t_int_tensor_ops(x):
    i = (x * 10).to(torch.int64)
    return i & 7, i | 1, i ^ 3, ~i, i << 1, i >> 1


def t_operator_module(x, y):
    return operator.add(x, y), operator.mul(x, 2), operator.neg(y), operator.matmul(x, y.t())


# ----------------------------------------------------------------------------- python number arithmetic
def py_int_arith(x, n, k):
    vals = (n + k, n - k, n * k, n // k, n % k, n ** 2, -n, +n, ~n, abs(-n), n / k)
    return x * sum(vals), vals


def py_int_bitwise(x, n):
    return x + ((n & 6) | (n ^ 1)) + (n << 2) - (n >> 1)


def py_float_arith(x, f):
    v = f / 2 + f ** 2 - f * 3 + f // 1 + f % 1 - (-f)
    return x * v, v


def py_negative_floordiv_mod(x):
    a = -7 // 2
    b = -7 % 3
    c = 7 // -2
    return x + a + b + c, (a, b, c)


def py_divmod_round(x):
    q, r = divmod(17, 5)
    return x * q + r + round(2.567, 2) + round(3.5) + round(-2.5), (q, r, round(2.567, 2), round(3.5))


def py_builtin_conversions(x):
    a = int(3.9)
    b = float(2)
    c = bool(0)
    d = int("12")
    e = float("1.5")
    return x * a + b + c + d + e, (a, b, c, d, e)


def py_pow_builtin(x):
    return x + pow(2, 5) + pow(2.0, -1), pow(3, 2, 5)


def py_min_max_abs(x):
    return x * max(3, 7, 1) - min(2.5, -1.0) + abs(-4), max([4, 9, 2]), min((5, 3))


def py_math_funcs(x):
    return x + math.floor(2.7) + math.ceil(2.1) + math.log(math.e) + math.cos(0.0)


def walrus(x):
    if (n := 3) > 2:
        return x * n
    return x


# ----------------------------------------------------------------------------- comparisons
def py_comparisons(x, a, b):
    res = (a < b, a <= b, a > b, a >= b, a == b, a != b)
    return x + sum(res), res


def py_chained_comparison(x, a):
    if 0 < a < 10:
        y = x + a
    else:
        y = x - a
    return y, 0 < a <= 5 < 10, 1 < a < 2


def py_tuple_comparison(x):
    return x + ((1, 2) < (1, 3)), (1, 2, 3) == (1, 2, 3), [1, 2] != [1, 2]


def py_str_comparison(x, mode):
    if mode == "double":
        return x * 2
    return x


def py_float_int_eq(x):
    return x + (1.0 == 1), (2 == 2.0, 0.5 < 1)


# ----------------------------------------------------------------------------- and / or / not
def py_and_or(x, a, b):
    r1 = a and b
    r2 = a or b
    r3 = 0 and a
    r4 = 0 or b
    r5 = None or a
    return x * (r1 + r2 + r3 + r4 + r5), (r1, r2, r3, r4, r5)


def py_not(x, a):
    return x + (not a) + (not 0), (not a, not [], not [1], not None)


def py_bool_conditions(x, a, b):
    if a > 0 and b > 0:
        x = x + 1
    if a < 0 or b > 0:
        x = x * 2
    if not (a == b):
        x = x - 3
    return x


# ----------------------------------------------------------------------------- is / in
def is_none_checks(x, y=None):
    if y is None:
        return x + 1
    return x + y


def is_none_checks_given(x, y=None):
    if y is not None:
        return x * y
    return x


def is_identity(x, y):
    z = x
    return x + 1, z is x, x is y, y is not x, True is True


def in_containers(x, k):
    r = (k in [1, 2, 3], k not in (4, 5), "a" in {"a": 1}, k in {1, 2}, "ell" in "hello")
    return x * sum(r), r


def in_branch(x, name):
    if name in ("relu", "gelu"):
        return torch.relu(x)
    return torch.tanh(x)


# ----------------------------------------------------------------------------- static if/else
def if_python_int(x, n):
    if n > 2:
        return x * n
    elif n == 2:
        return x + n
    else:
        return x - n


def if_isinstance(x, y):
    out = x
    if isinstance(y, torch.Tensor):
        out = out + y
    if isinstance(y, (int, float)):
        out = out * 100
    if isinstance(3, int) and not isinstance(3.0, int):
        out = out - 1
    return out


def if_isinstance_scalar(x, s):
    if isinstance(s, float):
        return x * s
    return x + s


def if_len_list(x, xs):
    if len(xs) == 3:
        return x + sum(xs)
    return x


def if_empty_list(x, xs):
    if xs:
        return x * 2
    return x - 1


def if_tensor_dim(x):
    if x.dim() == 2:
        return x.sum(0)
    return x


def if_tensor_shape(x):
    if x.shape[0] == 3 and x.shape[-1] > 2:
        return x[:, :2]
    return x


def if_tensor_shape_tuple(x):
    if x.shape == (3, 4):
        return x.t()
    return x


def if_tensor_dtype(x):
    if x.dtype == torch.float32:
        return x.double() + 1
    return x


def if_tensor_dtype_is(x):
    if x.dtype is torch.float64:
        return x * 2
    return x * 3


def if_nested(x, a, b):
    if a:
        if b > 1:
            y = x + b
        else:
            y = x - b
    else:
        y = x
    return y


def ternary_simple(x, n):
    y = x * 2 if n > 0 else x / 2
    z = 1 if n < 0 else -1
    return y + z


def ternary_none(x, b=None):
    return x + (b if b is not None else 0)


def ternary_nested(x, n):
    return x * (10 if n > 5 else (5 if n > 2 else 1))


# ----------------------------------------------------------------------------- strings
def fstring_constants(x, n):
    key = f"layer_{n}"
    fmt = f"{n:03d}|{2.5:.1f}|{'abc'!r}"
    if key == "layer_3":
        x = x + 1
    return x, key, fmt


def fstring_dict_keys(x):
    return {f"k{i}": x + i for i in range(3)}


def string_methods(x, s):
    parts = s.split(",")
    up = s.upper()
    if up.startswith("A") and len(parts) == 2:
        x = x * 2
    return x, parts, "-".join(parts), s.replace("a", "z")


def string_concat_format(x):
    s = "a" + "b" * 2
    t = "{}_{}".format("x", 1)
    u = "%s=%d" % ("n", 5)
    return x + len(s), s, t, u


# ----------------------------------------------------------------------------- augmented assignment
def aug_assign_local(x):
    y = x.clone()
    y += 1
    y *= 2
    y -= x
    y /= 3
    return y


def aug_assign_python(x):
    n = 1
    n += 2
    n *= 3
    n -= 1
    n //= 2
    n **= 2
    n %= 7
    f = 1.5
    f /= 2
    return x * n + f, n, f


def aug_assign_rebind(x):
    y = x + 0
    y = y + 1
    x2 = x
    x2 = x2 * 2
    return y, x2, x


def aug_assign_input_inplace(x, y):
    x += y  # in-place on the input tensor
    x *= 2
    return x


def aug_assign_list(x):
    xs = [x]
    xs += [x + 1]
    xs *= 2
    return xs


# ----------------------------------------------------------------------------- del / assert
def del_local(x):
    y = x + 1
    z = y * 2
    del y
    return z


def del_in_loop(x):
    tmp = x * 2
    out = tmp + 1
    del tmp
    tmp = out - 1
    return tmp


def assert_python(x, n):
    assert n > 0
    assert isinstance(x, torch.Tensor), "needs a tensor"
    assert x.shape == (3, 4)
    assert x.dtype == torch.float32 and x.dim() == 2
    return x * n


def assert_with_message(x, xs):
    assert len(xs) == 2, f"bad length {len(xs)}"
    return x + xs[0] + xs[1]


# ----------------------------------------------------------------------------- builtins on tensors / misc
def builtin_len_tensor(x):
    return x * len(x), len(x)


def builtin_type_checks(x, n):
    out = x
    if type(n) is int:
        out = out + 1
    if type(x) is torch.Tensor:
        out = out * 2
    return out


def builtin_callable_id(x):
    return x + callable(torch.relu) + callable(3)


def builtin_sum_tensors(x, y):
    return sum([x, y, x * y])


def builtin_max_tensors(x, y):
    return torch.maximum(x, y) + min(2, 3) - max(1.5, 0.5)


def builtin_hash_static(x):
    return x + (hash(3) == hash(3))


CASES = ids_unique([
    # locals / constants / globals
    case(locals_simple, A(R(3, 4), R(3, 4))),
    case(locals_rebind, A(R(3, 4))),
    case(constants_python, A(R(3, 4))),
    case(constant_none_return, A(R(3, 4))),
    case(constants_math, A(R(3, 4))),
    case(constants_int_float_mix, A(R(3, 4))),
    case(global_tensor, A(R(3, 4))),
    case(global_int_float, A(R(3, 4))),
    case(global_function, A(R(3, 4))),
    case(global_containers, A(R(3, 4))),
    case(global_dtype, A(R(3, 4, dtype=torch.float64))),
    case(global_str_branch, A(R(3, 4))),
    case(global_flag_branch, A(R(3, 4))),
    case(global_module_attr, A(R(3, 4))),
    # tensor arithmetic
    case(t_add, A(R(3, 4), R(3, 4))),
    case(t_sub, A(R(3, 4), R(4))),
    case(t_mul, A(R(3, 4), R(3, 1))),
    case(t_truediv, A(R(3, 4), R(3, 4))),
    case(t_floordiv, A(R(3, 4))),
    case(t_mod, A(R(3, 4))),
    case(t_pow, A(R(3, 4)), rtol=1e-4),
    case(t_matmul, A(R(3, 4), R(4, 5)), rtol=1e-4, atol=1e-5),
    case(t_unary, A(R(3, 4))),
    case(t_reverse_ops, A(R(3, 4)), rtol=1e-4),
    case(t_compare_ops, A(R(3, 4), R(3, 4))),
    case(t_bool_tensor_ops, A(R(3, 4), R(3, 4))),
    case(t_int_tensor_ops, A(R(3, 4))),
    case(t_operator_module, A(R(3, 4), R(3, 4)), rtol=1e-4, atol=1e-5),
    # python number arithmetic
    case(py_int_arith, A(R(3, 4), 7, 3)),
    case(py_int_bitwise, A(R(3, 4), 5)),
    case(py_float_arith, A(R(3, 4), 2.5)),
    case(py_negative_floordiv_mod, A(R(3, 4))),
    case(py_divmod_round, A(R(3, 4))),
    case(py_builtin_conversions, A(R(3, 4))),
    case(py_pow_builtin, A(R(3, 4))),
    case(py_min_max_abs, A(R(3, 4))),
    case(py_math_funcs, A(R(3, 4))),
    case(walrus, A(R(3, 4))),
    # comparisons
    case(py_comparisons, A(R(3, 4), 2, 5)),
    case(py_chained_comparison, A(R(3, 4), 4)),
    case(py_tuple_comparison, A(R(3, 4))),
    case(py_str_comparison, A(R(3, 4), "double")),
    case(py_float_int_eq, A(R(3, 4))),
    # and / or / not
    case(py_and_or, A(R(3, 4), 2, 3)),
    case(py_not, A(R(3, 4), 0)),
    case(py_bool_conditions, A(R(3, 4), 1, 2)),
    # is / in
    case(is_none_checks, A(R(3, 4))),
    case(is_none_checks_given, A(R(3, 4), R(3, 4))),
    case(is_identity, A(R(3, 4), R(3, 4))),
    case(in_containers, A(R(3, 4), 2)),
    case(in_branch, A(R(3, 4), "gelu")),
    # static if/else
    case(if_python_int, A(R(3, 4), 2)),
    case(if_python_int, A(R(3, 4), 5), id="if_python_int_big"),
    case(if_isinstance, A(R(3, 4), R(3, 4))),
    case(if_isinstance_scalar, A(R(3, 4), 1.5)),
    case(if_len_list, A(R(3, 4), [1, 2, 3])),
    case(if_empty_list, A(R(3, 4), [])),
    case(if_tensor_dim, A(R(3, 4))),
    case(if_tensor_shape, A(R(3, 4))),
    case(if_tensor_shape_tuple, A(R(3, 4))),
    case(if_tensor_dtype, A(R(3, 4))),
    case(if_tensor_dtype_is, A(R(3, 4, dtype=torch.float64))),
    case(if_nested, A(R(3, 4), True, 1)),
    case(ternary_simple, A(R(3, 4), 3)),
    case(ternary_none, A(R(3, 4))),
    case(ternary_nested, A(R(3, 4), 4)),
    # strings
    case(fstring_constants, A(R(3, 4), 3)),
    case(fstring_dict_keys, A(R(3, 4))),
    case(string_methods, A(R(3, 4), "ab,cd")),
    case(string_concat_format, A(R(3, 4))),
    # augmented assignment
    case(aug_assign_local, A(R(3, 4))),
    case(aug_assign_python, A(R(3, 4))),
    case(aug_assign_rebind, A(R(3, 4))),
    case(aug_assign_input_inplace, A(R(3, 4), R(3, 4))),
    case(aug_assign_list, A(R(3, 4))),
    # del / assert
    case(del_local, A(R(3, 4))),
    case(del_in_loop, A(R(3, 4))),
    case(assert_python, A(R(3, 4), 2)),
    case(assert_with_message, A(R(3, 4), [1, 2.5])),
    # builtins / misc
    case(builtin_len_tensor, A(R(3, 4))),
    case(builtin_type_checks, A(R(3, 4), 3)),
    case(builtin_callable_id, A(R(3, 4))),
    case(builtin_sum_tensors, A(R(3, 4), R(3, 4))),
    case(builtin_max_tensors, A(R(3, 4), R(3, 4))),
    case(builtin_hash_static, A(R(3, 4))),
])


@pytest.mark.parametrize("fn,make_args,opts", CASES)
def test_basics(fn, make_args, opts):
    run_case(fn, make_args, opts)
