"""kiln's compile cache: a warm process compiles nothing.

``cached(gm, example_inputs, backend=..., options=..., compile=...)`` returns the compiled
callable for a captured graph: loaded from ``<kiln.config.cache_dir>/aot/`` when an entry
with the same key exists, else compiled by ``compile()`` and stored (``dump(compiled)``).
Cached: graphs from the ``inductor`` backend (AOT result + Inductor's generated code,
``kiln.backends.inductor.cache_entry``), ``aot_eager``, and ``aot_backend``s that declare a
``cache_key`` (``kiln.aot.AOTArtifact``): a load rebuilds the callable without tracing or
lowering. Dynamic graphs are keyed with their symbolic sizes and the capture's shape facts;
their entries hold the symbolic sizes and the guards the compile added, which a load adds to
the capture's ShapeEnv (``kiln.aot.symbolic_codec``); a package load, which has no capture,
rebuilds the sizes in a ShapeEnv of their own and each call's input check tests the guards. Everything else is a *bypass*, logged
with its reason under ``KILN_LOGS=cache``. A cache failure never fails the call: it compiles instead.

Frame records (``kiln.package.frame_records``): each compiled function also keeps its entries
in package form, so that a warm process installs them before capturing at all.

Remote cache (``kiln.remote_cache``): with ``KILN_REMOTE_CACHE=redis://host:port/db`` the
entries, frame records and kernel records are also read from and written to a Redis server that
machines share (``store`` reads it after the local directory). One compile per job
(``compile_once``): ranks of a torch.distributed job that miss the same graph compile it once.

``kiln.config.cache = False`` (or ``KILN_CACHE=0``) turns the cache off.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

from .. import logs
from ..aot.symbolic_codec import EntryDoesNotFit
from ..config import config
from .compiling import compiling_function
from . import compile_once, key as cache_key, miss_reasons, store
from .store import clear, reset_stats, stats

__all__ = ["cached", "bypass", "stats", "reset_stats", "clear"]


def function_name(gm) -> str:
    name = type(gm).__name__
    return name[5:] if name.startswith("Kiln_") else name


def _log(message: str, **fields) -> None:
    """A cache event: ``fields`` has its ``action`` (hit, miss, bypass...) and ``function``."""
    if logs.enabled.cache:
        logs.event("cache", "cache", message, **fields)


def note_not_stored(error: BaseException) -> None:
    """Log (``KILN_LOGS=cache``) a compiled graph (one shape of a per-shape result) whose cache
    payload could not be made: it runs, and is compiled again by the next process."""
    _log(f"not stored (one shape of a per-shape graph): {type(error).__name__}: {error}",
         action="not_stored", function=None, reason=f"{type(error).__name__}: {error}")


def bypass(gm, reason: str) -> None:
    """Count and log (``KILN_LOGS=cache``) a graph compiled without the cache, and why."""
    if config.cache:
        _bypass(function_name(gm), reason)


def _bypass(fn: str, reason: str) -> None:
    store.count("bypasses")
    _log(f"bypass {fn}: {reason}", action="bypass", function=fn, reason=reason)


def input_names(gm) -> list:
    """The graph's inputs as the capture names them (``L['x']``): not part of the key (two
    functions that differ only in argument names share an entry), kept in the header so that
    a load names the caller's inputs."""
    return [str(n.meta.get("kiln_source", n.name)) for n in gm.graph.nodes if n.op == "placeholder"]


def _renames(stored: Any, current: list) -> dict:
    if not isinstance(stored, list) or len(stored) != len(current):
        return {}
    return {old: new for old, new in zip(stored, current) if isinstance(old, str) and old != new}


