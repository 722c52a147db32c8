"""Attribute lookup on a module inside compiled code is Python's: the class's attribute (a
method named as a submodule) before ``Module.__getattr__``'s parameters, buffers and
submodules; a ``forward`` set on the instance (accelerate's and PEFT's hooks, a monkeypatch)
before the class's, and guarded both ways."""
import types

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.testing import CompileCounter


class Base(nn.Module):
    def linear(self, x):
        return x + 1


class MethodBeforeSubmodule(Base):
    """``self.linear`` is the base class's method in eager: the Linear registered under the
    same name lives in ``_modules``, which only ``__getattr__`` reads."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x) * 2


class ShadowedState(nn.Module):
    """A method named as a submodule; a property (a data descriptor) named as an entry of the
    instance dict: Python reads the property."""

    def __init__(self):
        super().__init__()
        self.act = nn.ReLU()
        self.__dict__["gain"] = 2.0

    def act(self, x):            # noqa: F811 - the class's method is what eager calls
        return torch.tanh(x)

    @property
    def gain(self):
        return 3.0

    def forward(self, x):
        return self.act(x) * self.gain


@pytest.mark.parametrize("cls", [MethodBeforeSubmodule, ShadowedState])
def test_class_attributes_win_over_parameters_buffers_and_submodules(cls):
    torch.manual_seed(0)
    m = cls()
    cnt = CompileCounter()
    compiled = kiln.compile(m, backend=cnt, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3, 3)
        torch.testing.assert_close(compiled(x), m(x))
    assert cnt.frame_count == 1


class Cos(nn.Module):
    def forward(self, x):
        return torch.cos(x)


class Sin(nn.Module):
    def forward(self, x):
        return torch.sin(x)


class NoForward(nn.Module):
    pass


def test_a_forward_set_on_the_instance_is_called():
    m = Cos()
    m.forward = types.MethodType(Sin.forward, m)
    outer = nn.Sequential(m)
    x = torch.randn(5)
    torch.testing.assert_close(kiln.compile(m, backend="eager", fullgraph=True)(x), torch.sin(x))
    torch.testing.assert_close(kiln.compile(outer, backend="eager", fullgraph=True)(x), torch.sin(x))


def test_a_class_without_forward_runs_the_instance_forward():
    m = NoForward()
    m.forward = lambda x: x - 1              # (a plain function on the instance: no self)
    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(lambda t: m(t), backend="eager")(x), x - 1)


def test_patching_forward_after_a_compile_recompiles():
    m = Cos()
    cnt = CompileCounter()
    f = kiln.compile(lambda t: m(t) + 1, backend=cnt)
    x = torch.randn(5)
    torch.testing.assert_close(f(x), torch.cos(x) + 1)
    m.forward = types.MethodType(Sin.forward, m)
    torch.testing.assert_close(f(x), torch.sin(x) + 1)
    del m.forward
    torch.testing.assert_close(f(x), torch.cos(x) + 1)
    assert cnt.frame_count == 2              # (the first entry serves again once it is deleted)


def test_a_wrapped_forward_as_accelerate_installs_it():
    """accelerate's ``add_hook_to_module``: the old forward kept, a new one on the instance
    that calls it around pre and post work."""
    m = nn.Linear(4, 4)
    old_forward = m.forward

    def new_forward(*args, **kwargs):
        return old_forward(*(a * 2 for a in args), **kwargs) - 1

    m.forward = new_forward
    cnt = CompileCounter()
    compiled = kiln.compile(m, backend=cnt, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 4)
        torch.testing.assert_close(compiled(x), m(x))
    assert cnt.frame_count == 1
