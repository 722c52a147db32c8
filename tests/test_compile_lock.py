"""The compile scope: the cyclic garbage collector is paused while kiln compiles, and is as the
user left it afterwards."""
import gc

import pytest
import torch

import kiln


def _spying_backend(seen: list):
    def backend(gm, example_inputs):
        seen.append(gc.isenabled())
        return gm
    return backend


@pytest.fixture
def gc_state():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_gc_paused_while_compiling_and_restored_after(gc_state):
    gc.enable()
    seen = []
    f = kiln.compile(lambda x: torch.sin(x) + 1, backend=_spying_backend(seen))
    x = torch.randn(4)
    torch.testing.assert_close(f(x), torch.sin(x) + 1)
    assert seen == [False]
    assert gc.isenabled()


def test_gc_the_user_disabled_stays_disabled(gc_state):
    gc.disable()
    seen = []
    f = kiln.compile(lambda x: x * 2, backend=_spying_backend(seen))
    f(torch.randn(3))
    assert seen == [False]
    assert not gc.isenabled()


def test_gc_left_running_when_switched_off(gc_state):
    gc.enable()
    seen = []
    with kiln.config.patch(pause_gc_while_compiling=False):
        f = kiln.compile(lambda x: x - 1, backend=_spying_backend(seen))
        f(torch.randn(3))
    assert seen == [True]
    assert gc.isenabled()


def test_gc_restored_when_compiling_fails_and_nested_compiles(gc_state):
    gc.enable()
    inner = kiln.compile(lambda x: x.cos(), backend="eager")

    def backend(gm, example_inputs):
        inner(torch.randn(2))           # a compile inside a compile: one pause, released once
        assert not gc.isenabled()
        raise RuntimeError("backend failed")

    f = kiln.compile(lambda x: x.exp(), backend=backend)
    x = torch.randn(3)
    with pytest.raises(Exception):
        f(x)
    assert gc.isenabled()
    torch.testing.assert_close(inner(x), x.cos())
    assert gc.isenabled()
