"""The fuzzer tells float noise from wrong answers (``noise.py``).

The backends here are the user's callables, each a known kind of compiler: one that computes
more precisely than eager (a legitimate difference), one that adds a constant (a miscompile),
one that computes float32 in bfloat16 (a precision-losing miscompile)."""
import torch

from .noise import deviation, in_float64
from .observe import observe
from .program import Call, SourceProgram
from .runner import load, run_program

INPUTS = '''
import torch
import math


def make_inputs(seed, n, k, s, flag):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 64, generator=g, dtype=torch.float32),)
'''

# two orders of one sum, subtracted and scaled: all that is left is rounding, times 1e9
ILL_CONDITIONED = INPUTS + '''

def fn(x):
    a = x.sum()
    b = x.sum(dim=0).sum()
    return (a - b) * 1e9
'''

# the shape: a float read with .item() and floored at a step finer than its rounding
FLOORED = INPUTS + '''

def fn(x):
    t = (x * 0.37).sum() + x.sum(dim=0).sum() * 0.63
    return math.floor(t.item() * 1e7)
'''

WELL_CONDITIONED = INPUTS + '''

def fn(x):
    return x.sin().sum(dim=1) * 2.0
'''

CALLS = [Call(seed=s, n=8, k=1, s=0.5, flag=False) for s in (11, 12)]


def program(text: str) -> SourceProgram:
    return SourceProgram(7, text, ["x"], CALLS)


def _map_outputs(out, f):
    if isinstance(out, torch.Tensor):
        return f(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_map_outputs(o, f) for o in out)
    return out


def _computing_float32_in(dtype):
    """A backend that computes float32 inputs in ``dtype`` and rounds the results back."""
    def backend(gm, example_inputs):
        def run(*args):
            if not any(isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in args):
                return gm(*args)
            cast = [a.to(dtype) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a for a in args]
            return _map_outputs(gm(*cast), lambda t: t.float() if t.dtype == dtype else t)
        return run
    return backend


# eager's function, other bits: float32 computed in float64
more_precise = _computing_float32_in(torch.float64)
# a miscompile that loses precision
in_bfloat16 = _computing_float32_in(torch.bfloat16)


def plus_one(gm, example_inputs):
    return lambda *args: _map_outputs(gm(*args), lambda t: t + 1 if t.is_floating_point() else t)


def test_rounding_amplified_by_the_program_is_noise():
    out = run_program(program(ILL_CONDITIONED), more_precise)
    assert out.status == "noise", out.describe()


def test_a_floored_item_that_flips_is_noise():
    # the floor flips only where kiln's last bits cross a step: try inputs until one does
    found = None
    for s in range(40):
        calls = [Call(seed=s, n=8, k=1, s=0.5, flag=False)]
        out = run_program(SourceProgram(7, FLOORED, ["x"], calls), more_precise)
        if out.status != "ok":
            found = out
            break
    assert found is not None, "no input made the floored value differ"
    assert found.status == "noise", found.describe()


def test_a_miscompile_of_an_ill_conditioned_program_is_wrong():
    out = run_program(program(ILL_CONDITIONED), plus_one)
    assert out.status == "wrong", out.describe()


def test_lost_precision_is_wrong_even_where_the_program_amplifies_rounding():
    out = run_program(program(ILL_CONDITIONED), in_bfloat16)
    assert out.status == "wrong", out.describe()


def test_a_well_conditioned_program_is_never_noise():
    out = run_program(program(WELL_CONDITIONED), in_bfloat16)
    assert out.status == "wrong", out.describe()
    out = run_program(program(WELL_CONDITIONED), plus_one)
    assert out.status == "wrong", out.describe()


def test_deviation_is_the_largest_numeric_difference():
    mod = load(WELL_CONDITIONED, "kiln_fuzz_noise_dev", "/kiln-fuzz/noise_dev.py")
    x = mod.make_inputs(1, 4, 1, 0.5, False)[0]
    a = observe(mod.fn, (x,), mod.__dict__)
    b = observe(lambda x: mod.fn(x) + 0.25, (x.clone(),), mod.__dict__)
    assert abs(deviation(a, b) - 0.25) < 1e-6
    c = observe(lambda x: mod.fn(x)[:2], (x.clone(),), mod.__dict__)
    assert deviation(a, c) == float("inf")      # another shape is not a number's difference


def test_float64_version_names_no_float32():
    text = in_float64(program(ILL_CONDITIONED + "\ny = torch.ones(2).float()\n")).source()
    assert "float32" not in text and ".float()" not in text and "torch.float64" in text
