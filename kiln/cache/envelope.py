"""The artifact envelope: the one file format of cache entries, frame records, kernel records
and packages.

An envelope is a zip archive (stdlib ``zipfile``; ``unzip -l`` lists it). Its members are
stored uncompressed (``ZIP_STORED``): a payload that is itself a ``torch.save`` zip is kept
byte for byte, with no second compression to undo on load. The first member, ``kiln.json``, is
the header anyone can read (``unzip -p FILE kiln.json``)::

    {"format": "kiln package", "version": 4, "kiln": "0.1.0", "torch": "2.13.0",
     "header": {...},                          # what the writer says of the file (may be {})
     "members": [{"name": "manifest.json", "size": 1234, "sha256": "..."}, ...],
     "sha256": "..."}                          # the content hash

The content hash is the SHA-256 of the header's JSON without its own ``sha256`` field (keys
sorted, compact): it covers the header and, through their listed digests, every member. A
reader checks, before it returns anything: the archive opens and starts with ``kiln.json``;
the format name and version; the content hash; that the members are exactly those listed,
each with its size and SHA-256 (zip's CRC-32s are for zip tools; kiln.json's is checked too);
that the zip's own bookkeeping (local headers, directory, end record) is as ``pack`` writes it.
So every byte of the file is checked before anything of it is unpickled or run: a changed
byte anywhere is refused (in files under 4 GiB; zip64's own fields are left to zipfile). ``read_header``
reads ``kiln.json`` alone (``kiln cache ls``), checking the content hash of the header only.

This module sits in ``kiln/cache/``, the lowest layer that writes such files: the packages
(``kiln/package/``) and the backends' kernel records import it from above.
"""
from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
from dataclasses import dataclass
from typing import Mapping

import torch

from ..version import __version__

HEADER = "kiln.json"
_LOCAL_MAGIC = b"PK\x03\x04"
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")    # (zip's local file header, 30 bytes)
_END = struct.Struct("<4s4H2LH")                  # (zip's end of central directory, 22 bytes)
_CENTRAL_HEADER_SIZE = 46
# members carry a fixed time and mode: the same content gives the same bytes
_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_MODE = 0o644 << 16
# the starts of the files of earlier kilns (their own binary layouts): refused as old, by name
OLD_MAGICS = {b"KILNAOT1": "a kiln cache file", b"KILNPKG\x01": "a kiln package"}

# why bytes are not a usable envelope (EnvelopeError.reason)
FOREIGN = "foreign"        # not an envelope, or one of another format
OLD = "old"                # written by an earlier kiln (old layout, or an older version)
TRUNCATED = "truncated"    # starts as an envelope, but its end (the zip directory) is missing
DAMAGED = "damaged"        # changed bytes: a CRC, a digest or the content hash does not match
VERSION = "version"        # a version of the format this kiln does not read (newer)


class EnvelopeError(Exception):
    """Bytes that are not a usable envelope of the format asked for. ``reason``: one of
    FOREIGN, OLD, TRUNCATED, DAMAGED, VERSION; the message says what was found (``describe``
    puts the two together); ``version``: the file's version of the format, where it was read."""

    def __init__(self, reason: str, message: str, version: object = None):
        super().__init__(message)
        self.reason = reason
        self.version = version

    def describe(self, what: str) -> str:
        """The refusal in words, for a file that should have been ``what`` (a kiln cache entry)."""
        return {FOREIGN: f"not {what}", OLD: "written by an earlier kiln", TRUNCATED: "truncated",
                DAMAGED: "content hash mismatch", VERSION: "written by a newer kiln"}[self.reason] + f" ({self})"


@dataclass(frozen=True)
class Format:
    """A kind of envelope: its name in ``kiln.json`` and the version this kiln writes; a reader
    accepts ``readable`` (default: that version only)."""
    name: str
    version: int
    readable: tuple = ()

    def reads(self, version: object) -> bool:
        return version in (self.readable or (self.version,))


class Envelope:
    """An envelope read and verified: its header, and its members by name."""

    def __init__(self, info: dict, members: dict[str, bytes]):
        self.format, self.version = info["format"], info["version"]
        self.kiln, self.torch = info["kiln"], info["torch"]
        self.header: dict = info["header"]
        self.members = members

    def member(self, name: str) -> bytes:
        return self.members[name]


def _canonical(info: dict) -> bytes:
    return json.dumps(info, sort_keys=True, separators=(",", ":")).encode()


def _content_hash(info: dict) -> str:
    return hashlib.sha256(_canonical({k: v for k, v in info.items() if k != "sha256"})).hexdigest()


