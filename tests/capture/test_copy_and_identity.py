"""``copy.deepcopy``/``copy.copy`` of plain objects and ``id()``, captured in one graph.

Library code copies configuration objects inside a forward (transformers' ``get_text_config``
deep-copies an encoder-decoder config when a cache is built). The copy runs as the ``copy``
module's own Python code, inlined: ``id()`` keys its memo, ``object.__reduce_ex__`` and
``object.__new__`` are modelled as CPython implements them. Each case is compared with eager
(outputs and the original object, which a copy must never change) and its graph count asserted.
"""
from __future__ import annotations

import copy

import pytest
import torch

import kiln
from kiln.testing import CompileCounter, assert_same


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


class Config:
    def __init__(self, scale=2):
        self.scale = scale
        self.layers = [1, 2, 3]
        self.names = {"encoder_layers": 2, "decoder_layers": 3}
        self.dtype = torch.float32
        self.is_encoder_decoder = True


GLOBAL_CONFIG = Config()


class WithGetstate(Config):
    def __getstate__(self):
        state = dict(self.__dict__)
        state["scale"] = state["scale"] * 10
        return state


class WithDeepcopy(Config):
    def __deepcopy__(self, memo):
        other = WithDeepcopy(self.scale + 1)
        return other


class Slotted:
    __slots__ = ("scale",)

    def __init__(self):
        self.scale = 3


def _compile(fn, fullgraph=True):
    cc = CompileCounter()
    return cc, kiln.compile(fn, backend=cc, fullgraph=fullgraph)


def _text_config(cfg, decoder=True):
    """The shape of transformers' legacy-config path: copy, then rename keys on the copy."""
    out = copy.deepcopy(cfg)
    prefix = "decoder" if decoder else "encoder"
    for key in list(out.names):
        if key.startswith(prefix):
            out.num_layers = out.names[key]
    del out.layers
    out.scale = out.scale + 1
    return out


def test_deepcopy_then_mutate_the_copy_is_one_graph_and_leaves_the_original():
    def f(x, cfg):
        c = _text_config(cfg)
        return x * c.scale + c.num_layers + len(c.names)

    cc, g = _compile(f)
    for scale in (2, 2, 5):
        cfg, ref = Config(scale), Config(scale)
        x = torch.randn(4)
        assert_same(g(x, cfg), f(x, ref))
        assert vars(cfg).keys() == vars(ref).keys() and cfg.layers == [1, 2, 3] and cfg.scale == scale
    # one graph per config's values: another object with the same values reuses it (the
    # copy's memo keys the argument by an id() token, not by an identity guard)
    assert cc.frame_count == 2


def _returns_a_copy(f):
    """``f(x, cfg)`` compiled (one graph) and eager, each on a fresh Config: the first outputs
    match, the second is a real Config equal to eager's, and the argument is unchanged.
    Returns (the compiled call's copy, its argument)."""
    cc, g = _compile(f)
    cfg = Config()
    x = torch.randn(3)
    out, c = g(x, cfg)
    e_out, e_c = f(x, Config())
    assert_same(out, e_out)
    assert type(c) is Config and vars(c) == vars(e_c) and cfg.layers == [1, 2, 3]
    assert cc.frame_count == 1
    return c, cfg


def test_deepcopy_result_escapes_as_a_real_object():
    def f(x, cfg):
        c = _text_config(cfg)
        return x + 1, c

    c, cfg = _returns_a_copy(f)
    assert c is not cfg and c.names is not cfg.names


def test_deepcopy_shares_a_repeated_object_once():
    def f(x, cfg):
        shared = [cfg.scale]
        c = copy.deepcopy({"a": shared, "b": shared, "cfg": cfg})
        c["a"].append(7)
        return x * len(c["b"]), c["cfg"] is cfg, c["a"] is c["b"]

    cc, g = _compile(f)
    cfg = Config()
    x = torch.randn(3)
    assert_same(g(x, cfg), f(x, cfg))
    assert cc.frame_count == 1


def test_copy_copy_is_shallow():
    def f(x, cfg):
        c = copy.copy(cfg)
        c.scale = 9
        return x * c.scale, c.names is cfg.names

    cc, g = _compile(f)
    cfg = Config()
    x = torch.randn(3)
    assert_same(g(x, cfg), f(x, Config()))
    assert cfg.scale == 2 and cc.frame_count == 1


