"""Packages of library models: a Hugging Face decoder at its defaults saves its entry and loads
in a fresh process with nothing captured. Its guards reach objects that have no name of their
own (a class's ``__dict__`` slot, a property, a decorated function under its wrapper, a
module-level instance, a class attribute reached by its path), and its inlined functions sit
under decorators' wrappers that share their qualified names."""
import functools
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

from kiln.package.identity import code_hash, codes_of
from kiln.package.values import Decoder, Encoder

HERE = os.path.dirname(__file__)


def _run(*args, **env_vars):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]), **env_vars)
    r = subprocess.run([sys.executable, os.path.join(HERE, "_library_model_process.py"), *args],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout


def _stats(out: str) -> dict:
    return json.loads(out.split("STATS ", 1)[1].splitlines()[0])


def _first_process(tmp_path_factory, mode: str) -> tuple:
    """The first process of two tests, run once for the module: ``mode`` (``save`` or
    ``save-train``) compiles the model over an empty cache directory (frame records on), calls
    it, prints the cache stats and saves a package. Its output, the package and the cache."""
    pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp(mode)
    path, cache = d / "qwen2.kiln", d / "cache"
    out = _run(mode, str(path), KILN_CACHE_DIR=str(cache), KILN_CACHE_FRAMES="1")
    return out, str(path), cache


@pytest.fixture(scope="module")
def decoder_saved(tmp_path_factory):
    return _first_process(tmp_path_factory, "save")


@pytest.fixture(scope="module")
def training_step_saved(tmp_path_factory):
    return _first_process(tmp_path_factory, "save-train")


def test_a_transformers_decoder_package_loads_in_a_fresh_process_without_capture(decoder_saved):
    out, path, _ = decoder_saved
    assert "saved" in out
    assert "loaded" in _run("load", path)


def test_a_warm_process_serves_a_transformers_decoder_from_its_frame_record(tmp_path, decoder_saved):
    """The record's inlined functions sit under decorators' wrappers (``can_return_tuple``) and
    include a dataclass's generated ``__init__``: all are checked by name in the new process."""
    out, _, first_cache = decoder_saved
    cache = str(tmp_path / "cache")
    shutil.copytree(first_cache, cache)           # (the cache the first process left: ours to change)
    cold = _stats(out)
    assert cold["frame_misses"] == 1
    warm = _stats(_run("warm", "-", KILN_CACHE_DIR=cache, KILN_CACHE_FRAMES="1"))
    assert warm["frame_hits"] == 1 and warm["frame_misses"] == 0, warm


def test_a_transformers_training_step_package_loads_and_compiles_nothing(tmp_path, training_step_saved):
    """Inductor, a training step at the model's defaults: the entry holds the forward and the
    backward made at run time (the segmented graph's, as one), so the loading process neither
    captures nor lowers anything."""
    _, path, _ = training_step_saved
    loaded = _stats(_run("load-train", path, KILN_CACHE_DIR=str(tmp_path / "empty")))
    assert loaded["imported"] == [], loaded


def test_a_warm_process_serves_a_training_step_from_its_frame_record(tmp_path, training_step_saved):
    out, _, first_cache = training_step_saved
    cache = str(tmp_path / "cache")
    shutil.copytree(first_cache, cache)
    cold = _stats(out)
    assert cold["frame_misses"] == 1
    warm = _stats(_run("warm-train", "-", KILN_CACHE_DIR=cache, KILN_CACHE_FRAMES="1"))
    assert warm["frame_hits"] == 1 and warm["frame_misses"] == 0 and warm["misses"] == 0, warm
    assert warm["imported"] == [], warm       # the backward came from the record too


def _decorated(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return fn(*a, **k)
    return wrapper


class _Holder:
    __slots__ = ("slot",)

    @property
    def prop(self):
        return 1

    @staticmethod
    def static():
        return 2


def _round_trip(obj):
    # (a function of another module: the object is not found among its globals)
    namespace = {"__name__": "elsewhere"}
    exec("def fn():\n    return None", namespace)
    fn = namespace["fn"]
    enc = Encoder(fn)
    return Decoder(fn).decode(enc.encode(obj, identity=True))


class _Registry:
    def act(self, x):
        return x


_REGISTRY = _Registry()
_GELU_TANH = functools.partial(__import__("torch").nn.functional.gelu, approximate="tanh")


@pytest.mark.parametrize("get", [
    lambda: object.__dict__["__class__"],            # a getset descriptor
    lambda: _Holder.__dict__["slot"],                # a member descriptor
    lambda: _Holder.__dict__["prop"],                # a property
    lambda: _Holder.__dict__["static"],              # a staticmethod object
    lambda: os.environ,                              # a module-level instance
    lambda: functools.__dict__,                      # a module's globals
    lambda: sys.modules["_collections_abc"].__dict__,    # one whose __name__ names another module
    lambda: logging.getLogger("kiln.aot"),          # a logger: one per name in every process
    lambda: logging.getLogger(),                     # the root logger
    lambda: __import__("torch").nn.functional.max_pool2d,   # a factory's function (boolean_dispatch)
    lambda: _GELU_TANH,                              # a module-level functools.partial
], ids=["getset", "member", "property", "staticmethod", "module_instance", "globals", "renamed_globals", "logger",
        "root_logger", "factory_function", "partial"])
def test_objects_without_a_name_of_their_own_are_found_again(get):
    assert _round_trip(get()) is get()


@pytest.mark.parametrize("get", [lambda: _REGISTRY.act, lambda: os.environ.get], ids=["registry", "os_environ"])
def test_a_bound_method_of_a_named_instance_comes_back_equal(get):
    """(A bound method is a new object on every attribute read: an equal one comes back.)"""
    assert _round_trip(get()) == get()


def test_a_decorated_function_is_found_under_its_wrapper():
    import transformers.models.qwen2.modeling_qwen2 as q

    inner = q.Qwen2Model.forward
    while hasattr(inner, "__wrapped__"):
        inner = inner.__wrapped__
    assert inner is not q.Qwen2Model.forward
    assert _round_trip(inner) is inner


def test_the_identity_check_reads_the_codes_under_a_wrapper():
    def f(x):
        return x + 1
    g = _decorated(f)
    hashes = {code_hash(c) for c in codes_of(g)}
    assert code_hash(f.__code__) in hashes and code_hash(g.__code__) in hashes


def test_a_function_a_wrapper_keeps_in_its_closure_is_under_the_wrappers_name():
    """``huggingface_hub``'s ``strict`` replaces a config class's ``__setattr__`` by a wrapper
    that calls the original from its closure (no ``__wrapped__``)."""
    def original(self, name, value):
        object.__setattr__(self, name, value)

    def make_strict(setattr_):
        def strict_setattr(self, name, value):
            setattr_(self, name, value)
        return strict_setattr
    wrapper = make_strict(original)
    assert code_hash(original.__code__) in {code_hash(c) for c in codes_of(wrapper)}


def _strict(setattr_):
    def strict_setattr(self, name, value):
        setattr_(self, name, value)
    return strict_setattr


class _StrictConfig:
    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)


_ORIGINAL_SETATTR = _StrictConfig.__dict__["__setattr__"]
_StrictConfig.__setattr__ = _strict(_ORIGINAL_SETATTR)


def test_a_function_in_a_cell_of_a_named_classs_wrapper_is_found_through_the_class():
    from kiln.capture.sources import CellSource
    from kiln.package.guards import _path_from_a_named_object

    def fn():
        return None
    enc = Encoder(fn)
    enc.encode(_StrictConfig, identity=True)
    cell = _StrictConfig.__dict__["__setattr__"].__closure__[0]
    path = _path_from_a_named_object(CellSource(cell, "setattr_"), enc)
    assert path is not None
    assert Decoder(fn).decode(path) is _ORIGINAL_SETATTR


def test_a_module_made_in_the_call_is_not_guarded():
    """A parameterless module the model builds in its forward (``CrossEntropyLoss()``) is the
    capture's own object: no guard reads it, so packages and frame records can hold the entry."""
    import torch

    import kiln
    from kiln.testing import CompileCounter

    def f(x, y):
        return torch.nn.CrossEntropyLoss()(x, y)

    cc = CompileCounter()
    g = kiln.compile(f, backend=cc)
    x, y = torch.randn(4, 3), torch.randint(0, 3, (4,))
    torch.testing.assert_close(g(x, y), f(x, y))
    texts = [gd.describe() for e in g.entries for gd in e.guards]
    assert texts and not any("<CrossEntropyLoss" in t for t in texts), texts
    assert cc.frame_count == 1


_POOLING_NET = """
import json, sys, torch, kiln
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.MaxPool2d(2), torch.nn.ReLU()).eval()
x = torch.randn(2, 3, 16, 16)
if sys.argv[1] == "load":
    fn = kiln.load_package(sys.argv[2], net, on_miss="error")
else:
    fn = kiln.compile(net, backend="aot_eager")
with torch.no_grad():
    torch.testing.assert_close(fn(x), net(x))
if sys.argv[1] == "save":
    print("SAVED", sum(fn.save_package(sys.argv[2]).saved.values()))
print("STATS " + json.dumps(kiln.cache.stats()))
"""


def test_a_model_calling_a_factory_made_function_is_packaged_and_recorded(tmp_path):
    """``F.max_pool2d`` (what ``nn.MaxPool2d`` calls, as timm's ResNets do) is made by
    ``boolean_dispatch`` and bound in ``torch.nn.functional`` under its name: its graph node
    and the inlined dispatcher are found by that name in another process."""
    script = tmp_path / "pooling.py"
    script.write_text(_POOLING_NET)
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_CACHE_FRAMES="1")

    def run(*args):
        r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout
    path = str(tmp_path / "pool.kiln")
    assert "SAVED 1" in run("save", path)
    run("load", path)
    warm = _stats(run("warm", "-"))
    assert warm["frame_hits"] == 1 and warm["frame_misses"] == 0, warm
