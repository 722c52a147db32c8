"""Guards: every fact a compiled entry relies on is checked on each call, and changing exactly
that fact recompiles (or runs eagerly) with eager's result, while changing nothing but tensor
values reuses the entry.

Pattern of most tests: compile with a CompileCounter, call once (1 graph), call again with the
guarded thing unchanged but fresh tensor values (still 1 graph), change exactly the guarded
thing (2 graphs), compare every result with eager, and check ``recompile_reasons[-1]``: it
starts with the guard kind and names the source (``L['x']``, ``G(...)['SCALE']``,
``Closure['k']``, ``L['m'].scale``...).
"""
import sys
import warnings

import pytest
import torch
from torch import nn

import kiln
from kiln.capture.guards import GuardKind
from kiln.testing import CompileCounter, assert_same

THIS = sys.modules[__name__]

# Module globals read by compiled functions (tests change them with monkeypatch).
SCALE = 2
ACT = torch.relu
W = torch.ones(3)
UNUSED = 0


def helper(x):
    return x + 1


def other_helper(x):
    return x - 1


def compiled(fn, **kw):
    cnt = CompileCounter()
    return kiln.compile(fn, backend=cnt, **kw), cnt


def check(cf, fn, *args, **kwargs):
    """Compiled result equals eager's (for functions that do not mutate their inputs)."""
    got = cf(*args, **kwargs)
    assert_same(got, fn(*args, **kwargs))
    return got


def last_reason(cf):
    assert cf.recompile_reasons, "expected a recompile"
    return cf.recompile_reasons[-1]


# ============================================================================ EQUALS_MATCH
def test_int_arg_equals_match():
    def f(x, n):
        return x * n

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3), 2)
    check(cf, f, torch.randn(3), 2)
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(3), 3)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("EQUALS_MATCH failed")
    assert "L['n'] == 2" in r and "(saw int 3)" in r


def test_float_arg_reason_shows_value_seen():
    def f(x, scale):
        return x * scale

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3), 0.5)
    check(cf, f, torch.randn(3), 0.5)
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(3), 2.0)
    assert cnt.frame_count == 2
    assert cf.recompile_reasons == ["EQUALS_MATCH failed: L['scale'] == 0.5 (saw float 2.0)"]


def test_int_then_equal_float_recompiles():
    # 2 == 2.0 but the type is part of the guard: x * 2.0 is a float op in general.
    def f(x, n):
        return x * n

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3), 2)
    check(cf, f, torch.randn(3), 2.0)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    # a Python number's type is guarded where it is read, its value where it is used
    assert r.startswith("TYPE_MATCH") and "L['n']" in r and "saw float 2.0" in r


def test_bool_arg():
    def f(x, flag):
        return x.relu() if flag else x.sigmoid()

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(4), True)
    check(cf, f, torch.randn(4), True)
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(4), False)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("EQUALS_MATCH") and "L['flag']" in r and "saw bool False" in r


def test_str_arg():
    def f(x, mode):
        return torch.tanh(x) if mode == "tanh" else torch.sin(x)

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(4), "tanh")
    check(cf, f, torch.randn(4), "tanh")
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(4), "sin")
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("EQUALS_MATCH") and "L['mode']" in r and "'sin'" in r


def test_none_arg_then_tensor():
    def f(x, b=None):
        return x * 2 if b is None else x * 2 + b

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(4), None)
    check(cf, f, torch.randn(4))
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(4), torch.randn(4))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TYPE_MATCH") and "L['b']" in r and "saw Tensor" in r


def test_torch_size_arg():
    def f(x, shape):
        return x.reshape(shape) * 2

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(12), torch.Size([3, 4]))
    check(cf, f, torch.randn(12), torch.Size([3, 4]))
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(12), torch.Size([4, 3]))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("EQUALS_MATCH") and "L['shape']" in r


def test_global_int(monkeypatch):
    def f(x):
        return x * SCALE

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 1
    monkeypatch.setattr(THIS, "SCALE", 3)
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("EQUALS_MATCH") and "['SCALE'] == 2" in r and "saw int 3" in r


def test_unrelated_global_change_does_not_recompile(monkeypatch):
    def f(x):
        return x * SCALE

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    monkeypatch.setattr(THIS, "UNUSED", 123)
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 1
    assert cf.recompile_reasons == []


def test_closure_over_int():
    k = 2

    def f(x):
        return x + k

    def set_k(v):
        nonlocal k
        k = v

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 1
    set_k(5)
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("EQUALS_MATCH") and "Closure['k'] == 2" in r and "saw int 5" in r


def test_closure_cell_changes_type():
    c = 2

    def f(x):
        return x * c

    def set_c(v):
        nonlocal c
        c = v

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    set_c(torch.randn(3))
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TYPE_MATCH") and "Closure['c']" in r and "saw Tensor" in r


def test_global_read_by_inlined_helper_of_other_module():
    helper_fn, ns = _function_in_namespace("def helper(x):\n    return x * K\n", "helper", K=2)

    def f(x):
        return helper_fn(x) + 1

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 1
    ns["K"] = 5
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 2
    assert last_reason(cf) == "EQUALS_MATCH failed: G(kiln_guard_test_ns)['K'] == 2 (saw int 5)"


def test_bool_where_int_was_in_tuple():
    def f(x, t):
        return x * 2, t[0]

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(2), (1,))
    check(cf, f, torch.randn(2), (True,))  # True == 1, but eager returns True
    assert cnt.frame_count == 2
    assert last_reason(cf) == "TYPE_MATCH failed: type(L['t'][0]) is builtins.int (saw bool True)"


class Cfg:
    def __init__(self, alpha):
        self.alpha = alpha


def test_object_attribute():
    def f(x, cfg):
        return x * cfg.alpha

    cf, cnt = compiled(f)
    cfg = Cfg(1.5)
    check(cf, f, torch.randn(3), cfg)
    check(cf, f, torch.randn(3), Cfg(1.5))  # another instance, same class and value
    assert cnt.frame_count == 1
    cfg.alpha = 2.5
    check(cf, f, torch.randn(3), cfg)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("EQUALS_MATCH") and "L['cfg'].alpha == 1.5" in r and "saw float 2.5" in r


class Scaled(nn.Module):
    def __init__(self, scale=2.0):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = scale

    def forward(self, x):
        return self.lin(x) * self.scale


def test_module_python_attribute():
    m = Scaled(2.0)
    cm, cnt = compiled(m)
    check(cm, m, torch.randn(2, 4))
    check(cm, m, torch.randn(2, 4))
    assert cnt.frame_count == 1
    m.scale = 3.0
    check(cm, m, torch.randn(2, 4))
    assert cnt.frame_count == 2
    r = last_reason(cm)
    assert r.startswith("EQUALS_MATCH") and ".scale == 2.0" in r and "saw float 3.0" in r


class TrainBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if self.training else y - 1


