"""Dicts keyed by tensors (an optimizer's ``state``, keyed by its parameters): the key tensors
are values of the graph and a lookup finds them by identity, as Python does. The dict's keys
are guarded by identity: another tensor with the same data is another key. Compared with
eager; graph and break counts asserted; a compiled optimizer step is one graph with no break."""
import pytest
import torch

import kiln
from kiln.testing import CompileCounter


def test_a_lookup_by_a_tensor_key_and_iteration_are_one_graph():
    a, b = torch.randn(3), torch.randn(3)
    table = {a: torch.tensor(2.0), b: torch.tensor(3.0), "bias": 1.0}

    def f(x, key):
        total = x * table[key] + table["bias"]
        for k, v in table.items():
            if isinstance(k, torch.Tensor):
                total = total + k * v
        return total, key in table

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    x = torch.randn(3)
    for key in (a, b, a):
        torch.testing.assert_close(compiled(x, key), f(x, key))
    assert counter.frame_count == 2        # (one per key: the argument is the one or the other)
    table[a] = torch.tensor(5.0)           # another value under the same key: no recompile
    torch.testing.assert_close(compiled(x, a), f(x, a))
    assert counter.frame_count == 2
    assert kiln.explain(f)(x, a).graph_break_count == 0


def test_another_tensor_with_the_same_data_is_another_key():
    a = torch.ones(2)
    table = {a: torch.tensor(1.0)}

    def f(x):
        return x + sum(v for v in table.values()) + len(table)

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter)
    x = torch.randn(2)
    torch.testing.assert_close(compiled(x), f(x))
    twin = a.clone()
    table[twin] = torch.tensor(10.0)        # same data as a, another key: the dict grew
    torch.testing.assert_close(compiled(x), f(x))
    del table[a]                            # one key, not the guarded one
    torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 3


class LayerTable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = torch.nn.Linear(3, 3)
        self.order = {self.b: 0, self.a: 1}
        self.scale = {self.a: 2.0, self.b: 3.0}

    def forward(self, x):
        for m in sorted(self.order, key=lambda m: self.order[m]):
            x = m(x) * self.scale[m]
        for m, i in self.order.items():
            x = x + i
        return x, self.a in self.scale


def test_a_dict_keyed_by_modules_is_read_by_identity_and_guarded():
    model = LayerTable()
    cnt = CompileCounter()
    compiled = kiln.compile(model, backend=cnt, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 3)
        torch.testing.assert_close(compiled(x), model(x))
    assert cnt.frame_count == 1
    model.order = {model.a: 0, model.b: 1}        # the other order: another entry
    x = torch.randn(2, 3)
    torch.testing.assert_close(compiled(x), model(x))
    assert cnt.frame_count == 2
    with torch.no_grad():                          # the modules' state is read at each call
        model.a.weight.mul_(2)
    torch.testing.assert_close(compiled(x), model(x))
    assert cnt.frame_count == 2


def test_a_key_missing_raises_keyerror_as_in_eager():
    a, other = torch.randn(2), torch.randn(2)
    table = {a: 1.0}

    def f(key):
        return table[key]

    compiled = kiln.compile(f, backend="aot_eager")
    assert compiled(a) == 1.0
    with pytest.raises(KeyError):
        compiled(other)


@pytest.mark.parametrize("name, kwargs", [("AdamW", {}), ("Adam", {"foreach": True}),
                                          ("SGD", {"momentum": 0.9})])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_optimizer_step_is_one_graph_with_no_break(name, kwargs, backend):
    def train(compile_step):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        opt = getattr(torch.optim, name)(model.parameters(), lr=0.01, **kwargs)
        step = compile_step(opt.step)
        for i in range(4):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
            model(x).pow(2).mean().backward()
            step()
            opt.zero_grad()
        return [p.detach() for p in model.parameters()], opt

    kiln.reset()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return kiln.backends.registry.lookup_backend(backend)[0](gm, example_inputs)

    got, opt = train(lambda fn: kiln.compile(fn, backend=counting))
    want, _ = train(lambda fn: fn)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the first step creates the state, the others run one graph
    assert len(graphs) == 2
    assert kiln.explain(opt.step)().graph_break_count == 0


def test_the_optimizer_step_is_one_graph_after_torch_compile_patched_the_optimizers():
    """torch.compile's first compile in a process wraps every optimizer's ``_init_group`` in
    ``torch._dynamo.disable`` (dynamo runs it itself): kiln still inlines the method, so a
    process that also runs torch.compile captures the same step."""
    import torch._dynamo

    torch._dynamo.eval_frame.TorchPatcher.patch()
    assert getattr(torch.optim.AdamW._init_group, "_torchdynamo_disable", False)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        model(torch.randn(2, 8)).sum().backward()
        explained = kiln.explain(opt.step)()
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)
        opt.step()
        opt.zero_grad()
