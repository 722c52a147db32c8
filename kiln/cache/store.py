"""Entries on disk: ``<cache_dir>/aot/<key>.entry``, each an artifact envelope
(``kiln.cache.envelope``: a zip whose ``kiln.json`` holds the entry's header, function name,
key parts and versions, and whose ``payload`` member holds the backend's bytes, all covered by a
content hash). A file that is not a whole entry of this kiln (truncated, bit-flipped, foreign,
written by an earlier kiln) or that cannot be read is treated as absent, with one warning; the
compile that follows rewrites it. Writes go to a temporary file in the same directory and are
renamed into place (atomic on POSIX), so concurrent writers of one key leave one whole entry,
never a mix.

Frame records (``kiln.package.frame_records``) live in
``<cache_dir>/frames/<frame key>/<writer>.rec``, envelopes of their own format (a header, then
the members of a package). The directory (entries and records together) is kept under
``kiln.config.cache_size_limit`` bytes by removing the least recently used files (a hit
touches its file's mtime).

The remote cache (``kiln.remote_cache``, on when ``kiln.config.remote_cache`` names a Redis
server) stands behind the directory: an entry, frame record or kernel record absent here is
asked of it, checked as a file of the directory is (the envelope's content hash, its format),
and written here before use; every write here is written there too. Remote kinds: ``entry``
(by key), ``frame`` (by frame key: the newest record any writer made of the frame) and
``kernels`` (a kernel record, by file name).
"""
from __future__ import annotations

import os
import tempfile
import warnings

from .. import logs, remote_cache
from ..config import config
from ..process_state import cache_stats as _stats, cache_stats_lock, cache_warned as _warned, reset_cache_stats
from . import envelope

# the envelopes of the cache directory (version 1 was an earlier kiln's own binary layout)
ENTRY = envelope.Format("kiln cache entry", 2)
RECORD = envelope.Format("kiln frame record", 2)
KERNELS = envelope.Format("kiln kernel record", 2)
PAYLOAD = "payload"


class CorruptEntry(Exception):
    pass


def stats() -> dict:
    """Counters since the process started (or ``reset_stats()``): hits, misses, bypasses,
    bytes_read, bytes_written (graphs), frame_hits, frame_misses (frame records: a hit skipped
    capture), job_hits (graphs another rank of a torch.distributed job compiled), job_kernels
    (generated modules of those loaded with that rank's recorded Triton kernels), and the
    remote cache's: remote_hits, remote_misses, remote_errors (the server
    failing), remote_bytes_read, remote_bytes_written."""
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


def encode(header: dict, payload: bytes, fmt: envelope.Format = ENTRY) -> bytes:
    """An envelope of ``fmt`` holding ``header`` and ``payload`` (its one member)."""
    return envelope.pack(fmt, header, {PAYLOAD: payload})


def decode(blob: bytes, fmt: envelope.Format = ENTRY) -> tuple[dict, bytes]:
    """(header, payload) of an envelope made by ``encode``; CorruptEntry for anything else."""
    found = _unpack(blob, fmt)
    return found.header, found.member(PAYLOAD)


def _unpack(blob: bytes, fmt: envelope.Format) -> envelope.Envelope:
    try:
        found = envelope.unpack(blob, fmt)
    except envelope.EnvelopeError as e:
        raise CorruptEntry(e.describe(f"a {fmt.name}")) from None
    # (an entry and a kernel record hold one payload; a frame record a package's members)
    if fmt is not RECORD and list(found.members) != [PAYLOAD]:
        raise CorruptEntry(f"not a {fmt.name}: its members are {', '.join(found.members) or 'none'}")
    return found


def read(key: str) -> tuple[dict, bytes] | None:
    """(header, payload) of a whole entry, or None (absent, or corrupt: warned once); from the
    remote cache when it is not here (and written here then)."""
    path = entry_path(key)
    found = read_path(path)
    if found is None:           # (absent, or damaged here: the remote's replaces it)
        remote = _fetch("entry", key, ENTRY, path)
        if remote is not None:
            found = remote[0].header, remote[0].member(PAYLOAD)
    return found