def test_module_training_flag_via_eval():
    m = TrainBranch()
    cm, cnt = compiled(m)
    check(cm, m, torch.randn(2, 4))
    check(cm, m, torch.randn(2, 4))
    assert cnt.frame_count == 1
    m.eval()
    check(cm, m, torch.randn(2, 4))
    assert cnt.frame_count == 2
    r = last_reason(cm)
    assert r.startswith("EQUALS_MATCH") and ".training" in r and "saw bool False" in r
    m.train()  # back to the first entry
    check(cm, m, torch.randn(2, 4))
    assert cnt.frame_count == 2


def test_submodule_swapped_for_same_type_reuses_entry():
    m = Outer()
    cm, cnt = compiled(m)
    check(cm, m, torch.randn(2, 4))
    m.fc = nn.Linear(4, 4)  # new instance and parameters, same type and shapes
    check(cm, m, torch.randn(2, 4))
    assert cnt.frame_count == 1
    m.fc = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    check(cm, m, torch.randn(2, 4))
    assert cnt.frame_count == 2
    r = last_reason(cm)
    assert r.startswith("TYPE_MATCH") and "['fc']" in r and "Linear" in r and "saw Sequential" in r


def test_frozen_parameter_recompiles():
    m = Outer()
    cm, cnt = compiled(m)
    check(cm, m, torch.randn(2, 4))
    check(cm, m, torch.randn(2, 4))
    assert cnt.frame_count == 1
    m.fc.weight.requires_grad_(False)
    x = torch.randn(2, 4)
    out = cm(x)
    assert_same(out, m(x))
    out.sum().backward()
    assert m.fc.weight.grad is None and m.fc.bias.grad is not None
    assert cnt.frame_count == 2
    r = last_reason(cm)
    assert r.startswith("TENSOR_MATCH") and "['weight']" in r and "requires_grad" in r


# ============================================================================ TYPE_MATCH
def test_type_list_then_tuple():
    def f(xs):
        return xs[0] + xs[1]

    cf, cnt = compiled(f)
    check(cf, f, [torch.randn(3), torch.randn(3)])
    check(cf, f, [torch.randn(3), torch.randn(3)])
    assert cnt.frame_count == 1
    check(cf, f, (torch.randn(3), torch.randn(3)))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TYPE_MATCH failed: type(L['xs']) is builtins.list (saw tuple (")


class A:
    def __init__(self):
        self.alpha = 2.0


class B:
    def __init__(self):
        self.alpha = 2.0


def test_type_of_object_argument():
    def f(x, obj):
        return x * obj.alpha

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3), A())
    check(cf, f, torch.randn(3), A())
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(3), B())
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TYPE_MATCH") and "type(L['obj'])" in r and ".A" in r


# ============================================================================ ID_MATCH
def test_global_function_rebound(monkeypatch):
    def f(x):
        return ACT(x) * 2

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(5))
    check(cf, f, torch.randn(5))
    assert cnt.frame_count == 1
    monkeypatch.setattr(THIS, "ACT", torch.tanh)
    check(cf, f, torch.randn(5))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("ID_MATCH") and "['ACT']" in r


def test_global_user_function_rebound(monkeypatch):
    def f(x):
        return helper(x) * 3

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(5))
    check(cf, f, torch.randn(5))
    assert cnt.frame_count == 1
    monkeypatch.setattr(THIS, "helper", other_helper)
    check(cf, f, torch.randn(5))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("ID_MATCH") and "['helper']" in r and "other_helper" in r


def test_function_argument():
    def f(x, act):
        return act(x) + 1

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(5), torch.sin)
    check(cf, f, torch.randn(5), torch.sin)
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(5), torch.cos)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("ID_MATCH") and "L['act']" in r


def test_dtype_argument():
    def f(x, dtype):
        return x.to(dtype) * 2

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(5), torch.float64)
    check(cf, f, torch.randn(5), torch.float64)
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(5), torch.float16)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("ID_MATCH") and "L['dtype']" in r


# ============================================================================ LENGTH_MATCH
def test_list_length():
    def f(xs):
        out = xs[0]
        for t in xs[1:]:
            out = out + t
        return out

    cf, cnt = compiled(f)
    check(cf, f, [torch.randn(3) for _ in range(2)])
    check(cf, f, [torch.randn(3) for _ in range(2)])
    assert cnt.frame_count == 1
    check(cf, f, [torch.randn(3) for _ in range(3)])
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("LENGTH_MATCH failed: len(L['xs']) == 2") and "saw list" in r


def test_tuple_length():
    def f(*args):
        return sum(a.sum() for a in args)

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3), torch.randn(3))
    check(cf, f, torch.randn(3), torch.randn(3))
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("LENGTH_MATCH") and "L['args']" in r


# ============================================================================ DICT_KEYS
def test_dict_keys_changed():
    def f(d):
        return [k + str(v.shape[0]) for k, v in d.items()], sum(v.sum() for v in d.values())

    cf, cnt = compiled(f)
    check(cf, f, {"a": torch.randn(2), "b": torch.randn(3)})
    check(cf, f, {"a": torch.randn(2), "b": torch.randn(3)})
    assert cnt.frame_count == 1
    check(cf, f, {"a": torch.randn(2), "c": torch.randn(3)})
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("DICT_KEYS failed: keys(L['d']) == ['a', 'b']") and "'c'" in r


def test_dict_key_order_changed():
    def f(d):
        return [v * i for i, v in enumerate(d.values())]

    cf, cnt = compiled(f)
    check(cf, f, {"a": torch.randn(2), "b": torch.randn(2)})
    check(cf, f, {"a": torch.randn(2), "b": torch.randn(2)})
    assert cnt.frame_count == 1
    check(cf, f, {"b": torch.randn(2), "a": torch.randn(2)})
    assert cnt.frame_count == 2
    assert last_reason(cf).startswith("DICT_KEYS")


# ============================================================================ HASATTR
class Plain:
    pass


def test_hasattr_becomes_true():
    def f(x, obj):
        if hasattr(obj, "bias"):
            return x + obj.bias
        return x * 2

    cf, cnt = compiled(f)
    obj = Plain()
    check(cf, f, torch.randn(3), obj)
    check(cf, f, torch.randn(3), Plain())
    assert cnt.frame_count == 1
    obj.bias = 1.5
    check(cf, f, torch.randn(3), obj)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("HASATTR failed: hasattr(L['obj'], 'bias') is False")


def test_attribute_deleted():
    def f(x, obj):
        if hasattr(obj, "bias"):
            return x + obj.bias
        return x * 2

    cf, cnt = compiled(f)
    obj = Plain()
    obj.bias = 1.0
    check(cf, f, torch.randn(3), obj)
    check(cf, f, torch.randn(3), obj)
    assert cnt.frame_count == 1
    del obj.bias
    check(cf, f, torch.randn(3), obj)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert "L['obj'].bias" in r and "saw AttributeError" in r


# ============================================================================ GLOBAL_ABSENT
def _function_in_namespace(src, name, **globs):
    """A function whose globals are a fresh dict (so tests can shadow builtins in it)."""
    ns = {"__name__": "kiln_guard_test_ns", **globs}
    exec(compile(src, "<guard test>", "exec"), ns)
    return ns[name], ns