def test_a_copy_of_a_copy_is_one_graph():
    # Whisper's decoder copies its config, and the cache built from the copy copies it again
    def f(x, cfg):
        first = copy.deepcopy(cfg)
        first.scale = 4
        second = copy.deepcopy(first)
        second.layers.append(9)
        return x * second.scale + len(second.layers) + len(first.layers), second

    _returns_a_copy(f)


def test_a_c_method_of_a_new_object_is_bound_to_it():
    def f(x, cfg):
        a, b = copy.copy(cfg), copy.copy(cfg)
        same, other = a.__eq__, a.__ne__          # bound methods, read first and called later
        return x + 1, same(a), same(b), other(b), a == b, a != a

    cc, g = _compile(f, fullgraph=False)
    x = torch.randn(3)
    assert_same(g(x, Config()), f(x, Config()))


@pytest.mark.parametrize("cls", [WithGetstate, WithDeepcopy])
def test_a_class_that_customizes_copying_is_honoured(cls):
    def f(x, cfg):
        return x * copy.deepcopy(cfg).scale

    cc, g = _compile(f)
    x = torch.randn(3)
    assert_same(g(x, cls()), f(x, cls()))
    assert cc.frame_count == 1


def test_slots_and_a_copy_after_a_store_fall_back_to_eager_and_stay_right():
    def f(x, obj):
        return x * copy.deepcopy(obj).scale

    def g_store(x, cfg):
        cfg.scale = 4            # the copy must see this store, not the object's old state
        return x * copy.deepcopy(cfg).scale

    for fn, make in ((f, Slotted), (g_store, Config)):
        cc, g = _compile(fn, fullgraph=False)
        x = torch.randn(3)
        a, b = make(), make()
        assert_same(g(x, a), fn(x, b))
        assert vars(a) == vars(b) if hasattr(a, "__dict__") else a.scale == b.scale


def test_id_of_an_argument_or_a_new_object_is_a_token():
    def f(x, cfg):
        seen = {id(cfg): "cfg"}
        new = []
        seen[id(new)] = "new"
        same = id(new) == id(new)
        return x + len(seen), seen[id(cfg)], same

    cc, g = _compile(f)
    x = torch.randn(3)
    cfg = Config()
    assert_same(g(x, cfg), f(x, cfg))
    assert_same(g(x, Config()), f(x, Config()))    # another object: the same graph
    assert cc.frame_count == 1


def test_id_of_a_global_is_a_constant_behind_an_identity_guard():
    def f(x):
        return x + (id(GLOBAL_CONFIG) == id(GLOBAL_CONFIG)), id(GLOBAL_CONFIG)

    cc, g = _compile(f)
    x = torch.randn(3)
    assert_same(g(x), f(x))
    assert cc.frame_count == 1


def test_the_number_of_a_new_objects_id_is_not_made_up():
    def f(x):
        new = []
        return x + 1, id(new) % 7

    cc = CompileCounter()
    g = kiln.compile(f, backend=cc)
    x = torch.randn(3)
    out, _ = g(x)
    assert_same(out, x + 1)
    with pytest.raises(Exception, match="id"):
        kiln.compile(f, backend=CompileCounter(), fullgraph=True)(x)


class _Plain:
    pass


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_dict_of_a_new_object_is_the_objects_own(backend):
    """``a.__dict__`` of an object made in the function is one dict, the object's: the same
    object at every read, written through across a graph break, and still the object's own
    when both are returned."""
    def f(x):
        a = _Plain()
        a.x = x * 2
        d = a.__dict__
        same = d is a.__dict__ and vars(a) is d
        print(end="")           # a graph break
        d["y"] = x + 1
        d.pop("x")
        return same, sorted(vars(a)), d is a.__dict__, d, a

    x = torch.ones(2)
    want = f(x)
    got = kiln.compile(f, backend=backend)(x)
    assert got[:3] == want[:3] == (True, ["y"], True)
    d, a = got[3], got[4]
    assert d is a.__dict__
    torch.testing.assert_close(a.y, x + 1)
