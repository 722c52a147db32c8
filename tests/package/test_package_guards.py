"""Each guard kind owns its package form; guards come back as text that explains misses."""
import pytest
import torch

import kiln
from kiln.capture.guards import GuardKind
from kiln.package import PackageMiss
from kiln.package.guards import SAVERS

import _pkg_models as M


def test_every_guard_kind_has_a_package_form():
    missing = [k.value for k in GuardKind if k not in SAVERS]
    assert not missing, f"guard kinds with no package form (add one to kiln.package.guards.SAVERS): {missing}"


def _roundtrip(tmp_path, fn, *calls, backend="eager"):
    kiln.reset()
    c = kiln.compile(fn, backend=backend, dynamic=False)
    for args in calls:
        c(*args)
    report = c.save_package(tmp_path / "p.kiln")
    kiln.reset()
    return report, kiln.load_package(tmp_path / "p.kiln", fn, on_miss="error")


class Cfg:
    scale = 2.0


def scaled(x, cfg, n, flag, opts):
    if flag and "bias" in opts:
        return x * cfg.scale + opts["bias"] * n
    return x - n


def test_python_value_guards_are_checked_after_load(tmp_path, monkeypatch):
    x = torch.randn(3)
    args = (x, Cfg(), 3, True, {"bias": 1.0})
    report, fast = _roundtrip(tmp_path, scaled, args)
    assert report.entries == 1
    torch.testing.assert_close(fast(*args), scaled(*args))
    text = "\n".join(fast.entries[0].describe_guards().splitlines())
    assert "TYPE_MATCH" in text and "EQUALS_MATCH" in text and "DICT_KEYS" in text
    class Other(Cfg):
        pass
    Other.scale = 3.0
    for bad, guard in [((x, Other(), 3, True, {"bias": 1.0}), "TYPE_MATCH"),((x, Cfg(), 4, True, {"bias": 1.0}), "EQUALS_MATCH"),
                       ((x, Cfg(), 3, True, {"bias": 1.0, "more": 2}), "DICT_KEYS"),
                       ((x, object(), 3, True, {"bias": 1.0}), "TYPE_MATCH")]:
        with pytest.raises(PackageMiss, match=guard):
            fast(*bad)
    # a class attribute (identity-guarded) keeps its value in a new process: compared by value
    monkeypatch.setattr(Cfg, "scale", 5.0)
    with pytest.raises(PackageMiss, match="scale"):
        fast(*args)


def test_global_state_guard_after_load(tmp_path):
    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    _, fast = _roundtrip(tmp_path, M.f, (x, y))
    torch.testing.assert_close(fast(x, y), M.f(x, y))
    with torch.no_grad(), pytest.raises(PackageMiss, match="GLOBAL_STATE.*grad_mode"):
        fast(x, y)
    with pytest.raises(PackageMiss, match="TENSOR_MATCH"):
        fast(x.detach(), y)


def test_global_read_resolves_against_the_loaded_function(tmp_path, monkeypatch):
    x = torch.randn(4)
    _, fast = _roundtrip(tmp_path, M.uses_helper, (x,))
    torch.testing.assert_close(fast(x), M.uses_helper(x))
    # a global the entry relies on changes: its guard fails in the loaded function
    monkeypatch.setattr(M, "_helper", lambda x: x)
    with pytest.raises(PackageMiss, match="_helper"):
        fast(x)


def test_tensor_kinds_a_package_cannot_rebuild_are_left_out(tmp_path):
    """TENSOR_MATCH also tells conjugate and negative views and inference tensors apart (their
    dispatch keys); a rebuilt guard would not, so such entries are left out with the reason."""
    def twice(x):
        return x * 2
    z = torch.randn(3, dtype=torch.complex64).conj()
    with torch.inference_mode():
        inf = torch.randn(3)
    for arg, why in ((z, "conjugate view"), (inf, "inference tensor")):
        report, fast = _roundtrip(tmp_path, twice, (arg,))
        assert report.entries == 0 and why in str(report), str(report)
        with pytest.raises(PackageMiss):
            fast(arg)


class Padded:
    def __init__(self, pad):
        self.pad = pad


def padded(x, h):
    return x * h.pad[0] + h.pad[1]


def test_a_remembered_constant_tuple_is_checked_again_after_load(tmp_path):
    # the entry remembers the tuple that passed last (guard_cse.IdentityMemo); a package
    # starts with nothing remembered, so the first call checks the values in full
    x, h = torch.randn(3), Padded((2, 3))
    report, fast = _roundtrip(tmp_path, padded, (x, h))
    assert report.entries == 1
    assert "___memo" in fast.entries[0].fn.__kiln_source__
    for _ in range(2):
        torch.testing.assert_close(fast(x, h), padded(x, h))
    torch.testing.assert_close(fast(x, Padded((2, 3))), padded(x, Padded((2, 3))))
    for bad in [(2, 4), (2.0, 3), (2, 3, 1)]:
        with pytest.raises(PackageMiss, match="pad"):
            fast(x, Padded(bad))