def test_builtin_shadowed_by_new_global():
    f, ns = _function_in_namespace(
        "def f(x, xs):\n    return x * len(xs)\n", "f", torch=torch)
    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3), (1, 2))
    check(cf, f, torch.randn(3), (1, 2))
    assert cnt.frame_count == 1
    ns["len"] = lambda xs: 10
    x = torch.randn(3)
    assert_same(cf(x, (1, 2)), x * 10)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("GLOBAL_ABSENT") and "'len'" in r
    del ns["len"]  # the builtin again: the first entry serves
    x = torch.randn(3)
    assert_same(cf(x, (1, 2)), x * 2)
    assert cnt.frame_count == 2


# ============================================================================ NO_HOOKS
def test_forward_hook_registered_after_compile():
    m = nn.Linear(4, 4)
    cm, cnt = compiled(m)
    check(cm, m, torch.randn(2, 4))
    check(cm, m, torch.randn(2, 4))
    assert cnt.frame_count == 1
    calls = []

    def hook(mod, inp, out):
        calls.append(1)
        return out * 10

    h = m.register_forward_hook(hook)
    try:
        x = torch.randn(2, 4)
        got = cm(x)
        assert calls == [1]
        assert_same(got, m(x))  # eager, hook included
        assert cnt.frame_count in (1, 2)  # recompiled, or run eagerly: either honours the hook
        assert len(cm.entries) == 2
        assert last_reason(cm).startswith("NO_HOOKS")
    finally:
        h.remove()
    frames = cnt.frame_count
    check(cm, m, torch.randn(2, 4))  # hook removed: the first entry again
    assert cnt.frame_count == frames and len(cm.entries) == 2


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).relu()


def test_forward_pre_hook_on_submodule():
    def f(m, x):
        return m(x) + 1

    m = Outer()
    cf, cnt = compiled(f)
    check(cf, f, m, torch.randn(2, 4))
    check(cf, f, m, torch.randn(2, 4))
    assert cnt.frame_count == 1
    h = m.fc.register_forward_pre_hook(lambda mod, args: (args[0] * 0,))
    try:
        x = torch.randn(2, 4)
        got = cf(m, x)
        assert_same(got, f(m, x))
        assert_same(got, torch.relu(m.fc.bias).expand(2, 4) + 1)
        # the hook is inlined: one more graph (the recompile), no break
        assert cnt.frame_count == 2
        r = last_reason(cf)
        assert r.startswith("NO_HOOKS") and "L['m']" in r and "['fc']" in r
    finally:
        h.remove()


def test_global_module_hook():
    m = nn.Linear(4, 4)
    cm, cnt = compiled(m)
    check(cm, m, torch.randn(2, 4))
    h = torch.nn.modules.module.register_module_forward_hook(lambda mod, inp, out: out + 100)
    try:
        x = torch.randn(2, 4)
        got = cm(x)
        assert_same(got, m(x))
        assert (got > 50).all()
        assert cnt.frame_count in (1, 2)
        assert last_reason(cm).startswith("NO_HOOKS")
    finally:
        h.remove()


# ============================================================================ ALIAS_MATCH
def _alias_fn(a, b):
    a.add_(1)
    return a * b


def test_alias_then_distinct():
    cf, cnt = compiled(_alias_fn)
    for _ in range(2):
        x = torch.randn(3)
        xe = x.clone()
        assert_same(cf(x, x), _alias_fn(xe, xe))
        assert_same(x, xe)
    assert cnt.frame_count == 1
    x, y = torch.randn(3), torch.randn(3)
    xe, ye = x.clone(), y.clone()
    assert_same(cf(x, y), _alias_fn(xe, ye))
    assert_same(x, xe)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("ALIAS_MATCH") and "L['b']" in r and "L['a']" in r


def test_distinct_then_alias():
    cf, cnt = compiled(_alias_fn)
    for _ in range(2):
        x, y = torch.randn(3), torch.randn(3)
        xe, ye = x.clone(), y.clone()
        assert_same(cf(x, y), _alias_fn(xe, ye))
    assert cnt.frame_count == 1
    x = torch.randn(3)
    xe = x.clone()
    assert_same(cf(x, x), _alias_fn(xe, xe))
    assert_same(x, xe)
    assert cnt.frame_count == 2
    assert last_reason(cf).startswith(("ALIAS_MATCH", "TENSOR_MATCH"))


def test_alias_through_list():
    def f(x, xs):
        x.mul_(2)
        return xs[0] + 1

    cf, cnt = compiled(f)
    x = torch.randn(3)
    xe = x.clone()
    assert_same(cf(x, [x]), f(xe, [xe]))
    assert cnt.frame_count == 1
    x, y = torch.randn(3), torch.randn(3)
    xe, ye = x.clone(), y.clone()
    assert_same(cf(x, [y]), f(xe, [ye]))
    assert cnt.frame_count == 2
    assert last_reason(cf).startswith("ALIAS_MATCH")


def test_argument_aliasing_a_global_tensor(monkeypatch):
    monkeypatch.setattr(THIS, "W", torch.ones(3))

    def f(x):
        x.add_(1)
        return x + W

    cf, cnt = compiled(f)
    x = torch.zeros(3)
    assert_same(cf(x), torch.full((3,), 2.0))
    assert cnt.frame_count == 1
    out = cf(W)  # eager: W becomes 2, then W + W
    assert_same(out, torch.full((3,), 4.0))
    assert_same(W, torch.full((3,), 2.0))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith(("TENSOR_MATCH", "ALIAS_MATCH")) and "['W']" in r


# ============================================================================ TENSOR_MATCH
def _double(x):
    return x * 2 + 1


def test_tensor_shape():
    cf, cnt = compiled(_double)
    check(cf, _double, torch.randn(3, 2))
    check(cf, _double, torch.randn(3, 2))
    assert cnt.frame_count == 1
    check(cf, _double, torch.randn(4, 2))
    assert cnt.frame_count == 2
    assert cf.recompile_reasons == [
        "TENSOR_MATCH failed: tensor 'L['x']' size mismatch at index 0. expected 3, actual 4"]


def test_tensor_rank():
    cf, cnt = compiled(_double)
    check(cf, _double, torch.randn(6))
    check(cf, _double, torch.randn(6))
    check(cf, _double, torch.randn(2, 3))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TENSOR_MATCH") and "L['x']" in r


def test_tensor_dtype():
    cf, cnt = compiled(_double)
    check(cf, _double, torch.randn(3))
    check(cf, _double, torch.randn(3))
    assert cnt.frame_count == 1
    check(cf, _double, torch.randn(3, dtype=torch.float64))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TENSOR_MATCH") and "L['x']" in r and "dtype" in r.lower()


def test_tensor_stride_transpose():
    def f(x):
        return x.view(-1) * 2 if x.is_contiguous() else x.reshape(-1) + 1

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3, 3))
    check(cf, f, torch.randn(3, 3))
    assert cnt.frame_count == 1
    check(cf, f, torch.randn(3, 3).t())  # same shape, strides (1, 3)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TENSOR_MATCH") and "L['x']" in r and "stride" in r


