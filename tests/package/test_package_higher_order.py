"""Packages of functions whose graphs hold subgraphs (``torch.cond``'s branches,
``torch.while_loop``'s condition and body): saved whole, each subgraph once, and loaded in a
fresh process with nothing captured, traced or lowered; a damaged subgraph is refused."""
import json
import operator
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.package import PackageError, fileformat
from kiln.package.graphs import _graph_from_data, _graph_to_data
from kiln.package.values import Decoder, Encoder

import _fresh_process as P
import _pkg_models as M

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _run(cwd: pathlib.Path, *args: str) -> str:
    home = cwd / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "KILN_CACHE_DIR": str(cwd / "kiln-cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    env.pop("KILN_LOGS", None)
    out = subprocess.run([sys.executable, str(HERE / "_fresh_process.py"), *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_cond_and_while_loop_packages_load_elsewhere_without_compiling(tmp_path, monkeypatch, backend):
    (tmp_path / "pkgs").mkdir()
    # saved here (a cache dir of its own), loaded in a fresh process
    monkeypatch.setattr(kiln.config, "cache_dir", str(tmp_path / "save" / "kiln-cache"))
    kiln.reset()
    P.save_higher_order(str(tmp_path / "pkgs"), backend)
    kiln.reset()
    assert "LOADED HIGHER ORDER" in _run(tmp_path / "load", "load_higher_order", str(tmp_path / "pkgs"), backend)


def _shared_block_graph() -> torch.fx.GraphModule:
    """A captured-style graph calling one block three times through one subgraph: two get_attr
    nodes of one target and one of another target naming the same object."""
    block = make_fx(lambda a: (a.sin() * 2 + torch.ones(3),))(torch.randn(3))
    root = torch.nn.Module()
    root.block = block
    root.alias = block
    g = torch.fx.Graph()
    y = g.placeholder("x")
    for target in ("block", "block", "alias"):
        out = g.call_function(torch.ops.higher_order.invoke_subgraph, (g.get_attr(target), "block", y))
        y = g.call_function(operator.getitem, (out, 0))
    g.output((y,))
    return torch.fx.GraphModule(root, g)


def test_a_shared_subgraph_is_saved_once_and_loads_as_one_attribute():
    gm = _shared_block_graph()
    data, tensors = _graph_to_data(gm, Encoder(M.f))
    data = json.loads(json.dumps(data))              # (what the manifest holds)
    assert len(data["subgraphs"]) == 1
    assert [d["subgraph"] for d in data["nodes"] if d["op"] == "get_attr"] == [0, 0, 0]
    loaded = _graph_from_data(data, tensors, Decoder(M.f))
    assert loaded.block is loaded.alias
    x = torch.randn(3)
    torch.testing.assert_close(loaded(x), gm(x))


@pytest.fixture
def cond_package(tmp_path):
    kiln.reset()
    c = kiln.compile(M.with_cond, backend="aot_eager", fullgraph=True)
    c(M.signed((4, 3), 1), torch.randn(4, 3))
    path = tmp_path / "cond.kiln"
    report = c.save_package(path)
    assert report.entries == 1 and not report.left_out, report
    kiln.reset()
    yield path
    kiln.reset()


def test_a_flipped_byte_in_a_subgraph_is_refused(cond_package):
    data = bytearray(cond_package.read_bytes())
    at = data.find(b'"subgraphs"')                   # (the captured graph's subgraphs, in the manifest)
    assert at > 0
    data[at + 40] ^= 0x04
    cond_package.write_bytes(bytes(data))
    with pytest.raises(PackageError, match="damaged"):
        kiln.load_package(cond_package, M.with_cond)


def test_a_package_whose_subgraph_is_missing_never_runs_it(cond_package):
    """A whole file whose graph refers to a subgraph it does not hold (a kiln with a defect
    wrote it): the entry is not loaded, said so, and its calls compile."""
    pkg = fileformat.read(str(cond_package))
    manifest = json.loads(json.dumps(pkg.manifest))
    text = json.dumps(manifest)
    assert '"subgraph": 1' in text
    manifest = json.loads(text.replace('"subgraph": 1', '"subgraph": 5'))
    blobs = fileformat.Blobs()
    for i in range(len(pkg.blob_sizes())):
        blobs.add(pkg.blob(i))
    fileformat.write(str(cond_package), manifest, blobs)
    assert zipfile.ZipFile(cond_package).testzip() is None
    with pytest.warns(RuntimeWarning, match="could not be loaded.*subgraph 5, which it does not hold"):
        fast = kiln.load_package(cond_package, M.with_cond, on_miss="compile")
    for sign in (1, -1):
        x, y = M.signed((4, 3), sign), torch.randn(4, 3)
        torch.testing.assert_close(fast(x, y), M.with_cond(x, y))


@pytest.mark.parametrize("name", ["cond", "while_loop", "scan", "map_impl", "flex_attention", "invoke_subgraph"])
def test_higher_order_ops_are_saved_by_their_registered_name(name):
    op = getattr(torch.ops.higher_order, name)
    enc = Encoder(M.f).encode(op, identity=True)
    assert enc == ["higher_order_op", name, type(op).__module__]
    assert Decoder(M.f).decode(json.loads(json.dumps(enc))) is op
