"""``torch._foreach_addcdiv(_)`` / ``_foreach_addcmul(_)`` with their ``scalars`` given as a CPU
tensor (one number per list item): what a foreach optimizer step calls while compiling, after
stacking its step sizes. FakeTensor's foreach rule cannot run it, so the capture computes the
same arithmetic with foreach ops over the tensor's elements. Compared with eager in one graph;
an optimizer's foreach step compiles and trains as eager does; scalars eager refuses are still
refused."""
import pytest
import torch

import kiln
from kiln.backends.registry import lookup_backend
from kiln.testing import CompileCounter


def _lists(seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (5,), (2, 2, 2)]
    return ([torch.randn(s, generator=g) for s in shapes], [torch.randn(s, generator=g) for s in shapes],
            [torch.rand(s, generator=g) + 0.5 for s in shapes])


def _counting(backend):
    inner, graphs = lookup_backend(backend)[0], []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inner(gm, example_inputs)
    return counting, graphs


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_foreach_ops_with_a_scalars_tensor_are_one_graph_and_match_eager(backend):
    def f(ps, a, b, sizes):
        scalars = torch.stack([s * -1 for s in sizes])        # as torch.optim stacks them
        torch._foreach_addcdiv_(ps, a, b, scalars)
        out = torch._foreach_addcmul(ps, a, b, scalars)
        by_name = torch._foreach_addcdiv(ps, a, b, scalars=scalars)
        return out, by_name

    kiln.reset()
    counting, graphs = _counting(backend)
    compiled = kiln.compile(f, backend=counting)
    for seed in (0, 1):
        mine, ref = _lists(seed), _lists(seed)
        sizes = [torch.tensor(0.1 * (i + 1)) for i in range(3)]
        got, want = compiled(*mine, sizes), f(*ref, sizes)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(mine[0], ref[0])         # the in-place write
    assert len(graphs) == 1
    code = graphs[0].code       # (the whole function, in the rewritten form: no break before the ops)
    assert "_foreach_addcdiv" not in code and "unbind" in code and "_foreach_add_" in code


def test_scalars_eager_refuses_are_refused():
    def f(ps, a, b, scalars):
        torch._foreach_addcdiv_(ps, a, b, scalars)

    compiled = kiln.compile(f, backend="aot_eager")
    for scalars in (torch.ones(2), torch.ones(3, 1)):       # wrong count, wrong shape
        with pytest.raises(RuntimeError) as eager_error:
            f(*_lists(0), scalars)
        with pytest.raises(RuntimeError) as compiled_error:
            compiled(*_lists(0), scalars)
        assert type(compiled_error.value) is type(eager_error.value)


@pytest.mark.parametrize("name", ["Adam", "AdamW", "NAdam", "RAdam"])
def test_a_foreach_optimizer_step_compiles_and_trains_as_eager(name):
    def train(compile_step):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        opt = getattr(torch.optim, name)(model.parameters(), lr=0.01, foreach=True)

        def step():
            opt.step()
        step = compile_step(step)
        for i in range(4):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
            model(x).pow(2).mean().backward()
            step()
            opt.zero_grad()
        return [p.detach() for p in model.parameters()]

    kiln.reset()
    counter = CompileCounter()
    got = train(lambda fn: kiln.compile(fn, backend=counter))
    want = train(lambda fn: fn)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # (the update itself is captured: before, every Adam-family call ran eagerly)
    assert counter.frame_count >= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_foreach_optimizer_step_on_cuda_under_inductor():
    """CUDA parameters with the step counts on the CPU (an eager first step made them there):
    torch.optim's default foreach path, with its step sizes stacked on the CPU."""
    def train(compile_step):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)      # (foreach by default on CUDA)

        def step():
            opt.step()
        compiled = compile_step(step)
        for i in range(3):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i)).cuda()
            model(x).pow(2).mean().backward()
            (step if i == 0 else compiled)()
            opt.zero_grad()
        return [p.detach().cpu() for p in model.parameters()]

    kiln.reset()
    counting, graphs = _counting("inductor")
    got = train(lambda fn: kiln.compile(fn, backend=counting))
    want = train(lambda fn: fn)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert any("unbind" in gm.code for gm in graphs)
