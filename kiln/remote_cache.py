"""The remote cache: kiln's cache values in a Redis server that a fleet of machines shares.

``KILN_REMOTE_CACHE=redis://host:port/db`` (or ``kiln.config.remote_cache``) switches it on;
the client is redis-py (``pip install kiln[redis]``). The cache layers above (``kiln.cache.store``,
``kiln.shapes.profile``) read their local files first and this next (a remote hit is written
locally), and write through to it: ``get(kind, key)`` and ``put(kind, key, data)`` on bytes.

Layout, under the prefix ``kiln:v1:`` (``ls`` and ``clear`` touch nothing else):

* ``kiln:v1:<kind>:<key>``, the value's *description*: JSON with its size, SHA-256, number of
  chunks, the id of the write, and the kiln and torch versions that wrote it;
* ``kiln:v1:<kind>:<key>:<write id>:<i>``, its chunks of at most ``CHUNK`` bytes.

A writer stores its chunks under a write id of its own, then sets the description (one SET,
atomic), and removes the chunks of the description it replaced: concurrent writers of one key
never mix their chunks. A reader takes the description, then its chunks, and returns the bytes
only when the versions are this process's and the size and SHA-256 match; anything else (a
chunk evicted by the server's maxmemory policy, or replaced meanwhile, a changed byte, a value
from another kiln or torch) is a miss, logged under ``KILN_LOGS=cache``. So the bytes a layer
above receives are the bytes a writer of the same versions put; the layers above check them
again (an entry is an artifact envelope, verified before anything of it is unpickled).

Values over ``config.remote_cache_max_bytes`` are not stored (logged): they stay local.

Redis down, slow or full costs little: connections and commands time out after
``config.remote_cache_timeout`` seconds, without retries; the first error warns once
(RuntimeWarning) and switches the remote cache off for ``RETRY_AFTER`` seconds, after which
one command tries it again. The local cache goes on meanwhile.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
import warnings

import torch

from . import logs
from .config import config
from .process_state import cache_stats, cache_stats_lock, cache_warned
from .version import __version__

PREFIX = "kiln:v1:"
CHUNK = 4 * 1024 * 1024          # (Redis handles values of this size in one command easily)
RETRY_AFTER = 30.0               # seconds without the server after an error

_lock = threading.Lock()
_clients: dict = {}              # url -> redis.Redis
_down_until: dict = {}           # url -> time.monotonic() before which the server is not tried


class RemoteUnavailable(Exception):
    """No remote cache to use: none configured, redis-py missing, or the server failing."""


def enabled() -> bool:
    return bool(config.remote_cache) and config.cache


def _log(message: str) -> None:
    if logs.enabled.cache:
        logs.log("cache", f"remote: {message}")


def _count(name: str, n: int = 1) -> None:
    with cache_stats_lock:
        cache_stats[name] += n


def _warn_once(what, message: str) -> None:
    with cache_stats_lock:
        if what in cache_warned:
            return
        cache_warned.add(what)
    warnings.warn(f"kiln remote cache: {message}", RuntimeWarning, stacklevel=4)


def describe_url(url: str) -> str:
    """``url`` without its password (for messages)."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest


def _client():
    """The redis-py client of ``config.remote_cache``, or RemoteUnavailable."""
    url = config.remote_cache
    if not url or not config.cache:
        raise RemoteUnavailable("no remote cache configured")
    with _lock:
        if time.monotonic() < _down_until.get(url, 0.0):
            raise RemoteUnavailable("the server failed recently")
        client = _clients.get(url)
        if client is not None:
            return client
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        _warn_once(("remote", "import"), "KILN_REMOTE_CACHE is set but the redis package is missing "
                   "(pip install kiln[redis]); using the local cache only")
        raise RemoteUnavailable("redis-py is not installed") from None
    if not url.startswith(("redis://", "rediss://", "unix://")):
        _warn_once(("remote", "url", url), f"KILN_REMOTE_CACHE={describe_url(url)!r} is not a redis:// URL; "
                   "using the local cache only")
        raise RemoteUnavailable("not a redis URL")
    timeout = float(config.remote_cache_timeout)
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                      retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
                                      health_check_interval=0)
    except ValueError as e:
        _warn_once(("remote", "url", url), f"cannot use KILN_REMOTE_CACHE={describe_url(url)!r} ({e}); "
                   "using the local cache only")
        raise RemoteUnavailable(str(e)) from None
    with _lock:
        return _clients.setdefault(url, client)


def _failed(what: str, e: Exception) -> None:
    """The server failed (down, slow, full, refusing): warn once, and leave it for a while."""
    url = config.remote_cache
    with _lock:
        _down_until[url] = time.monotonic() + RETRY_AFTER
    _count("remote_errors")
    _warn_once(("remote", "down", url), f"{describe_url(url)} failed ({what}: {type(e).__name__}: {e}); "
               f"using the local cache only, trying it again in {RETRY_AFTER:.0f} s")
    _log(f"{what} failed: {type(e).__name__}: {e}")


def _server_errors() -> tuple:
    import redis
    return (redis.RedisError, OSError)


def name(kind: str, key: str) -> str:
    return f"{PREFIX}{kind}:{key}"


def _chunk_names(kind: str, key: str, write_id: str, n: int) -> list[str]:
    return [f"{name(kind, key)}:{write_id}:{i}" for i in range(n)]


