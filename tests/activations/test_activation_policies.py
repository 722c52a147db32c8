"""Built-in activation policies: cast, fp8, offload, the size threshold,
report() and KILN_LOGS=activations. Compared with eager under the same policy (the policy's
own rounding is the only allowed difference) and with kiln without hooks."""
import pytest
import torch

import kiln
from kiln.activations import report as full_report
from kiln.activations.report import clear


@pytest.fixture(autouse=True)
def _fresh_report():
    clear()
    yield
    clear()


class MLP(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.a = torch.nn.Linear(d, 4 * d)
        self.b = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return (self.b(torch.nn.functional.gelu(self.a(x))) + x).pow(2).mean()


def step(model, x, policy):
    model.zero_grad(set_to_none=True)
    with policy:
        loss = model(x)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


class _none:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _compare(policy_factory, rtol, atol):
    torch.manual_seed(0)
    model = MLP()
    compiled = kiln.compile(model, backend="aot_eager")
    for _ in range(2):
        x = torch.randn(16, 32)
        loss_k, grads_k = step(compiled, x, policy_factory())
        loss_e, grads_e = step(model, x, policy_factory())
        loss_0, grads_0 = step(model, x, _none())
        torch.testing.assert_close(loss_k, loss_0)            # the forward is exact
        torch.testing.assert_close(loss_k, loss_e)
        for gk, ge, g0 in zip(grads_k, grads_e, grads_0):
            torch.testing.assert_close(gk, ge, rtol=rtol, atol=atol)
            torch.testing.assert_close(gk, g0, rtol=rtol, atol=atol)
    assert len(compiled.entries) == 1       # a new policy object with the same settings: no recompile
    return compiled


def test_cast_bfloat16_matches_eager_to_its_rounding_and_halves_activations():
    compiled = _compare(lambda: kiln.activations.cast(torch.bfloat16, min_bytes=0), rtol=3e-2, atol=3e-3)
    cg = compiled.entries[0].compiled_graph
    assert "torch.bfloat16" in cg.forward_graph.code and "_to_copy" in cg.forward_graph.code
    assert "float32" in cg.backward_graph.code
    rep = kiln.activations.cast(torch.bfloat16, min_bytes=0).report()
    assert rep.rows and rep.bytes_after < rep.bytes_before
    # every packed activation was float32: at least the packed ones are halved
    assert rep.bytes_after <= rep.bytes_before * 0.75


def test_cast_float64_to_float32():
    model = MLP().double()
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(8, 32, dtype=torch.float64)
    loss_k, grads_k = step(compiled, x, kiln.activations.cast(torch.float32, min_bytes=0))
    loss_0, grads_0 = step(model, x, _none())
    torch.testing.assert_close(loss_k, loss_0)
    for a, b in zip(grads_k, grads_0):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert full_report().bytes_after < full_report().bytes_before


def test_threshold_keeps_small_tensors_unchanged():
    torch.manual_seed(0)
    model = MLP()
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(16, 32)
    loss_k, grads_k = step(compiled, x, kiln.activations.cast(torch.bfloat16, min_bytes=1 << 30))
    loss_0, grads_0 = step(model, x, _none())
    for a, b in zip(grads_k, grads_0):
        torch.testing.assert_close(a, b)
    rep = full_report()
    assert rep.rows and rep.bytes_after == rep.bytes_before
    assert "bfloat16" not in compiled.entries[0].compiled_graph.forward_graph.code


def test_other_settings_recompile():
    model = MLP()
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(16, 32)
    step(compiled, x, kiln.activations.cast(torch.bfloat16, min_bytes=0))
    step(compiled, x, kiln.activations.cast(torch.float16, min_bytes=0))
    assert len(compiled.entries) == 2
    assert "SAVED_TENSOR_HOOKS" in compiled.recompile_reasons[-1]


@pytest.mark.skipif(not kiln.activations.fp8_supported("cpu")[0], reason="no float8 conversion on this CPU build")
def test_fp8_per_tensor_scale():
    compiled = _compare(lambda: kiln.activations.fp8(min_bytes=0), rtol=0.15, atol=2e-2)
    code = compiled.entries[0].compiled_graph.forward_graph.code
    assert "float8_e4m3fn" in code and "amax" in code
    rep = full_report()
    assert rep.bytes_after < 0.5 * rep.bytes_before


def test_offload_on_cpu_changes_nothing_and_says_so(capsys):
    kiln.set_logs("activations")
    torch.manual_seed(0)
    model = MLP()
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(16, 32)
    policy = kiln.activations.offload(min_bytes=0)
    loss_k, grads_k = step(compiled, x, policy)
    loss_0, grads_0 = step(model, x, _none())
    for a, b in zip(grads_k, grads_0):
        torch.testing.assert_close(a, b)
    err = capsys.readouterr().err
    if not torch.cuda.is_available():
        assert "offload: no accelerator" in err
    assert "saved-tensor hooks inlined" in err          # KILN_LOGS=activations shows each graph
    rep = policy.report()
    assert rep.bytes_after == rep.bytes_before and rep.offloaded_bytes == 0


def test_report_prints_a_table():
    model = MLP()
    compiled = kiln.compile(model, backend="aot_eager")
    step(compiled, torch.randn(16, 32), kiln.activations.cast(torch.bfloat16, min_bytes=0))
    rep = kiln.activations.report()
    text = str(rep)
    assert "before" in text and "after" in text and "total" in text and "cast(torch.bfloat16" in text
    assert rep.bytes_before > 0 and 0 < rep.saved_fraction < 1
    assert kiln.activations.report(reset=True).rows and not kiln.activations.report().rows


def test_bad_arguments():
    with pytest.raises(TypeError):
        kiln.activations.cast(torch.int32)
    with pytest.raises(ValueError):
        kiln.activations.cast(torch.bfloat16, min_bytes=-1)
    with pytest.raises(ValueError):
        kiln.activations.fp8(min_bytes=1.5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["cast", "fp8", "offload"])
def test_policies_on_cuda(name):
    policy = {"cast": lambda: kiln.activations.cast(torch.bfloat16, min_bytes=0),
              "fp8": lambda: kiln.activations.fp8(min_bytes=0),
              "offload": lambda: kiln.activations.offload(min_bytes=0)}[name]
    torch.manual_seed(0)
    model = MLP().cuda()
    compiled = kiln.compile(model, backend="inductor")
    x = torch.randn(16, 32, device="cuda")
    loss_k, grads_k = step(compiled, x, policy())
    loss_0, grads_0 = step(model, x, _none())
    torch.testing.assert_close(loss_k, loss_0, rtol=1e-4, atol=1e-5)
    tol = {"cast": (3e-2, 3e-3), "fp8": (0.15, 2e-2), "offload": (1e-4, 1e-5)}[name]
    for a, b in zip(grads_k, grads_0):
        torch.testing.assert_close(a, b, rtol=tol[0], atol=tol[1])
    rep = full_report()
    if name == "offload":
        assert rep.offloaded_bytes > 0 and rep.bytes_after < rep.bytes_before
    else:
        assert rep.bytes_after < rep.bytes_before


def test_cast_with_inductor():
    torch.manual_seed(0)
    model = MLP()
    compiled = kiln.compile(model, backend="inductor")
    x = torch.randn(16, 32)
    for policy in (kiln.activations.cast(torch.bfloat16, min_bytes=0), kiln.activations.cast(torch.bfloat16, min_bytes=0)):
        loss_k, grads_k = step(compiled, x, policy)
        loss_e, grads_e = step(model, x, kiln.activations.cast(torch.bfloat16, min_bytes=0))
        torch.testing.assert_close(loss_k, loss_e)
        for a, b in zip(grads_k, grads_e):
            torch.testing.assert_close(a, b, rtol=3e-2, atol=3e-3)
    assert len(compiled.entries) == 1
    rep = full_report()
    assert rep.rows and rep.bytes_after < rep.bytes_before


# -- what the lossy policies round, and where pack runs ----------------------------------------

def _grads(fn, policy, *args):
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    with policy:
        out = fn(*args)
    out.backward()
    return [a.grad for a in args if a.requires_grad]


def test_lossy_policies_keep_log_probabilities_exact():
    """Cross-entropy's backward reads the saved log-probabilities through exp: rounded to fp8
    they give gradients off by tens of percent (what eager hooks do); compiled, they stay exact."""
    torch.manual_seed(0)
    z, w = torch.randn(64, 32, requires_grad=True), torch.randn(32, 512) * 3
    t = torch.randint(0, 512, (64,))

    def loss(z):
        return torch.nn.functional.cross_entropy(z @ w, t)
    exact = _grads(loss, _none(), z)[0]
    for policy in (lambda: kiln.activations.fp8(min_bytes=0),
                   lambda: kiln.activations.cast(torch.bfloat16, min_bytes=0)):
        compiled = kiln.compile(loss, backend="aot_eager")
        torch.testing.assert_close(_grads(compiled, policy(), z)[0], exact)
    eager_fp8 = _grads(loss, kiln.activations.fp8(min_bytes=0), z)[0]
    assert (eager_fp8 - exact).abs().max() > 10 * (exact.abs().max() * 1e-3)   # why this matters


def test_fp8_saves_probabilities_in_bfloat16():
    torch.manual_seed(0)
    z, v = torch.randn(8, 64, 64, requires_grad=True), torch.randn(8, 64, 16)

    def attention(z):
        return (torch.softmax(z, dim=-1) @ v).square().sum()
    exact = _grads(attention, _none(), z)[0]
    compiled = kiln.compile(attention, backend="aot_eager")
    got = _grads(compiled, kiln.activations.fp8(min_bytes=0), z)[0]
    torch.testing.assert_close(got, exact, rtol=2e-2, atol=2e-2 * exact.abs().max().item())
    fw = compiled.entries[0].compiled_graph.forward_graph.graph
    softmax = next(n for n in fw.nodes if n.target == torch.ops.aten._softmax.default)
    packed = [u for u in softmax.users if u.meta.get("kiln_saved_hook")]
    assert [u.kwargs.get("dtype") for u in packed] == [torch.bfloat16]
    # the other activation (the input of square) is fp8
    assert any(n.kwargs.get("dtype") == torch.float8_e4m3fn for n in fw.nodes if n.op == "call_function")


def test_pack_runs_right_after_the_last_forward_use():
    """Pack is inlined after the saved tensor's last use in the forward (not at the end of the
    graph), so the graph can free the full tensor there: offload and fp8 lower the peak."""
    torch.manual_seed(0)
    model = MLP()
    compiled = kiln.compile(model, backend="aot_eager")
    step(compiled, torch.randn(16, 32), kiln.activations.cast(torch.bfloat16, min_bytes=0))
    fw = compiled.entries[0].compiled_graph.forward_graph.graph
    nodes = list(fw.nodes)
    packs = {}
    for i, n in enumerate(nodes):
        tag = n.meta.get("kiln_saved_hook")
        if tag and tag[0] == "pack":
            packs.setdefault(tag[1], i)
    assert packs
    by_name = {n.name: n for n in nodes}
    for saved, first in packs.items():
        users = [nodes.index(u) for u in by_name[saved].users if u.op != "output"
                 and not u.meta.get("kiln_saved_hook")]
        last = max(users, default=nodes.index(by_name[saved]))
        between = [n for n in nodes[last + 1:first] if not n.meta.get("kiln_saved_hook")]
        assert not between, f"pack of {saved} runs after {[n.name for n in between]}"
