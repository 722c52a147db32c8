"""The package file: one artifact envelope (``kiln.cache.envelope``), checked whole before
anything in it is used.

Members (``unzip -l net.kiln``)::

    kiln.json       format "kiln package", its version, the kiln and torch that wrote it, the
                    size and SHA-256 of each member below, and the content hash over them all
    manifest.json   everything readable: entries, guards as text, graphs as code, the versions
                    it was saved with
    blobs/0 ...     the graphs' tensor constants and the backends' artifacts (``torch.save``
                    zips among them, stored as they are), by index

A file that is not such an envelope (foreign), that ends early (truncated), whose bytes changed
(a digest, the content hash or the zip's layout does not match), or that an earlier kiln wrote
(its own binary layout, format 3 or before) is refused before its manifest is even parsed:
nothing of it runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform

from ..cache import envelope
from ..version import __version__
from .errors import PackageError

# 2: a continuation several graph breaks resume in is saved once ("ref"); 3: each shape
# condition in parentheses (earlier kilns joined an ``or`` condition unparenthesized with
# ``and``: a check that could pass wrongly, so formats 1 and 2 are not read); 4: the artifact
# envelope (a zip) instead of kiln's own binary layout
FORMAT_VERSION = 4
READABLE_FORMATS = (4,)
FORMAT = envelope.Format("kiln package", FORMAT_VERSION, READABLE_FORMATS)
MANIFEST = "manifest.json"
_AGAIN = "Save the package again with this kiln"


class Blobs:
    """The artifacts of a package being written: ``add(bytes) -> index``. Equal bytes are
    stored once (the layers of a model share one compiled graph: one entry of the compile
    cache, whose payload each layer's entry saves)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self._index: dict[tuple[int, bytes], int] = {}

    def add(self, data: bytes) -> int:
        data = bytes(data)
        digest = (len(data), hashlib.blake2b(data, digest_size=16).digest())
        found = self._index.get(digest)
        if found is not None:
            return found
        self.parts.append(data)
        self._index[digest] = len(self.parts) - 1
        return len(self.parts) - 1


def blob_name(index: int) -> str:
    return f"blobs/{index}"


def environment() -> dict:
    """What a package is valid for: kiln, torch and Python versions, and the device kinds."""
    import torch

    env = {"kiln": __version__, "torch": torch.__version__, "python": ".".join(platform.python_version_tuple()[:2]),
           "machine": platform.machine(), "cuda": None}
    if torch.cuda.is_available():
        env["cuda"] = torch.cuda.get_device_name(0)
    return env


def members(manifest: dict, blobs: Blobs) -> dict[str, bytes]:
    """The members of a package (also of a frame record, ``frame_records``): the manifest, then
    the blobs."""
    out = {MANIFEST: json.dumps(manifest, sort_keys=True).encode()}
    for i, data in enumerate(blobs.parts):
        out[blob_name(i)] = data
    return out


def write(path: str, manifest: dict, blobs: Blobs) -> int:
    """Write the package atomically (a reader never sees half a file); returns its size."""
    data = envelope.pack(FORMAT, {}, members(manifest, blobs))
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return len(data)


class Package:
    """A package read and verified: its manifest, and its blobs by index."""

    def __init__(self, found: envelope.Envelope, path: str):
        if MANIFEST not in found.members:
            raise PackageError(f"{path} is damaged: it has no {MANIFEST}; nothing of it was run. {_AGAIN}")
        try:
            self.manifest = json.loads(found.member(MANIFEST))
        except ValueError as e:       # (its digest matched: written so by a faulty kiln)
            raise PackageError(f"{path} has an unreadable {MANIFEST} ({e}); {_AGAIN}") from None
        self._members = found.members

    def blob(self, index: int) -> bytes:
        return self._members[blob_name(index)]

    def blob_sizes(self) -> list[int]:
        sizes, i = [], 0
        while blob_name(i) in self._members:
            sizes.append(len(self._members[blob_name(i)]))
            i += 1
        return sizes


def read(path: str) -> Package:
    """The verified package at ``path``; PackageError for anything that is not an intact
    kiln package of this format (checked before the manifest is parsed)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PackageError(f"cannot read package {path}: {e}") from None
    return unpack(data, path)


def unpack(data: bytes, path: str) -> Package:
    """The verified package in ``data`` (read from ``path``, named in errors)."""
    try:
        found = envelope.unpack(data, FORMAT)
    except envelope.EnvelopeError as e:
        raise PackageError(refusal(e, path)) from None
    return Package(found, path)


def refusal(e: envelope.EnvelopeError, path: str) -> str:
    """What a package load says of a file the envelope refused, and what to do."""
    if e.reason == envelope.FOREIGN:
        return f"{path} is not a kiln package ({e}); save one with compiled.save_package(path)"
    if e.reason == envelope.TRUNCATED:
        return f"{path} is truncated ({e}); nothing of it was run. Save the package again"
    if e.reason == envelope.DAMAGED:
        return (f"{path} is damaged: its content hash does not match (truncated or changed bytes: {e}); "
                "nothing of it was run. Save the package again")
    readable = ", ".join(map(str, READABLE_FORMATS))
    if e.reason == envelope.OLD:
        return f"{path} has an older package format ({e}); this kiln reads format {readable}. {_AGAIN}"
    return f"{path} has package format {e.version}, newer than this kiln reads ({readable}). {_AGAIN}"


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
