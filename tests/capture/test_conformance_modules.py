"""Conformance: nn.Module calls (Linear, Sequential, ModuleList, ModuleDict, custom modules,
buffers, python attributes, self.training branches, helper methods), compiling a module
itself, and parameters being graph inputs (not constants)."""
import copy
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from _conformance import (  # noqa: E402
    A, R, assert_same, case, compile_fn, fresh, ids_unique, make_counter, reset, run_case)

TOL = dict(rtol=1e-4, atol=1e-5)


def seeded(factory, seed=0):
    """Build a module deterministically (the same module object is used on both calls)."""
    torch.manual_seed(seed)
    return factory()


# ----------------------------------------------------------------------------- module classes
class MLP(nn.Module):
    def __init__(self, d_in=4, d_hidden=8, d_out=3):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("mean", torch.linspace(-1, 1, 4))
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x):
        return self.lin((x - self.mean) * self.scale)


class MutatesBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("running", torch.zeros(4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.running.mul_(0.9).add_(x.mean(0) * 0.1)
        self.steps += 1
        return x - self.running


class PyAttrs(nn.Module):
    def __init__(self, scale=0.5, use_act=True, mode="tanh", n_repeat=2):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = scale
        self.use_act = use_act
        self.mode = mode
        self.n_repeat = n_repeat
        self.dims = (1, 4)

    def forward(self, x):
        for _ in range(self.n_repeat):
            x = self.lin(x) * self.scale
            if self.use_act:
                x = torch.tanh(x) if self.mode == "tanh" else F.relu(x)
        return x.reshape(-1, *self.dims)


class TrainingBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            return y * 2
        return y - 1


class HelperMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 6)
        self.eps = 1e-5

    def _norm(self, t):
        return t / (t.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def _split(self, t):
        return t[..., :3], t[..., 3:]

    def forward(self, x):
        a, b = self._split(self.proj(self._norm(x)))
        return a * torch.sigmoid(b)


class Block(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class Stack(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(n)])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


class ModuleListIndexed(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        outs = []
        for i, layer in enumerate(self.layers):
            x = layer(x) + i
            outs.append(x)
        return self.layers[-1](x) + self.layers[0](outs[0]), len(self.layers)


class ModuleDictRouter(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

    def forward(self, x, which="a"):
        out = {name: head(x) for name, head in self.heads.items()}
        return out, self.heads[which](x), "b" in self.heads, list(self.heads.keys())


class ParamDirect(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.b = nn.Parameter(torch.zeros(4))
        self.plist = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(2)])

    def forward(self, x):
        y = x @ self.w + self.b
        for p in self.plist:
            y = y * p
        return y, self.w.shape


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(F.relu(self.bn(self.conv(x)))).flatten(1)


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = MLP(4, 8, 4)
        self.dec = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.extra = WithBuffer()

    def forward(self, x):
        return self.dec(self.enc(x)) + self.extra(x)


class ChildAccess(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        h = self.seq[0](x)
        h = self.seq[1](h)
        return self.seq[2](h), self.seq[-1].weight.shape, len(self.seq), self.seq[0].out_features


class KwargsForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, *, scale=1.0, bias=None):
        y = self.lin(x) * scale
        if bias is not None:
            y = y + bias
        return y


class ModulesIterators(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        total = 0
        for p in self.parameters():
            total = total + p.sum()
        for name, m in self.named_children():
            x = m(x) if name != "b" else x + m(x)
        return x + total


# ----------------------------------------------------------------------------- functions calling modules
def call_module(m, x):
    return m(x)


def call_module_kwargs(m, x, b):
    return m(x, scale=2.0, bias=b) + m(x)


def call_module_twice_and_params(m, x):
    y = m(x)
    return y + m(y), m.weight.sum(), m.bias.shape


def call_module_router(m, x):
    return m(x, which="b")


def call_module_list_arg(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def call_module_dict_arg(mods, x):
    return mods["enc"](x) * mods["gate"](x).sigmoid()


def call_module_attr_branch(m, x):
    if m.training:
        return m(x) + 1
    if isinstance(m, nn.Linear) and m.in_features == 4:
        return m(x) * 2
    return m(x)


def call_module_functional_weights(m, x):
    return F.linear(x, m.weight * 2, m.bias) + F.linear(x, m.weight.t().t())


def call_module_in_no_grad(m, x):
    with torch.no_grad():
        y = m(x)
    return y, m(x)


def call_module_state_dict_shape(m, x):
    return m(x) * len(list(m.parameters())) + len(list(m.buffers()))


def call_two_modules(m1, m2, x):
    return m2(m1(x))


CASES = ids_unique([
    case(call_module, A(seeded(lambda: nn.Linear(4, 5)), R(3, 4)), id="linear", **TOL),
    case(call_module, A(seeded(lambda: nn.Linear(4, 5, bias=False)), R(3, 4)), id="linear_nobias", **TOL),
    case(call_module, A(seeded(lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))), R(3, 4)),
         id="sequential", **TOL),
    case(call_module, A(seeded(MLP), R(3, 4)), id="custom_mlp", **TOL),
    case(call_module, A(seeded(WithBuffer), R(3, 4)), id="buffers", **TOL),
    case(call_module, A(fresh(MutatesBuffer), R(3, 4)), id="buffer_mutation", **TOL),
    case(call_module, A(seeded(PyAttrs), R(3, 4)), id="python_attrs", **TOL),
    case(call_module, A(seeded(lambda: PyAttrs(2.0, True, "relu", 3)), R(3, 4)), id="python_attrs_other", **TOL),
    case(call_module, A(seeded(TrainingBranch), R(3, 4)), id="training_branch_train", **TOL),
    case(call_module, A(seeded(lambda: TrainingBranch().eval()), R(3, 4)), id="training_branch_eval", **TOL),
    case(call_module, A(seeded(HelperMethod), R(3, 4)), id="helper_method", **TOL),
    case(call_module, A(seeded(Stack), R(3, 4)), id="modulelist_loop", **TOL),
    case(call_module, A(seeded(ModuleListIndexed), R(3, 4)), id="modulelist_indexed", **TOL),
    case(call_module, A(seeded(ModuleDictRouter), R(3, 4)), id="moduledict", **TOL),
    case(call_module, A(seeded(ParamDirect), R(3, 4)), id="parameters_direct", **TOL),
    case(call_module, A(seeded(lambda: Conv().eval()), R(2, 2, 5, 5)), id="conv_bn_eval", **TOL),
    case(call_module, A(seeded(Conv), R(2, 2, 5, 5)), id="conv_bn_train", **TOL),
    case(call_module, A(seeded(Nested), R(3, 4)), id="nested_submodules", **TOL),
    case(call_module, A(seeded(ChildAccess), R(3, 4)), id="sequential_child_access", **TOL),
    case(call_module, A(seeded(ModulesIterators), R(3, 4)), id="parameters_children_iter", **TOL),
    case(call_module, A(seeded(lambda: nn.Sequential(nn.Dropout(0.5), nn.Tanh()).eval()), R(3, 4)), id="dropout_eval",
         **TOL),   # (dropout in eval hands its input on: no op of its own)
    case(call_module, A(seeded(lambda: nn.LayerNorm(4)), R(3, 4)), id="layernorm", **TOL),
    case(call_module, A(seeded(lambda: nn.Embedding(10, 3)), fresh(lambda: torch.randint(0, 10, (2, 5)))),
         id="embedding", **TOL),
    case(call_module_kwargs, A(seeded(KwargsForward), R(3, 4), R(4)), **TOL),
    case(call_module_twice_and_params, A(seeded(lambda: nn.Linear(4, 4)), R(3, 4)), **TOL),
    case(call_module_router, A(seeded(ModuleDictRouter), R(3, 4)), **TOL),
    case(call_module_list_arg, A(seeded(lambda: nn.ModuleList([nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)])),
                                 R(3, 4)), **TOL),
    case(call_module_dict_arg, A(seeded(lambda: nn.ModuleDict({"enc": nn.Linear(4, 3), "gate": nn.Linear(4, 3)})),
                                 R(3, 4)), **TOL),
    case(call_module_attr_branch, A(seeded(lambda: nn.Linear(4, 3).eval()), R(3, 4)), **TOL),
    case(call_module_functional_weights, A(seeded(lambda: nn.Linear(4, 3)), R(3, 4)), **TOL),
    case(call_module_in_no_grad, A(seeded(lambda: nn.Linear(4, 3)), R(3, 4)), **TOL),
    case(call_module_state_dict_shape, A(seeded(WithBuffer), R(3, 4)), **TOL),
    case(call_two_modules, A(seeded(MLP), seeded(lambda: nn.Linear(3, 2), 1), R(3, 4)), **TOL),
])


@pytest.mark.parametrize("fn,make_args,opts", CASES)
def test_module_calls(fn, make_args, opts):
    run_case(fn, make_args, opts)


# ----------------------------------------------------------------------------- compiling the module itself
def _check_compiled_module(m, make_input, calls=2, **tol):
    tol = tol or TOL
    torch.manual_seed(0)
    reset()
    cnt = make_counter()
    ref = copy.deepcopy(m)
    cm = compile_fn(m, cnt)
    assert isinstance(cm, nn.Module), f"compiling a module must give a module, got {type(cm).__name__}"
    got_params = list(cm.parameters())
    orig_params = list(m.parameters())
    assert len(got_params) == len(orig_params) and all(p is q for p, q in zip(got_params, orig_params)), (
        "the compiled module must share the original module's parameters")
    for i in range(calls):
        x = make_input()
        expected = ref(x.clone())
        got = cm(x)
        assert_same(got, expected, path=f"call{i}:out", **tol)
        assert_same(m, ref, path=f"call{i}:module_state", **tol)
    assert cnt.frame_count == 1, f"expected 1 compiled graph, got {cnt.frame_count}"
    assert cnt.op_count >= 1
    return cm, cnt


COMPILED_MODULES = [
    pytest.param(lambda: nn.Linear(4, 5), (3, 4), id="linear"),
    pytest.param(lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (3, 4), id="sequential"),
    pytest.param(MLP, (3, 4), id="mlp"),
    pytest.param(Stack, (3, 4), id="modulelist_stack"),
    pytest.param(WithBuffer, (3, 4), id="buffers"),
    pytest.param(MutatesBuffer, (3, 4), id="buffer_mutation"),
    pytest.param(PyAttrs, (3, 4), id="python_attrs"),
    pytest.param(TrainingBranch, (3, 4), id="training_branch"),
    pytest.param(lambda: TrainingBranch().eval(), (3, 4), id="training_branch_eval"),
    pytest.param(HelperMethod, (3, 4), id="helper_method"),
    pytest.param(Conv, (2, 2, 5, 5), id="conv_bn_train"),
    pytest.param(lambda: Conv().eval(), (2, 2, 5, 5), id="conv_bn_eval"),
    pytest.param(Nested, (3, 4), id="nested"),
]


@pytest.mark.parametrize("factory,shape", COMPILED_MODULES)
def test_compile_module_itself(factory, shape):
    m = seeded(factory)
    _check_compiled_module(m, lambda: torch.randn(*shape))


def test_compile_module_forward_kwargs():
    m = seeded(KwargsForward)
    reset()
    cnt = make_counter()
    cm = compile_fn(m, cnt)
    for i in range(2):
        x, b = torch.randn(3, 4), torch.randn(4)
        assert_same(cm(x, scale=3.0, bias=b), m(x, scale=3.0, bias=b), path=f"call{i}", **TOL)
    assert cnt.frame_count == 1


def test_compile_module_sees_inplace_param_update():
    """Parameters are graph inputs: an in-place update of a weight is visible to the
    compiled module without recompiling."""
    m = seeded(MLP)
    reset()
    cnt = make_counter()
    cm = compile_fn(m, cnt)
    x = torch.randn(3, 4)
    assert_same(cm(x), m(x), path="before", **TOL)
    with torch.no_grad():
        m.fc1.weight.mul_(-2.0)
        m.fc2.bias.add_(1.0)
    assert_same(cm(x), m(x), path="after_update", **TOL)
    assert cnt.frame_count == 1, f"expected 1 compiled graph, got {cnt.frame_count}"


def test_compile_module_backward_grads_match():
    m = seeded(MLP)
    ref = copy.deepcopy(m)
    reset()
    cnt = make_counter()
    cm = compile_fn(m, cnt)
    x = torch.randn(3, 4)
    cm(x).sum().backward()
    ref(x).sum().backward()
    for (n, p), q in zip(m.named_parameters(), ref.parameters()):
        assert p.grad is not None, f"no grad for {n}"
        torch.testing.assert_close(p.grad, q.grad, msg=lambda s: f"grad {n}: {s}", **TOL)
    assert cnt.frame_count == 1


# ----------------------------------------------------------------------------- params are inputs, not constants
def apply_layer(m, x):
    return m(x)


LAYER_FACTORIES = [
    pytest.param(lambda: nn.Linear(4, 5), (3, 4), id="linear"),
    pytest.param(MLP, (3, 4), id="mlp"),
    pytest.param(lambda: nn.Conv2d(2, 3, 3), (1, 2, 5, 5), id="conv2d"),
    pytest.param(Block, (3, 4), id="block"),
]


@pytest.mark.parametrize("factory,shape", LAYER_FACTORIES)
def test_two_instances_one_graph(factory, shape):
    """Two instances of the same layer class (different parameter values, same shapes)
    through `def f(m, x): return m(x)`: both correct, ONE graph total."""
    m1 = seeded(factory, seed=1)
    m2 = seeded(factory, seed=2)
    assert any(not torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    reset()
    cnt = make_counter()
    cf = compile_fn(apply_layer, cnt)
    torch.manual_seed(0)
    for i in range(2):
        for name, m in (("m1", m1), ("m2", m2)):
            x = torch.randn(*shape)
            assert_same(cf(m, x), m(x), path=f"call{i}:{name}", **TOL)
    assert cnt.frame_count == 1, (
        f"expected ONE graph for two same-shaped instances (parameters must be graph inputs), "
        f"got {cnt.frame_count}")