def cached(gm, example_inputs: list, *, backend: str, options: dict, compile: Callable[[], Callable],
           load: Callable[[bytes, Any, dict], Callable], dump: Callable[[Callable], bytes],
           rebind: Callable[[bytes, int, int], bytes] | None = None,
           shares_backwards: bool = False) -> Callable:
    """The compiled ``gm``: loaded (``load(payload, gm, rename)``; ``rename`` maps the stored
    input names to the caller's) or compiled (``compile()``) and stored (``dump(compiled)``;
    it raises ValueError for a result it cannot store).

    ``rebind(payload, from_index, to_index)``: the payload of a graph on one CUDA device, made
    to run on another (a backend whose code names its device). With it, such a graph's key
    leaves the index out, and an entry compiled on cuda:0 loads on cuda:1 rebound: the ranks
    of one machine share their compiles.

    ``shares_backwards``: the compiled graphs hold no state of their own (no CUDA graphs, no
    user compilers), so graphs of one entry in this process may share the backwards they make
    at run time (``share_backwards``)."""
    fn = function_name(gm)
    if not config.cache:
        return offer(compile(), lambda c: dump(c))
    try:
        device = _one_cuda_device(gm, example_inputs) if rebind is not None else None
        parts = cache_key.key_parts(gm, example_inputs, backend, options, cuda=device)
        on_device = _on_device(device, rebind)
        key = cache_key.digest(parts)
    except Exception as e:          # a graph kiln cannot key: compile it, uncached
        _bypass(fn, f"cannot compute the key: {type(e).__name__}: {e}")
        return offer(compile(), lambda c: dump(c))
    not_fit = None
    try:
        found = store.read(key)
        if found is not None:
            header, payload = found
            # the header must describe this key (a hash collision or a renamed file is a miss)
            if header.get("key") == key and header.get("parts") == parts:
                header, payload = on_device(header, payload)
                compiled = load(payload, gm, _renames(header.get("inputs"), input_names(gm)))
                store.count("hits")
                _log(f"hit {fn} ({key[:12]}, {len(payload)} bytes)", action="hit", function=fn, key=key,
                     bytes=len(payload))
                _refreshed_by(compiled, key, header, dump)
                if shares_backwards:
                    _share_backwards(key, compiled)
                return offer(compiled, _stored(key, lambda c: dump(c), on_device))
            store.warn_once(("mismatch", key), f"entry {key[:12]} does not match its key; recompiling")
    except EntryDoesNotFit as e:    # a dynamic entry traced under guards these sizes fail
        not_fit = str(e)
    except Exception as e:          # a load that fails is a miss (never run, never raised)
        store.warn_once(("load", key), f"cannot load entry {key[:12]} ({type(e).__name__}: {e}); recompiling")
    store.count("misses")
    if logs.enabled.cache:
        nearest = miss_reasons.nearest(fn, parts)
        why = not_fit or miss_reasons.describe(fn, nearest)
        _log(f"miss {fn} ({key[:12]}): {why}", action="miss", function=fn, key=key, reason=why,
             diff=[] if not_fit or nearest is None else nearest)
    job = compile_once.claim(key, fn)       # (None: no torch.distributed job)
    if job is not None and not job.mine:
        received = _received(job, gm, key, parts, load, dump, on_device)
        if received is not None:
            return received
    try:
        compiled = compile()
        try:
            payload = dump(compiled)
        except Exception as e:
            _log(f"not stored {fn}: {type(e).__name__}: {e}", action="not_stored", function=fn,
                 reason=f"{type(e).__name__}: {e}")
            return offer(compiled, _failed(f"{type(e).__name__}: {e}"))
        header = {"key": key, "function": fn, "backend": backend, "parts": parts, "inputs": input_names(gm)}
        if device is not None:
            header["cuda_device"] = device
        store.write(key, header, payload)
        if job is not None and job.mine:
            job.publish(store.encode(header, payload))
    finally:
        if job is not None and job.mine:
            job.publish(compile_once.FAILED)        # (no entry: the waiting ranks compile it themselves)
    _refreshed_by(compiled, key, header, dump)
    if shares_backwards:
        _share_backwards(key, compiled)
    return offer(compiled, _stored(key, lambda c: dump(c), on_device))


# -- graphs of one entry in this process ------------------------------------------------------------
# Each layer of a model compiled one by one (torch's regional compilation, FSDP2's per-block
# compile) captures its own graph, which hits the entry the first layer compiled. A backward
# made at run time (for a segment's gradients) was then built and compiled again per layer.

_LIVE: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


def _share_backwards(key: str, compiled: Callable) -> None:
    share = getattr(compiled, "share_backwards", None)
    if share is None:
        return
    sibling = _LIVE.get(key)
    if sibling is None:
        _LIVE[key] = compiled       # (a graph with ``share_backwards``: an AOTCompiled)
    elif sibling is not compiled:
        share(sibling)


def _one_cuda_device(gm, example_inputs: list) -> int | None:
    """The graph's CUDA device when it names exactly one (its entry can be rebound)."""
    indices = cache_key.cuda_indices(gm, example_inputs)
    return indices[0] if len(indices) == 1 else None


def _on_device(device: int | None, rebind: Callable[[bytes, int, int], bytes] | None
               ) -> Callable[[dict, bytes], tuple[dict, bytes]]:
    """``(header, payload) -> (header, payload)`` for ``device``: an entry compiled for another
    is rebound (its header then names the new device, so that an entry stored again from it
    says what it holds)."""
    def bind(header: dict, payload: bytes) -> tuple[dict, bytes]:
        stored = header.get("cuda_device")
        if device is None or rebind is None or stored is None or stored == device:
            return header, payload
        return {**header, "cuda_device": device}, rebind(payload, int(stored), device)
    return bind


