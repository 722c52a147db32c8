"""Every case of the capture conformance suite (tests/capture/test_conformance_*.py), saved
to a package and loaded again: a loaded entry answers what eager answers on fresh inputs
(outputs and input mutations), and an entry that cannot be saved is left out with a reason
(never a failed save, never a wrong answer)."""
import copy
import importlib
import pathlib
import sys

import pytest
import torch

import kiln

CAPTURE = pathlib.Path(__file__).resolve().parents[1] / "capture"
MODULES = sorted(p.stem for p in CAPTURE.glob("test_conformance_*.py"))


def _cases():
    if str(CAPTURE) not in sys.path:
        sys.path.insert(0, str(CAPTURE))
    out = []
    for name in MODULES:
        mod = importlib.import_module(name)
        for p in getattr(mod, "CASES", []):
            fn, make_args, opts = p.values
            out.append(pytest.param(fn, make_args, opts, id=f"{name[len('test_conformance_'):]}-{p.id}"))
    return out


CASES = _cases()
_saved = {"saved": 0, "left_out": 0}


@pytest.mark.parametrize("fn,make_args,opts", CASES)
def test_conformance_case_round_trip(fn, make_args, opts, tmp_path):
    from _conformance import assert_same

    rtol, atol = opts.get("rtol", 1e-5), opts.get("atol", 1e-6)
    torch.manual_seed(0)
    kiln.reset()
    c = kiln.compile(fn, backend="eager")
    if not hasattr(c, "save_package"):
        pytest.skip(f"kiln.compile returned a {type(c).__name__} (a functools.partial of a compiled function)")
    args, kwargs = make_args()
    c(*args, **kwargs)
    report = c.save_package(tmp_path / "p.kiln")
    for lo in report.left_out:
        assert lo.reason, "an entry left out without a reason"
    kiln.reset()
    fast = kiln.load_package(tmp_path / "p.kiln", fn, on_miss="compile" if report.left_out else "error")
    for i in range(2):
        args, kwargs = make_args()
        eargs, ekwargs = copy.deepcopy((args, kwargs))
        expected = fn(*eargs, **ekwargs)
        got = fast(*args, **kwargs)
        assert_same(got, expected, rtol, atol, path=f"call{i}:out")
        assert_same(args, eargs, rtol, atol, path=f"call{i}:args")
        assert_same(kwargs, ekwargs, rtol, atol, path=f"call{i}:kwargs")
    kiln.reset()
