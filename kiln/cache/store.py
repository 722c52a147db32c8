"""Entries on disk: ``<cache_dir>/aot/<key>.entry``, each in a hashed envelope.

File layout: ``MAGIC`` (8 bytes), the SHA-256 of the rest (32 bytes), then a 4-byte header
length, a JSON header (function name, key parts, versions) and the payload bytes. A file
whose hash does not match (truncated, bit-flipped) or that cannot be read is treated as
absent, with one warning; the compile that follows rewrites it. Writes go to a temporary
file in the same directory and are renamed into place (atomic on POSIX), so concurrent
writers of one key leave one whole entry, never a mix.

Frame records (``kiln.package.frame_records``) live in
``<cache_dir>/frames/<frame key>/<writer>.rec`` in the same envelope. The directory (entries and records together) is kept under
``kiln.config.cache_size_limit`` bytes by removing the least recently used files (a hit
touches its file's mtime).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import warnings

from .. import logs
from ..config import config
from ..process_state import cache_stats as _stats, cache_stats_lock, cache_warned as _warned, reset_cache_stats

MAGIC = b"KILNAOT1"


class CorruptEntry(Exception):
    pass


def stats() -> dict:
    """Counters since the process started (or ``reset_stats()``): hits, misses, bypasses,
    bytes_read, bytes_written (graphs), frame_hits, frame_misses (frame records: a hit skipped
    capture)."""
    return dict(_stats)


def reset_stats() -> None:
    """Zero the counters (``kiln.reset()`` leaves them: they count the cache on disk)."""
    reset_cache_stats()


def count(name: str, n: int = 1) -> None:
    with cache_stats_lock:
        _stats[name] += n


def warn_once(what: str, message: str) -> None:
    with cache_stats_lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(f"kiln cache: {message}", RuntimeWarning, stacklevel=3)


def aot_dir() -> str:
    return os.path.join(os.path.expanduser(config.cache_dir), "aot")


def entry_path(key: str) -> str:
    return os.path.join(aot_dir(), f"{key}.entry")


def frames_dir() -> str:
    return os.path.join(os.path.expanduser(config.cache_dir), "frames")


def kernels_dir() -> str:
    """Kernel libraries written out of entries to be loaded (``backends.inductor.generated_module``):
    a copy of bytes an entry holds, so evicting or clearing them loses nothing; and the Triton
    kernels recorded after a module's first call (``backends.inductor.triton_kernels``): evicting those
    only makes the next load go through Inductor, which records them again."""
    return os.path.join(os.path.expanduser(config.cache_dir), "kernels")


def record_path(frame_key: str, writer: str) -> str:
    return os.path.join(frames_dir(), frame_key, f"{writer}.rec")


def encode(header: dict, payload: bytes) -> bytes:
    head = json.dumps(header, sort_keys=True, default=str).encode()
    body = struct.pack("<I", len(head)) + head + payload
    return MAGIC + hashlib.sha256(body).digest() + body


def decode(blob: bytes, header_only: bool = False) -> tuple[dict, bytes]:
    if len(blob) < 44 or blob[:8] != MAGIC:
        raise CorruptEntry("not a kiln cache entry (bad magic or truncated)")
    body = blob[40:]
    if not header_only and hashlib.sha256(body).digest() != blob[8:40]:
        raise CorruptEntry("content hash mismatch (truncated or corrupted)")
    (n,) = struct.unpack("<I", body[:4])
    if 4 + n > len(body):
        raise CorruptEntry("truncated header")
    try:
        header = json.loads(body[4:4 + n])
    except ValueError as e:
        raise CorruptEntry(f"unreadable header: {e}") from e
    return header, body[4 + n:]


def read(key: str) -> tuple[dict, bytes] | None:
    """(header, payload) of a whole entry, or None (absent, or corrupt: warned once)."""
    return read_path(entry_path(key))


def read_path(path: str) -> tuple[dict, bytes] | None:
    """(header, payload) of a whole entry or record file, or None (absent, or corrupt: warned once)."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        warn_once(("read", path), f"cannot read {path} ({e}); compiling instead")
        return None
    try:
        header, payload = decode(blob)
    except CorruptEntry as e:
        warn_once(("corrupt", path), f"ignoring entry {path}: {e}; it is recompiled and rewritten")
        return None
    count("bytes_read", len(blob))
    try:
        os.utime(path)          # LRU: a hit is a use
    except OSError:
        pass
    return header, payload


