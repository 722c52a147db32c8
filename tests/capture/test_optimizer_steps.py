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
