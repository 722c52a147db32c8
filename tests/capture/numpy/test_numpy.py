"""NumPy code traced into the graph (torch._numpy semantics on tensors).

Each case runs compiled (``fullgraph=True``) and eagerly on fresh random inputs three times,
and compares the results exactly as eager makes them: the Python type (``np.ndarray``,
``np.float64``, ``torch.Tensor``), the dtype, the shape and the values, and the state of every
argument afterwards (NumPy code that writes into its arguments). The graph count is asserted:
the first call compiles one graph, warm calls none.
"""
import copy

import numpy as np
import pytest
import torch

import kiln
from kiln.backends.registry import lookup_backend
from kiln.testing import CompileCounter

RNG = np.random.default_rng(0)


class Counter:
    """Counts graphs; runs them through the named backend."""

    def __init__(self, backend="eager"):
        self.inner = CompileCounter() if backend == "eager" else lookup_backend(backend)[0]
        self.frame_count = 0

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        return self.inner(gm, example_inputs)


def arr(*shape, dtype=np.float64):
    if np.issubdtype(dtype, np.integer):
        return RNG.integers(-5, 6, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def ten(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def assert_same_numpy(actual, expected, path="out"):
    """Same Python type, same dtype and shape, close values; containers item by item."""
    assert type(actual) is type(expected), f"{path}: {type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, equal_nan=True)
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert np.shape(actual) == np.shape(expected), f"{path}: shape"
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6, err_msg=path)
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same_numpy(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def check(fn, make_args, graphs=1, backend="eager", fullgraph=True, calls=3, dynamic=None):
    counter = Counter(backend)
    compiled = kiln.compile(fn, backend=counter, fullgraph=fullgraph, dynamic=dynamic)
    for _ in range(calls):
        args = make_args()
        eager_args = copy.deepcopy(args)
        expected = fn(*eager_args)
        actual = compiled(*args)
        assert_same_numpy(actual, expected)
        assert_same_numpy(list(args), list(eager_args), "args")
    assert counter.frame_count == graphs
    return counter


# ============================================================================ cases
def tensor_numpy_ufunc(x):
    return np.sin(x.numpy()) * 2


def sum_to_scalar(a):
    return np.sum(a * 2 + 1)


def matmul_operators(a, b):
    return np.matmul(a, b) @ b.T - a / 3


def where_select(a):
    return np.where(a > 0, a, 0.0)


def concatenate_reshape_transpose(a):
    return np.concatenate([a, a], axis=0).reshape(-1, 2).transpose()


def indexing(a):
    return a[1:, 0], a[0, 0], a[..., 1], a[0, ...], a[:, None, 0], a[[0, 2]]


def from_numpy_round_trip(x):
    return torch.from_numpy(np.cos(x.numpy())) + 1


def creation_defaults(a):
    return (np.ones(3), np.arange(4) + a.shape[0], np.zeros((2, 2), dtype=np.int32),
            np.full((2,), 3), np.linspace(0, 1, 5), np.eye(2, dtype=np.float32))


def integer_promotion(i):
    return i / 2, i // 2, i * 2, i + np.int32(1), i.astype(np.int32) + np.int32(1), i.sum()


def float_promotion(f):
    return f + 1.5, f + np.float64(1.5), f * np.float32(2), f.astype(np.float64) * 2


def numpy_scalar_types_of_values(a):
    s = a.sum()
    return (np.float32(s), np.int64(a[0] > 0), np.float32(a), np.float64(a.max()) * 2,
            s.astype(np.float32), s.copy(), s.T, s.reshape(1), s[...], s[()])


def finfo_iinfo_dtype(a):
    eps = np.finfo(a.dtype).eps
    big = np.iinfo(np.int32).max
    return a * eps, big, a.dtype, np.dtype("float32"), a.dtype == np.float64, np.float32(2.5)


def methods(a):
    return (a.T, a.reshape(2, -1), a.copy(), a.clip(-0.5, 0.5), a.std(), a.mean(axis=0),
            a.max(), a.argmax(), a.cumsum(axis=1), a.ravel(), a.squeeze(), a.astype(np.float32))


def linalg_and_reductions(a):
    return np.linalg.norm(a), np.abs(a).max(axis=1), np.exp(a).prod(), np.mean(a, axis=0)


def writes_into_argument(a):
    a[0] = 5.0
    a += 1
    a[:, 1] *= 2
    return a.sum()


def tensor_numpy_shares_memory(x):
    n = x.numpy()
    n[0] = 7.0
    n *= 2
    return x + 1


def ufunc_on_tensors(x, y):
    return np.sin(x), np.add(x, y), np.greater(x, 0), np.maximum(x, y)


def numpy_asarray_of_tensor(x):
    return np.asarray(x) * 2, np.array(x) + 1, np.asarray(x, dtype=np.float64)


def numpy_functions_that_convert_tensors(x, y):
    return (np.where(x > 0, x, 0.0), np.concatenate([x, y]), np.stack([x, y], axis=1),
            np.zeros_like(x), np.ones_like(y), np.full_like(x, 2))


def shape_len_iteration(a):
    total = 0.0
    for row in a:
        total = total + row.sum()
    return total, len(a), a.shape, a.ndim, a.size, a.itemsize


def returns_same_array_twice(a):
    b = np.exp(a)
    return b, b, a


def comparisons_and_logic(a, b):
    return (a > b) & (a < 1), ~(a == b), np.logical_or(a > 0, b > 0), -a, abs(b)


def scalar_argument(a, s):
    return a * s + s


def small_integer_dtypes(i8, u8, i32):
    return (i8 / i8, u8 + 250, i32.cumsum(), np.cumsum(i8, axis=0), i32.sum(), i32.prod(),
            np.trace(np.outer(i32, i32)), (i8 > 0) / 2, (i8 > 0).cumprod(), i8 // -2, i8 % -3)


def float_dtypes(f16, f32):
    return (f16 * 2, f32.mean(), f32.cumsum(), (f32 + 1j) * 2, np.mean(np.arange(4)),
            np.var(np.arange(4)), f16 + f32)


def ufuncs_on_zero_dim_and_mixed(x0, x, a):
    return np.sin(x0), np.add(x0, 1), np.add(x, a), np.sqrt(x.abs().to(torch.int64))


CASES = [
    (tensor_numpy_ufunc, lambda: (ten(3, 4),)),
    (sum_to_scalar, lambda: (arr(3, 4),)),
    (matmul_operators, lambda: (arr(3, 3), arr(3, 3))),
    (where_select, lambda: (arr(4, 2),)),
    (concatenate_reshape_transpose, lambda: (arr(2, 3),)),
    (indexing, lambda: (arr(3, 4),)),
    (from_numpy_round_trip, lambda: (ten(5),)),
    (creation_defaults, lambda: (arr(3),)),
    (integer_promotion, lambda: (arr(4, dtype=np.int64),)),
    (float_promotion, lambda: (arr(4, dtype=np.float32),)),
    (finfo_iinfo_dtype, lambda: (arr(3),)),
    (numpy_scalar_types_of_values, lambda: (arr(3),)),
    (methods, lambda: (arr(2, 3),)),
    (linalg_and_reductions, lambda: (arr(3, 3),)),
    (writes_into_argument, lambda: (arr(3, 2),)),
    (tensor_numpy_shares_memory, lambda: (ten(4),)),
    (ufunc_on_tensors, lambda: (ten(3), ten(3))),
    (numpy_asarray_of_tensor, lambda: (ten(2, 2),)),
    (numpy_functions_that_convert_tensors, lambda: (ten(3), ten(3))),
    (shape_len_iteration, lambda: (arr(3, 2),)),
    (returns_same_array_twice, lambda: (arr(2),)),
    (comparisons_and_logic, lambda: (arr(3), arr(3))),
    (scalar_argument, lambda: (arr(3), np.float64(1.25))),
    (small_integer_dtypes, lambda: (arr(4, dtype=np.int8) | 1, arr(4, dtype=np.uint8),
                                    arr(4, dtype=np.int32))),
    (float_dtypes, lambda: (arr(3, dtype=np.float16), arr(3, dtype=np.float32))),
    (ufuncs_on_zero_dim_and_mixed, lambda: (torch.randn(()), ten(3), arr(3))),
]


@pytest.mark.parametrize("fn,make_args", CASES, ids=[c[0].__name__ for c in CASES])
def test_numpy_one_graph(fn, make_args):
    check(fn, make_args)


@pytest.mark.parametrize("fn,make_args", CASES, ids=[c[0].__name__ for c in CASES])
def test_numpy_aot_eager(fn, make_args):
    check(fn, make_args, backend="aot_eager")


def test_identity_of_returned_arrays():
    compiled = kiln.compile(returns_same_array_twice, backend=CompileCounter(), fullgraph=True)
    a = arr(3)
    b1, b2, a_out = compiled(a)
    assert b1 is b2 and a_out is a


def test_graph_has_no_numpy_and_no_conversions_at_the_call():
    """The graph is torch code: NumPy is traced, not called; the ndarray argument enters as a
    tensor sharing its memory, and the result leaves as one ndarray."""
    counter = CompileCounter()
    compiled = kiln.compile(matmul_operators, backend=counter, fullgraph=True)
    compiled(arr(3, 3), arr(3, 3))
    gm = counter.graphs[0]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 2
    for node in gm.graph.nodes:
        if node.op == "call_function":
            assert not type(node.target).__module__.startswith("numpy")
            assert getattr(node.target, "__module__", "").startswith(("kiln", "torch", "_operator"))


# ============================================================================ guards
def test_dtype_and_shape_of_ndarray_arguments_are_guarded():
    def f(a):
        return np.sum(a * 2, axis=0)

    counter = Counter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True, dynamic=False)
    for a in (arr(3, 2), arr(3, 2), arr(3, 2, dtype=np.float32), arr(4, 2), arr(3, 2, dtype=np.int32)):
        assert_same_numpy(compiled(a), f(a.copy()))
    assert counter.frame_count == 4


def test_ndarray_argument_with_dynamic_shapes():
    sizes = iter([4, 6, 5, 8])
    counter = check(lambda a: (a * 2).sum(axis=1), lambda: (arr(next(sizes), 3),),
                    graphs=1, dynamic=True, calls=4)
    assert counter.frame_count == 1


def sizes_in_numpy_code(a, i):
    n = a.shape[0]
    return (np.zeros(n) + a[:, 0], np.arange(n) * a[:, 1], a.reshape(n * 2, -1), a + n,
            np.sum(a, axis=0) / len(a), i + n, i * len(i), (i > 0) + n, a[: n - 1])


@pytest.mark.parametrize("dynamic", [True, None])
def test_sizes_stay_symbolic_in_numpy_code(dynamic):
    """Sizes used as shapes, indices and operands keep NumPy's dtypes without specializing:
    one graph serves every size (automatic dynamic: from the second size on)."""
    sizes = iter([3, 5, 4, 7, 6])

    def make():
        n = next(sizes)
        return arr(n, 2), arr(n + 1, dtype=np.int32)

    check(sizes_in_numpy_code, make, graphs=1 if dynamic else 2, dynamic=dynamic, calls=5)


def test_numpy_scalar_argument_is_a_constant_like_a_float():
    """A NumPy scalar from outside is a constant guarded by value (as a Python float is): one
    graph per value; a torch op with it follows torch's rules for scalars, as in eager."""
    check(scalar_argument, lambda: (arr(3), np.float64(0.5)), graphs=1, calls=3)
    check(scalar_argument, lambda: (arr(3), np.float64(RNG.standard_normal())), graphs=3, calls=3)

    def tensor_with_numpy_scalars(x, s, k):
        return x * s + k, x > s, torch.clamp(x, max=float(s))

    check(tensor_with_numpy_scalars, lambda: (ten(3), np.float64(0.25), np.int64(3)))

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = np.sqrt(np.float32(16.0))   # np.float32, set once

        def forward(self, x):
            return x * self.scale, np.float32(2) * self.scale

    m = Scaled()
    check(lambda x: m(x), lambda: (ten(2, 2, dtype=torch.float16),))


# ============================================================================ breaks
def test_np_random_is_a_graph_break_that_draws_from_numpys_stream():
    def f(x):
        a = x.numpy() * 2
        noise = np.random.rand(3)
        return a + noise

    with pytest.raises(kiln.Unsupported, match="np.random"):
        kiln.compile(f, backend="eager", fullgraph=True)(ten(3))
    counter = Counter()
    compiled = kiln.compile(f, backend=counter)
    for _ in range(3):
        x = ten(3)
        np.random.seed(7)
        expected = f(x)
        np.random.seed(7)
        assert_same_numpy(compiled(x), expected)
    assert counter.frame_count == 2


def test_graph_break_hands_ndarrays_over():
    def f(a):
        b = np.sin(a) + 1
        print("between", end="")
        return b * 2, np.float32(3) * b.sum()

    check(f, lambda: (arr(3),), graphs=2, fullgraph=False)


def test_numpy_on_tensor_where_eager_raises():
    def f(x):
        return np.sum(x)   # NumPy calls Tensor.sum(axis=None, out=None): TypeError in eager

    x = ten(3)
    with pytest.raises(TypeError):
        f(x)
    with pytest.raises(TypeError):
        kiln.compile(f, backend="eager")(x)
    with pytest.raises(kiln.Unsupported, match="torch.Tensor"):
        kiln.compile(f, backend="eager", fullgraph=True)(x)


def test_numpy_of_tensor_requiring_grad_raises_as_eager():
    def f(x):
        return x.numpy() + 1

    x = ten(3).requires_grad_()
    with pytest.raises(RuntimeError, match="requires grad"):
        kiln.compile(f, backend="eager")(x)
    check(lambda x: np.cos(x.numpy(force=True)), lambda: (ten(3).requires_grad_(),))


def test_data_dependent_numpy_breaks():
    def f(a):
        b = a[a > 0]               # its size depends on the data
        return b.sum() * 2

    signs = np.array([1.0, -1.0, 1.0, 1.0, -1.0, -1.0])   # three positives: one size of b
    check(f, lambda: (np.abs(arr(6)) * signs,), graphs=2, fullgraph=False)  # a > 0 | b.sum() * 2
    with pytest.raises(kiln.Unsupported, match="data"):
        kiln.compile(f, backend="eager", fullgraph=True)(arr(6))


def test_numpy_function_torch_numpy_lacks_breaks():
    def f(a):
        b = a * 2
        return np.unique(np.round(b)), b

    # one graph up to np.unique (its size depends on the data), which then runs natively
    check(f, lambda: (arr(5),), graphs=1, fullgraph=False)
    with pytest.raises(kiln.Unsupported, match="unique"):
        kiln.compile(f, backend="eager", fullgraph=True)(arr(5))


def test_branch_on_array_data_breaks():
    def f(a):
        if a.sum() > 0:
            return a * 2
        return a - 1

    signs = iter([1.0, -1.0] * 3)    # (both branches, whatever the shared RNG drew before)
    check(f, lambda: (np.abs(arr(4)) * next(signs),), graphs=3, fullgraph=False, calls=6)


def test_read_only_array_argument_runs_correctly():
    def f(a):
        return a * 2

    a = arr(3)
    a.flags.writeable = False
    assert_same_numpy(kiln.compile(f, backend="eager")(a), f(a))


# ============================================================================ memory sharing
def copies_that_numpy_makes(a):
    b = a.flatten()
    c = +a
    b[0] = 100.0
    c[0, 0] = -100.0
    return a, b, c


def views_without_writes(a):
    return np.flip(a, 0) * 2, a[::-1, 1], np.diagonal(a) + 1, np.broadcast_to(a[0], (2, 3))


def test_copies_and_views_as_numpy_makes_them():
    check(copies_that_numpy_makes, lambda: (arr(2, 3),))
    check(views_without_writes, lambda: (arr(3, 3),))


def write_through_flip(a):
    f = np.flip(a, 0)
    f[0] = 0.0           # NumPy: a changes too (torch._numpy's flip is a copy)
    return a.sum()


def write_base_after_reverse(a):
    r = a[::-1]
    a[0] = 7.0           # NumPy: r sees it
    return r * 1


def write_through_diagonal(a):
    d = a.diagonal()
    d[0] = 1.0           # NumPy raises: the diagonal is a read-only view
    return a


@pytest.mark.parametrize("fn", [write_through_flip, write_base_after_reverse])
def test_writes_numpy_shares_with_a_copied_view_break(fn):
    with pytest.raises(kiln.Unsupported, match="shares"):
        kiln.compile(fn, backend="eager", fullgraph=True)(arr(3, 3))
    counter = Counter()
    compiled = kiln.compile(fn, backend=counter)
    for _ in range(2):
        a = arr(3, 3)
        expected = fn(a.copy())
        assert_same_numpy(compiled(a), expected)


def test_write_through_read_only_view_raises_as_eager():
    with pytest.raises(ValueError, match="read-only"):
        write_through_diagonal(arr(3, 3))
    with pytest.raises(ValueError, match="read-only"):
        kiln.compile(write_through_diagonal, backend="eager")(arr(3, 3))


def test_module_with_ndarray_attribute():
    """An ndarray held by a module is an input like a buffer: guarded, read each call (a new
    value in it is seen), not baked in."""
    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = arr(4)

        def forward(self, x):
            return torch.from_numpy(self.table * 2) * x, np.float32(self.table.sum())

    m = Lookup()
    counter = Counter()
    compiled = kiln.compile(m, backend=counter, fullgraph=True)
    for _ in range(3):
        m.table[:] = arr(4)          # new values, same array
        x = ten(4)
        assert_same_numpy(compiled(x), m(x))
    assert counter.frame_count == 1


# ============================================================================ NumPy checks torch._numpy
def test_where_torch_numpy_differs_numpy_runs_it():
    """torch._numpy's dtype, shape or values differ from NumPy's here: each call is checked
    against NumPy on stand-in arrays at capture time, and breaks (NumPy runs it)."""
    differing = [
        lambda b: np.sin(b),                      # NumPy: float16 for bools
        lambda v: np.median(v) * 1,               # NumPy: a 0-d result, a scalar
        lambda v: np.cbrt(v),                     # cube roots of negatives
        lambda f: np.fft.rfft(f),                 # NumPy 2: complex64 for float32
        lambda i: np.square(i.astype(np.int8)),   # integer squares stay integers
    ]
    inputs = [lambda: arr(4) > 0, lambda: arr(5), lambda: arr(5), lambda: arr(8, dtype=np.float32),
              lambda: arr(4, dtype=np.int64)]
    graphs = [0, 0, 0, 0, 1]                      # (astype is traced, square breaks)
    for fn, make, n in zip(differing, inputs, graphs):
        with pytest.raises(kiln.Unsupported, match="differs from NumPy"):
            kiln.compile(fn, backend="eager", fullgraph=True)(make())
        check(fn, lambda: (make(),), graphs=n, fullgraph=False)


def test_result_containers_as_numpy_makes_them():
    def f(m, v):
        u, s, vh = np.linalg.svd(m)
        return np.linalg.svd(m), np.meshgrid(v, v), u @ np.diag(s) @ vh

    check(f, lambda: (arr(3, 3), arr(2)))


UNARY = ["sin", "exp", "log1p", "sqrt", "abs", "negative", "floor", "ceil", "sign", "square",
         "reciprocal", "tanh", "arctan", "isnan", "isfinite", "logical_not", "cumsum", "sort",
         "argsort", "ravel", "transpose", "diff", "fliplr", "nonzero", "count_nonzero", "trace",
         "std", "var", "ptp", "argmax", "amax", "sum", "prod", "mean", "median", "round",
         "trunc", "rint", "deg2rad", "exp2", "cbrt", "fix", "i0", "sinc", "angle", "real"]
DTYPES = [np.float64, np.float32, np.int32, np.bool_]


@pytest.mark.parametrize("name", UNARY)
def test_numpy_functions_equal_eager_on_every_dtype(name):
    """A differential sweep: compiled (graph or break) returns exactly what eager returns."""
    fn = getattr(np, name)

    def f(a):
        return fn(a)

    for dtype in DTYPES:
        make = (lambda: arr(3, 4) > 0) if dtype is np.bool_ else (lambda: arr(3, 4, dtype=dtype))
        try:
            fn(make())
        except Exception:
            continue   # not defined for this dtype in NumPy either
        compiled = kiln.compile(f, backend="eager")
        for _ in range(2):
            a = make()
            assert_same_numpy(compiled(a), f(a.copy()), f"np.{name}({np.dtype(dtype).name})")


def test_large_arrays_are_checked_on_small_stand_ins():
    """Over the stand-in budget, NumPy still checks dtypes, ranks and result kinds on stand-ins
    with every size cut to 2; a reshape to the real sizes is traced unchecked."""
    big = arr(300, 300)
    for fn in (lambda v: np.sin(v > 0), lambda v: np.median(v)):
        with pytest.raises(kiln.Unsupported, match="differs from NumPy"):
            kiln.compile(fn, backend="eager", fullgraph=True)(big)
    check(lambda v: ((v @ v.T).sum(axis=0), v.reshape(900, 100) * 2, v.max()),
          lambda: (arr(300, 300),))


# -- np.asarray of a NumPy scalar: a new 0-d array ---------------------------------------------
def mean_as_tensor(x):
    """PyTorch's test_mean_sum_np: a NumPy reduction's scalar made a tensor through an array."""
    return x + torch.from_numpy(np.asarray(np.mean(x.numpy()))) + torch.from_numpy(np.array(np.sum(x.numpy())))


def scalar_then_array_written(a):
    s = np.sum(a)                 # a NumPy scalar (immutable)
    z = np.asarray(s)             # a new 0-d array: writing it leaves the scalar as it was
    z += 1
    return s, z, type(z), type(s)


def test_asarray_of_a_numpy_scalar_is_a_new_array():
    check(mean_as_tensor, lambda: (torch.randn(4),))
    check(scalar_then_array_written, lambda: (np.random.rand(3).astype(np.float32),))