def test_tensor_contiguity_of_slice():
    cf, cnt = compiled(_double)
    check(cf, _double, torch.randn(4, 3))
    check(cf, _double, torch.randn(4, 3))
    assert cnt.frame_count == 1
    x = torch.randn(4, 6)[:, ::2]  # same shape (4, 3), strides (6, 2)
    assert not x.is_contiguous()
    check(cf, _double, x)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TENSOR_MATCH") and "stride" in r


def test_tensor_requires_grad():
    def f(x):
        return (x * x).sum()

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 1
    x = torch.randn(3, requires_grad=True)
    out = cf(x)
    assert_same(out, f(x.detach()))
    assert out.requires_grad
    out.backward()
    assert_same(x.grad, 2 * x.detach())
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TENSOR_MATCH") and "L['x']" in r and "requires_grad" in r


def test_parameter_vs_tensor():
    def f(w, x):
        return x @ w

    cf, cnt = compiled(f)
    w = torch.randn(4, 2, requires_grad=True)
    check(cf, f, w, torch.randn(3, 4))
    check(cf, f, w, torch.randn(3, 4))
    assert cnt.frame_count == 1
    check(cf, f, nn.Parameter(torch.randn(4, 2)), torch.randn(3, 4))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TENSOR_MATCH") and "L['w']" in r


def test_global_tensor_values_and_shape(monkeypatch):
    def f(x):
        return x + W

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    monkeypatch.setattr(THIS, "W", torch.randn(3))  # new values, same metadata: a graph input
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 1
    monkeypatch.setattr(THIS, "W", torch.randn(1))  # broadcasting shape
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TENSOR_MATCH") and "['W']" in r


def test_closure_over_tensor():
    t = torch.randn(3)

    def f(x):
        return x * t

    def set_t(v):
        nonlocal t
        t = v

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    set_t(torch.randn(3))  # new values are read, not baked in
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 1
    set_t(torch.randn(2, 3))
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TENSOR_MATCH") and "Closure['t']" in r


def test_tensor_in_dict_shape():
    def f(d):
        return d["w"].sum() + d["b"]

    cf, cnt = compiled(f)
    check(cf, f, {"w": torch.randn(2, 2), "b": torch.randn(2)})
    check(cf, f, {"w": torch.randn(2, 2), "b": torch.randn(2)})
    assert cnt.frame_count == 1
    check(cf, f, {"w": torch.randn(2, 2), "b": torch.randn(5)})
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TENSOR_MATCH") and "L['d']['b']" in r


def test_layer_instances_share_one_graph():
    def f(m, x):
        return m(x)

    cf, cnt = compiled(f)
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    check(cf, f, a, torch.randn(2, 4))
    check(cf, f, b, torch.randn(2, 4))  # parameters are graph inputs, not constants
    check(cf, f, a, torch.randn(2, 4))
    assert cnt.frame_count == 1
    check(cf, f, nn.Linear(4, 5), torch.randn(2, 4))
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("TENSOR_MATCH") and "L['m']" in r and "['weight']" in r
    assert "size mismatch at index 0. expected 4, actual 5" in r


def test_compiled_modules_of_one_class_share_entries():
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    cnt = CompileCounter()
    ca, cb = kiln.compile(a, backend=cnt), kiln.compile(b, backend=cnt)
    check(ca, a, torch.randn(2, 4))
    check(cb, b, torch.randn(2, 4))
    assert cnt.frame_count == 1
    c = nn.Linear(4, 5)
    cc = kiln.compile(c, backend=cnt)
    check(cc, c, torch.randn(2, 4))
    assert cnt.frame_count == 2


# ============================================================================ GLOBAL_STATE
def test_grad_mode():
    cf, cnt = compiled(_double)
    check(cf, _double, torch.randn(3))
    check(cf, _double, torch.randn(3))
    assert cnt.frame_count == 1
    with torch.no_grad():
        check(cf, _double, torch.randn(3))
    assert cnt.frame_count == 2
    assert cf.recompile_reasons == ["GLOBAL_STATE changed (grad_mode: expected True, got False)"]
    check(cf, _double, torch.randn(3))  # grad mode back on: the first entry
    assert cnt.frame_count == 2


def test_grad_mode_result_under_no_grad():
    def f(w, x):
        return (x @ w).sum()

    cf, cnt = compiled(f)
    w = torch.randn(3, 2, requires_grad=True)
    assert cf(w, torch.randn(4, 3)).requires_grad
    with torch.no_grad():
        x = torch.randn(4, 3)
        out = cf(w, x)
        assert_same(out, f(w, x))
        assert not out.requires_grad
    assert cnt.frame_count == 2
    assert last_reason(cf).startswith("GLOBAL_STATE")


def test_default_dtype():
    def f(x):
        return x + torch.ones(3)

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 1
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = check(cf, f, torch.randn(3))
        assert out.dtype == torch.float64
    finally:
        torch.set_default_dtype(old)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("GLOBAL_STATE changed") and "default_dtype" in r


def test_deterministic_algorithms():
    cf, cnt = compiled(_double)
    check(cf, _double, torch.randn(3))
    check(cf, _double, torch.randn(3))
    assert cnt.frame_count == 1
    old = torch.are_deterministic_algorithms_enabled()
    old_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(not old)
    try:
        check(cf, _double, torch.randn(3))
    finally:
        torch.use_deterministic_algorithms(old, warn_only=old_warn)
    assert cnt.frame_count == 2
    r = last_reason(cf)
    assert r.startswith("GLOBAL_STATE changed") and "deterministic_algorithms" in r


# ============================================================================ BACKEND_MATCH
def test_backend_match():
    def f(x):
        return x.sin() + 1

    cnt_a, cnt_b = CompileCounter(), CompileCounter()
    ca = kiln.compile(f, backend=cnt_a)
    check(ca, f, torch.randn(3))
    check(ca, f, torch.randn(3))
    assert cnt_a.frame_count == 1
    cb = kiln.compile(f, backend=cnt_b)
    check(cb, f, torch.randn(3))
    assert cnt_b.frame_count == 1 and cnt_a.frame_count == 1
    r = last_reason(cb)
    assert r.startswith("BACKEND_MATCH failed") and "CompileCounter" in r
    check(ca, f, torch.randn(3))  # A's entry again
    check(cb, f, torch.randn(3))  # B's entry again
    assert cnt_a.frame_count == 1 and cnt_b.frame_count == 1
    assert len(ca.entries) == 1 and len(cb.entries) == 1


def test_backend_match_with_named_backend():
    def f(x):
        return x.cos() * 2

    ce = kiln.compile(f, backend="eager")
    check(ce, f, torch.randn(3))
    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    assert cnt.frame_count == 1
    assert cf.recompile_reasons == [
        "BACKEND_MATCH failed: entries exist for backend 'eager', called with 'CompileCounter'"]


