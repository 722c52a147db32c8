"""The guard check as straight-line code (kiln/capture/guard_cse.py): every access path that
several guards read through is read once into a local, and a condition two guards share is
stated once. The check must still fail exactly where the ``and`` chain did: on a changed
attribute deep in a module tree, a swapped submodule, a hook, or a container that lost the
key the next read needs."""
import re

import pytest
import torch
from torch import nn

import kiln
from kiln.testing import CompileCounter, assert_same


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layer1 = nn.Sequential(Block(4), Block(4))
        self.layer2 = nn.Sequential(Block(4), Block(4))
        self.head = nn.Linear(4, 5)

    def forward(self, x):
        return self.head(self.layer2(self.layer1(self.stem(x))).mean((2, 3)))


def _compiled(model):
    cnt = CompileCounter()
    return kiln.compile(model, backend=cnt), cnt


def _check_source(compiled) -> str:
    return compiled.entries[-1].check.__kiln_source__


def test_shared_paths_are_read_once_and_conditions_stated_once():
    model = Net().eval()
    c, cnt = _compiled(model)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert_same(c(x), model(x))
    src = _check_source(c)
    # each submodule of layer1 is reached through one read of layer1
    assert src.count("['layer1']") == 1, src
    assert src.count("['layer2']") == 1, src
    # a TYPE_MATCH and an EQUALS_MATCH on one value share their type check
    conditions = re.findall(r"type\(([^()]+)\) is ___t\d+", src)
    assert len(conditions) == len(set(conditions)), "a type condition is checked twice"
    assert cnt.frame_count == 1


def test_deep_attribute_change_recompiles_with_its_path():
    model = Net().eval()
    c, cnt = _compiled(model)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        c(x)
        c(torch.randn(2, 3, 8, 8))
        assert cnt.frame_count == 1
        model.layer2[1].conv1.padding = (2, 2)       # a different program (and output size)
        model.layer2[1].conv1.dilation = (2, 2)
        assert_same(c(x), model(x))
    assert cnt.frame_count == 2
    assert "layer2" in c.recompile_reasons[-1] and ("padding" in c.recompile_reasons[-1]
                                                    or "dilation" in c.recompile_reasons[-1])


def test_deep_submodule_swapped_for_another_type_recompiles():
    model = Net().eval()
    c, cnt = _compiled(model)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        c(x)
        model.layer1[0].bn2 = nn.Identity()
        assert_same(c(x), model(x))
    assert cnt.frame_count == 2
    assert "bn2" in c.recompile_reasons[-1]


def test_hook_on_a_deep_submodule_is_honoured():
    model = Net().eval()
    c, cnt = _compiled(model)
    x = torch.randn(2, 3, 8, 8)
    calls = []
    with torch.no_grad():
        c(x)
        h = model.layer2[0].conv2.register_forward_hook(lambda m, a, out: calls.append(1) or out * 2)
        assert_same(c(x), model(x))
        assert len(calls) == 2          # once compiled, once eager
        assert cnt.frame_count > 1
        compiled_with_hook = cnt.frame_count
        h.remove()
        assert_same(c(x), model(x))
    assert cnt.frame_count == compiled_with_hook     # the entry without hooks serves again
    assert len(calls) == 2


class Holder:
    def __init__(self, inner):
        self.inner = inner


class Inner:
    def __init__(self, scale, shift):
        self.scale, self.shift = scale, shift


def fn(h, x):
    return x * h.inner.scale + h.inner.shift


def test_a_read_shared_by_guards_fails_as_a_miss_not_an_error():
    cnt = CompileCounter()
    c = kiln.compile(fn, backend=cnt)
    x = torch.randn(4)
    assert_same(c(Holder(Inner(2.0, 1.0)), x), fn(Holder(Inner(2.0, 1.0)), x))
    assert_same(c(Holder(Inner(2.0, 1.0)), x), fn(Holder(Inner(2.0, 1.0)), x))
    assert cnt.frame_count == 1
    # a changed value deep in the shared path recompiles
    assert_same(c(Holder(Inner(3.0, 1.0)), x), fn(Holder(Inner(3.0, 1.0)), x))
    assert "L['h'].inner.scale" in c.recompile_reasons[-1]
    # the shared read (h.inner) is now an object without the attributes the next guards read
    with pytest.raises(AttributeError):
        fn(Holder(object()), x)
    with pytest.raises(AttributeError):
        c(Holder(object()), x)
    assert_same(c(Holder(Inner(2.0, 1.0)), x), fn(Holder(Inner(2.0, 1.0)), x))


def test_dict_argument_missing_the_key_a_later_read_needs():
    def g(d, x):
        return x + d["a"][0] * d["b"]

    cnt = CompileCounter()
    c = kiln.compile(g, backend=cnt)
    x = torch.randn(3)
    assert_same(c({"a": (2,), "b": 3}, x), g({"a": (2,), "b": 3}, x))
    assert_same(c({"a": [5], "b": 3}, x), g({"a": [5], "b": 3}, x))
    assert_same(c({"b": 3, "a": (2,)}, x), g({"b": 3, "a": (2,)}, x))
    with pytest.raises(KeyError):
        c({"b": 3}, x)