def _fetch(kind: str, key: str, fmt: envelope.Format, path: str) -> tuple[envelope.Envelope, bytes] | None:
    """The remote cache's value of (kind, key), verified as a ``fmt`` envelope and written to
    ``path`` (the envelope and its bytes); None when it has none, or none that checks (a miss)."""
    blob = remote_cache.get(kind, key)
    if blob is None:
        return None
    try:
        found = _unpack(blob, fmt)
    except CorruptEntry as e:
        warn_once(("corrupt remote", kind, key), f"ignoring the remote {kind} {key[:16]}: {e}")
        return None
    _write_file(path, blob, remote=None)
    return found, blob


def read_path(path: str) -> tuple[dict, bytes] | None:
    """(header, payload) of a whole entry, or None (absent, or corrupt: warned once)."""
    found = _read_file(path, ENTRY)
    return None if found is None else (found.header, found.member(PAYLOAD))


def read_record(path: str) -> envelope.Envelope | None:
    """The verified frame record at ``path`` (its header and members), or None (absent, or
    corrupt: warned once)."""
    return _read_file(path, RECORD)


def _read_file(path: str, fmt: envelope.Format) -> envelope.Envelope | None:
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        warn_once(("read", path), f"cannot read {path} ({e}); compiling instead")
        return None
    try:
        found = _unpack(blob, fmt)
    except CorruptEntry as e:
        warn_once(("corrupt", path), f"ignoring entry {path}: {e}; it is recompiled and rewritten")
        return None
    count("bytes_read", len(blob))
    try:
        os.utime(path)          # LRU: a hit is a use
    except OSError:
        pass
    return found


def write(key: str, header: dict, payload: bytes) -> bool:
    """Write atomically (and to the remote cache); False (warned once) when the directory is
    not writable."""
    return _write_file(entry_path(key), encode(header, payload), remote=("entry", key))


def write_record(frame_key: str, writer: str, header: dict, members: dict[str, bytes]) -> bool:
    """Write a frame record (``header`` and ``members``) atomically (and to the remote cache);
    False (warned once) when the directory is not writable."""
    blob = envelope.pack(RECORD, header, members)
    return _write_file(record_path(frame_key, writer), blob, remote=("frame", frame_key))


def write_received(key: str, blob: bytes) -> bool:
    """An entry's bytes received whole from another rank of the job (which wrote them to the
    remote cache): written here only."""
    return _write_file(entry_path(key), blob)


REMOTE_WRITER = "remote"       # (the file name of a frame record fetched from the remote cache)


def fetch_records(frame_key: str) -> list[tuple[str, str]]:
    """``records(frame_key)``, and when there are none here, the remote cache's record of the
    frame, written here first."""
    found = records(frame_key)
    if not found and _fetch("frame", frame_key, RECORD, record_path(frame_key, REMOTE_WRITER)) is not None:
        found = records(frame_key)
    return found


def write_kernel_record(path: str, blob: bytes) -> bool:
    """A kernel record (a ``KERNELS`` envelope) at ``path`` in ``kernels_dir()``, and in the
    remote cache."""
    return _write_file(path, blob, remote=("kernels", os.path.basename(path)))


def write_received_kernel_record(path: str, blob: bytes) -> bool:
    """A kernel record received whole from another rank of the job (which wrote it to the
    remote cache): written here only."""
    return _write_file(path, blob)


def read_kernel_record(path: str) -> bytes | None:
    """The bytes of the kernel record at ``path``, from the remote cache (checked, and written
    at ``path``) when it is not there; None when neither has it."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        pass
    except OSError:
        return None
    found = _fetch("kernels", os.path.basename(path), KERNELS, path)
    return None if found is None else found[1]


def _write_file(path: str, blob: bytes, remote: tuple[str, str] | None = None) -> bool:
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
        if remote is not None:
            remote_cache.put(*remote, blob)
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    count("bytes_written", len(blob))
    evict()
    if remote is not None:
        remote_cache.put(*remote, blob)
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
    """The header of the entry or frame record at ``path`` (reading that alone), or None."""
    try:
        return envelope.read_header(path, ENTRY, RECORD)
    except (OSError, envelope.EnvelopeError):
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
                    logs.event("cache", "cache", f"evicted {key[:12]} ({size} bytes): over cache_size_limit={limit}",
                               action="evicted", key=key, bytes=size)
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
