"""``kiln cache ls | why [FUNCTION] | clear``: what the compile cache holds and why it missed;
``kiln cache ls --remote | clear --remote``: the same of the remote cache (KILN_REMOTE_CACHE)."""
from __future__ import annotations

import os
import sys

from .. import remote_cache
from ..config import config
from . import miss_reasons, store


def ls() -> int:
    rows = store.entries()
    total = 0
    for key, path in rows:
        header = store.read_header(path) or {}
        size = os.path.getsize(path)
        total += size
        print(f"{key[:16]}  {size:>9}  {header.get('backend', '?'):<10} {header.get('function', '? (unreadable)')}")
    print(f"{len(rows)} entries, {total} bytes in {store.aot_dir()}")
    records = store.records()
    total = 0
    for key, path in records:          # (frame records: what a warm process installs before capture)
        header = store.read_header(path) or {}
        size = os.path.getsize(path)
        total += size
        print(f"frame {key[:10]}  {size:>9}  {header.get('backend', '?'):<10} "
              f"{header.get('function', '? (unreadable)')} ({header.get('entries', '?')} entries)")
    print(f"{len(records)} frame records, {total} bytes in {store.frames_dir()}")
    return 0


def why(function: str | None) -> int:
    """For each function (or one), how its stored entries differ from each other: the
    parts that made the entries after the first miss."""
    by_function: dict = {}
    for _, path in reversed(store.entries()):          # oldest first
        header = store.read_header(path)
        if header and (function is None or header.get("function") == function):
            by_function.setdefault(header["function"], []).append(header.get("parts", {}))
    if not by_function:
        print(f"no entries{' for ' + function if function else ''} in {store.aot_dir()}")
        return 1 if function else 0
    for fn, parts in by_function.items():
        print(f"{fn}: {len(parts)} entr{'y' if len(parts) == 1 else 'ies'}")
        for i in range(1, len(parts)):
            nearest = min(parts[:i], key=lambda p: len(miss_reasons.differences(p, parts[i])))
            print(f"  entry {i + 1} missed: " + "; ".join(miss_reasons.differences(nearest, parts[i])) + "; all else equal")
    return 0


def clear() -> int:
    entries, records = len(store.entries()), len(store.records())
    store.clear()
    print(f"removed {entries} entries and {records} frame records from {os.path.dirname(store.aot_dir())}")
    return 0


def ls_remote() -> int:
    """Every value kiln stored in the remote cache: kind, key, size, the versions that wrote it."""
    url = _remote_url()
    if url is None:
        return 1
    try:
        rows = remote_cache.ls()
    except remote_cache.RemoteUnavailable as e:
        print(f"error: the remote cache {url} is unavailable: {e}", file=sys.stderr)
        return 1
    for kind, key, size, versions in rows:
        print(f"{kind:<8} {key[:32]:<32}  {size:>9}  {versions}")
    print(f"{len(rows)} values, {sum(max(r[2], 0) for r in rows)} bytes in {url}")
    return 0


def clear_remote() -> int:
    """Remove kiln's keys (and only those) from the remote cache."""
    url = _remote_url()
    if url is None:
        return 1
    try:
        n = remote_cache.clear()
    except remote_cache.RemoteUnavailable as e:
        print(f"error: the remote cache {url} is unavailable: {e}", file=sys.stderr)
        return 1
    print(f"removed {n} keys under {remote_cache.PREFIX!r} from {url}")
    return 0


def _remote_url() -> str | None:
    if not config.remote_cache:
        print("error: no remote cache: set KILN_REMOTE_CACHE=redis://host:port/db", file=sys.stderr)
        return None
    return remote_cache.describe_url(config.remote_cache)
