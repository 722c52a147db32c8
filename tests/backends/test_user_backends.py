"""A backend of the user's own, built on torch's AOT autograd (``aot_module_simplified``),
as tutorials write them. It is handed the graph with the capture's fake mode (a
TracingContext) and its symbolic sizes as SymInts, as dynamo hands them: the AOT trace is
then as general as the graph, and a graph compiled for dynamic sizes gives eager's answer at
every size its guards admit."""
import pytest
import torch
from torch._functorch.aot_autograd import aot_module_simplified

import kiln

SEEN = []


def aot_backend(gm, example_inputs):
    SEEN.append(list(example_inputs))
    return aot_module_simplified(gm, example_inputs, fw_compiler=lambda g, _: g.forward)


@pytest.mark.parametrize("dynamic", [None, True])
def test_sizes_stay_symbolic_in_a_users_aot_backend(dynamic):
    def f(a, b):
        return (a.view(-1, 2) * b.shape[0]).sum(1)

    kiln.reset()
    SEEN.clear()
    compiled = kiln.compile(f, backend=aot_backend, dynamic=dynamic)
    for n in (4, 6, 8, 10):     # (the second size makes the sizes dynamic, when not already)
        a = torch.randn(n, requires_grad=True)
        b = torch.randn(n)
        expected = f(a, b)
        expected.sum().backward()
        grad, a.grad = a.grad, None
        got = compiled(a, b)
        got.sum().backward()
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(a.grad, grad)
    assert len(SEEN) <= 2


def test_an_int_argument_stays_symbolic_in_a_users_aot_backend():
    def f(t1, t2, d):
        return torch.add(t1, t2, alpha=d)

    kiln.reset()
    SEEN.clear()
    compiled = kiln.compile(f, backend=aot_backend, dynamic=True)
    t1 = torch.arange(3.0).requires_grad_(True)
    t2 = torch.arange(3.0).requires_grad_(True)
    for d in (5, 6, 7):
        torch.testing.assert_close(compiled(t1, t2, d), f(t1, t2, d))
    assert len(SEEN) == 1
    assert any(isinstance(x, torch.SymInt) for x in SEEN[0])


def test_a_dynamic_graph_takes_the_symbols_its_inputs_are_sized_by():
    """The symbol of a dynamic size is a graph input even when no op reads it (as dynamo hands
    graphs over): an FX pass such as split_module looks each symbol up by name."""
    from torch.fx.passes.split_module import split_module

    seen = []

    def backend(gm, example_inputs):
        seen.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
        parts = split_module(gm, None, lambda node: 0)
        return parts.forward

    def f(a):
        return (a + 1).mul_(2)

    g = kiln.compile(f, backend=backend, dynamic=True)
    for n in (4, 6, 8):
        a = torch.ones(n)
        torch.testing.assert_close(g(a), f(torch.ones(n)))
    assert len(seen) == 1 and len(seen[0]) == 2       # the size's symbol, then the tensor


def test_a_users_backend_calling_kilns_aot_eager_loads_graph_constants_as_real_tensors():
    """A user's backend runs inside the capture's TracingContext, where torch.load makes meta
    storages; kiln's aot_eager called from it loads its cache entry there (the second
    compile): the graph's tensor constant must come back as the CPU tensor it was."""
    aot_eager = kiln.backends.lookup_backend("aot_eager")[0]
    calls = []

    def backend(gm, example_inputs):
        calls.append(gm)
        return aot_eager(gm, example_inputs)

    def f(x):
        return x.sin() + torch.tensor([2.0, 3.0, 4.0])

    for _ in range(2):      # the second compile is a cache hit
        kiln.reset()
        compiled = kiln.compile(f, backend=backend)
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), f(x))
        (entry,) = compiled.entries
        assert not entry.is_eager, entry.eager_reason
    assert len(calls) == 2
