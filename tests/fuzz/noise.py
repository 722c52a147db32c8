"""Float noise: a mismatch that is rounding amplified by the program, not a kiln bug.

A compiled program may sum in another order or fuse an expression, so its float32 results
differ from eager's in the last bits. A program that amplifies those bits
(``math.floor(t.sum().item() * 1000) / 1000``, a difference of two equal sums scaled by 1e9,
a branch on such a value) then differs from eager by far more than any tolerance. torch.compile
fails the same programs the same way.

A mismatch counts as noise only when all three hold:

1. **The program is ill-conditioned.** Eager itself, run again on inputs perturbed by a few
   units of float32 rounding, already fails the comparison with eager on the exact inputs.
2. **kiln's difference is of that size.** The largest difference between kiln's and eager's
   numbers is at most ``SPREAD_FACTOR`` times the largest difference that the perturbations
   made (a difference of structure, such as another branch taken, is infinite on both sides
   or not noise). A miscompile that loses precision (float32 computed in bfloat16) is far
   bigger than the program's own rounding spread and stays a failure.
3. **In float64 kiln agrees.** The same program with every float32 made float64 (inputs,
   casts, parameters through the default dtype) runs with no mismatch. A real miscompile
   computes a different function, which float64 does not hide.

Everything else stays ``wrong``, so a real failure is never hidden among these.
"""
from __future__ import annotations

import contextlib
import math
import re
import sys

import torch

from .observe import _NUMBER, Observation, TensorSnap, _flat_tensors, compare, observe

SPREAD_FACTOR = 10.0

# relative size of each perturbation, and the seed of its noise: a few ulps to a few hundred
PERTURBATIONS = ((1e-7, 1), (1e-7, 2), (1e-6, 3), (1e-6, 4), (1e-5, 5), (1e-5, 6))

# mismatches that rounding can cause; kiln raising, aliasing, grad mode and memory never are
NOISY_KINDS = frozenset({"outputs", "inputs", "globals", "printed", "grads", "exception", "traceback"})


def _numbers(x, path: str, out: dict) -> None:
    """Numeric leaves of an observation's snapshot, by path; a non-numeric leaf by its value."""
    if isinstance(x, TensorSnap):
        out[path] = ("tensor", x.dtype, tuple(x.shape), x.value)
        if x.grad is not None:
            _numbers(x.grad, path + ".grad", out)
    elif isinstance(x, tuple) and len(x) == 2 and x[0] == "text":
        out[path] = ("text", _NUMBER.split(x[1]), [float(n) for n in _NUMBER.findall(x[1])])
    elif isinstance(x, (list, tuple)):
        out[path + "#len"] = ("same", len(x))
        for i, v in enumerate(x):
            _numbers(v, f"{path}/{i}", out)
    elif isinstance(x, dict):
        out[path + "#keys"] = ("same", list(x))
        for k, v in x.items():
            _numbers(v, f"{path}.{k}", out)
    elif isinstance(x, (bool, int, float)) and not isinstance(x, bool):
        out[path] = ("number", float(x))
    else:
        out[path] = ("same", repr(x))


def _leaf_deviation(a, b) -> float:
    if a[0] != b[0]:
        return math.inf
    kind = a[0]
    if kind == "same":
        return 0.0 if a[1] == b[1] else math.inf
    if kind == "number":
        return _diff(a[1], b[1])
    if kind == "text":
        if a[1] != b[1] or len(a[2]) != len(b[2]):
            return math.inf
        return max((_diff(x, y) for x, y in zip(a[2], b[2])), default=0.0)
    if a[1] != b[1] or a[2] != b[2]:
        return math.inf
    va, vb = a[3], b[3]
    if va.numel() == 0:
        return 0.0
    if not va.is_floating_point() and not va.is_complex():
        return 0.0 if torch.equal(va, vb) else float((va.double() - vb.double()).abs().max())
    va, vb = va.double(), vb.double()
    same = (va == vb) | (va.isnan() & vb.isnan())
    if bool(same.all()):
        return 0.0
    d = (va - vb).abs()[~same]
    return math.inf if bool(d.isnan().any()) else float(d.max())


def _diff(x: float, y: float) -> float:
    if x == y or (math.isnan(x) and math.isnan(y)):
        return 0.0
    d = abs(x - y)
    return math.inf if math.isnan(d) else d


