"""The package file: an artifact envelope (a zip) with a content hash; truncated, changed,
foreign or old-format files are refused before anything in them runs; ``kiln package inspect``
prints the manifest."""
import hashlib
import json
import struct
import zipfile

import pytest
import torch

import kiln
from kiln.cli import main as cli
from kiln.package import PackageError, fileformat

import _pkg_models as M


@pytest.fixture
def package(tmp_path):
    kiln.reset()
    c = kiln.compile(M.with_break, backend="aot_eager")
    c(torch.randn(3))
    path = tmp_path / "b.kiln"
    c.save_package(path)
    kiln.reset()
    yield path
    kiln.reset()


def _refused(path, match, monkeypatch):
    import kiln.package.load as load

    # nothing of a refused package may run: rebuilding its entries is the first thing that would
    monkeypatch.setattr(load, "load_entries", lambda *a: pytest.fail("a refused package ran"))
    with pytest.raises(PackageError, match=match):
        kiln.load_package(path, M.with_break)
    assert cli(["package", "inspect", str(path)]) == 1


def test_truncated(package, monkeypatch):
    data = package.read_bytes()
    for n in (len(data) - 1, len(data) // 2, 20):
        package.write_bytes(data[:n])
        _refused(package, "truncated|damaged", monkeypatch)


def test_bit_flipped(package, monkeypatch):
    data = bytearray(package.read_bytes())
    for pos in (len(data) - 5, len(data) // 2, 60):
        flipped = bytearray(data)
        flipped[pos] ^= 0x10
        package.write_bytes(bytes(flipped))
        _refused(package, "damaged", monkeypatch)


def test_a_package_is_a_zip_whose_header_lists_the_manifest_and_blobs(package):
    zf = zipfile.ZipFile(package)
    assert zf.testzip() is None
    info = json.loads(zf.read("kiln.json"))
    assert (info["format"], info["version"]) == ("kiln package", fileformat.FORMAT_VERSION)
    assert info["kiln"] == kiln.__version__ and info["torch"] == torch.__version__
    pkg = fileformat.read(str(package))
    blobs = [f"blobs/{i}" for i in range(len(pkg.blob_sizes()))]
    assert blobs and zf.namelist() == ["kiln.json", "manifest.json", *blobs]
    assert [m["name"] for m in info["members"]] == ["manifest.json", *blobs]
    assert json.loads(zf.read("manifest.json")) == pkg.manifest
    assert all(zf.read(b) == pkg.blob(i) for i, b in enumerate(blobs))


def test_a_flipped_byte_in_any_member_is_refused(package, monkeypatch):
    data = package.read_bytes()
    for i in zipfile.ZipFile(package).infolist():
        start = i.header_offset + 30 + len(i.filename)
        for pos in (start, start + i.file_size // 2, start + i.file_size - 1):
            flipped = bytearray(data)
            flipped[pos] ^= 0x04
            package.write_bytes(bytes(flipped))
            _refused(package, "damaged: its content hash does not match", monkeypatch)


def _old_layout_package(manifest: dict, blobs: list, format_version: int) -> bytes:
    """A package as kilns before format 4 wrote it: their own binary layout."""
    offsets, pos = [], 0
    for b in blobs:
        offsets.append([pos, len(b)])
        pos += len(b)
    text = json.dumps({**manifest, "format": format_version, "blobs": offsets}).encode()
    body = struct.pack(">Q", len(text)) + text + b"".join(blobs)
    return b"KILNPKG\x01" + hashlib.sha256(body).digest() + body


def test_an_old_format_package_is_refused_saying_to_save_it_again(package, monkeypatch):
    pkg = fileformat.read(str(package))
    old = _old_layout_package(pkg.manifest, [pkg.blob(i) for i in range(len(pkg.blob_sizes()))], 3)
    package.write_bytes(old)
    _refused(package, "older package format.*this kiln reads format 4. Save the package again with this kiln",
             monkeypatch)


def test_foreign_file(package, monkeypatch):
    package.write_bytes(b"PK\x03\x04 a zip file, not a kiln package" * 10)
    _refused(package, "not a kiln package", monkeypatch)
    torch.save({"x": torch.ones(2)}, package)
    _refused(package, "not a kiln package", monkeypatch)


def test_other_versions_are_refused_clearly(package):
    pkg = fileformat.read(str(package))
    m = dict(pkg.manifest)
    blobs = fileformat.Blobs()
    for i in range(len(pkg.blob_sizes())):
        blobs.add(pkg.blob(i))
    for field, value, match in [("torch", "1.0.0", "torch 1.0.0"), ("kiln", "0.0.1", "kiln 0.0.1"),
                                ("device_kind", "cuda", "CUDA")]:
        if field == "device_kind" and torch.cuda.is_available():
            continue
        m2 = {**m, "environment": {**m["environment"], field: value}}
        fileformat.write(str(package), m2, blobs)
        with pytest.raises(PackageError, match=match):
            kiln.load_package(package, M.with_break)


def test_inspect_prints_the_manifest(package, capsys):
    assert cli(["package", "inspect", str(package)]) == 0
    out = capsys.readouterr().out
    assert "_pkg_models.with_break(x)" in out and "backend='aot_eager'" in out
    assert "TENSOR_MATCH   L['x']: float32[3]" in out          # guards as text
    assert "def forward(self, l_x):" in out                     # graphs as code
    assert "__kiln_resume_with_break" in out and "def __kiln_entry(x):" in out
    # the manifest itself is JSON, and the artifacts are there with their sizes
    pkg = fileformat.read(str(package))
    assert pkg.blob_sizes() and all(size > 0 for size in pkg.blob_sizes()) and json.dumps(pkg.manifest)
    assert f"artifacts    {len(pkg.blob_sizes())} ({sum(pkg.blob_sizes())} bytes)" in out


def test_equal_blobs_are_stored_once():
    """The layers of a model compiled one by one save one compile-cache payload each, the
    same bytes: a package or frame record holds it once."""
    blobs = fileformat.Blobs()
    assert [blobs.add(b"abc"), blobs.add(b"xyz"), blobs.add(bytearray(b"abc")), blobs.add(b"")] == [0, 1, 0, 2]
    assert blobs.parts == [b"abc", b"xyz", b""]