# ============================================================================ describe_guards
def test_describe_guards_lists_expected_kinds(monkeypatch):
    def f(x, n, xs, d, cfg):
        return ACT(x) * n + xs[0] + d["k"] * cfg.alpha + len(xs)

    cf, cnt = compiled(f)
    args = (torch.randn(3), 2, [torch.randn(3)], {"k": torch.randn(3)}, Cfg(0.5))
    check(cf, f, *args)
    assert cnt.frame_count == 1
    (entry,) = cf.entries
    text = entry.describe_guards()
    kinds = {g.kind for g in entry.guards}
    for kind in (GuardKind.TENSOR_MATCH, GuardKind.EQUALS_MATCH, GuardKind.TYPE_MATCH,
                 GuardKind.LENGTH_MATCH, GuardKind.DICT_KEYS, GuardKind.ID_MATCH,
                 GuardKind.GLOBAL_ABSENT, GuardKind.GLOBAL_STATE):
        assert kind in kinds
        assert kind.value in text
    assert len(text.splitlines()) == len(entry.guards)
    for fragment in ("L['x']", "L['n'] == 2", "len(L['xs']) == 1", "keys(L['d']) == ['k']",
                     "L['cfg'].alpha == 0.5", "['ACT']", "'len'", "grad_mode=True"):
        assert fragment in text, fragment


# ============================================================================ recompile limit
def test_recompile_limit_warns_once_and_falls_back_to_eager():
    def f(x, n):
        return x * n + n

    cf, cnt = compiled(f)
    # specialize_int: each new n recompiles (automatic dynamic would make n symbolic instead)
    with kiln.config.patch(recompile_limit=3, specialize_int=True):
        for n in (1, 2, 3):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                check(cf, f, torch.randn(3), n)
        assert cnt.frame_count == 3
        with pytest.warns(RuntimeWarning) as rec:
            check(cf, f, torch.randn(3), 4)
        assert len(rec) == 1
        msg = str(rec[0].message)
        assert "recompile_limit=3" in msg
        assert "EQUALS_MATCH" in msg and "L['n']" in msg
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check(cf, f, torch.randn(3), 5)
            check(cf, f, torch.randn(3), 6)
            check(cf, f, torch.randn(3), 2)  # a cached value still uses its entry
        assert cnt.frame_count == 3
        assert len(cf.entries) == 3


class _Slot:
    value = None


class _IndexedLayer(nn.Module):
    """A layer that keeps its output in its own slot of a shared list, found by its index (as
    Hugging Face's layers update their layer of the KV cache at ``self.layer_idx``): the
    lookup makes each instance guard its index."""

    def __init__(self, idx: int):
        super().__init__()
        self.layer_idx = idx
        self.lin = nn.Linear(4, 4)

    def forward(self, x, store):
        y = torch.relu(self.lin(x))
        store[self.layer_idx].value = y
        return y + self.layer_idx


def _slots(n):
    return [_Slot() for _ in range(n)]


def test_recompile_limit_counts_entries_per_module_instance():
    """Twelve layers compiled one by one (FSDP2's per-block compile) each need an entry of their
    own: the limit counts each instance's, so none runs eagerly, and each layer still runs
    its own entry (its index), never another layer's."""
    torch.manual_seed(0)
    layers = [_IndexedLayer(i) for i in range(12)]
    cnt = CompileCounter()
    compiled_layers = [kiln.compile(layer, backend=cnt) for layer in layers]
    with kiln.config.patch(recompile_limit=4), warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            x = torch.randn(2, 4)
            got, want = _slots(12), _slots(12)
            y_got = y_want = x
            for layer, c in zip(layers, compiled_layers):
                y_got, y_want = c(y_got, got), layer(y_want, want)
            assert_same(y_got, y_want)
            for a, b in zip(got, want):
                assert_same(a.value, b.value)
    assert cnt.frame_count == 12
    assert len(compiled_layers[0].entries) == 12


class _BreakingLayer(_IndexedLayer):
    def forward(self, x, store):
        y = torch.relu(self.lin(x))
        print(end="")                          # a graph break: the rest of the layer is a continuation
        store[self.layer_idx].value = y
        return y * 2


def test_a_continuation_inside_every_layer_is_compiled_for_each():
    """A whole model compiled, with a graph break inside each of its 12 layers: the
    continuation after the break, one function for all layers, needs an entry per layer (its
    index); counted per layer, none of them runs eagerly."""
    torch.manual_seed(0)
    layers = nn.ModuleList(_BreakingLayer(i) for i in range(12))

    def model(x, store):
        for layer in layers:
            x = layer(x, store)
        return x

    cnt = CompileCounter()
    c = kiln.compile(model, backend=cnt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            got, want = _slots(12), _slots(12)
            x = torch.randn(2, 4)
            assert_same(c(x, got), model(x, want))
            for a, b in zip(got, want):
                assert_same(a.value, b.value)
    # the graph up to the first break, the model's loop after it, and each layer's continuation
    assert cnt.frame_count == 1 + 1 + 12


def test_recompile_limit_still_holds_per_instance_and_in_all():
    """One instance whose inputs keep changing still stops at ``recompile_limit``, and all
    instances together at ``accumulated_recompile_limit``."""
    torch.manual_seed(0)
    layer = _IndexedLayer(0)
    cnt = CompileCounter()
    c = kiln.compile(layer, backend=cnt)
    with kiln.config.patch(recompile_limit=3, specialize_int=True):
        for n in (1, 2, 3):
            layer.layer_idx = n
            c(torch.randn(2, 4), _slots(4))
        layer.layer_idx = 0
        with pytest.warns(RuntimeWarning, match="recompile_limit=3 entries for this _IndexedLayer instance"):
            store = _slots(4)
            out = c(torch.randn(2, 4), store)
        assert store[0].value is not None and out is not None
        assert cnt.frame_count == 3
    class OtherLayer(_IndexedLayer):    # (a function of its own: the limit warns once per function)
        pass

    layers = [OtherLayer(i) for i in range(6)]
    cnt = CompileCounter()
    with kiln.config.patch(accumulated_recompile_limit=4):
        outs = [kiln.compile(m, backend=cnt)(torch.randn(2, 4), _slots(6)) for m in layers[:4]]
        with pytest.warns(RuntimeWarning, match="accumulated_recompile_limit=4"):
            kiln.compile(layers[4], backend=cnt)(torch.randn(2, 4), _slots(6))
    assert cnt.frame_count == 4 and len(outs) == 4


# ============================================================================ logging
def test_recompiles_log(capsys):
    def scaled_by(x, scale):
        return x * scale

    kiln.set_logs("recompiles")
    cf, cnt = compiled(scaled_by)
    check(cf, scaled_by, torch.randn(3), 0.5)
    assert "[kiln:recompiles]" not in capsys.readouterr().err  # first compile is not a recompile
    check(cf, scaled_by, torch.randn(3), 2.0)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[kiln:recompiles]")]
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith("[kiln:recompiles] Recompiling ")
    assert "scaled_by" in line and "test_guards.py:" in line
    assert line.endswith("EQUALS_MATCH failed: L['scale'] == 0.5 (saw float 2.0)")


def test_recompiles_log_off_by_default(capsys):
    cf, cnt = compiled(_double)
    check(cf, _double, torch.randn(3))
    check(cf, _double, torch.randn(4))
    assert cnt.frame_count == 2
    assert "[kiln:recompiles]" not in capsys.readouterr().err


# ============================================================================ bound methods
class Holder:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        return x * self.k


def test_bound_method_guards_on_self_attribute():
    h = Holder(2)
    cm, cnt = compiled(h.apply)
    check(cm, h.apply, torch.randn(3))
    check(cm, h.apply, torch.randn(3))
    assert cnt.frame_count == 1
    h.k = 4
    check(cm, h.apply, torch.randn(3))
    assert cnt.frame_count == 2
    r = last_reason(cm)
    assert r.startswith("EQUALS_MATCH") and "L['self'].k == 2" in r


# ============================================================================ regressions (bugs found and fixed)
def test_nan_float_argument_compiles_once():
    def f(x, s):
        return x * s

    cf, cnt = compiled(f)
    for _ in range(3):
        x = torch.randn(3)
        assert_same(cf(x, float("nan")), f(x, float("nan")))
    assert cnt.frame_count == 1


def test_negative_zero_is_not_zero():
    import math

    def f(x, s):
        return x * math.copysign(1.0, s)

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3), 0.0)
    check(cf, f, torch.randn(3), -0.0)