def get(kind: str, key: str) -> bytes | None:
    """The verified bytes stored under (kind, key), or None: absent, off, failing, or not
    whole and of this kiln and torch (a miss, never an error)."""
    try:
        client = _client()
    except RemoteUnavailable:
        return None
    try:
        raw = client.get(name(kind, key))
        if raw is None:
            return _miss(kind, key, None)
        try:
            meta = json.loads(raw)
            n, write_id, size, digest = meta["chunks"], meta["id"], meta["size"], meta["sha256"]
            if not (isinstance(n, int) and 0 <= n <= 1 + size // CHUNK and isinstance(write_id, str)):
                raise ValueError("malformed")
        except (ValueError, KeyError, TypeError):
            return _miss(kind, key, "its description is not kiln's", corrupt=True)
        if meta.get("kiln") != __version__ or meta.get("torch") != torch.__version__:
            return _miss(kind, key, f"written by kiln {meta.get('kiln')} with torch {meta.get('torch')}")
        chunks = client.mget(_chunk_names(kind, key, write_id, n)) if n else []
    except _server_errors() as e:
        _failed("read", e)
        return None
    if any(c is None for c in chunks):
        return _miss(kind, key, "chunks missing (evicted, or replaced by another writer)")
    data = b"".join(chunks)
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        return _miss(kind, key, "content hash mismatch", corrupt=True)
    _count("remote_hits")
    _count("remote_bytes_read", len(data))
    _log(f"hit {kind} {key[:16]} ({len(data)} bytes)")
    return data


def _miss(kind: str, key: str, why: str | None, corrupt: bool = False) -> None:
    _count("remote_misses")
    if why is not None:
        if corrupt:
            _warn_once(("remote", "corrupt", kind, key), f"ignoring {kind} {key[:16]}: {why}")
        _log(f"miss {kind} {key[:16]}: {why}")
    return None


def put(kind: str, key: str, data: bytes) -> bool:
    """Store ``data`` under (kind, key), replacing what was there; False when not stored (off,
    failing, or over ``config.remote_cache_max_bytes``)."""
    try:
        client = _client()
    except RemoteUnavailable:
        return False
    limit = config.remote_cache_max_bytes
    if limit and len(data) > limit:
        _log(f"not stored {kind} {key[:16]}: {len(data)} bytes, over remote_cache_max_bytes={limit}")
        return False
    write_id = uuid.uuid4().hex[:12]
    n = (len(data) + CHUNK - 1) // CHUNK
    meta = json.dumps({"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "chunks": n,
                       "id": write_id, "kiln": __version__, "torch": torch.__version__})
    try:
        pipe = client.pipeline(transaction=False)
        for i, chunk_name in enumerate(_chunk_names(kind, key, write_id, n)):
            pipe.set(chunk_name, data[i * CHUNK:(i + 1) * CHUNK])
        pipe.execute()
        old = client.set(name(kind, key), meta, get=True)       # (the value is whole from here on)
        _remove_chunks_of(client, kind, key, old, write_id)
    except _server_errors() as e:
        _failed("write", e)
        return False
    _count("remote_bytes_written", len(data))
    _log(f"stored {kind} {key[:16]} ({len(data)} bytes, {n} chunks)")
    return True


def _remove_chunks_of(client, kind: str, key: str, old: bytes | None, keep: str) -> None:
    try:
        meta = json.loads(old) if old is not None else None
        old_chunks = _chunk_names(kind, key, str(meta["id"]), int(meta["chunks"])) if meta else []
        if old_chunks and meta.get("id") != keep:
            client.delete(*old_chunks)
    except (ValueError, KeyError, TypeError):
        pass


def ls() -> list[tuple[str, str, int, str]]:
    """(kind, key, size, writer versions) of every value kiln stored on the server (a
    RemoteUnavailable when none is configured or the server fails)."""
    client = _client()
    rows = []
    try:
        names = [n.decode() for n in client.scan_iter(match=PREFIX + "*", count=1000)]
        descriptions = [n for n in names if n.count(":") == PREFIX.count(":") + 1]
        values = client.mget(descriptions) if descriptions else []
    except _server_errors() as e:
        _failed("ls", e)
        raise RemoteUnavailable(f"{type(e).__name__}: {e}") from None
    for n, raw in zip(descriptions, values):
        kind, key = n[len(PREFIX):].split(":", 1)
        try:
            meta = json.loads(raw)
            rows.append((kind, key, int(meta["size"]), f"kiln {meta.get('kiln')}, torch {meta.get('torch')}"))
        except (TypeError, ValueError, KeyError):
            rows.append((kind, key, -1, "unreadable"))
    return sorted(rows)


def clear() -> int:
    """Remove every key under kiln's prefix (nothing else of the server); how many went."""
    client = _client()
    n = 0
    try:
        batch = []
        for found in client.scan_iter(match=PREFIX + "*", count=1000):
            batch.append(found)
            if len(batch) >= 1000:
                n += client.delete(*batch)
                batch = []
        if batch:
            n += client.delete(*batch)
    except _server_errors() as e:
        _failed("clear", e)
        raise RemoteUnavailable(f"{type(e).__name__}: {e}") from None
    return n


def forget_failures() -> None:
    """Try the server again at the next command (tests; a user who restarted Redis)."""
    with _lock:
        _down_until.clear()
