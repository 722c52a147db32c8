"""Run one generated program eagerly and through ``kiln.compile`` and classify the result.

Each program is exec'd twice, as two fresh modules (one for eager, one for kiln), so that
globals it mutates are compared, not shared. For every ``Call`` of the program's plan (two
calls with fresh inputs of one size, one with another size, sometimes one under no_grad), both
sides get inputs from ``make_inputs`` with the same seed and are observed (``observe.py``).

Statuses: ``ok``; ``wrong`` (kiln returned, or left behind, something eager did not; or eager
raised and kiln did not); ``crash`` (kiln raised where eager did not, or another type);
``invalid`` (the program itself does not load: a generator bug, never kiln's); ``noise`` (a
``wrong`` result that is float rounding amplified by the program, as ``noise.py`` decides: not
a failure, counted apart).
"""
from __future__ import annotations

import gc
import linecache
import logging
import re
import shutil
import sys
import tempfile
import time
import types
import weakref
from dataclasses import dataclass

import torch

import kiln

from . import noise
from .observe import Mismatch, _flat_tensors, compare, observe
from .program import Program

# FakeTensorMode logs every op that fails under it (a generated `bad op` does, on purpose).
logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)


def available_backends(wanted=("eager", "aot_eager", "inductor")) -> list:
    have = set(kiln.backends.list_backends())
    return [b for b in wanted if b in have]


@dataclass
class Outcome:
    seed: int
    backend: str
    dynamic: object
    status: str
    call: int = -1
    mismatch: Mismatch | None = None
    eager_raised: bool = False
    seconds: float = 0.0
    spread: float = 0.0     # the largest difference between kiln's numbers and eager's, when wrong
    internal: list = None   # first lines of kiln's own errors that made a frame run eagerly or break

    def __post_init__(self):
        if self.internal is None:
            self.internal = []

    @property
    def signature(self) -> str:
        """The failure, with names and numbers taken out: failures of one root cause group
        together."""
        if self.mismatch is None:
            return self.status
        m = self.mismatch
        path = re.sub(r"/\d+|\[\d+\]|\['?\w+'?\]", "", m.path)
        detail = m.detail
        if m.kind in ("exception", "backward"):
            detail = re.sub(r"\(.*?\), kiln", "(...), kiln", detail, count=1)
        detail = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", detail)
        detail = re.sub(r"\b\d+(\.\d+)?\b", "N", detail)
        detail = re.sub(r"\b(t|n|f|L|dd|acc|e|i|row|val|key|loss|g|cnt|bump|inner|act|helper|prev)N\b", "VAR", detail)
        detail = re.sub(r"values differ:.*", "values differ", detail)
        detail = re.sub(r"printed .*", "printed text differs", detail)
        return f"{self.status}:{m.kind}:{path}: {detail[:160]}"

    def describe(self) -> str:
        dyn = "" if self.dynamic is None else f", dynamic={self.dynamic}"
        where = f" (call {self.call})" if self.call >= 0 else ""
        return f"seed {self.seed} [{self.backend}{dyn}] {self.status}{where}: {self.mismatch or ''}"


def load(source: str, name: str, filename: str) -> types.ModuleType:
    """``source`` as a module registered in sys.modules (classes pickle and report their
    module as user code does), with its lines in linecache (tracebacks, break reasons)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    mod = types.ModuleType(name)
    mod.__file__ = filename
    sys.modules[name] = mod
    exec(compile(source, filename, "exec"), mod.__dict__)
    return mod


def _weak_tensors(args, kwargs):
    flat = []
    _flat_tensors([list(args), kwargs or {}], "args", flat, set())
    return [(path, weakref.ref(t)) for path, t in flat]


def _leaked(refs_e, refs_k):
    """The first input that is still alive after kiln's call but not after eager's."""
    # until nothing more is found: freeing one cycle (a compiled continuation) can release
    # the next (its own continuations, torch tensors whose PyObject was preserved by C++),
    # which a single collection does not see. What is still alive then is reachable.
    for _ in range(10):
        if not gc.collect():
            break
    for (path, re_), (_, rk) in zip(refs_e, refs_k):
        if re_() is None and rk() is not None:
            return path
    return None


def internal_errors() -> list[str]:
    """The first line of each kiln internal error behind a frame that runs eagerly or a
    graph break, over every compiled function's entries (continuations included). Not
    wrong answers: compiles lost, each a kiln bug."""
    from kiln.process_state import function_caches, registry_lock

    found = []
    with registry_lock:
        caches = list(function_caches)
    for cache in caches:
        for entry in list(cache.entries):
            for exc in (entry.eager_reason, entry.graph_break):
                if exc is not None and getattr(exc, "internal", False):
                    found.append(internal_signature(getattr(exc, "construct", str(exc))))
    return sorted(set(found))


def internal_signature(message: str) -> str:
    """An internal error's message with names and numbers taken out, so one bug counts once."""
    first = message.strip().splitlines()[0] if message.strip() else message
    first = re.sub(r"\s*\(at .*$|; the frame runs eagerly.*$|; it runs eagerly.*$", "", first)
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", first)
    first = re.sub(r"\b(compiling|generated code of) [\w.<>]+", r"\1 FN", first)
    first = re.sub(r"\b\d+\b", "N", first)
    return first[:200]