def _received(job: compile_once.Claim, gm, key: str, parts: dict, load: Callable, dump: Callable,
              on_device: Callable[[dict, bytes], tuple[dict, bytes]]) -> Callable | None:
    """The graph another rank of the job compiled (``compile_once``), loaded from the entry it
    published and written to this machine's cache; None (logged) when there is none to use."""
    blob = job.receive()
    if blob is None:
        return None
    try:
        header, payload = store.decode(blob)
        if header.get("key") != key or header.get("parts") != parts:
            raise store.CorruptEntry("it does not match its key")
        header, payload = on_device(header, payload)
        with compile_once.receiving(job):
            compiled = load(payload, gm, _renames(header.get("inputs"), input_names(gm)))
    except Exception as e:
        _log(f"rank {job.rank}: cannot use the entry of {job.function} ({key[:12]}) another rank "
             f"compiled ({type(e).__name__}: {e}); compiling it here", action="job_refused", function=job.function,
             key=key, reason=f"{type(e).__name__}: {e}")
        return None
    store.write_received(key, blob)
    store.count("job_hits")
    _log(f"rank {job.rank}: received {job.function} ({key[:12]}, {len(payload)} bytes) from the rank that compiled it",
         action="job_hit", function=job.function, key=key)
    _refreshed_by(compiled, key, header, dump)
    return offer(compiled, _stored(key, lambda c: dump(c), on_device))


# -- an entry that grows after its compile ------------------------------------------------------
# A backward made at run time (for some outputs' gradients only, or a segmented graph's as one)
# is compiled at the first backward() that needs it, after the entry was written. The backend
# then calls ``refresh(compiled)``: the entry is written again with it, and so is the record of
# the function that compiled it, so that a warm process loads it instead of compiling it.

REFRESH_ATTR = "kiln_cache_refresh"


def _refreshed_by(compiled: Callable, key: str, header: dict, dump: Callable[[Callable], bytes]) -> None:
    owner = compiling_function()

    def refresh(c: Callable) -> None:
        if not config.cache:
            return
        try:
            payload = dump(c)
        except Exception as e:
            _log(f"not stored again {header.get('function')}: {type(e).__name__}: {e}", action="not_stored",
                 function=header.get("function"), reason=f"{type(e).__name__}: {e}")
            return
        store.write(key, header, payload)
        _log(f"stored again {header.get('function')} ({key[:12]}, {len(payload)} bytes)", action="stored",
             function=header.get("function"), key=key, bytes=len(payload))
        cf = owner() if owner is not None else None
        if cf is not None:
            cf.record_frames()
    try:
        setattr(compiled, REFRESH_ATTR, refresh)
    except (AttributeError, TypeError):
        pass


def refresh(compiled: Callable | None) -> None:
    """``compiled`` (a graph the cache stored or loaded) compiled more since: store it again."""
    fn = getattr(compiled, REFRESH_ATTR, None)
    if fn is not None:
        fn(compiled)


def refresher(compiled: Callable) -> Callable[[], None]:
    """What a backend calls once it compiled more for ``compiled``: ``refresh`` of it (held
    weakly: the backend's compile state belongs to the callable)."""
    try:
        ref = weakref.ref(compiled)
    except TypeError:
        return lambda: None
    return lambda: refresh(ref())


# -- what a package (kiln/package) saves of a compiled graph -------------------------------------

PAYLOAD_ATTR = "kiln_package_payload"


def offer(compiled: Callable, payload: Callable[[Callable], bytes]) -> Callable:
    """Let ``kiln.package`` save ``compiled``: ``payload(compiled)`` returns the bytes the
    backend's ``load_artifact(payload, gm)`` rebuilds it from (the cache entry's payload), or
    raises ValueError saying why it cannot be saved. Called lazily, at save time."""
    try:
        setattr(compiled, PAYLOAD_ATTR, payload)
    except (AttributeError, TypeError):   # (a bound method: the package saves what it is)
        pass
    return compiled


def _stored(key: str, fallback: Callable[[Callable], bytes],
            on_device: Callable[[dict, bytes], tuple[dict, bytes]]) -> Callable[[Callable], bytes]:
    """The payload as the cache stored it (read back at save time: not kept in memory), for
    this process's device."""
    def payload(compiled):
        found = store.read(key)
        if found is not None and found[0].get("key") == key:
            return on_device(found[0], found[1])[1]
        return fallback(compiled)
    return payload


def _failed(reason: str) -> Callable[[Callable], bytes]:
    def payload(compiled):
        raise ValueError(reason)
    return payload