def pack(fmt: Format, header: dict, members: Mapping[str, bytes]) -> bytes:
    """The bytes of an envelope of ``fmt`` holding ``header`` (JSON; values JSON cannot hold
    are written as their ``str``) and ``members`` (name -> bytes, in this order)."""
    if HEADER in members:
        raise ValueError(f"an envelope member cannot be named {HEADER}")
    listed = [{"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
              for name, data in members.items()]
    info = {"format": fmt.name, "version": fmt.version, "kiln": __version__, "torch": torch.__version__,
            "header": header, "members": listed}
    # (as a reader will see it: the hash is of the JSON the file holds, not of the writer's objects)
    info = json.loads(json.dumps(info, sort_keys=True, default=str))
    info["sha256"] = _content_hash(info)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        _add(zf, HEADER, json.dumps(info, sort_keys=True, indent=1).encode())
        for name, data in members.items():
            _add(zf, name, data)
    return buf.getvalue()


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    zi = zipfile.ZipInfo(name, date_time=_DATE_TIME)
    zi.create_system, zi.external_attr = 3, _MODE
    zf.writestr(zi, data, compress_type=zipfile.ZIP_STORED)


def unpack(data: bytes, fmt: Format) -> Envelope:
    """The verified envelope in ``data``; EnvelopeError for anything else (nothing of it is
    returned before every check passed)."""
    _check_start(data, fmt)
    zf = _open(io.BytesIO(data), data[-_END.size:])
    with zf:
        spans = _check_layout(zf, data)
        info = _read_info(zf, fmt)
    listed = info["members"]
    if list(spans)[1:] != [m.get("name") for m in listed]:
        raise _damaged(f"its members are not the ones its {HEADER} lists")
    members = {}
    for m in listed:
        # (sliced out where the checked layout puts it: its SHA-256 makes zip's CRC-32 redundant)
        start, size = spans[m["name"]]
        data_m = data[start:start + size]
        if size != m.get("size") or hashlib.sha256(data_m).hexdigest() != m.get("sha256"):
            raise _damaged(f"member {m['name']!r}")
        members[m["name"]] = data_m
    return Envelope(info, members)


def read(path: str, fmt: Format) -> Envelope:
    """The verified envelope in the file ``path`` (OSError when it cannot be read)."""
    with open(path, "rb") as f:
        data = f.read()
    return unpack(data, fmt)


def read_header(path: str, *formats: Format) -> dict:
    """The ``header`` of the envelope at ``path`` (one of ``formats``), reading ``kiln.json``
    only; its members are not read (nor checked). OSError or EnvelopeError."""
    with open(path, "rb") as f:
        start = f.read(len(_LOCAL_MAGIC) + 26 + len(HEADER))
        _check_start(start, formats[0])
        f.seek(0, io.SEEK_END)
        f.seek(max(f.tell() - _END.size, 0))
        last = f.read()
        with _open(f, last) as zf:
            return _read_info(zf, *formats)["header"]


def _open(f, last: bytes) -> zipfile.ZipFile:
    """The zip archive in ``f``, whose last bytes are ``last``."""
    try:
        return zipfile.ZipFile(f)
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as e:
        # (no end record where kiln writes it, at the end: the file was cut short)
        if last.startswith(b"PK\x05\x06") and len(last) == _END.size:
            raise _damaged(f"its zip directory is unreadable: {e}") from None
        raise EnvelopeError(TRUNCATED, f"its zip directory is missing: {e}") from None


def _check_start(data: bytes, fmt: Format) -> None:
    for magic, what in OLD_MAGICS.items():
        if data.startswith(magic):
            raise EnvelopeError(OLD, f"{what} in kiln's binary layout from before the zip envelope")
    # (the first local header names kiln.json: a zip that does not is no kiln file)
    if not (data.startswith(_LOCAL_MAGIC) and data[30:30 + len(HEADER)] == HEADER.encode()):
        raise EnvelopeError(FOREIGN, f"no {HEADER} at its start")


def _damaged(detail: str) -> EnvelopeError:
    return EnvelopeError(DAMAGED, detail)


def _check_layout(zf: zipfile.ZipFile, data: bytes) -> dict[str, tuple[int, int]]:
    """Where each member's bytes are in ``data`` (name -> start, size), the archive checked to
    be laid out byte for byte as ``pack`` writes it (so that no byte of the file goes
    unchecked): kiln.json first, the members one after the other from the start, each local
    header agreeing with the zip directory, the directory filling the rest up to its end
    record, no comments."""
    infos = zf.infolist()
    if not infos or infos[0].filename != HEADER or zf.comment:
        raise _damaged(f"{HEADER} is not its first member")
    if len({i.filename for i in infos}) != len(infos):
        raise _damaged("a member name appears twice")
    pos, spans = 0, {}
    for i in infos:
        if i.header_offset != pos or pos + _LOCAL_HEADER.size > len(data):
            raise _damaged(f"member {i.filename!r} is not where the zip directory says")
        local = _LOCAL_HEADER.unpack_from(data, pos)
        name, (n, extra) = i.filename.encode(), local[-2:]
        start = pos + _LOCAL_HEADER.size
        if data[start:start + n] != name or not _as_written(i) or \
                (not _zip64(i) and local != _local_header(i, name)):
            raise _damaged(f"the zip headers of member {i.filename!r} disagree")
        spans[i.filename] = (start + n + extra, i.file_size)
        pos = start + n + extra + i.file_size
    if pos > len(data):
        raise _damaged(f"member {infos[-1].filename!r} runs past the end")
    if len(data) < zipfile.ZIP64_LIMIT:
        _check_directory(infos, data, pos)
    return spans


def _as_written(i: zipfile.ZipInfo) -> bool:
    return (i.compress_type, i.create_system, i.external_attr, i.internal_attr, i.volume, i.comment) == \
        (zipfile.ZIP_STORED, 3, _MODE, 0, 0, b"") and i.compress_size == i.file_size \
        and i.create_version == i.extract_version


def _zip64(i: zipfile.ZipInfo) -> bool:
    """(A member over 4 GiB, or past them, keeps its sizes and offset in an extra field.)"""
    return i.file_size >= zipfile.ZIP64_LIMIT or i.header_offset >= zipfile.ZIP64_LIMIT


def _local_header(i: zipfile.ZipInfo, name: bytes) -> tuple:
    """The fields of ``i``'s local header as ``pack`` writes them, from the zip directory."""
    y, mo, d, h, mi, sec = i.date_time
    return (_LOCAL_MAGIC, i.extract_version, i.reserved, i.flag_bits, zipfile.ZIP_STORED,
            h << 11 | mi << 5 | sec // 2, (y - 1980) << 9 | mo << 5 | d, i.CRC, i.file_size, i.file_size,
            len(name), 0)


def _check_directory(infos: list, data: bytes, pos: int) -> None:
    """The zip directory from ``pos``: an entry per member, then the end record, to the end."""
    at = pos
    for i in infos:
        name = i.filename.encode()
        lengths = struct.unpack_from("<3H", data, at + 28) if at + _CENTRAL_HEADER_SIZE <= len(data) else None
        if lengths != (len(name), len(i.extra), len(i.comment)) \
                or data[at + _CENTRAL_HEADER_SIZE:at + _CENTRAL_HEADER_SIZE + len(name)] != name:
            raise _damaged("its zip directory is not as kiln writes it")
        at += _CENTRAL_HEADER_SIZE + sum(lengths)
    end = _END.unpack_from(data, at) if at + _END.size == len(data) else None
    if end != (b"PK\x05\x06", 0, 0, len(infos), len(infos), at - pos, pos, 0):
        raise _damaged("its zip end record is not as kiln writes it")


def _read(zf: zipfile.ZipFile, name: str) -> bytes:
    try:
        return zf.read(name)         # (checks the member's CRC-32)
    except (zipfile.BadZipFile, KeyError, ValueError, EOFError, OSError) as e:
        raise _damaged(f"member {name!r}: {e}") from None


def _read_info(zf: zipfile.ZipFile, *formats: Format) -> dict:
    """``kiln.json``, checked: one of ``formats`` in a version it reads, and its content hash."""
    try:
        info = json.loads(_read(zf, HEADER))
    except ValueError as e:
        raise _damaged(f"unreadable {HEADER}: {e}") from None
    if not isinstance(info, dict):
        raise _damaged(f"unreadable {HEADER}")
    fmt = next((f for f in formats if f.name == info.get("format")), None)
    if fmt is None:
        raise EnvelopeError(FOREIGN, f"a {info.get('format')!r} file")
    version = info.get("version")
    if not fmt.reads(version):
        older = isinstance(version, int) and version < fmt.version
        raise EnvelopeError(OLD if older else VERSION, f"version {version} of {fmt.name!r}; this kiln reads "
                            f"{', '.join(map(str, fmt.readable or (fmt.version,)))}", version)
    if info.get("sha256") != _content_hash(info) or not isinstance(info.get("members"), list) \
            or not isinstance(info.get("header"), dict) or not all(isinstance(m, dict) for m in info["members"]):
        raise _damaged(f"{HEADER} does not match its content hash")
    return info
