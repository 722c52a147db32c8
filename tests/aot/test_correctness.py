"""kiln's AOT path against eager, on what autograd makes observable: grad mode after the call,
``requires_grad``/``grad_fn`` of outputs, ``.grad`` None versus zeros, views made under no_grad
or by multi-output ops, in-place writes eager refuses, and backward() after the user changes
an input or an output in place. A graph the AOT stages cannot handle runs as captured."""
import pytest
import torch
import torch.nn as nn

import kiln
from kiln.backends.aot import aot_backend, aot_eager
from kiln.testing import assert_same

BACKENDS = {"aot_eager": aot_eager, "min_cut": aot_backend(partition_fn="min_cut")}


class AOTCounter:
    """Counts the graphs the AOT backend gets, and those it runs as captured."""

    def __init__(self, backend=aot_eager):
        self.backend = backend
        self.frame_count = 0
        self.fallbacks: list[str] = []

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        compiled = self.backend(gm, example_inputs)
        if "kiln_aot_fallback" in gm.meta:
            self.fallbacks.append(gm.meta["kiln_aot_fallback"])
        return compiled


def _outcome(action):
    """('ok', value) or ('raises', exception type)."""
    try:
        return ("ok", action())
    except Exception as e:          # noqa: BLE001 (the type is what is compared)
        return ("raises", type(e))


def _describe(t):
    if not isinstance(t, torch.Tensor):
        return t
    return (t.requires_grad, t.grad_fn is not None, t._is_view(), t.is_leaf)


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_like_eager(fn, make_args, *, backend=aot_eager, loss_on=None, post=None, expected_graphs=None,
                   fallbacks=0, grad_mode=True, fullgraph=False):
    """Call ``fn`` eagerly and compiled (fresh arguments of the same values) and compare
    everything autograd makes observable. ``post(args, outs)`` runs after the call (an in-place
    change the user makes); then backward() of the outputs ``loss_on`` (default: all that
    require grad)."""
    counter = AOTCounter(backend)
    compiled = kiln.compile(fn, backend=counter, fullgraph=fullgraph)
    results = []
    for run in (fn, compiled):
        torch.manual_seed(0)
        args = make_args()
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.is_leaf and a.requires_grad]
        leaves += [p for a in args if isinstance(a, nn.Module) for p in a.parameters()]
        with torch.set_grad_enabled(grad_mode):
            got = _outcome(lambda: _flat(run(*args)))
            mode_after = torch.is_grad_enabled()
        r = {"call": got[0] if got[0] == "ok" else got, "mode_after": mode_after}
        if got[0] == "ok":
            outs = got[1]
            r["outs"] = [_describe(o) for o in outs]
            r["values"] = [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outs]
            r["args"] = [a.detach().clone() for a in args if isinstance(a, torch.Tensor)]
            if post is not None:
                r["post"] = _outcome(lambda: post(args, outs))
            picked = [o for k, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad
                      and (loss_on is None or k in loss_on)]
            if picked:
                def backward():
                    sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)).sum()
                        for o in picked).backward()
                bw = _outcome(backward)
                r["backward"] = bw[0] if bw[0] == "ok" else bw
                if bw[0] == "ok":
                    r["grads"] = [None if p.grad is None else p.grad.clone() for p in leaves]
        results.append(r)
    eager, kiln_run = results
    for key in eager:
        assert key in kiln_run, f"{key}: missing from kiln's run"
        assert_same(kiln_run[key], eager[key], path=key)
    assert set(kiln_run) == set(eager)
    if expected_graphs is not None:
        assert counter.frame_count == expected_graphs
    assert len(counter.fallbacks) == fallbacks, counter.fallbacks
    return counter


def run_with_post(fn, make_args, which, **kw):
    """``run_like_eager`` with an in-place change after the call to output ``("out", k)``
    or argument ``("arg", i)``."""
    kind, i = which

    def post(args, outs):
        (outs[i] if kind == "out" else args[i]).mul_(1.5)
    return run_like_eager(fn, make_args, post=post, **kw)


