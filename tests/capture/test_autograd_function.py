"""Custom torch.autograd.Function in compiled code: the forward is captured into the graph,
the user's backward is what autograd (and the AOT stage's joint graph) uses.

Each case runs compiled and eager on fresh inputs (same values, fresh objects) several times
and compares outputs, requires_grad of outputs, every leaf's ``.grad`` (None versus a
tensor), and the arguments' state; it asserts how many graphs were compiled and whether the
frame broke. Under ``aot_eager`` it also asserts that the AOT stage compiled a backward graph
(the user's backward traced into the joint graph, not run eagerly beside it).
"""
import copy

import pytest
import torch
from torch import nn

import kiln
from kiln.backends import aot_backend
from kiln.testing import CompileCounter, assert_same

BACKENDS = ["eager", "aot_eager"]
DYNAMIC = [None, True]
DT = torch.float64


class Counter:
    """Counts graphs (and for aot_eager, the backward graphs the AOT stage compiles)."""

    def __init__(self, backend):
        self.backend_name = backend
        self.backward_graphs = []
        if backend == "eager":
            self.inner = CompileCounter()
        else:
            def bw(gm, example_inputs):
                self.backward_graphs.append(gm)
                return gm.forward
            self.inner = aot_backend(bw_compiler=bw)
        self.frame_count = 0

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        return self.inner(gm, example_inputs)


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []


def _loss(outs):
    total = 0
    for o in outs:
        if o.requires_grad:
            w = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)
            total = total + (o * w).sum()
    return total


def check(fn, make_args, backend, *, dynamic=None, graphs=1, broken=False, calls=3, module=None,
          fullgraph=False):
    """Compare ``fn`` compiled with eager over ``calls`` fresh calls; return the counter."""
    counter = Counter(backend)
    ref_module = copy.deepcopy(module) if module is not None else None
    target = module if module is not None else fn
    compiled = kiln.compile(target, backend=counter, dynamic=dynamic, fullgraph=fullgraph)
    for call in range(calls):
        rng = torch.get_rng_state()
        args = make_args(call)
        torch.set_rng_state(rng)
        e_args = make_args(call)
        out = compiled(*args)
        ref = (ref_module if module is not None else fn)(*e_args)
        assert_same(out, ref)
        outs, refs = _tensors(out), _tensors(ref)
        assert [o.requires_grad for o in outs] == [r.requires_grad for r in refs], "requires_grad"
        leaves = [a for a in _tensors(list(args)) if a.is_leaf and a.requires_grad]
        e_leaves = [a for a in _tensors(list(e_args)) if a.is_leaf and a.requires_grad]
        if module is not None:
            leaves += list(module.parameters())
            e_leaves += list(ref_module.parameters())
        if any(o.requires_grad for o in outs):
            for p in leaves + e_leaves:
                p.grad = None
            _loss(outs).backward()
            _loss(refs).backward()
            for i, (a, b) in enumerate(zip(leaves, e_leaves)):
                assert (a.grad is None) == (b.grad is None), f"grad {i}: {a.grad} vs {b.grad}"
                if b.grad is not None:
                    assert_same(a.grad, b.grad, path=f"grad[{i}]")
        assert_same(list(args), list(e_args), path="args after the call")
        if module is not None:
            for k, v in ref_module.state_dict().items():
                assert_same(module.state_dict()[k], v, path=f"state[{k}]")
        assert torch.is_grad_enabled()
    assert counter.frame_count == graphs, f"{counter.frame_count} graphs, expected {graphs}"
    entries = compiled.entries if module is None else compiled.forward.entries \
        if hasattr(compiled.forward, "entries") else []
    if module is None:
        assert any(e.graph_break is not None for e in entries) == broken, \
            [str(e.graph_break) for e in entries]
    return counter


def rg(*shape):
    return torch.randn(*shape, dtype=DT, requires_grad=True)


def rn(*shape):
    return torch.randn(*shape, dtype=DT)


# =============================================================================== Functions
class Sin(torch.autograd.Function):
    """A plain Function, its backward the true derivative."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * torch.cos(x)


class NotTheDerivative(torch.autograd.Function):
    """A backward that is deliberately not the derivative of the forward."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * 7 + w, g * x.exp()