def test_changed_defaults_are_honoured():
    def f(x, n=2):
        return x * n

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    f.__defaults__ = (3,)
    check(cf, f, torch.randn(3))


def test_changed_kwdefaults_are_honoured():
    def f(x, *, n=2):
        return x * n

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    f.__kwdefaults__ = {"n": 3}
    check(cf, f, torch.randn(3))


def test_replaced_code_is_honoured():
    def f(x):
        return x + 1

    def g(x):
        return x - 1

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(3))
    f.__code__ = g.__code__
    check(cf, f, torch.randn(3))


def test_dict_key_bool_vs_int():
    def f(x, d):
        return x + 1, list(d)

    cf, cnt = compiled(f)
    check(cf, f, torch.randn(2), {1: 0})
    check(cf, f, torch.randn(2), {True: 0})


def test_unread_arguments_install_no_guards():
    """An argument the function never reads is not guarded."""
    def f(x, unused_list, n):
        return x + 1

    cnt = CompileCounter()
    cf = kiln.compile(f, backend=cnt)
    for i in range(4):
        x = torch.randn(3)
        assert_same(cf(x, list(range(i)), i), x + 1)
    assert cnt.frame_count == 1
    kinds = {g.kind.value for g in cf.entries[0].guards}
    assert "LENGTH_MATCH" not in kinds and "EQUALS_MATCH" not in kinds


def test_monkeypatched_method_of_user_class_recompiles():
    class Net(torch.nn.Module):
        def forward(self, x):
            return self.helper(x)

        def helper(self, x):
            return x + 1

    def helper2(self, x):
        return x * 3

    cnt = CompileCounter()
    net = Net()
    cf = kiln.compile(net, backend=cnt)
    x = torch.randn(3)
    assert_same(cf(x), x + 1)
    Net.helper = helper2
    assert_same(cf(x), x * 3)
    assert cnt.frame_count == 2
    assert cf.recompile_reasons[-1].startswith("ID_MATCH failed") and "helper" in cf.recompile_reasons[-1]


# ============================================================================ functions the caller made
# A nested function the compiled frame made is handed to the resume function after a break: a
# new object every call. It is guarded by its code (and read through itself), not by identity,
# so the resume function compiles once (not once per call, up to the recompile limit).

def _nested_then_break(x, k: float = 2.0):
    def scale(t):
        return x * t + k
    print("", end="")                      # a graph break: `scale` goes to the resume function
    return scale(3.0) + 1


def _two_nested_then_break(x, flag: bool):
    if flag:
        def act(t):
            return t.sin() + x
    else:
        def act(t):
            return t.cos() - x
    print("", end="")
    return act(x)


def _nested_identity(x):
    def f(t):
        return t * 2
    g = f
    print("", end="")
    return f(x) if g is f else x


def test_function_made_by_the_caller_does_not_recompile_each_call():
    cf, cnt = compiled(_nested_then_break)
    for _ in range(4):
        check(cf, _nested_then_break, torch.randn(3))
    assert cnt.frame_count == 1            # the resume function's graph, compiled once
    assert not cf.recompile_reasons


def test_function_made_by_the_caller_with_other_code_recompiles():
    cf, cnt = compiled(_two_nested_then_break)
    check(cf, _two_nested_then_break, torch.randn(3), True)
    check(cf, _two_nested_then_break, torch.randn(3), True)
    before = cnt.frame_count
    check(cf, _two_nested_then_break, torch.randn(3), False)
    assert cnt.frame_count > before
    check(cf, _two_nested_then_break, torch.randn(3), True)     # both entries are reused
    check(cf, _two_nested_then_break, torch.randn(3), False)


def test_identity_of_a_function_made_by_the_caller_is_guarded_when_used():
    # `g is f`: the two locals are guarded to be one object (not each one's identity)
    cf, cnt = compiled(_nested_identity)
    for _ in range(3):
        check(cf, _nested_identity, torch.randn(3))
    assert cnt.frame_count == 1 and not cf.recompile_reasons


def test_a_function_made_by_the_caller_keeps_nothing_of_the_call():
    import gc
    import weakref

    cf = kiln.compile(_nested_then_break, backend="eager")
    x = torch.randn(3)
    cf(x)
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is None


def test_constants_equal_as_values_but_not_alike_recompile():
    """``range(0) == range(-10)``, ``slice(0, 2) == slice(0, 2.0)``, ``0j == -0j``: the guard
    tells them apart (start/stop/step, each part's type, the zero's sign)."""
    def attrs(r):
        return r.start, r.stop, r.step

    def parts(s, c, t):
        return type(s.stop).__name__, str(c), str(t)

    compiled = kiln.compile(attrs, backend="eager")
    for r in (range(0), range(-10), range(0, 3, 5), range(0, 1), range(0)):
        assert compiled(r) == attrs(r)
    compiled = kiln.compile(parts, backend="eager")
    for args in ((slice(0, 2), 0j, (0.0, 1)), (slice(0, 2.0), complex(0, -0.0), (-0.0, 1))):
        assert compiled(*args) == parts(*args)


# -- an attribute the capture found missing ------------------------------------------------------

class _Plain:
    pass


class _AnswersMissing:
    def __getattr__(self, name):
        return 30


class _Slotted:
    __slots__ = ("b",)


class _TriesB(nn.Module):
    def forward(self, x):
        try:
            return x * self.b
        except AttributeError:
            return x * 3


class _DictWithAttrs(dict):
    pass


def _model_output():
    outputs = pytest.importorskip("transformers.modeling_outputs")
    return outputs.BaseModelOutput(last_hidden_state=torch.zeros(1))


