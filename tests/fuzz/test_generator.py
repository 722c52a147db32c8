"""The fuzzer's own checks: programs are deterministic per seed, valid Python, mostly run
eagerly without an error, and cover the constructs the fuzzer is for."""
import collections

import pytest
import torch

from .generator import generate
from .program import Call
from .observe import Observation, compare, observe, snapshot
from .runner import load

N = 200


def test_same_seed_same_program():
    for seed in (0, 7, 123):
        assert generate(seed).source() == generate(seed).source()
    assert generate(1).source() != generate(2).source()


def test_programs_are_valid_python_and_diverse():
    tags = collections.Counter()
    for seed in range(N):
        prog = generate(seed)
        compile(prog.source(), f"seed_{seed}", "exec")
        tags.update(prog.tags)
    share = {t: c / N for t, c in tags.items()}
    # every construct of the brief shows up in a fair share of programs
    for tag, least in [("break", 0.5), ("inplace", 0.3), ("mutate_input", 0.3), ("view", 0.3), ("loop", 0.3),
                       ("branch", 0.3), ("data_branch", 0.1), ("closure", 0.2), ("module", 0.15), ("list", 0.2),
                       ("dict", 0.15), ("grad_block", 0.2), ("try", 0.1), ("raise", 0.1), ("backward_inside", 0.1),
                       ("mutate_object", 0.05), ("mutate_global", 0.15), ("accumulate", 0.1), ("import", 0.05),
                       ("autograd_function", 0.05), ("introspect", 0.05)]:
        assert share.get(tag, 0) >= least, f"{tag}: {share.get(tag, 0):.2f} of programs, want >= {least}"


def test_most_programs_run_eagerly_without_error():
    raised = 0
    n = 80
    for seed in range(n):
        prog = generate(seed)
        mod = load(prog.source(), f"kiln_fuzz_gen_{seed}", f"/kiln-fuzz/gen_{seed}.py")
        c = prog.calls[0]
        obs = observe(mod.fn, mod.make_inputs(c.seed, c.n, c.k, c.s, c.flag), mod.__dict__, c.grad)
        raised += obs.exception is not None or obs.backward_exception is not None
    assert raised / n < 0.25, f"{raised} of {n} programs raise eagerly: the generator writes too many invalid programs"


def _obs(**kw):
    base = dict(outputs=None, args=[], globals={}, printed="", grad_mode=True, aliasing=[])
    base.update(kw)
    return Observation(**base)


@pytest.mark.parametrize("field,a,b", [
    ("grad_mode", True, False),
    ("printed", "sum 1.0\n", "sum 2.0\n"),
    ("exception", None, "RuntimeError"),
])
def test_compare_catches_differences(field, a, b):
    assert compare(_obs(**{field: a}), _obs(**{field: a})) is None
    assert compare(_obs(**{field: a}), _obs(**{field: b})) is not None


def test_compare_tells_none_grad_from_zero_grad():
    def obs_with(grad):
        t = torch.ones(2, requires_grad=True)
        t.grad = grad
        return _obs(args=[snapshot(t)])
    assert compare(obs_with(None), obs_with(None)) is None
    assert compare(obs_with(None), obs_with(torch.zeros(2))) is not None


def test_printed_numbers_compare_within_float32_tolerance():
    assert compare(_obs(printed="v 1.0000001\n"), _obs(printed="v 1.0000002\n")) is None
    assert compare(_obs(printed="v 1.0\n"), _obs(printed="w 1.0\n")) is not None


def _off_by_one(gm, example_inputs):
    """A broken backend: every floating-point graph output is 1 too large."""
    def run(*args):
        out = gm(*args)
        bump = lambda o: o + 1 if isinstance(o, torch.Tensor) and o.is_floating_point() else o  # noqa: E731
        return type(out)(bump(o) for o in out) if isinstance(out, (tuple, list)) else bump(out)
    return run


def test_runner_flags_a_backend_that_changes_values_and_the_minimizer_shrinks_it():
    from .minimize import minimize
    from .runner import run_program
    from .test_regressions import program_of

    prog = program_of('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4), k)

def fn(x, k):
    n = k + 1
    print("n", n, file=LOG)
    y = x.sin() * n
    z = y.cos()
    return y
''', [Call(101, 3, 2, 0.5, False)])
    out = run_program(prog, _off_by_one)
    assert out.status == "wrong" and out.mismatch.kind == "outputs", out.describe()
    small, small_out = minimize(prog, _off_by_one, budget=60)
    assert small_out.status == "wrong"
    assert "z = y.cos()" not in small.source() and len(small.source()) < len(prog.source())