def rg(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


def rn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def nonleaf(*shape):
    return rg(*shape) * 1


# ------------------------------------------------------------------------------------------------
# 1. grad mode set by the graph itself
# ------------------------------------------------------------------------------------------------

def break_inside_no_grad(x):
    y = torch.tanh(x)
    with torch.no_grad():
        v = float(y.mean())          # graph break inside the block
    return y * v


def break_between_set_grad_enabled(x):
    y = torch.tanh(x)
    torch.set_grad_enabled(False)
    v = float(y.mean())
    torch.set_grad_enabled(True)
    return y * v, y.sin()


def break_then_leave_grad_off(x):
    y = x.cos()
    torch.set_grad_enabled(False)
    v = float(y.sum())
    return y * v, x * 2          # the function leaves grad mode off, as eager does


def enable_grad_inside(x):
    with torch.enable_grad():
        y = x.sin()
        print("", end="")        # graph break inside enable_grad
        z = y * 2
    return z, x * 3


@pytest.mark.parametrize("fn", [break_inside_no_grad, break_between_set_grad_enabled, break_then_leave_grad_off,
                                enable_grad_inside])
@pytest.mark.parametrize("grad_mode", [True, False])
def test_grad_mode_changes_of_the_graph(fn, grad_mode):
    run_like_eager(fn, lambda: (rg(3),), expected_graphs=2, grad_mode=grad_mode)
    torch.set_grad_enabled(True)


def test_set_grad_enabled_around_a_break_with_fullgraph_false_only_breaks():
    counter = run_like_eager(break_between_set_grad_enabled, lambda: (nonleaf(4),), expected_graphs=2)
    assert not counter.fallbacks


# ------------------------------------------------------------------------------------------------
# 2. .grad None where eager's autograd never reaches a leaf
# ------------------------------------------------------------------------------------------------

def two_outputs(x, y):
    return x.sin(), y.cos() * x


def dead_input(x, y):
    a = x.sin()
    b = y.cos()
    print("", end="")            # break: b is alive across it
    return a


def backward_inside(x, y):
    a = x.sin()
    b = y.cos()
    a.sum().backward()           # graph break: b's gradient path is never taken
    return b.detach()


def detached_use(x, y):
    return x.sin() + y.detach(), (y * 2).detach()


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("fn,loss_on", [(two_outputs, {0}), (two_outputs, {1}), (dead_input, None),
                                        (detached_use, None)])
def test_leaves_backward_does_not_reach_keep_grad_none(backend, fn, loss_on):
    run_like_eager(fn, lambda: (rg(3), rg(3)), backend=BACKENDS[backend], loss_on=loss_on)


def test_backward_inside_the_function_leaves_other_grads_none():
    run_like_eager(backward_inside, lambda: (rg(3), rg(3)))


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.a = nn.Linear(4, 2)
        self.b = nn.Linear(4, 2)
        self.unused = nn.Linear(4, 2)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        with torch.no_grad():
            _ = self.unused(h)
        return self.a(h), self.b(h)


@pytest.mark.parametrize("loss_on", [{0}, {1}, {0, 1}])
def test_parameters_of_an_unused_head_keep_grad_none(loss_on):
    def make():
        torch.manual_seed(1)
        return (TwoHeads().double(), rn(3, 4))
    run_like_eager(lambda m, x: m(x), make, loss_on=loss_on, expected_graphs=1)


# ------------------------------------------------------------------------------------------------
# 3. views: made under no_grad, by multi-output ops, of intermediates
# ------------------------------------------------------------------------------------------------

def no_grad_view_of_input(x):
    with torch.no_grad():
        v = x[:2]
    return v


def no_grad_view_after_break(x):
    y = x * 2
    with torch.no_grad():
        v = y[:2]
    print("", end="")
    return v, y


def no_grad_view_written_after_break(x):
    y = x * 2
    with torch.no_grad():
        v = y[:2]
    print("", end="")
    v.mul_(2)                    # eager: RuntimeError (a no_grad view written with grad mode on)
    return v, y


def view_of_intermediate(x):
    return (x * 2).view(-1)[1:]


def chunk_of_intermediate(x):
    a, b = (x * 2).chunk(2)
    return a, b


def detached_and_view_of_intermediate(x):
    y = x.exp()
    return y.detach(), y.diagonal()


@pytest.mark.parametrize("fn", [no_grad_view_of_input, no_grad_view_after_break, view_of_intermediate,
                                chunk_of_intermediate, detached_and_view_of_intermediate])
@pytest.mark.parametrize("make", [lambda: (rg(4, 4),), lambda: (nonleaf(4, 4),), lambda: (rn(4, 4),)])
def test_view_outputs_behave_as_eager_views(fn, make):
    # in-place on the first output: allowed or refused as in eager; then backward
    run_with_post(fn, make, ("out", 0))


def test_no_grad_view_written_after_a_break_raises_as_eager():
    run_like_eager(no_grad_view_written_after_break, lambda: (rg(4),))


def unbind_then_write_base(x):
    y = x * 2
    a, b = y.unbind(0)
    print("", end="")
    y.add_(1)                    # eager: using a or b afterwards raises
    return a + b


def chunk_then_write_view(x):
    y = x * 2
    a, b = y.chunk(2)
    print("", end="")
    a.add_(1)                    # eager: RuntimeError (one of several views)
    return a, b


@pytest.mark.parametrize("fn", [unbind_then_write_base, chunk_then_write_view])
def test_multi_output_views_across_a_break(fn):
    run_like_eager(fn, lambda: (rg(2, 3),))


def test_inplace_on_a_returned_view_of_an_intermediate_is_allowed_in_inference():
    w = torch.randn(2, requires_grad=True)
    for backend in ("eager", "aot_eager"):
        out = kiln.compile(lambda x: (x * 2).view(-1)[1:], backend=backend)(rn(3))
        out.add_(w[:1].expand(2))     # eager: fine; the view now requires grad
        assert out.requires_grad and out._is_view()


# ------------------------------------------------------------------------------------------------
# 4. graphs the AOT stages refuse run as captured
# ------------------------------------------------------------------------------------------------

def saved_output_changed_in_place(x):
    y = x.exp()
    y.add_(1)                    # exp saved y: eager's backward raises, its forward does not
    return y


def overlapping_write(x, b):
    t = b.t()
    t.add_(b)                    # eager: RuntimeError (partially overlapping memory)
    return x * 2


def expanded_write(x):
    e = x[:1].detach().expand(3, 4)
    e.add_(1)                    # eager: RuntimeError (written-to elements share memory)
    return x


def test_a_tensor_the_backward_needs_changed_in_place_runs_as_captured():
    counter = run_like_eager(saved_output_changed_in_place, lambda: (rg(3),), fallbacks=1)
    assert "modified by an inplace operation" in counter.fallbacks[0]


def overlapping_inputs_write(x, b):
    torch.ops.aten.add_.Tensor(b.t(), b)   # eager: RuntimeError (partially overlapping memory)
    return x * 2


def overlapping_inputs_write_unbound(x, b):
    torch.Tensor.add_(b.t(), b)
    return x * 2


def _overlapping_views():
    return (rg(3), rn(4, 4))


@pytest.mark.parametrize("fn", [overlapping_inputs_write, overlapping_inputs_write_unbound])
def test_writes_eager_refuses_for_overlapping_memory(fn):
    # capture breaks before the write (an ATen op or an unbound method is the in-place method
    # it names): eager raises its own error at the user's line
    run_like_eager(fn, _overlapping_views, fallbacks=0)


def test_the_aot_stages_refuse_a_graph_with_a_write_eager_refuses():
    """A graph that reaches the AOT stages with such a write (capture would have broken
    before it) runs as captured: a functional graph would compute the write out of place."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln.aot.overlap import overlapping_write

    gm = torch.fx.symbolic_trace(overlapping_inputs_write)
    with FakeTensorMode() as mode:
        env = {}
        for node, arg in zip([n for n in gm.graph.nodes if n.op == "placeholder"], _overlapping_views()):
            env[node] = mode.from_tensor(arg)
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                node.meta["example_value"] = env[node]
            elif node.op in ("call_function", "call_method"):
                args = torch.fx.node.map_arg(node.args, lambda a: env[a])
                fn = node.target if node.op == "call_function" else getattr(type(args[0]), node.target)
                env[node] = node.meta["example_value"] = fn(*args)
    assert overlapping_write(gm) == "add_ reads memory it partially overwrites"


@pytest.mark.parametrize("fn,make", [(overlapping_write, lambda: (rg(3), rn(4, 4))),
                                     (expanded_write, lambda: (rn(3, 4),))])
def test_a_write_eager_refuses_is_left_to_eager(fn, make):
    # capture breaks before it (tests/capture/test_inplace_overlap.py): eager raises its own
    # error at the user's line, no AOT fallback needed
    run_like_eager(fn, make, fallbacks=0)


def test_fullgraph_turns_an_aot_failure_into_unsupported():
    compiled = kiln.compile(saved_output_changed_in_place, backend="aot_eager", fullgraph=True)
    with pytest.raises(kiln.Unsupported, match="modified by an inplace operation"):
        compiled(rg(3))


def test_aot_failures_are_logged(capsys):
    from kiln import logs

    logs.set_logs("aot")
    try:
        kiln.compile(saved_output_changed_in_place, backend="aot_eager")(rg(3))
    finally:
        logs.set_logs("")
    assert "runs as captured" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# 5. backward() after the user changes an input or an output in place
# ------------------------------------------------------------------------------------------------

def add_then_sin(x):
    return (x + 1).sin()          # eager saves x + 1 only


def exp_out(x):
    return x.exp()                # eager saves the output


def sin_then_cos(x):
    y = x.sin()
    return y, y.cos()             # eager saves x and y


def scaled_then_sin(x):
    y = x * 2
    return y, (y + 1).sin()       # eager saves y + 1, not y


def mutated_then_saved(x, w):
    x.add_(1)
    return torch.nn.functional.linear(x, w), x     # linear saves the changed x


def fused_outputs(x, b):
    b.add_(x)
    t1 = (x + 1).sigmoid()        # sigmoid saves its output t1
    t2 = b.sum(-1, keepdim=True) * b
    print("", end="")
    t1.add_(t2)                   # t1 changed: only its own gradient would need it
    return b, t2


CASES = [
    (add_then_sin, lambda: (nonleaf(3),), [("arg", 0)]),
    (exp_out, lambda: (rg(3),), [("out", 0)]),
    (sin_then_cos, lambda: (nonleaf(3),), [("out", 0), ("arg", 0)]),
    (scaled_then_sin, lambda: (rg(3),), [("out", 0)]),
    (mutated_then_saved, lambda: (rn(2, 3), rg(3, 3)), [("arg", 0), ("out", 1)]),
    (fused_outputs, lambda: (nonleaf(4, 4), rn(4, 4)), [("arg", 0)]),
]


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("fn,make,where", [(f, m, w) for f, m, ws in CASES for w in ws],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_backward_after_an_inplace_change_by_the_user(backend, fn, make, where):
    run_with_post(fn, make, where, backend=BACKENDS[backend])


def test_backward_through_one_output_skips_checks_for_the_others():
    def f(x):
        y = x.exp()
        return y, x.sin()
    # y changed in place: only backward() through y must raise
    run_with_post(f, lambda: (rg(3),), ("out", 0), loss_on={1})
    run_with_post(f, lambda: (rg(3),), ("out", 0), loss_on={0})


def write_through_detach(x, y):
    x.detach().copy_(y * 2)      # hidden from autograd: eager allows it on a leaf that requires grad
    return x + 1, x.detach().mul_(2)


@pytest.mark.parametrize("make", [lambda: (rg(3), rg(3)), lambda: (nonleaf(3), rg(3))])
def test_writes_through_a_detached_alias_are_hidden_from_autograd(make):
    run_like_eager(write_through_detach, make, expected_graphs=1)


def detach_then_write_with_grad(x, w):
    t = x.detach()
    t.copy_(w * 2)               # t: x's memory, its own history (from w)
    return t, x + 1


def test_an_alias_with_its_own_history_runs_as_captured():
    counter = run_like_eager(detach_then_write_with_grad, lambda: (rn(3), rg(3)), fallbacks=1)
    assert "history of its own" in counter.fallbacks[0]
    run_with_post(detach_then_write_with_grad, lambda: (rg(3), rg(3)), ("out", 0), fallbacks=1)


def test_dynamic_graph_leaves_unreached_grads_none_for_every_size():
    counter = AOTCounter()
    compiled = kiln.compile(two_outputs, backend=counter, dynamic=True)
    for n in (3, 5, 7):
        x, y = rg(n), rg(n)
        a, b = compiled(x, y)
        assert_same([a, b], list(two_outputs(x, y)))
        a.sum().backward()                       # not through b: y gets no gradient
        assert y.grad is None
        assert_same(x.grad, x.detach().cos())
    assert counter.frame_count == 1 and not counter.fallbacks


def sqrt_beside(x):
    h = x * 3
    return h * 2, h.sqrt()          # sqrt's derivative is infinite at 0


def test_an_output_backward_does_not_reach_cannot_poison_the_gradient():
    run_like_eager(sqrt_beside, lambda: (torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64, requires_grad=True),),
                   loss_on={0})


def independent_outputs(w):
    return w * 2, w.exp(), (w * w).sum()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_backward_through_each_output_in_turn(backend):
    def run(fn):
        w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
        a, b, c = fn(w)
        grads, errors = [], []
        for out in (c, a, b, b):                 # the last one: b's path again
            try:
                out.sum().backward()
                errors.append(None)
            except RuntimeError as e:
                errors.append(type(e))
            grads.append(w.grad.clone())
        return grads, errors
    torch.manual_seed(0)
    expected = run(independent_outputs)
    torch.manual_seed(0)
    assert_same(run(kiln.compile(independent_outputs, backend=BACKENDS[backend])), expected)
    assert expected[1] == [None, None, None, RuntimeError]


def disjoint_paths(a, b, w):
    return a * 2, torch.nn.functional.linear(b, w), w.sum()


def unused_input(x, a):
    return x.sin()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_backward_through_one_output_does_not_free_what_another_needs(backend):
    def run(fn):
        torch.manual_seed(0)
        base = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
        a = base.exp()                       # a's node saves a tensor: freed when backward runs it
        b = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
        w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
        out = fn(a, b, w)
        grads = []
        for o in out[:2]:
            o.sum().backward()
            grads.append([t.grad.clone() if t.grad is not None else None for t in (base, b, w)])
        return grads
    assert_same(run(kiln.compile(disjoint_paths, backend=BACKENDS[backend])), run(disjoint_paths))

    def run_unused(fn):
        torch.manual_seed(0)
        base = torch.randn(3, dtype=torch.float64, requires_grad=True)
        a = base.exp()
        x = torch.randn(3, dtype=torch.float64, requires_grad=True)
        fn(x, a).sum().backward()            # eager's autograd never runs a's node here
        a.sum().backward()
        return [x.grad, base.grad]
    assert_same(run_unused(kiln.compile(unused_input, backend=BACKENDS[backend])), run_unused(unused_input))


# ------------------------------------------------------------------------------------------------
# A leaf reached only through a derivative that is constant zeros still gets a gradient
# ------------------------------------------------------------------------------------------------
def overwritten_by_copy(x, w, scale):
    h = x @ w
    h.copy_(scale)               # eager: w.grad is zeros (CopyBackwards still reaches w)
    return h


def _zeros_like_decomposed():
    # Inductor's decompositions (with FX compilers: fast) make the derivative of the
    # overwritten value a constant: the traced gradient depends on no tangent (fuzz seed 7348)
    from kiln.backends.inductor import decomposition_table

    return aot_backend(partition_fn="min_cut", decompositions=decomposition_table())


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_gradient_of_constant_zeros_is_zeros_not_none(dynamic):
    def make():
        return (rn(3, 4), rg(4, 4), rg(4))
    for backend in (aot_eager, _zeros_like_decomposed()):
        kiln.reset()
        compiled = kiln.compile(overwritten_by_copy, backend=backend, dynamic=dynamic)
        for run in (overwritten_by_copy, compiled):
            torch.manual_seed(0)
            x, w, s = make()
            (run(x, w, s) * 2).sum().backward()
            assert w.grad is not None and not w.grad.any()
            torch.testing.assert_close(s.grad, torch.full((4,), 6.0, dtype=s.dtype))
