"""Forward pre-hooks and forward hooks of modules called in compiled code are inlined, in
Module.__call__'s order, and guarded: registering or removing one recompiles. Backward hooks
still run the call natively."""
import pytest
import torch
import torch.nn as nn

import kiln


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def graphs(model, *args):
    r = kiln.explain(model)(*args)
    return r.graph_count, r.graph_break_count


def check(model, compiled, x):
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = model(x1)
    ref.sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    out = compiled(x2)
    out.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x2.grad, x1.grad)
    for p, g in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, g)
    model.zero_grad()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_forward_hooks_and_pre_hooks_are_inlined_in_one_graph(backend):
    torch.manual_seed(0)
    m = Net()
    m.a.register_forward_hook(lambda mod, args, out: out * 2)
    m.b.register_forward_pre_hook(lambda mod, args: args[0] + 1)        # one value: a 1-tuple
    m.b.register_forward_hook(lambda mod, args, out: None)               # None: output kept
    m.b.register_forward_pre_hook(lambda mod, args, kwargs: ((args[0] * 3,), kwargs), with_kwargs=True)
    m.a.register_forward_hook(lambda mod, args, kwargs, out: out - args[0].sum(), with_kwargs=True)
    check(m, kiln.compile(m, backend=backend, fullgraph=True), torch.randn(3, 4))
    assert graphs(m, torch.randn(3, 4)) == (1, 0)


def test_registering_and_removing_a_hook_recompiles():
    torch.manual_seed(0)
    m = Net()
    c = kiln.compile(m, backend="aot_eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(c(x), m(x))
    h = m.a.register_forward_hook(lambda mod, args, out: out * -1)
    torch.testing.assert_close(c(x), m(x))
    h2 = m.a.register_forward_hook(lambda mod, args, out: out + 5)      # two, in order
    torch.testing.assert_close(c(x), m(x))
    h.remove()
    torch.testing.assert_close(c(x), m(x))
    h2.remove()
    torch.testing.assert_close(c(x), m(x))


def test_a_hook_that_marks_an_output_as_requiring_grad():
    """Hugging Face's enable_input_require_grads: ``out.requires_grad_(True)`` on an output that
    requires grad already changes nothing."""
    m = Net()
    m.a.register_forward_hook(lambda mod, args, out: out.requires_grad_(True))
    check(m, kiln.compile(m, backend="aot_eager", fullgraph=True), torch.randn(3, 4))


def test_backward_hooks_still_run_natively():
    m = Net()
    seen = []
    m.a.register_full_backward_hook(lambda mod, gin, gout: seen.append(1))
    c = kiln.compile(m, backend="aot_eager")
    check(m, c, torch.randn(3, 4))
    assert seen == [1, 1]
    with pytest.raises(kiln.Unsupported, match="backward hooks"):
        kiln.compile(m, backend="aot_eager", fullgraph=True)(torch.randn(3, 4))


def test_hf_gradient_checkpointing_is_one_graph():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=2, vocab_size=256)
    m = transformers.LlamaForCausalLM(cfg)
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 256, (2, 16))
    ref = m(input_ids=ids, labels=ids).loss
    ref.backward()
    want = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    loss = kiln.compile(m, backend="aot_eager")(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.testing.assert_close(loss, ref)
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, want[n], atol=1e-5, rtol=1e-4)
    r = kiln.explain(m)(input_ids=ids, labels=ids)
    assert (r.graph_count, r.graph_break_count) == (1, 0)


def test_hooks_that_run_outside_graphs_run_natively_around_the_compiled_forward():
    """Hooks torch marks to run outside compiled graphs (FSDP2's are such): a break at the
    module's call, the hooks run natively, in order, and the module's forward is compiled."""
    m = Net()
    seen = []

    @torch._disable_dynamo
    def pre(mod, args):
        seen.append("pre")
        return (args[0] * 2,)

    @torch._disable_dynamo
    def post(mod, args, out):
        seen.append("post")
        return out + 1

    m.a.register_forward_pre_hook(pre)
    m.a.register_forward_hook(post)
    counter = kiln.testing.CompileCounter()
    c = kiln.compile(m, backend=counter)
    check(m, c, torch.randn(3, 4))
    assert seen == ["pre", "post"] * 2
    ops = [n.target for g in counter.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert torch._C._nn.linear in ops or torch.nn.functional.linear in ops   # m.a's forward compiled


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_global_module_hook_never_sees_kilns_own_graphs(backend, tmp_path, monkeypatch):
    """kiln's AOT stages call its own GraphModules: a user's global nn.Module pre-hook must not
    run on them (on fake tensors, baked into the graph), at the compile or at a later one (a
    graph break's continuation), as eager never calls a module here."""
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path))     # (a cold compile)
    seen = []

    def pre(mod, args):
        seen.append(type(mod).__name__)
        return tuple(a * 2 if isinstance(a, torch.Tensor) else a for a in args)

    def g(x):
        y = (x * 3).sum()
        print("", end="")           # a graph break: its continuation is compiled too
        return y + x.cos().sum()

    x = torch.randn(2, 3)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    try:
        kiln.reset()
        got, expected = kiln.compile(g, backend=backend)(x), g(x)
    finally:
        handle.remove()
    torch.testing.assert_close(got, expected)
    assert seen == []