def _b_or_3(x, m):
    try:
        return x * m.b
    except AttributeError:
        return x * 3


def _b_via_getattr(x, m):
    return x * m.b


def _class_zz_or_3(x, m):
    try:
        v = type(m).zz
    except AttributeError:
        v = 3
    return x * v


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn, make, add", [
    (_b_or_3, _Plain, lambda m: setattr(m, "b", 1)),
    (_b_or_3, _Slotted, lambda m: setattr(m, "b", 1)),
    (_b_via_getattr, _AnswersMissing, lambda m: setattr(m, "b", 1)),
    (_class_zz_or_3, type("_Fresh", (), {}), lambda m: setattr(type(m), "zz", 1)),
    (lambda x, m: m(x), _TriesB, lambda m: setattr(m, "b", 1)),
    (_b_or_3, _DictWithAttrs, lambda m: setattr(m, "b", 1)),
    (_b_or_3, _model_output, lambda m: setattr(m, "b", 1)),
    (_b_or_3, lambda: torch.zeros(1), lambda m: setattr(m, "b", 1)),
], ids=["instance", "slot", "__getattr__", "class", "module", "dict subclass", "ModelOutput", "tensor"])
def test_an_attribute_added_after_a_missing_lookup_is_seen(fn, make, add, backend):
    """A lookup that raised AttributeError (caught, or answered by ``__getattr__``) is guarded
    to stay missing: once the attribute exists, the call does what eager does."""
    m = make()
    cf = kiln.compile(fn, backend=backend)
    x = torch.ones(2)
    assert_same(cf(x, m), fn(x, m))
    assert_same(cf(x, m), fn(x, m))
    add(m)
    assert_same(cf(x, m), fn(x, m))
    assert fn(x, m)[0].item() == 1.0


def _global_or_3(x):
    try:
        return x * LATER_GLOBAL  # noqa: F821 - defined by the test after the first call
    except NameError:
        return x * 3


def _builtin_or_3(x):
    try:
        return x * KILN_TEST_LATER_BUILTIN  # noqa: F821
    except NameError:
        return x * 3


_MOD = type(sys)("kiln_test_later_module")


def _module_attr_or_3(x):
    try:
        return x * _MOD.later
    except AttributeError:
        return x * 3


class _LaterClassAttr:
    pass


class _LaterDictAttr(dict):
    pass


def _new_object_attr_or_3(x):
    o = _LaterClassAttr()
    try:
        return x * o.later
    except AttributeError:
        return x * 3


def _new_dict_attr_or_3(x):
    d = _LaterDictAttr()
    try:
        return x * d.later
    except AttributeError:
        return x * 3


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn, add, remove", [
    (_global_or_3, lambda: setattr(THIS, "LATER_GLOBAL", 1), lambda: delattr(THIS, "LATER_GLOBAL")),
    (_builtin_or_3, lambda: setattr(__import__("builtins"), "KILN_TEST_LATER_BUILTIN", 1),
     lambda: delattr(__import__("builtins"), "KILN_TEST_LATER_BUILTIN")),
    (_module_attr_or_3, lambda: setattr(_MOD, "later", 1), lambda: delattr(_MOD, "later")),
    (_new_object_attr_or_3, lambda: setattr(_LaterClassAttr, "later", 1), lambda: delattr(_LaterClassAttr, "later")),
    (_new_dict_attr_or_3, lambda: setattr(_LaterDictAttr, "later", 1), lambda: delattr(_LaterDictAttr, "later")),
], ids=["global", "builtin", "module", "class of a new object", "class of a new dict"])
def test_a_name_defined_after_a_missing_lookup_is_seen(fn, add, remove, backend):
    """A NameError or AttributeError the code caught is guarded: once the global, builtin,
    module attribute or class attribute exists, the call does what eager does."""
    cf = kiln.compile(fn, backend=backend)
    x = torch.ones(2)
    assert_same(cf(x), fn(x))
    add()
    try:
        assert_same(cf(x), fn(x))
        assert fn(x)[0].item() == 1.0
    finally:
        remove()
    assert_same(cf(x), fn(x))


class _LoudRepr:
    shown: list = []

    def __init__(self, v):
        self.v = v

    def __repr__(self):
        _LoudRepr.shown.append(self.v)
        return f"_LoudRepr({self.v})"


class _LouderRepr(_LoudRepr):
    pass


def test_a_recompile_reason_runs_no_user_repr():
    """Explaining why a guard failed shows the value without calling its ``__repr__`` (user
    code, with effects of its own)."""
    cf, cnt = compiled(lambda o: o.v + 1)
    _LoudRepr.shown.clear()
    assert [cf(_LoudRepr(1)), cf(_LouderRepr(2)), cf(_LoudRepr(3))] == [2, 3, 4]
    assert _LoudRepr.shown == []
    assert "_LouderRepr" in last_reason(cf)


def _grows_sys_path(x):
    import sys
    sys.path.append("kiln-test-entry")
    n = len(sys.path)
    sys.path.remove("kiln-test-entry")
    return x + n


def _reads_an_env_var(x):
    import os
    return x + (1 if os.environ.get("KILN_TEST_ENV_FLAG") else 0)


@pytest.mark.parametrize("fn", [_grows_sys_path, _reads_an_env_var])
def test_a_standard_library_container_is_guarded_and_written_back(fn, monkeypatch):
    """A list or dict of a standard-library module (``sys.path``, ``os.environ``) is read
    through a source: changed in place, inside the call or between calls, it is what eager
    sees."""
    import sys
    cf = kiln.compile(fn, backend="eager")
    x = torch.ones(1)
    assert_same(cf(x), fn(x))
    monkeypatch.setenv("KILN_TEST_ENV_FLAG", "1")
    monkeypatch.setattr(sys, "path", [*sys.path, "kiln-test-more"])
    assert_same(cf(x), fn(x))
    assert "kiln-test-entry" not in sys.path


def test_a_closure_cell_filled_after_a_read_of_it_empty_is_seen():
    def f(x):
        try:
            return x + y        # noqa: F821 - bound below, after the first call
        except NameError:
            return x * 3

    cf = kiln.compile(f, backend="eager")
    x = torch.ones(1)
    assert_same(cf(x), f(x))
    y = 1                       # noqa: F841 - read by f through its cell
    assert_same(cf(x), f(x))
    assert f(x).item() == 2.0


def _same_object_in_containers(a, b, c):
    return a == b, b != a, c in a, a.count(c), a.index(c)


def test_containers_compare_an_object_to_itself_as_equal():
    """CPython's list and tuple comparisons, ``in``, ``count`` and ``index`` take the same
    object as equal before calling ``==``: a NaN in both containers is equal."""
    nan = float("nan")
    cf = kiln.compile(_same_object_in_containers, backend="eager")
    assert_same(cf([nan, 1], [nan, 1], nan), _same_object_in_containers([nan, 1], [nan, 1], nan))
    assert _same_object_in_containers([nan], [nan], nan)[0] is True


def _empty_cell_contents(c):
    try:
        return c.cell_contents
    except ValueError as e:
        return str(e)


