"""The package file: one file, checked whole before anything in it is used.

Layout::

    MAGIC (8 bytes)  SHA-256 of the rest (32 bytes)  manifest length (8 bytes, big-endian)
    manifest (UTF-8 JSON)  blobs (concatenated; the manifest gives each one's offset and size)

The manifest holds everything readable (entries, guards as text, graphs as code, sizes, the
versions it was saved with); the blobs hold the graphs' tensor constants and the backends' artifacts.
A file with another magic, a length that does not add up (truncated) or another hash
(changed bytes) is refused before its manifest is even parsed: nothing of it runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import struct

from ..version import __version__
from .errors import PackageError

MAGIC = b"KILNPKG\x01"
# 2: a continuation several graph breaks resume in is saved once ("ref"); 3: each shape
# condition in parentheses (earlier kilns joined an ``or`` condition unparenthesized with
# ``and``: a check that could pass wrongly, so formats 1 and 2 are not read)
FORMAT_VERSION = 3
READABLE_FORMATS = (3,)
_HEAD = len(MAGIC) + 32 + 8


class Blobs:
    """The artifacts of a package being written: ``add(bytes) -> index``."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def add(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(self.parts) - 1


def environment() -> dict:
    """What a package is valid for: kiln, torch and Python versions, and the device kinds."""
    import torch

    env = {"kiln": __version__, "torch": torch.__version__, "python": ".".join(platform.python_version_tuple()[:2]),
           "machine": platform.machine(), "cuda": None}
    if torch.cuda.is_available():
        env["cuda"] = torch.cuda.get_device_name(0)
    return env


def pack(manifest: dict, blobs: Blobs) -> bytes:
    """The bytes of a package (also the payload of a frame record, ``frame_records``)."""
    offsets, pos = [], 0
    for b in blobs.parts:
        offsets.append([pos, len(b)])
        pos += len(b)
    manifest = {**manifest, "format": FORMAT_VERSION, "blobs": offsets}
    text = json.dumps(manifest, sort_keys=True).encode()
    body = struct.pack(">Q", len(text)) + text + b"".join(blobs.parts)
    return MAGIC + hashlib.sha256(body).digest() + body


def write(path: str, manifest: dict, blobs: Blobs) -> int:
    """Write the package atomically (a reader never sees half a file); returns its size."""
    data = pack(manifest, blobs)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return len(data)


class Package:
    """A package read and verified: its manifest, and its blobs by index."""

    def __init__(self, manifest: dict, data: bytes, base: int):
        self.manifest = manifest
        self._data = data
        self._base = base

    def blob(self, index: int) -> bytes:
        off, size = self.manifest["blobs"][index]
        return self._data[self._base + off:self._base + off + size]


def read(path: str) -> Package:
    """The verified package at ``path``; PackageError for anything that is not an intact
    kiln package (checked before the manifest is parsed)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PackageError(f"cannot read package {path}: {e}") from None
    return unpack(data, path)


def unpack(data: bytes, path: str) -> Package:
    """The verified package in ``data`` (read from ``path``, named in errors)."""
    if not data.startswith(MAGIC):
        raise PackageError(f"{path} is not a kiln package (no kiln package header); "
                           "save one with compiled.save_package(path)")
    if len(data) < _HEAD:
        raise PackageError(f"{path} is truncated ({len(data)} bytes); save the package again")
    digest, body = data[len(MAGIC):len(MAGIC) + 32], data[len(MAGIC) + 32:]
    (n,) = struct.unpack(">Q", body[:8])
    if 8 + n > len(body):
        raise PackageError(f"{path} is truncated (its manifest needs {n} bytes); save the package again")
    if hashlib.sha256(body).digest() != digest:
        raise PackageError(f"{path} is damaged: its content hash does not match (truncated or changed "
                           "bytes); nothing of it was run. Save the package again")
    manifest = json.loads(body[8:8 + n])
    if manifest.get("format") not in READABLE_FORMATS:
        raise PackageError(f"{path} has package format {manifest.get('format')}; this kiln reads "
                           f"{', '.join(map(str, READABLE_FORMATS))}. Save the package again with this kiln")
    return Package(manifest, data, len(MAGIC) + 32 + 8 + n)


def check_environment(path: str, saved: dict) -> None:
    """Raise PackageError when the package was saved for another setup."""
    now = environment()
    diffs = [f"{k} {saved.get(k)} (this process: {now[k]})" for k in ("kiln", "torch", "python", "machine")
             if saved.get(k) != now[k]]
    if saved.get("device_kind") == "cuda" and now["cuda"] is None:
        diffs.append("CUDA (this process has no CUDA device)")
    elif saved.get("device_kind") == "cuda" and saved.get("cuda") != now["cuda"]:
        diffs.append(f"device {saved.get('cuda')} (this process: {now['cuda']})")
    if diffs:
        raise PackageError(f"{path} was saved with " + ", ".join(diffs) +
                           "; a package loads only where it was made. Save it again here")
