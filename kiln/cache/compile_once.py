"""One compile per job: ranks of a torch.distributed job that miss the same graph compile it once.

The ranks of a job run the same program and so miss the same cache keys at about the same time.
At a miss (``kiln.cache.cached``), a rank *claims* the key in the key-value store of the default
process group (``store.add(<key>/claim, 1)``: atomic, one answer per rank): the first rank to
claim compiles, then publishes the entry's bytes there (``<key>/entry``); a later rank waits for
them and loads them, as it would load its own cache's entry (the same envelope and checks).

No collective is involved, so nothing depends on the ranks compiling the same graphs in the same
order or number: a rank whose program differs claims keys no other rank needs, compiles them at
once, and never waits. A rank waits only for a compile that another rank has started, and the
claimer always publishes (its entry, or an empty value when its compile failed or cannot be
stored: the waiters then compile for themselves), so the waits cannot form a cycle. A claimer
that dies leaves the waiters waiting up to ``config.distributed_compile_timeout`` seconds, after
which they compile for themselves. With a remote cache, the claimer's entry is also written there,
and a job on a warm remote cache misses nothing, so no rank claims or compiles at all.

On whenever torch.distributed is initialized with more than one rank and
``config.distributed_compile_once`` is True (the default; ``KILN_DISTRIBUTED_COMPILE_ONCE=0``
turns it off). What each rank did is logged under ``KILN_LOGS=cache``.
"""
from __future__ import annotations

import datetime
from typing import Any

from .. import _torch, logs
from ..config import config

_PREFIX = "kiln/compile_once/"
FAILED = b""                 # published when the claimer has no entry to give


def _log(message: str) -> None:
    if logs.enabled.cache:
        logs.log("cache", message)


class Claim:
    """A rank's claim of one key: ``mine`` (this rank compiles and must ``publish``) or not
    (``receive`` the claimer's entry)."""

    def __init__(self, store: Any, rank: int, key: str, function: str, mine: bool):
        self.store, self.rank, self.key, self.function, self.mine = store, rank, key, function, mine
        self.published = False

    def _name(self, what: str) -> str:
        return f"{_PREFIX}{self.key}/{what}"

    def publish(self, blob: bytes) -> None:
        """The entry's bytes for the ranks that wait (FAILED: they compile for themselves)."""
        if self.published:
            return
        self.published = True
        try:
            self.store.set(self._name("entry"), blob)
        except Exception as e:        # (the job's store failing: the waiters time out and compile)
            _log(f"rank {self.rank}: could not publish {self.function} ({self.key[:12]}): {type(e).__name__}: {e}")

    def receive(self) -> bytes | None:
        """The claimer's entry, or None (it failed, or did not publish in time)."""
        timeout = datetime.timedelta(seconds=float(config.distributed_compile_timeout))
        try:
            self.store.wait([self._name("entry")], timeout)
            blob = self.store.get(self._name("entry"))
        except Exception as e:
            _log(f"rank {self.rank}: no entry for {self.function} ({self.key[:12]}) from the rank that "
                 f"compiles it ({type(e).__name__}: {e}); compiling it here")
            return None
        if blob == FAILED:
            _log(f"rank {self.rank}: the rank that compiled {self.function} ({self.key[:12]}) could not "
                 "store it; compiling it here")
            return None
        return bytes(blob)


def claim(key: str, function: str) -> Claim | None:
    """This rank's claim of ``key`` (a graph it is about to compile), or None when compiling
    once per job is off or there is no job (torch.distributed not initialized, one rank)."""
    if not config.distributed_compile_once:
        return None
    try:
        job = _torch.distributed_job()
        if job is None:
            return None
        store, rank, world = job
        mine = store.add(f"{_PREFIX}{key}/claim", 1) == 1
    except Exception as e:            # (no usable store: every rank compiles for itself)
        _log(f"compile once per job is off here: {type(e).__name__}: {e}")
        return None
    if mine:
        _log(f"rank {rank} of {world}: compiles {function} ({key[:12]}) for the job (the first rank to "
             "need it; a rank whose program differs compiles its own graphs)")
    else:
        _log(f"rank {rank} of {world}: waits for {function} ({key[:12]}), which another rank compiles")
    return Claim(store, rank, key, function, mine)
