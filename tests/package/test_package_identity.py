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