def test_reading_an_empty_cell_raises_value_error():
    import types
    c = types.CellType()
    assert kiln.compile(_empty_cell_contents, backend="eager")(c) == _empty_cell_contents(c) == "Cell is empty"


class _Tagged(list):
    pass


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_builtin_replaced_after_the_capture_is_seen(backend, monkeypatch):
    """Python's builtins are guarded as the globals they are: a test or library that replaces
    one after the capture (``mock.patch("builtins.len")``) gets eager's answer."""
    import builtins

    def f(x, items):
        return x + len(items) + (10 if isinstance(items, _Tagged) else 0)

    c = kiln.compile(f, backend=backend)
    x, items = torch.zeros(2), _Tagged([1, 2, 3])
    torch.testing.assert_close(c(x, items), f(x, items))
    real_len, real_isinstance = builtins.len, builtins.isinstance
    monkeypatch.setattr(builtins, "len", lambda o: 50 if type(o) is _Tagged else real_len(o))
    torch.testing.assert_close(c(x, items), f(x, items))
    monkeypatch.setattr(builtins, "isinstance",
                        lambda o, t: False if t is _Tagged else real_isinstance(o, t))
    torch.testing.assert_close(c(x, items), f(x, items))
    assert f(x, items)[0] == 50


class _Methods:
    def m(self):
        return 1

    @staticmethod
    def s():
        return 1

    @classmethod
    def c(cls):
        return 1


class _SubMethods(_Methods):
    pass


@pytest.mark.parametrize("read", [
    lambda o: _Methods.m(o), lambda o: _Methods.s(), lambda o: _Methods.c(),
    lambda o: _SubMethods.m(o), lambda o: type(o).m(o),
], ids=["function", "staticmethod", "classmethod", "inherited", "through_type"])
def test_a_function_read_through_its_class_is_guarded(read, monkeypatch):
    """``Foo.m(o)`` reads the class's attribute: rebinding it after the capture (a test's
    monkeypatch) calls the new one, as in eager."""
    def f(x, o):
        return x + read(o)

    c = kiln.compile(f, backend="eager")
    x, o = torch.zeros(1), _SubMethods()
    torch.testing.assert_close(c(x, o), f(x, o))
    monkeypatch.setattr(_Methods, "m", lambda self: 2)
    monkeypatch.setattr(_Methods, "s", staticmethod(lambda: 2))
    monkeypatch.setattr(_Methods, "c", classmethod(lambda cls: 2))
    assert f(x, o)[0] == 2
    torch.testing.assert_close(c(x, o), f(x, o))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("dynamic", [None, True])
def test_storage_offset_of_an_input_view_is_guarded(backend, dynamic):
    """``x.storage_offset()`` of a slice (and offsets computed from it) follows the slice of
    each call: TENSOR_MATCH does not cover the offset, so reading it guards it."""
    def f(x):
        return x * 2, x.storage_offset(), x.as_strided((2,), (1,), x.storage_offset() + 1), x[1:].storage_offset()

    c = kiln.compile(f, backend=backend, dynamic=dynamic)
    base = torch.arange(12.0)
    for off in (0, 2, 5, 2):
        v = base[off:off + 4]
        got, want = c(v), f(v)
        assert got[1] == want[1] and got[3] == want[3]
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[2], want[2])


def test_is_view_of_an_input_is_guarded():
    def f(x):
        return x._is_view(), x * 2

    c = kiln.compile(f, backend="eager")
    for t in (torch.arange(4.0), torch.arange(8.0)[:4], torch.arange(4.0)):
        assert c(t)[0] == f(t)[0]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_an_instance_attribute_shadowing_a_class_method_is_seen(backend):
    """``o.m(x)`` found ``m`` on the class; setting ``o.m`` later (or a module's helper method)
    makes the instance's the one called, as in eager."""
    class B:
        def m(self, x):
            return x + 1

    class G(torch.nn.Module):
        def forward(self, x):
            return self.helper(x)

        def helper(self, x):
            return x + 1

    obj, g, x = B(), G(), torch.ones(2)
    f = kiln.compile(lambda x, o: o.m(x), backend=backend)
    cg = kiln.compile(g, backend=backend)
    torch.testing.assert_close(f(x, obj), x + 1)
    torch.testing.assert_close(cg(x), x + 1)
    obj.m = lambda x: x * 10
    g.helper = lambda x: x * 10
    torch.testing.assert_close(f(x, obj), x * 10)
    torch.testing.assert_close(cg(x), x * 10)
    del obj.m
    torch.testing.assert_close(f(x, obj), x + 1)


def _doubled(x):
    return x * 2


def _less_seven(x):
    return x - 7


def _calls_doubled(x):
    return _doubled(x) + 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_function_or_class_renamed_or_given_new_code_is_seen(backend):
    """A function the capture inlined, or whose name it read, and a class whose name it read,
    changed after the first call: the next call does what eager does."""
    x = torch.ones(3)

    def make():
        def inner(x):
            return x * 2

        def by_name(x):
            return x + (1 if inner.__name__ == "inner" else 100)
        return inner, by_name

    inner, by_name = make()
    c = kiln.compile(by_name, backend=backend)
    assert_same(c(x), by_name(x))
    inner.__name__ = "renamed"
    assert_same(c(x), by_name(x))

    c = kiln.compile(_calls_doubled, backend=backend)
    assert_same(c(x), _calls_doubled(x))
    old = _doubled.__code__
    _doubled.__code__ = _less_seven.__code__
    try:
        assert_same(c(x), _calls_doubled(x))
    finally:
        _doubled.__code__ = old

    class D:
        pass
    d = D()
    f = kiln.compile(lambda x: x + (1 if type(d).__name__ == "D" else 100), backend=backend)
    assert_same(f(x), x + 1)
    D.__name__ = "E"
    assert_same(f(x), x + 100)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_as_strided_of_an_input_view_follows_where_the_view_starts(backend):
    """``x.as_strided(size, stride, 0)`` lands where it lands relative to the input's storage:
    a write through it outside the view's own elements reaches the base (it was lost), at every
    offset the view is passed at."""
    def f(x):
        x.as_strided((2,), (1,), 0).add_(100)
        return x.sum()

    c = kiln.compile(f, backend=backend)
    for off in (0, 3, 0, 5):
        want, got = torch.arange(20.0), torch.arange(20.0)
        assert_same(c(got[off:off + 4]), f(want[off:off + 4]))
        assert_same(got, want)


def test_as_strided_of_views_at_moving_offsets_compiles_once():
    """Without an explicit storage offset, ``as_strided`` places its view from the input's own
    start: same-shaped slices of one buffer at moving offsets share one entry."""
    def f(x):
        return x.as_strided((2, 2), (1, 1)).sum(0) * 2

    counter = CompileCounter()
    c = kiln.compile(f, backend=counter)
    buf = torch.arange(40.0)
    for i in range(10):
        assert_same(c(buf[i:i + 8]), f(buf[i:i + 8]))
    assert counter.frame_count == 1
