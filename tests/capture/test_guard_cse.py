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


def _checks(src: str) -> list[str]:
    """The check of a call whose module tree is unchanged (module_state.py), and the whole one."""
    fast, sep, full = src.partition("\n        else:\n")
    return [fast, full] if sep else [src]


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
    # a TYPE_MATCH and an EQUALS_MATCH on one value share their type check (in each of the
    # two checks: of a call whose module tree changed, and of one whose tree did not)
    for part in _checks(src):
        conditions = re.findall(r"type\(([^()]+)\) is ___t\d+", part)
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


# -- tuples of constants: checked in full only when they are a new object (IdentityMemo) -----

class Padded:
    def __init__(self, pad):
        self.pad = pad


def padded(h, x):
    return x * h.pad[0] + h.pad[1]


def test_a_tuple_of_constants_is_checked_in_full_only_when_it_is_a_new_object():
    cnt = CompileCounter()
    c = kiln.compile(padded, backend=cnt)
    x = torch.randn(3)
    h = Padded((2, 3))
    assert_same(c(h, x), padded(h, x))
    src = _check_source(c)
    assert re.search(r"if ___r\d+ is not ___memo\d+\.last:", src), src
    assert_same(c(h, x), padded(h, x))              # the same tuple object: the memo's path
    h.pad = (2, 3)                                  # a new, equal tuple: checked in full, passes
    assert_same(c(h, x), padded(h, x))
    assert_same(c(Padded((2, 3)), x), padded(Padded((2, 3)), x))
    assert cnt.frame_count == 1
    # a changed value, or the same values of other types, is a new program
    for pad in [(2, 4), (2.0, 3), (True, 3), (2, 3, 4), [2, 3]]:
        h.pad = pad
        assert_same(c(h, x), padded(h, x))
        assert "pad" in c.recompile_reasons[-1], (pad, c.recompile_reasons[-1])
    n = cnt.frame_count
    for pad in [(2, 4), (2.0, 3), (True, 3), (2, 3, 4), [2, 3], (2, 3)]:   # each hits its own entry again
        h.pad = tuple(pad) if isinstance(pad, tuple) else list(pad)
        assert_same(c(h, x), padded(h, x))
    assert cnt.frame_count == n


def nested(h, x):
    return x * h.pad[0][0] + h.pad[1]


def test_a_tuple_that_holds_a_list_is_never_taken_on_identity():
    # the list in the tuple can change in place while the tuple stays the same object
    cnt = CompileCounter()
    c = kiln.compile(nested, backend=cnt)
    x = torch.randn(3)
    h = Padded(([2], 3))
    assert_same(c(h, x), nested(h, x))
    assert "___memo" not in _check_source(c)
    h.pad[0][0] = 5
    assert_same(c(h, x), nested(h, x))
    assert cnt.frame_count == 2
    # a tuple of tuples of constants is one memo
    h2 = Padded(((2,), 3))
    assert_same(c(h2, x), nested(h2, x))
    sources = [e.check.__kiln_source__ for e in c.entries]
    assert sum(src.count("___memo") == 2 for src in sources) == 1, sources      # (the check and the store)


def with_tensor(h, x):
    return x * h.pad[0] + h.pad[1]


def test_a_tuple_that_holds_a_tensor_input_is_read_every_call():
    cnt = CompileCounter()
    c = kiln.compile(with_tensor, backend=cnt)
    x = torch.randn(3)
    h = Padded((torch.randn(3), 3))
    assert_same(c(h, x), with_tensor(h, x))
    assert "___memo" not in _check_source(c)
    h.pad[0].mul_(2)                      # a tensor's values are inputs, read on every call
    assert_same(c(h, x), with_tensor(h, x))
    assert cnt.frame_count == 1


def star(x, *sizes):
    return x * sizes[0] + sizes[1]


def test_star_args_are_not_remembered():
    # *args is a new tuple on every call: a memo would only add work
    cnt = CompileCounter()
    c = kiln.compile(star, backend=cnt)
    x = torch.randn(3)
    assert_same(c(x, 2, 3), star(x, 2, 3))
    assert "___memo" not in _check_source(c)
    assert_same(c(x, 2, 4), star(x, 2, 4))
    assert cnt.frame_count == 2


def test_conv_attributes_are_remembered_and_a_changed_one_recompiles():
    model = Net().eval()
    c, cnt = _compiled(model)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        c(x)
        src = _check_source(c)
        # stride, padding and dilation of each of the 9 convolutions
        assert src.count("is not ___memo") == 27, src
        # ``x is False`` says x is a bool: BatchNorm's ``training`` has no type check of its own
        flags = re.findall(r"([\w.]+) is (?:True|False)\b", src)
        assert any(f.endswith(".training") for f in flags), src
        assert not any(f"type({f})" in src for f in flags), src
        model.layer1[0].conv1.stride = (1, 1)           # equal, new tuple: no recompile
        assert_same(c(x), model(x))
        assert cnt.frame_count == 1
        model.layer1[0].conv2.dilation = (2, 2)          # (a 1x1 convolution: same shapes)
        assert_same(c(x), model(x))
    assert cnt.frame_count == 2
    assert "dilation" in c.recompile_reasons[-1]
