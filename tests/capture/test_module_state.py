"""Skipping the guards of an unchanged module tree (kiln/capture/module_state.py).

After a call whose guards passed, an entry records the versions of the module tree's dicts
and classes; a later call whose tree has the same versions checks only the guards the tree
does not answer. Every test here first makes the entry answer calls from its snapshot, then
changes the tree in one way, and compares with eager: the change must be seen."""
import gc
import weakref

import pytest
import torch
from torch import nn

import kiln
from kiln.capture import module_state
from kiln.testing import CompileCounter, assert_same

pytestmark = pytest.mark.skipif(module_state.NATIVE is None, reason="kiln's C extension is not built")


class Block(nn.Module):
    gain = 1.0                  # a class attribute read through the instance

    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.scale = 0.5

    def forward(self, x):
        return x + self.scale * self.gain * torch.relu(self.bn(self.conv(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.Sequential(Block(4), Block(4))
        self.head = nn.Linear(4, 5)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def _memo(compiled, i=-1) -> module_state.ModuleStateMemo:
    program = compiled.entries[i].program
    return program.ctx.namespace[program.unchanged_tree.memo]


def _warm(model, compiled, calls=3):
    """Calls until the newest entry answers from its snapshot."""
    for _ in range(calls):
        x = torch.randn(2, 3, 8, 8)
        assert_same(compiled(x), model(x))
    memo = _memo(compiled)
    assert memo.state is not None and memo.used


def _same_after(model, compiled, change, graphs):
    cnt = compiled._kiln_counter
    _warm(model, compiled)
    change(model)
    for _ in range(2):
        x = torch.randn(2, 3, 8, 8)
        assert_same(compiled(x), model(x))
    if graphs is not None:
        assert cnt.frame_count == graphs, compiled.recompile_reasons


def _compiled(model):
    cnt = CompileCounter()
    c = kiln.compile(model, backend=cnt)
    c._kiln_counter = cnt
    return c


def test_an_unchanged_tree_checks_only_what_it_does_not_answer():
    model = Net().eval()
    c = _compiled(model)
    with torch.no_grad():
        _warm(model, c)
    src = c.entries[0].check.__kiln_source__
    fast = src.partition("\n        else:\n")[0]
    full = src.partition("\n        else:\n")[2]
    for fact in ("padding", "momentum", "_forward_hooks", "training", "scale"):
        assert fact not in fast and fact in full, fact
    assert "___in0 = " in fast     # (the call's own tensor: read and checked on every call)
    assert c._kiln_counter.frame_count == 1


def test_the_guards_log_says_how_many_guards_an_unchanged_tree_skips(capsys):
    kiln.set_logs("guards")
    try:
        model = Net().eval()
        c = kiln.compile(model, backend="eager")
        with torch.no_grad():
            c(torch.randn(2, 3, 8, 8))
    finally:
        kiln.set_logs("")
    err = capsys.readouterr().err
    import re

    covered, total = map(int, re.search(r"\((\d+) of these (\d+) Python-level guards are skipped", err).groups())
    assert 0 < covered < total


CHANGES = {
    "rebound attribute (dilation)": (lambda m: (setattr(m.blocks[1].conv, "dilation", (2, 2)),
                                                setattr(m.blocks[1].conv, "padding", (2, 2))), 2),
    "plain float attribute": (lambda m: setattr(m.blocks[0], "scale", 2.0), 2),
    "training mode": (lambda m: m.train(), 2),
    "replaced submodule": (lambda m: m.blocks.__setitem__(0, Block(4).eval()), 1),
    "replaced submodule of another class": (lambda m: m.blocks.__setitem__(1, nn.Identity()), 2),
    "new parameter object": (lambda m: setattr(m.head, "weight", nn.Parameter(torch.randn(5, 4))), 1),
    "deleted and restored bias": (lambda m: (delattr(m.stem, "bias"), m.stem.register_parameter("bias", None)), 2),
    "forward hook": (lambda m: m.blocks[0].register_forward_hook(lambda mod, i, o: o * 3), None),
    "forward pre-hook": (lambda m: m.head.register_forward_pre_hook(lambda mod, i: (i[0] + 1,)), None),
    "parameter data of other strides": (lambda m: setattr(m.head.weight, "data", torch.randn(4, 5).t()), 2),
    "instance __dict__ swapped": (lambda m: setattr(m.blocks[0], "__dict__", {**m.blocks[0].__dict__, "scale": 3.0}), 2),
    "class swapped": (lambda m: setattr(m.blocks[1], "__class__", _Doubled), 2),
}


class _Doubled(Block):
    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("name", list(CHANGES))
def test_a_change_to_the_tree_is_seen(name):
    change, graphs = CHANGES[name]
    model = Net().eval()
    c = _compiled(model)
    with torch.no_grad():
        _same_after(model, c, change, graphs)


def test_a_class_change_is_seen():
    class Mul(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 2.0

        def forward(self, x):
            return x * self.k

    model = nn.Sequential(nn.Linear(4, 4), Mul())
    c = kiln.compile(model, backend="eager")
    for _ in range(3):
        x = torch.randn(2, 4)
        assert_same(c(x), model(x))
    assert _memo(c).used
    Mul.k = property(lambda self: 5.0)        # a data descriptor now answers ``self.k``
    try:
        x = torch.randn(2, 4)
        assert_same(c(x), model(x))
    finally:
        del Mul.k


def test_a_plain_class_attribute_read_through_the_instance_is_covered():
    class Shift(nn.Module):
        k = 2.0                               # read as self.k: the class answers

        def forward(self, x):
            return x + self.k

    model = nn.Sequential(nn.Linear(4, 4), Shift())
    c = kiln.compile(model, backend="eager")
    for _ in range(3):
        x = torch.randn(2, 4)
        assert_same(c(x), model(x))
    assert _memo(c).used                      # (the snapshot was taken: the read is covered)
    for change in (lambda: setattr(Shift, "k", 3.0), lambda: setattr(model[1], "k", 5.0),
                   lambda: delattr(model[1], "k")):
        change()
        for _ in range(2):
            x = torch.randn(2, 4)
            assert_same(c(x), model(x))


def test_in_place_metadata_changes_of_parameters_are_still_checked():
    model = Net()
    c = _compiled(model)
    _warm(model, c)
    model.head.weight.requires_grad_(False)
    x = torch.randn(2, 3, 8, 8)
    out = c(x)
    out.sum().backward()
    assert model.head.weight.grad is None and model.head.bias.grad is not None
    assert c._kiln_counter.frame_count == 2


def test_a_module_argument_is_not_kept_alive():
    def f(m, x):
        return m(x) * 2

    cf = kiln.compile(f, backend="eager")
    for _ in range(3):
        m = nn.Linear(3, 3)
        x = torch.randn(2, 3)
        assert_same(cf(m, x), f(m, x))
    ref, wref = weakref.ref(m), weakref.ref(m.weight)
    del m
    gc.collect()
    assert ref() is None and wref() is None


def test_a_tree_that_changes_on_every_call_stops_taking_snapshots():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            self.seen = [x.shape[0]]   # (a new list in the instance dict: its version changes)
            return self.lin(x)

    model = Counting()
    c = kiln.compile(model, backend="eager")
    twin = Counting()
    twin.load_state_dict(model.state_dict())
    for _ in range(12):
        x = torch.randn(2, 3)
        assert_same(c(x), twin(x))
    assert model.seen == twin.seen == [2]
    assert _memo(c).plans is None


def test_without_the_extension_every_guard_is_checked(monkeypatch):
    monkeypatch.setattr(module_state, "NATIVE", None)
    model = Net().eval()
    c = _compiled(model)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, 8, 8)
            assert_same(c(x), model(x))
        assert c.entries[0].program.unchanged_tree is None
        model.blocks[0].scale = 2.0
        assert_same(c(x), model(x))
    assert c._kiln_counter.frame_count == 2


def _mutations(model, rng, hooks):
    blocks = model.blocks

    def dilate():
        d = rng.choice([1, 2])
        conv = blocks[rng.randrange(2)].conv
        conv.dilation, conv.padding = (d, d), (d, d)

    def hook():
        hooks.append(blocks[rng.randrange(2)].register_forward_hook(lambda m, i, o: o * 0.5))

    def unhook():
        if hooks:
            hooks.pop(rng.randrange(len(hooks))).remove()

    def replace():
        b = Block(4)
        b.train(model.training)
        blocks[rng.randrange(2)] = b

    def strides():
        w = model.head.weight
        w.data = w.data.t().contiguous().t() if w.is_contiguous() else w.data.contiguous()

    def swap_dict():
        b = blocks[rng.randrange(2)]
        b.__dict__ = dict(b.__dict__)

    return [
        lambda: None,
        lambda: setattr(blocks[rng.randrange(2)], "scale", rng.choice([0.5, 2.0, 3])),
        lambda: model.train(rng.random() < 0.5),
        dilate, hook, unhook, replace, strides, swap_dict,
        lambda: model.head.weight.requires_grad_(rng.random() < 0.5),
        lambda: setattr(Block, "gain", rng.choice([1.0, 2.0])),
        lambda: setattr(blocks[rng.randrange(2)], "gain", rng.choice([1.0, -1.0])),
        lambda: blocks[rng.randrange(2)].__dict__.pop("gain", None),
    ]


@pytest.mark.parametrize("seed", range(4))
def test_random_changes_between_calls_match_eager(seed):
    """Random sequences of the changes above, each followed by calls that must equal eager
    (outputs, and whether they require grad)."""
    import random

    rng = random.Random(seed)
    model = Net().eval()
    c = kiln.compile(model, backend="eager")
    hooks = []
    changes = _mutations(model, rng, hooks)
    try:
        for _ in range(30):
            rng.choice(changes)()
            for _ in range(rng.randrange(1, 3)):
                x = torch.randn(2, 3, 8, 8)
                torch.manual_seed(0)
                out = c(x)
                torch.manual_seed(0)
                ref = model(x)
                assert_same(out, ref)
                assert out.requires_grad == ref.requires_grad
    finally:
        Block.gain = 1.0
