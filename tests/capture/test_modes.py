"""Torch function and dispatch modes around a compiled call.

A mode of the user's may change what any op returns, so kiln never captures or runs compiled
code under one: the call runs as written, and entries captured without a mode are guarded to
run only without one. ``torch.device(d)`` and ``torch.set_default_device(d)`` (a
``DeviceContext`` mode) are the exception users rely on: the capture gives factory calls the
device, and the entry is guarded on it."""
import pytest
import torch
from torch.overrides import BaseTorchFunctionMode, TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import kiln


class AddGivesZeros(BaseTorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.add:
            return torch.zeros(5)
        return super().__torch_function__(func, types, args, kwargs or {})


class AddIsMul(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.add.Tensor:
            func = torch.ops.aten.mul.Tensor
        return func(*args, **(kwargs or {}))


class CountCalls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(func)
        return func(*args, **(kwargs or {}))


BACKENDS = ["eager", "aot_eager"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_function_mode_at_capture_is_not_baked_in(backend):
    def f(x):
        return torch.add(x, 3), torch.add(x, 3).shape[0]

    compiled = kiln.compile(f, backend=backend)
    x = torch.full((2,), 3.0)
    with AddGivesZeros():
        got = compiled(x)
        expected = f(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(compiled(x), f(x))       # without the mode: eager's answer
    assert len(compiled.entries) == 1      # (captured once: without the mode)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_function_mode_after_capture_applies(backend):
    def f(x):
        return torch.add(x, 4)

    compiled = kiln.compile(f, backend=backend)
    x = torch.full((2,), 3.0)
    torch.testing.assert_close(compiled(x), f(x))
    with AddGivesZeros():
        torch.testing.assert_close(compiled(x), torch.zeros(5))
    torch.testing.assert_close(compiled(x), f(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dispatch_mode_is_honoured_before_and_after_capture(backend):
    def f(x):
        return x + x

    compiled = kiln.compile(f, backend=backend)
    x = torch.full((2,), 3.0)
    with AddIsMul():
        torch.testing.assert_close(compiled(x), torch.full((2,), 9.0))
    torch.testing.assert_close(compiled(x), torch.full((2,), 6.0))
    with AddIsMul():
        torch.testing.assert_close(compiled(x), torch.full((2,), 9.0))


def test_a_users_mode_sees_only_the_functions_own_calls():
    def f(x):
        return x.sin()

    compiled = kiln.compile(f, backend="aot_eager")
    x = torch.randn(3)
    compiled(x)
    for _ in range(2):
        with CountCalls() as mode:
            compiled(x)
        with CountCalls() as eager:
            f(x)
        assert mode.calls == eager.calls


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mode_entered_inside_the_function(backend):
    class Times3(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            r = func(*args, **(kwargs or {}))
            return r * 3 if func is torch.Tensor.add else r

    def f(x, m):
        m.__enter__()
        y = x + 1
        m.__exit__(None, None, None)
        return y + 1

    x = torch.ones(3)
    torch.testing.assert_close(kiln.compile(f, backend=backend)(x, Times3()), f(x, Times3()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_default_device_is_guarded_and_given_to_factories(backend):
    def f(x):
        return torch.ones(2) + x.sum(), torch.arange(3, device=None)

    compiled = kiln.compile(f, backend=backend)
    x = torch.ones(2)
    assert compiled(x)[0].device.type == "cpu"
    with torch.device("meta"):
        got = compiled(x)
    assert [t.device.type for t in got] == ["meta", "meta"]
    torch.set_default_device("meta")
    try:
        got = compiled(x)
    finally:
        torch.set_default_device(None)
    assert [t.device.type for t in got] == ["meta", "meta"]
    got = compiled(x)
    assert [t.device.type for t in got] == ["cpu", "cpu"]
    torch.testing.assert_close(got, f(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_clearing_the_default_device_inside_the_function(backend):
    def f(x):
        torch.set_default_device(None)
        return x + 1

    def run(fn):
        fn(torch.ones(2))
        torch.set_default_device("meta")
        try:
            fn(torch.ones(2))
            return torch.ones(1).device.type
        finally:
            torch.set_default_device(None)

    assert run(kiln.compile(f, backend=backend)) == run(f) == "cpu"


def test_the_guard_text_names_the_modes():
    def f(x):
        return x * 2

    compiled = kiln.compile(f, backend="eager")
    compiled(torch.ones(2))
    with torch.device("meta"):
        compiled(torch.ones(2))
    assert any("modes: expected none, got default device meta" in r for r in compiled.recompile_reasons)