class StraightThrough(torch.autograd.Function):
    """round() forward, identity backward (autograd of round would give zeros)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, g):
        return g


class Scaled(torch.autograd.Function):
    """Non-tensor arguments (a float, an int, None, a string), multiple outputs with a
    constant among them, None gradients for the non-tensor inputs."""

    @staticmethod
    def forward(ctx, x, scale, power, unused, mode):
        ctx.scale, ctx.power, ctx.mode = scale, power, mode
        ctx.save_for_backward(x)
        y = x.pow(power) * scale
        if mode == "both":
            return y, y.sum(), 3
        return y, x.mean(), 3

    @staticmethod
    def backward(ctx, gy, gs, g3):
        assert g3 is None
        x, = ctx.saved_tensors
        gx = gy * ctx.power * x.pow(ctx.power - 1) * ctx.scale
        if ctx.mode == "both":
            gx = gx + gs * ctx.power * x.pow(ctx.power - 1) * ctx.scale
        else:
            gx = gx + gs / x.numel()
        return gx, None, None, None, None


class NeedsInputGrad(torch.autograd.Function):
    """The backward computes only what ``needs_input_grad`` asks for."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = g @ w.t()
        if ctx.needs_input_grad[1]:
            gw = x.t() @ g
        return gx, gw


class ShapeSaved(torch.autograd.Function):
    """Non-tensor ctx attributes: a shape (symbolic under dynamic shapes), an int, a tuple."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        ctx.n = x.shape[0]
        ctx.meta = ("sum", 2)
        return x.sum(0, keepdim=True) * 2

    @staticmethod
    def backward(ctx, g):
        assert ctx.meta == ("sum", 2)
        return g.expand(ctx.shape) * 2 + ctx.n


SCALE = 2.0


class ReadsGlobal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * SCALE

    @staticmethod
    def backward(ctx, g):
        return g * SCALE + 1


class SetupContextStyle(torch.autograd.Function):
    """forward without ctx + setup_context, with a default argument."""

    @staticmethod
    def forward(x, w, alpha=0.5):
        return x * w + alpha

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, alpha = inputs
        ctx.save_for_backward(x, w)
        ctx.alpha = alpha

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w * 3, g * x, None


class NonDifferentiable(torch.autograd.Function):
    """A marked non-differentiable output and an integer one; their grads arrive as zeros."""

    @staticmethod
    def forward(ctx, x):
        mask = x > 0
        ctx.mark_non_differentiable(mask)
        ctx.save_for_backward(mask)
        return x.clamp(min=0), mask, x.argmax()

    @staticmethod
    def backward(ctx, g, gmask, gidx):
        mask, = ctx.saved_tensors
        return g * mask + gmask.sum()


class ReturnsInput(torch.autograd.Function):
    """Returns its input: torch returns a view of it, not the tensor itself."""

    @staticmethod
    def forward(ctx, x, y):
        return x, y * 2

    @staticmethod
    def backward(ctx, gx, gy):
        return gx * 3, gy * 2


# ================================================================================ the tests
@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_simple_function_is_one_graph(backend, dynamic):
    def f(x, w):
        return Sin.apply(x * w).sum(-1) + 1

    # a new size: static first, then one graph dynamic in that dim (dynamic=None)
    counter = check(f, lambda i: (rg(3, 4 + i), rg(3, 4 + i)), backend, dynamic=dynamic,
                    graphs=2 if dynamic is None else 1)
    if backend == "aot_eager":
        assert len(counter.backward_graphs) >= 1


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_that_is_not_the_derivative(backend, dynamic):
    def f(x, w):
        return NotTheDerivative.apply(x.tanh(), w) * 2

    counter = check(f, lambda i: (rg(5), rg(5)), backend, dynamic=dynamic)
    if backend == "aot_eager":
        # the joint graph holds the user's backward: exp(x) is computed in the backward
        (gm,) = counter.backward_graphs
        assert any(n.target == torch.ops.aten.exp.default for n in gm.graph.nodes)


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_straight_through_estimator(backend, dynamic):
    def f(x):
        q = StraightThrough.apply(x)
        return (q * q).sum()

    check(f, lambda i: (rg(8),), backend, dynamic=dynamic)
    x = rg(8)
    kiln.compile(f, backend=backend, dynamic=dynamic)(x).backward()
    torch.testing.assert_close(x.grad, 2 * (torch.round(x.detach() * 4) / 4))   # not zeros


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_non_tensor_args_multiple_outputs_none_grads(backend, dynamic):
    def f(x, mode):
        y, s, three = Scaled.apply(x + 1, 1.5, 3, None, mode)
        return y * three, s

    check(f, lambda i: (rg(4), "both"), backend, dynamic=dynamic)
    check(f, lambda i: (rg(4), "mean"), backend, dynamic=dynamic)


@pytest.mark.parametrize("backend", BACKENDS)
def test_needs_input_grad_branches(backend):
    def f(x, w):
        return NeedsInputGrad.apply(x, w).relu()

    for need_x, need_w in [(True, True), (True, False), (False, True)]:
        kiln.reset()
        make = lambda i: (torch.randn(3, 4, dtype=DT, requires_grad=need_x),
                          torch.randn(4, 2, dtype=DT, requires_grad=need_w))
        check(f, make, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_needs_input_grad_is_guarded(backend):
    def f(x, w):
        return NeedsInputGrad.apply(x, w).relu()

    counter = Counter(backend)
    cf = kiln.compile(f, backend=counter)
    for need_w in (False, True, False):
        x, w = rg(3, 4), torch.randn(4, 2, dtype=DT, requires_grad=need_w)
        cf(x, w).sum().backward()
        assert (w.grad is not None) == need_w
        ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_(need_w)
        f(ex, ew).sum().backward()
        torch.testing.assert_close(x.grad, ex.grad)
    assert counter.frame_count == 2


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_saved_non_tensor_ctx_attributes(backend, dynamic):
    def f(x):
        return ShapeSaved.apply(x * 1.5)

    graphs = 1 if dynamic else 2
    check(f, lambda i: (rg(3 + i, 2),), backend, dynamic=dynamic, graphs=graphs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_symbolic_int_argument(backend):
    class Repeat(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, n):
            ctx.n = n
            return x.repeat(n) * n

        @staticmethod
        def backward(ctx, g):
            return g.view(ctx.n, -1).sum(0) * ctx.n * 2, None

    def f(x, n):
        return Repeat.apply(x, n + 1)

    check(f, lambda i: (rg(3 + i), 2 + i), backend, dynamic=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_function_inside_module(backend):
    class Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return x @ weight.t() + bias

        @staticmethod
        def backward(ctx, g):
            x, weight = ctx.saved_tensors
            return g @ weight, g.t() @ x, g.sum(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3).double()
            self.out = nn.Linear(3, 2).double()

        def forward(self, x):
            h = Linear.apply(x, self.fc.weight, self.fc.bias).tanh()
            return self.out(h)

    check(None, lambda i: (rg(5, 4),), backend, module=Net())


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_reads_a_global(backend):
    global SCALE

    def f(x):
        return ReadsGlobal.apply(x) + 1

    counter = Counter(backend)
    cf = kiln.compile(f, backend=counter)
    try:
        for scale in (2.0, 2.0, 3.0, 3.0):
            SCALE = scale
            x = rg(4)
            out = cf(x)
            out.sum().backward()
            torch.testing.assert_close(out, x.detach() * scale + 1)
            torch.testing.assert_close(x.grad, torch.full_like(x, scale + 1))
    finally:
        SCALE = 2.0
    assert counter.frame_count == 2
    assert "SCALE" in cf.recompile_reasons[-1]


def _apply_takes_keywords() -> bool:
    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

    try:
        Identity.apply(x=torch.zeros(1))
        return True
    except TypeError:
        return False


needs_apply_keywords = pytest.mark.skipif(
    not _apply_takes_keywords(), reason="this torch's autograd.Function.apply() takes no keyword arguments "
    "(eager raises TypeError, and so does kiln)")


@needs_apply_keywords
@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_setup_context_style_with_defaults_and_kwargs(backend, dynamic):
    def f(x, w):
        return SetupContextStyle.apply(x, w) + SetupContextStyle.apply(x, w=w, alpha=2.0)

    check(f, lambda i: (rg(4), rg(4)), backend, dynamic=dynamic)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_differentiable_outputs(backend):
    def f(x):
        y, mask, idx = NonDifferentiable.apply(x * 2)
        return y + mask.to(x.dtype), mask, idx

    check(f, lambda i: (rg(6),), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_returned_input_is_a_view(backend):
    def f(x, y):
        a, b = ReturnsInput.apply(x, y)
        return a * 1, b, a is x

    check(f, lambda i: (rg(3), rg(3)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_grad_and_inference(backend):
    def f(x, w):
        with torch.no_grad():
            a = NotTheDerivative.apply(x, w)
        return a + NotTheDerivative.apply(x.detach(), w.detach())

    check(f, lambda i: (rg(4), rg(4)), backend)
    kiln.reset()
    check(f, lambda i: (rn(4), rn(4)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_alias_of_apply_same_input_twice_and_two_calls(backend):
    op = NotTheDerivative.apply

    def f(x):
        return op(x, x) + op(x.sin(), x).cos()

    check(f, lambda i: (rg(5),), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_function_in_forward(backend):
    class Outer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return Sin.apply(x) * 2          # under no_grad: no backward of its own

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * 5 * x

    def f(x):
        return Outer.apply(x + 1)

    check(f, lambda i: (rg(4),), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_updates_a_buffer(backend):
    class Normalize(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, running):
            running.mul_(0.9).add_(x.mean(0) * 0.1)
            ctx.save_for_backward(running)
            return x - running

        @staticmethod
        def backward(ctx, g):
            return g * 2, None

    def f(x, running):
        return Normalize.apply(x, running)

    check(f, lambda i: (rg(4, 3), rn(3)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_saved_tensor_changed_in_place_fails_the_backward_as_in_eager(backend):
    def f(x):
        y = x * 2
        z = Sin.apply(y)
        y.add_(1)
        return z

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        f(rg(3)).sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        kiln.compile(f, backend=backend)(rg(3)).sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_double_backward_through_a_differentiable_backward(backend):
    if backend == "aot_eager":
        pytest.skip("double backward through an AOT-compiled graph is not supported by kiln.aot")

    def f(x):
        return Sin.apply(x * 2)

    x, ex = rg(5), None
    ex = x.detach().clone().requires_grad_()
    out = kiln.compile(f, backend=backend)(x)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    g.sum().backward()
    (eg,) = torch.autograd.grad(f(ex).sum(), ex, create_graph=True)
    eg.sum().backward()
    torch.testing.assert_close(g, eg)
    torch.testing.assert_close(x.grad, ex.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_dirty(backend):
    class AddInPlace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            x.add_(y)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2, g * 3

    def f(a, y):
        x = a * 1
        z = AddInPlace.apply(x, y)
        return z * 2, x + 1, z is x

    check(f, lambda i: (rg(4), rg(4)), backend)


class DoubleInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_dirty_tensor_returned_with_an_output_computed_from_it(backend, dynamic):
    """The dirtied tensor is an output and feeds another output: the graph is split after it,
    so the second part's input is mutated by the Function. That mutation runs under no_grad
    (functionalization calls it hidden from autograd) yet mark_dirty puts it on the autograd
    path: once dropped from it, the gradient through the returned tensor skipped the backward."""
    def f(a):
        x = a.clone()
        z = DoubleInPlace.apply(x)
        return z * 1, x

    check(f, lambda i: (rg(4),), backend, dynamic=dynamic)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_dirty_of_a_non_leaf_input(backend):
    def f(y, w):
        z = DoubleInPlace.apply(y)
        return z * w

    leaf = rg(4)
    check(f, lambda i: (leaf * 1, rg(4)), backend)
    assert leaf.grad is not None


class ReturnsItsInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 3


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_returned_input_is_an_output_next_to_the_input(backend, dynamic):
    """Eager's output is a view of x whose grad_fn is the user's backward; the AOT runtime
    re-took it as a plain view of x (gradient 1 where the backward says 3)."""
    def f(x):
        return ReturnsItsInput.apply(x), x

    check(f, lambda i: (rg(4),), backend, dynamic=dynamic)


MODULE = nn.Linear(3, 2).double()
W_BACKWARD = torch.randn(3, dtype=DT)


class ReadsModuleThroughCtx(torch.autograd.Function):
    """An object passed in (its tensors are read by the forward, not inputs of the Function)
    and kept on ctx for the backward."""

    @staticmethod
    def forward(ctx, x, mod):
        ctx.mod = mod
        return x @ mod.weight.t()

    @staticmethod
    def backward(ctx, g):
        return g @ ctx.mod.weight * 2, None


class ReadsGlobalInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * W_BACKWARD


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_tensors_read_from_objects_and_globals(backend, dynamic):
    def f(x):
        return ReadsModuleThroughCtx.apply(x, MODULE).sum(-1) + ReadsGlobalInBackward.apply(x)

    check(f, lambda i: (rg(3),), backend, dynamic=dynamic)
    assert MODULE.weight.grad is None      # the forward read it under no_grad: no gradient


@pytest.mark.parametrize("backend", BACKENDS)
def test_amp_custom_fwd_and_autocast(backend):
    class Amp(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cpu")
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w

        @staticmethod
        @torch.amp.custom_bwd(device_type="cpu")
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g @ w.t(), x.t() @ g

    class MatMul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w              # bfloat16 under autocast

        @staticmethod
        def backward(ctx, g):        # runs outside autocast, as eager's does
            x, w = ctx.saved_tensors
            return g @ w.t().to(g.dtype), x.t().to(g.dtype) @ g

    def f(x, w):
        return Amp.apply(x, w).relu()

    def g(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return MatMul.apply(x, w).relu()

    check(f, lambda i: (rg(2, 3), rg(3, 4)), backend)
    check(g, lambda i: (torch.randn(2, 3, requires_grad=True), torch.randn(3, 4, requires_grad=True)),
          backend)


def test_forward_exception_is_raised_natively_and_handled():
    class Raises(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            raise ValueError("no")

        @staticmethod
        def backward(ctx, g):
            return g

    def f(x):
        y = x.sin()
        try:
            return Raises.apply(y)
        except ValueError:
            return y * 2

    # one graph (sin); the apply raises natively and its handler runs in the break function
    check(f, lambda i: (rg(3),), "eager", graphs=1, broken=True)


def test_double_backward_reaches_tensors_the_backward_reads():
    lin = nn.Linear(3, 3).double()

    class ReadsWeight(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, mod):
            ctx.mod = mod
            return x @ mod.weight.t()

        @staticmethod
        def backward(ctx, g):
            return (g @ ctx.mod.weight) * ctx.mod.weight.sum(), None

    def f(x):
        return ReadsWeight.apply(x, lin).sin()

    x0 = rn(2, 3)
    results = []
    for fn in (f, kiln.compile(f, backend="eager")):
        lin.weight.grad = None
        x = x0.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
        g.sum().backward()
        results.append((g.detach(), x.grad, lin.weight.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


# ===================================================================== what breaks (natively)
class OnceDifferentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        return g * 4


class WithJvp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 4

    @staticmethod
    def jvp(ctx, t):
        return t * 3


class NoMaterialize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, ga, gb):
        out = torch.zeros(())
        if ga is not None:
            out = out + ga * 2
        if gb is not None:
            out = out + gb * 3
        return out


class DataDependent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.sum() > 0:
            return x * 2
        return x * -2

    @staticmethod
    def backward(ctx, g):
        return g * 5


LOG = []


class BackwardSideEffect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        LOG.append("backward")
        return g * 2


class GradLayout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2 if g.is_contiguous() else g * 3


class ApplyInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return Sin.apply(x) * g


class ReturnsList(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return [x * 2]

    @staticmethod
    def backward(ctx, g):
        return g


BREAKING = [OnceDifferentiable, WithJvp, NoMaterialize, DataDependent, BackwardSideEffect,
            GradLayout, ApplyInBackward]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn_cls", BREAKING, ids=lambda c: c.__name__)
def test_unsupported_functions_break_and_run_natively(backend, fn_cls):
    def f(x):
        y = x * 2
        out = fn_cls.apply(y)
        if isinstance(out, tuple):
            out = out[0]
        return out.sum() + y.sum()

    LOG.clear()
    check(f, lambda i: (rg(4),), backend, graphs=2, broken=True)
    if fn_cls is BackwardSideEffect:
        assert LOG == ["backward"] * 6        # compiled and eager, three calls each


@pytest.mark.parametrize("backend", BACKENDS)
def test_unsupported_inside_an_inlined_function_and_module(backend):
    def helper(x):
        return DataDependent.apply(x) + 1

    class M(nn.Module):
        def forward(self, x):
            return helper(x.cos()) * 2

    m = M()

    def f(x):
        return m(x.sin())

    # f breaks at m(...), m's forward at helper(...), helper at the apply, which runs
    # natively: the graphs are sin, cos, + 1 and * 2
    check(f, lambda i: (rg(4),), backend, graphs=4, broken=True)


def test_fullgraph_raises_unsupported():
    def f(x):
        return DataDependent.apply(x)

    with pytest.raises(kiln.Unsupported, match="DataDependent"):
        kiln.compile(f, backend="eager", fullgraph=True)(rg(3))


def test_a_list_output_runs_natively():
    def f(x):
        return ReturnsList.apply(x.cos())[0] + 1

    check(f, lambda i: (rg(3),), "eager", graphs=2, broken=True)


@needs_apply_keywords
def test_keyword_arguments_to_a_ctx_style_forward_run_natively():
    def f(x):
        return Sin.apply(x=x.cos()) + 1

    check(f, lambda i: (rg(3),), "eager", graphs=2, broken=True)


def test_a_tensor_escaping_the_forward_runs_the_frame_eagerly():
    class Leaky(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, sink):
            t = x * 3
            sink.append(t)
            return t + 1

        @staticmethod
        def backward(ctx, g):
            return g, None

    def f(x):
        sink = []
        y = Leaky.apply(x, sink)
        return y + sink[0]

    check(f, lambda i: (rg(3),), "eager", graphs=0)


def test_kiln_explain_names_the_function():
    def f(x):
        return OnceDifferentiable.apply(x.sin()).cos()

    report = kiln.explain(f)(rg(3))
    assert report.graph_break_count == 1
    assert "OnceDifferentiable" in str(report.break_reasons[0])


class _ReturnsSavedNoise(torch.autograd.Function):
    """A backward that returns, as the gradient, a random tensor its forward drew and saved."""

    @staticmethod
    def forward(ctx, x):
        r = torch.randn(x.shape)
        ctx.save_for_backward(r)
        return x + 1

    @staticmethod
    def backward(ctx, g):
        (r,) = ctx.saved_tensors
        return r


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_gradient_that_is_a_saved_random_draw_is_that_draw(backend):
    """The gradient is a forward value: the partitioner saves it (a random draw cannot be
    recomputed), so the backward returns the forward's numbers and draws none of its own."""
    def f(x):
        return _ReturnsSavedNoise.apply(x)

    results = []
    for fn in (f, kiln.compile(f, backend=backend)):
        x = torch.zeros(3, requires_grad=True)
        torch.manual_seed(0)
        fn(x).sum().backward()
        results.append((x.grad, torch.rand(1)))      # the gradient, then the next number drawn
    (ge, ne), (gk, nk) = results
    assert torch.equal(ge, gk) and torch.equal(ne, nk)


