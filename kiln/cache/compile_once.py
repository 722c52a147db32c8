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

A received entry's Triton kernels: the claimer records them (``triton_kernels``) after the
first call of each generated module, when Inductor has picked each kernel's configuration; it
then publishes the record too (``<PREFIX>kernels/<module digest>``). The entry is published
before that, at the end of the compile, so a receiver loads it at once and defers each module
whose kernels are not recorded yet to that module's first call, where it waits for the record
(``config.distributed_kernel_timeout`` seconds at most), instead of building every kernel again
through Inductor. The claimer reaches that first call without the receiver's help, since both
run the same program: the receiver is already past every collective before it; a module that
holds a collective itself (it would wait for the receiver) is never deferred. A record that
does not come in time (the claimer's program went elsewhere) is built through Inductor as
before.

On whenever torch.distributed is initialized with more than one rank and
``config.distributed_compile_once`` is True (the default; ``KILN_DISTRIBUTED_COMPILE_ONCE=0``
turns it off). What each rank did is logged under ``KILN_LOGS=cache``.
"""
from __future__ import annotations

import contextlib
import datetime
import threading
from typing import Any, Iterator

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

    def wait_kernels(self, module_digest: str) -> bytes | None:
        """The Triton kernel record the claimer publishes after its first call of the module
        ``module_digest``, or None when it does not come within ``distributed_kernel_timeout``."""
        name = f"{_PREFIX}kernels/{module_digest}"
        timeout = datetime.timedelta(seconds=float(config.distributed_kernel_timeout))
        try:
            self.store.wait([name], timeout)
            return bytes(self.store.get(name))
        except Exception as e:
            _log(f"rank {self.rank}: no Triton kernels of module {module_digest[:12]} ({self.function}) "
                 f"from the rank that compiled it ({type(e).__name__}: {e}); building them here")
            return None


def publish_kernels(module_digest: str, blob: bytes) -> None:
    """A Triton kernel record made here (``triton_kernels``), for the ranks that received the
    module from this one and wait for it at its first call (``Claim.wait_kernels``)."""
    if not config.distributed_compile_once:
        return
    try:
        job = _torch.distributed_job()
        if job is not None:
            job[0].set(f"{_PREFIX}kernels/{module_digest}", blob)
    except Exception as e:            # (the waiting ranks time out and build the kernels)
        _log(f"could not publish the Triton kernels of module {module_digest[:12]}: {type(e).__name__}: {e}")


_receiving = threading.local()


@contextlib.contextmanager
def receiving(claim: Claim) -> Iterator[None]:
    """Within: the entry being loaded is the one ``claim``'s compiling rank published."""
    prior = getattr(_receiving, "claim", None)
    _receiving.claim = claim
    try:
        yield
    finally:
        _receiving.claim = prior


def received_from() -> Claim | None:
    """The claim whose entry is being loaded now (``receiving``), None outside one."""
    return getattr(_receiving, "claim", None)


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