def _unload(*mods):
    for m in mods:
        if m is not None and sys.modules.get(m.__name__) is m:
            del sys.modules[m.__name__]


def run_program(prog: Program, backend, dynamic=None, calls=None, cache_dir: str | None = None,
                recognise_noise: bool = True) -> Outcome:
    """Run ``prog`` eagerly and compiled with ``backend``/``dynamic``; stop at the first
    call that differs. ``cache_dir``: kiln's cache directory, kept (a second run loads what
    the first stored); by default a fresh one, removed after. A ``wrong`` result is checked
    for float noise (``noise.py``) unless ``recognise_noise`` is off."""
    out = _run(prog, backend, dynamic, calls, cache_dir)
    if recognise_noise and out.status == "wrong" and \
            noise.is_float_noise(prog, out, run_program, load, _unload, calls):
        out.status = "noise"
    return out


def _run(prog, backend, dynamic, calls, cache_dir) -> Outcome:
    start = time.perf_counter()
    out = Outcome(prog.seed, backend, dynamic, "ok")
    source = prog.source()
    filename = f"/kiln-fuzz/seed_{prog.seed}.py"
    name = f"kiln_fuzz_{prog.seed}"     # both copies have the user's module name
    mod_e = mod_k = None
    cache = cache_dir or tempfile.mkdtemp(prefix="kiln-fuzz-")
    grad_before = torch.is_grad_enabled()
    try:
        try:
            mod_e = load(source, name, filename)
            mod_k = load(source, name, filename)
        except Exception as e:  # noqa: BLE001 - the generator wrote invalid Python
            out.status, out.mismatch = "invalid", Mismatch("load", "source", f"{type(e).__name__}: {e}")
            return out
        kiln.reset()
        with kiln.config.patch(cache_dir=cache):
            try:
                compiled = kiln.compile(mod_k.fn, backend=backend, dynamic=dynamic)
            except Exception as e:  # noqa: BLE001
                out.status, out.mismatch = "crash", Mismatch("exception", "kiln.compile", f"{type(e).__name__}: {e}")
                return out
            leak = None
            for i, call in enumerate(prog.calls if calls is None else calls):
                try:
                    args_e = mod_e.make_inputs(call.seed, call.n, call.k, call.s, call.flag)
                    args_k = mod_k.make_inputs(call.seed, call.n, call.k, call.s, call.flag)
                except Exception as e:  # noqa: BLE001
                    out.status, out.mismatch = "invalid", Mismatch("load", "make_inputs", f"{type(e).__name__}: {e}")
                    return out
                kw_e = kw_k = None
                if call.kw:
                    kw_e, kw_k = dict(zip(prog.params, args_e)), dict(zip(prog.params, args_k))
                    args_e = args_k = ()
                sys.modules[name] = mod_e
                e_obs = observe(mod_e.fn, args_e, mod_e.__dict__, call.grad, kw_e, filename)
                sys.modules[name] = mod_k
                k_obs = observe(compiled, args_k, mod_k.__dict__, call.grad, kw_k, filename)
                out.eager_raised = out.eager_raised or e_obs.exception is not None
                mm = compare(e_obs, k_obs)
                if mm is not None:
                    kiln_raised = (k_obs.exception if mm.kind == "exception" else
                                   k_obs.backward_exception if mm.kind == "backward" else None)
                    out.status = "crash" if kiln_raised else "wrong"
                    out.call, out.mismatch = i, mm
                    out.spread = noise.deviation(e_obs, k_obs)
                    return out
                if i == 0:   # the capturing call: kiln must not keep its inputs alive
                    refs_e, refs_k = _weak_tensors(args_e, kw_e), _weak_tensors(args_k, kw_k)
                    del args_e, args_k, kw_e, kw_k
                    leaked = _leaked(refs_e, refs_k)
                    if leaked:   # reported only if no later call differs in anything else
                        leak = Mismatch("memory", leaked, "kiln keeps this input alive after the call; eager does not")
        if leak is not None:
            out.status, out.call, out.mismatch = "wrong", 0, leak
        out.internal = internal_errors()
        return out
    finally:
        torch.set_grad_enabled(grad_before)
        kiln.reset()
        _unload(mod_e, mod_k)
        if cache_dir is None:
            shutil.rmtree(cache, ignore_errors=True)
        out.seconds = time.perf_counter() - start
