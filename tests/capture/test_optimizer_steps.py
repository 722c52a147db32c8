"""A compiled ``torch.optim`` step: while it is captured, each param group's ``capturable``
reads True (as torch.compile traces it), so the step is torch.optim's tensor-math
implementation, one graph with no break, whatever the optimizer. Parameters equal eager's
within float rounding; the real setting is not changed; a group that cannot run as capturable
(step counts on the CPU beside CUDA parameters) keeps the default implementation."""
import pytest
import torch

import kiln
from kiln.testing import CompileCounter

OPTIMIZERS = ["SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop", "Adadelta"]


def _train(name, foreach, compile_step, device="cpu", steps=4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
    kwargs = {"lr": 0.01, "foreach": foreach, **({"momentum": 0.9} if name == "SGD" else {})}
    opt = getattr(torch.optim, name)(model.parameters(), **kwargs)
    step = compile_step(opt.step)
    for i in range(steps):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i)).to(device)
        model(x).pow(2).mean().backward()
        step()
        opt.zero_grad()
    return [p.detach().cpu() for p in model.parameters()], opt


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_step_is_one_graph_and_trains_as_eager(name, foreach):
    kiln.reset()
    counter = CompileCounter()
    got, opt = _train(name, foreach, lambda fn: kiln.compile(fn, backend=counter))
    want, _ = _train(name, foreach, lambda fn: fn)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the first step creates the state; every later step is the same graph (RAdam's and
    # ASGD's default implementations branch on their step counts: a graph per count before)
    assert counter.frame_count == (1 if name == "Adagrad" else 2)      # (Adagrad's state is made in __init__)
    assert all(group["capturable"] is False for group in opt.param_groups if "capturable" in group)


def test_the_update_is_the_capturable_implementation():
    counter = CompileCounter()
    _train("RAdam", False, lambda fn: kiln.compile(fn, backend=counter))
    # (tensor math where the default one branches on ``rho_t > 5``)
    assert any("where" in gm.code for gm in counter.graphs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["AdamW", "RAdam"])
def test_a_cuda_optimizer_step_compiled_from_its_first_step(name):
    kiln.reset()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return kiln.backends.registry.lookup_backend("inductor")[0](gm, example_inputs)

    got, opt = _train(name, None, lambda fn: kiln.compile(fn, backend=counting), device="cuda")
    want, _ = _train(name, None, lambda fn: fn, device="cuda")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert len(graphs) == 2
    # (made as a capturable optimizer makes them: on the parameters' device)
    assert all(s["step"].device.type == "cuda" for s in opt.state.values())


def test_a_compiled_training_step_with_a_scheduler_keeps_the_real_setting():
    """A compiled function that steps the optimizer and a scheduler writes the groups back
    (their ``lr``): ``capturable`` keeps its own value there."""
    def run(compile_fn):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

        def step(x):
            model(x).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            return opt.param_groups[0]["capturable"]
        step = compile_fn(step)
        seen = [step(torch.randn(3, 4, generator=torch.Generator().manual_seed(i))) for i in range(3)]
        return [p.detach() for p in model.parameters()], opt.param_groups, seen

    got, got_groups, got_seen = run(lambda fn: kiln.compile(fn, backend="aot_eager"))
    want, want_groups, want_seen = run(lambda fn: fn)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert got_seen == want_seen == [False] * 3
    assert [(g["lr"], g["capturable"]) for g in got_groups] == [(g["lr"], g["capturable"]) for g in want_groups]