def write(key: str, header: dict, payload: bytes) -> bool:
    """Write atomically; False (warned once) when the directory is not writable."""
    return _write_file(entry_path(key), encode(header, payload))


def write_record(frame_key: str, writer: str, header: dict, payload: bytes) -> bool:
    """Write a frame record atomically; False (warned once) when the directory is not writable."""
    return _write_file(record_path(frame_key, writer), encode(header, payload))


def _write_file(path: str, blob: bytes) -> bool:
    directory = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".entry")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        root = os.path.expanduser(config.cache_dir)
        warn_once(("write", root), f"cannot write to {directory} ({e}); running without a cache")
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    count("bytes_written", len(blob))
    evict()
    return True


def entries() -> list[tuple[str, str]]:
    """(key, path) of every entry, most recently used first."""
    return [(k, p) for _, k, p in _files_in(aot_dir(), ".entry")]


def records(frame_key: str | None = None) -> list[tuple[str, str]]:
    """(frame key, path) of every frame record (or of one frame's), most recently used first."""
    keys = [frame_key] if frame_key is not None else _frame_dirs()
    found = [(t, k, p) for k in keys for t, _, p in _files_in(os.path.join(frames_dir(), k), ".rec")]
    found.sort(reverse=True)
    return [(k, p) for _, k, p in found]


def _files_in(d: str, suffix: str) -> list[tuple[float, str, str]]:
    """(mtime, name without suffix, path) of the files of ``d`` ending in ``suffix``, newest first."""
    try:
        names = [n for n in os.listdir(d) if n.endswith(suffix) and not n.startswith(".")]
    except OSError:
        return []
    items = []
    for n in names:
        p = os.path.join(d, n)
        try:
            items.append((os.stat(p).st_mtime, n[:-len(suffix)], p))
        except OSError:          # (removed meanwhile by another process)
            continue
    items.sort(reverse=True)
    return items


def _frame_dirs() -> list[str]:
    try:
        return [k for k in os.listdir(frames_dir()) if not k.startswith(".")]
    except OSError:
        return []


def read_header(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            return decode(f.read(), header_only=True)[0]
    except (OSError, CorruptEntry):
        return None


def _all_files() -> list[tuple[str, str]]:
    """(key, path) of every entry, frame record and kernel library, most recently used first."""
    files = []
    kernels = [(k, p) for suffix in (".so", ".cubin", ".kt") for _, k, p in _files_in(kernels_dir(), suffix)]
    for key, path in entries() + records() + kernels:
        try:
            files.append((os.stat(path).st_mtime, key, path))
        except OSError:
            continue
    files.sort(reverse=True)
    return [(k, p) for _, k, p in files]


def evict() -> None:
    limit = config.cache_size_limit
    if not limit or limit <= 0:
        return
    total = 0
    for key, path in _all_files():           # most recent first: keep until the limit
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        total += size
        if total > limit:
            try:
                os.unlink(path)
                if logs.enabled.cache:
                    logs.log("cache", f"evicted {key[:12]} ({size} bytes): over cache_size_limit={limit}")
            except OSError:
                pass


def clear() -> int:
    """Remove every entry, frame record and kernel library; returns how many files went."""
    n = 0
    for _, path in _all_files():
        try:
            os.unlink(path)
            n += 1
        except OSError:
            pass
    for key in _frame_dirs():              # (empty now, unless a writer just added a record)
        try:
            os.rmdir(os.path.join(frames_dir(), key))
        except OSError:
            pass
    return n