class _BranchesOnGradMode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * (3.0 if torch.is_grad_enabled() else 1.0)


class _BranchesOnGradRequiresGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * 10.0 if g.requires_grad else g


@pytest.mark.parametrize("fn_cls", [_BranchesOnGradMode, _BranchesOnGradRequiresGrad])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_backward_that_reads_grad_mode_refuses_create_graph(fn_cls, backend):
    """The captured backward holds the branch it takes without create_graph (so does an AOT
    backend's joint graph): without it, the gradient is eager's; with create_graph=True (the
    other branch in eager) it raises rather than return the wrong branch's gradient."""
    def f(x):
        return fn_cls.apply(x).sum()

    compiled = kiln.compile(f, backend=backend)
    x = torch.ones(3, requires_grad=True)
    (g,) = torch.autograd.grad(compiled(x), x)
    (eg,) = torch.autograd.grad(f(x), x)
    torch.testing.assert_close(g, eg)
    with pytest.raises(RuntimeError, match="create_graph|double backward"):
        torch.autograd.grad(compiled(x), x, create_graph=True)


class _NoGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return None


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_backward_that_returns_no_gradient_keeps_its_output_differentiable(backend):
    """Eager's output of a Function whose backward returns None requires grad (an edge to
    its input that gives it no gradient): backward() through it works and leaves ``x.grad``
    None. The AOT node took no input (no gradient reaches one), so its output required none."""
    def f(x):
        return _NoGradient.apply(x).sin()

    x = torch.randn(2, 3, requires_grad=True)
    kiln.reset()
    out = kiln.compile(f, backend=backend)(x)
    expected = f(x.detach().requires_grad_())
    assert out.requires_grad and expected.requires_grad
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert x.grad is None
