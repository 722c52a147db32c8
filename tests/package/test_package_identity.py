"""load_package checks that it gets the function the package was saved from: qualified name,
signature, and the code of the function and of the functions inlined into it."""
import types

import pytest
import torch

import kiln
from kiln.package import PackageMismatch

import _pkg_models as M


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _save(tmp_path, fn, *args):
    c = kiln.compile(fn, backend="eager")
    c(*args)
    path = tmp_path / "p.kiln"
    c.save_package(path)
    kiln.reset()
    return path


def _clone(fn, code=None, name=None):
    """``fn`` again (same globals, same module), optionally with other code or name."""
    new = types.FunctionType(code or fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__qualname__ = name or fn.__qualname__
    new.__module__ = fn.__module__
    return new


def test_same_function_loads(tmp_path):
    x = torch.randn(3)
    path = _save(tmp_path, M.uses_helper, x)
    fast = kiln.load_package(path, _clone(M.uses_helper), on_miss="error")
    torch.testing.assert_close(fast(x), M.uses_helper(x))


def test_other_name_or_signature_or_code(tmp_path):
    x = torch.randn(3)
    path = _save(tmp_path, M.uses_helper, x)
    with pytest.raises(PackageMismatch, match="qualified name"):
        kiln.load_package(path, _clone(M.uses_helper, name="other"))
    with pytest.raises(PackageMismatch, match=r"signature.*\(x\).*\(x, k=3\)"):
        kiln.load_package(path, _clone(M.with_default, name="uses_helper"))
    with pytest.raises(PackageMismatch, match="the code of _pkg_models.uses_helper changed"):
        kiln.load_package(path, _clone(M.uses_helper, code=M.g.__code__))


def test_inlined_callee_changed(tmp_path, monkeypatch):
    x = torch.randn(3)
    path = _save(tmp_path, M.uses_helper, x)
    monkeypatch.setattr(M, "_helper", _clone(M._helper, code=M.g.__code__))
    with pytest.raises(PackageMismatch, match="inlined function _pkg_models._helper"):
        kiln.load_package(path, M.uses_helper)
    # check_source=False loads anyway: the guards still decide (the changed global misses)
    fast = kiln.load_package(path, M.uses_helper, check_source=False)
    monkeypatch.undo()
    torch.testing.assert_close(fast(x), M.uses_helper(x))


def test_module_identity(tmp_path):
    m = M.MLP()
    path = tmp_path / "m.kiln"
    c = kiln.compile(m, backend="eager")
    c(torch.randn(2, 4))
    c.save_package(path)
    kiln.reset()
    with pytest.raises(PackageMismatch, match="qualified name"):
        kiln.load_package(path, torch.nn.Sequential(torch.nn.Linear(4, 4)))
    other = M.MLP(h=16)             # same class, other weights' shapes: loads; guards decide
    fast = kiln.load_package(path, other)
    x = torch.randn(2, 4)
    torch.testing.assert_close(fast(x), other(x))


_LIBRARY = '''
import functools
import torch


def uses_a_set(x):
    if "beta" in {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}:
        return x + 1
    return x


@functools.lru_cache(maxsize=None)
def cached_factor(n):
    return n * 2


@torch.no_grad()
def without_grad(x):
    return x * 2


def with_a_default(x, marker=object(), act=torch.nn.functional.gelu):
    return act(x)
'''

_HASHES = '''
import json, sys
sys.path.insert(0, sys.argv[1])
import library
from kiln.package.identity import code_hash, codes_of, signature_of
out = {}
for name in ("uses_a_set", "cached_factor", "without_grad", "with_a_default"):
    fn = getattr(library, name)
    out[name] = [sorted(code_hash(c) for c in codes_of(fn)), signature_of(fn)]
print(json.dumps(out))
'''


def test_the_identity_of_library_functions_is_the_same_in_every_process(tmp_path):
    """Set constants (their order follows per-process string hashing), ``lru_cache`` and
    ``torch.no_grad`` decorators and defaults holding objects with addresses: two processes
    running the same code agree; an edit under a decorator is still seen."""
    import json
    import subprocess
    import sys

    lib = tmp_path / "library.py"
    lib.write_text(_LIBRARY)
    script = tmp_path / "hashes.py"
    script.write_text(_HASHES)

    def hashes(seed: str) -> dict:
        import os
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONDONTWRITEBYTECODE="1")
        r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout.strip().splitlines()[-1])
    first, second = hashes("1"), hashes("2")
    assert first == second
    assert all(codes for codes, _ in first.values()), first       # every name reaches code
    lib.write_text(_LIBRARY.replace("return n * 2", "return n * 3"))
    changed = hashes("1")
    assert changed["cached_factor"] != first["cached_factor"]
    assert {k: v for k, v in changed.items() if k != "cached_factor"} == \
        {k: v for k, v in first.items() if k != "cached_factor"}