def deviation(a: Observation, b: Observation) -> float:
    """The largest difference between two observations' numbers; infinite when they differ
    in anything but numbers (an exception, a shape, a printed word, a branch taken)."""
    if a.exception != b.exception or a.backward_exception != b.backward_exception:
        return math.inf
    if a.grad_mode != b.grad_mode or a.aliasing != b.aliasing:
        return math.inf
    la, lb = {}, {}
    for name in ("outputs", "args", "globals", "grads"):
        _numbers(getattr(a, name), name, la)
        _numbers(getattr(b, name), name, lb)
    _numbers(("text", a.printed), "printed", la)
    _numbers(("text", b.printed), "printed", lb)
    if la.keys() != lb.keys():
        return math.inf
    return max((_leaf_deviation(la[k], lb[k]) for k in la), default=0.0)


def _perturb(args, kwargs, scale: float, seed: int) -> None:
    """Scale every floating-point tensor of the arguments by (1 + scale * noise), in place."""
    g = torch.Generator().manual_seed(seed)
    flat: list = []
    _flat_tensors([list(args), kwargs or {}], "args", flat, set())
    seen = set()
    with torch.no_grad():
        for _, t in flat:
            if id(t) in seen or not t.is_floating_point() or t.numel() == 0:
                continue
            seen.add(id(t))
            noise = torch.randn(t.shape, generator=g, dtype=torch.float64)
            t.copy_((t.double() * (1 + scale * noise)).to(t.dtype))


def eager_spread(prog, calls, load, unload):
    """(whether a perturbation made eager fail the comparison with itself, the largest
    deviation the perturbations made) over calls ``calls`` of ``prog``."""
    source = prog.source()
    filename = f"/kiln-fuzz/seed_{prog.seed}.py"
    name = f"kiln_fuzz_{prog.seed}"
    failed, worst = False, 0.0
    for scale, seed in PERTURBATIONS:
        mod_a = mod_b = None
        try:
            mod_a, mod_b = load(source, name, filename), load(source, name, filename)
            for i, call in enumerate(calls):
                args_a = mod_a.make_inputs(call.seed, call.n, call.k, call.s, call.flag)
                args_b = mod_b.make_inputs(call.seed, call.n, call.k, call.s, call.flag)
                kw_a = kw_b = None
                if call.kw:
                    kw_a, kw_b = dict(zip(prog.params, args_a)), dict(zip(prog.params, args_b))
                    args_a = args_b = ()
                _perturb(args_b, kw_b, scale, seed * 1000 + i)
                sys.modules[name] = mod_a
                oa = observe(mod_a.fn, args_a, mod_a.__dict__, call.grad, kw_a, filename)
                sys.modules[name] = mod_b
                ob = observe(mod_b.fn, args_b, mod_b.__dict__, call.grad, kw_b, filename)
                failed = failed or compare(oa, ob) is not None
                worst = max(worst, deviation(oa, ob))
        except Exception:  # noqa: BLE001 - a program that cannot be replayed is not noise
            return False, 0.0
        finally:
            unload(mod_a, mod_b)
        if worst == math.inf:
            break
    return failed, worst


_FLOAT32 = (("torch.float32", "torch.float64"), (".float()", ".double()"))


def in_float64(prog):
    """``prog`` with every float32 it names made float64 (its parameters follow the default
    dtype, which the caller sets)."""
    from .program import SourceProgram

    text = prog.source()
    for old, new in _FLOAT32:
        text = text.replace(old, new)
    text = re.sub(r"\btorch\.float\b(?!\d)", "torch.float64", text)
    return SourceProgram(prog.seed, text, list(prog.params), list(prog.calls))


@contextlib.contextmanager
def default_dtype(dtype):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(prev)


def is_float_noise(prog, outcome, run_program, load, unload, calls=None) -> bool:
    """Whether ``outcome`` (a ``wrong`` result of ``prog``) is float noise (module docstring)."""
    m = outcome.mismatch
    if outcome.status != "wrong" or m is None or m.kind not in NOISY_KINDS or outcome.call < 0:
        return False
    plan = list(prog.calls if calls is None else calls)[: outcome.call + 1]
    failed, spread = eager_spread(prog, plan, load, unload)
    if not failed or not (outcome.spread <= SPREAD_FACTOR * spread):
        return False
    with default_dtype(torch.float64):
        again = run_program(in_float64(prog), outcome.backend, outcome.dynamic, calls=calls,
                            recognise_noise=False)
    return again.status == "ok"
