"""Built-in activation-memory policies: saved-tensor hooks that kiln inlines.

Each policy is a context manager around a training step (forward under it; the backward may
run outside it). Eager code runs the same hooks as eager hooks. Tensors under ``min_bytes``,
and tensors the policy does not apply to (integers, another device), are saved unchanged. The
hooks of one configuration are made once and reused, so that a compiled step is not recompiled
when a new policy object with the same settings is entered (the hooks are guarded by identity).

* ``cast(dtype)``: floating-point activations wider than ``dtype`` are saved in ``dtype``.
* In compiled graphs both lossy policies (cast, fp8) keep log-softmax outputs exact and save
  softmax outputs in bfloat16 at the narrowest (``_hooks_for``): their backward reads them
  through exp, which turns rounding into large gradient errors. As eager hooks (uncompiled
  code) they cannot see which op saved a tensor, and round every one.
* ``fp8()``: float8_e4m3fn with one scale per tensor (amax-based); where the device cannot
  convert to float8 the tensor is saved unchanged, with the reason logged.
* ``offload()``: accelerator activations are copied to pinned CPU memory and back on a side
  stream (kiln::offload_start/finish, kiln::prefetch/prefetch_wait, stream_ops.py), so that
  the copies overlap compute; the copy back starts ``ahead`` saved tensors before the first
  use (aot/saved_hooks/schedule.py). Tensors already on the CPU stay (on a CPU-only run the
  policy changes nothing, and says so).
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from .. import logs
from ..aot.saved_hooks.inlining import mark_inline
from .hooks import saved_tensors_hooks
from .report import ActivationReport, report as _report

DEFAULT_MIN_BYTES = 64 * 1024
FP8_MAX = 448.0       # the largest finite float8_e4m3fn value


class Policy(saved_tensors_hooks):
    """One activation policy: a ``kiln.saved_tensors_hooks`` with a name and a report."""

    def __init__(self, name: str, hooks: tuple[Callable, Callable], min_bytes: int):
        self.name = name
        self.min_bytes = min_bytes
        pack, unpack = hooks
        pack.kiln_policy = name
        # the cache key: what the hooks compute, named exactly (their code reads torch only)
        super().__init__(pack, unpack, user_cache_hash=f"kiln.activations.{name}")

    def report(self) -> ActivationReport:
        """The graphs compiled so far with this policy's hooks inlined: saved-activation bytes
        before and after (``bytes_before``, ``bytes_after``; prints as a table)."""
        full = _report()
        return ActivationReport([r for r in full.rows if r.get("policy") == self.name])

    def __enter__(self):
        if logs.enabled.activations:
            logs.log("activations", f"policy {self.name} active")
        return super().__enter__() or self

    def __repr__(self) -> str:
        return f"kiln.activations.{self.name}"


def _check_min_bytes(min_bytes) -> int:
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise ValueError(f"min_bytes must be an int >= 0 (bytes below which a tensor is saved unchanged), "
                         f"got {min_bytes!r}")
    return min_bytes


def _nbytes(t: torch.Tensor):
    return t.numel() * t.element_size()


# Saved values that the lossy policies treat apart in compiled graphs: the backward of softmax
# and log-softmax reads their outputs through exp. Log-probabilities (around -ln(vocab)) rounded
# to bfloat16's 8 mantissa bits are off by ~0.03, probabilities by ~3%; to float8's 3 bits, by up
# to ~50%. The cross-entropy and attention gradients inherit that: GPT-2's loss after 20 steps
# was 3% (bf16) and 9% (fp8) off the no-hook run with every activation rounded. So log-softmax
# outputs stay exact, and softmax outputs (probabilities: a relative error, no worse) are saved
# in bfloat16 at the narrowest.
_LOG_PROBABILITY_OPS = frozenset({"aten::_log_softmax", "aten::log_softmax", "aten::_log_softmax_backward_data"})
_PROBABILITY_OPS = frozenset({"aten::_softmax", "aten::softmax", "aten::_safe_softmax",
                              "aten::_softmax_backward_data"})


def _op_name(target) -> str:
    schema = getattr(target, "_schema", None)       # ATen ops: "aten::_softmax"
    return schema.name if schema is not None else str(target)


def _ops_reading(saved: "torch.fx.Node", backward_users: list) -> set:
    """The ops a saved value comes from (as traced, before decompositions: node meta
    ``original_aten``) and the ops of the backward that read it."""
    ops = {_op_name(saved.target), _op_name(saved.meta.get("original_aten"))}
    ops.update(_op_name(u.target) for u in backward_users)
    return ops


def _hooks_for(own: tuple, probabilities: tuple | None) -> Callable:
    """``kiln_hooks_for`` of a lossy policy (aot/saved_hooks/inlining.py): None (keep exact) for
    log-probabilities, ``probabilities`` for softmax outputs (None: keep them exact too), else
    the policy's own hooks."""
    def hooks_for(saved, backward_users):
        ops = _ops_reading(saved, backward_users)
        if not ops.isdisjoint(_LOG_PROBABILITY_OPS):
            return None
        if not ops.isdisjoint(_PROBABILITY_OPS):
            return probabilities
        return own
    return hooks_for


# -- cast ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _cast_hooks(dtype: torch.dtype, min_bytes: int) -> tuple:
    def pack(t):
        if t.is_floating_point() and t.element_size() > dtype.itemsize and _nbytes(t) >= min_bytes:
            return (t.to(dtype), t.dtype)
        return (t, None)

    def unpack(packed):
        t, dtype_ = packed
        return t if dtype_ is None else t.to(dtype_)
    pack.__qualname__ = f"cast({dtype}).pack"
    unpack.__qualname__ = f"cast({dtype}).unpack"
    own = mark_inline(pack), mark_inline(unpack)
    # probabilities: bfloat16 or wider (float16's range loses the small ones)
    narrow = dtype.itemsize < 2 or dtype == torch.float16
    pack.kiln_hooks_for = _hooks_for(own, _cast_hooks(torch.bfloat16, min_bytes) if narrow else own)
    return own


def cast(dtype: torch.dtype = torch.bfloat16, *, min_bytes: int = DEFAULT_MIN_BYTES) -> Policy:
    """Save floating-point activations wider than ``dtype`` in ``dtype`` (cast back in the
    backward): ``with kiln.activations.cast(torch.bfloat16): loss = step(x)``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"cast(dtype): dtype must be a floating-point torch.dtype, got {dtype!r}")
    min_bytes = _check_min_bytes(min_bytes)
    return Policy(f"cast({dtype}, min_bytes={min_bytes})", _cast_hooks(dtype, min_bytes), min_bytes)


# -- fp8 ----------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def fp8_supported(device_type: str) -> tuple[bool, str]:
    """Whether tensors on ``device_type`` convert to and from float8_e4m3fn, and why not."""
    dt = getattr(torch, "float8_e4m3fn", None)
    if dt is None:
        return False, "this torch has no float8_e4m3fn"
    if device_type == "cuda" and not torch.cuda.is_available():
        return False, "CUDA is not available"
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes():      # (first asked while a hook is traced)
            x = torch.ones(4, device=device_type)
            ok = bool((x.to(dt).to(torch.float32) == x).all())
    except Exception as e:  # pragma: no cover (depends on the build)
        return False, f"{device_type} cannot convert to float8_e4m3fn ({type(e).__name__}: {e})"
    return ok, "" if ok else "float8 conversion is inexact for ones"


@functools.lru_cache(maxsize=None)
def _fp8_hooks(min_bytes: int) -> tuple:
    f8 = torch.float8_e4m3fn

    def pack(t):
        ok, why = fp8_supported(t.device.type)
        if not ok:
            if logs.enabled.activations:
                logs.log("activations", f"fp8: {tuple(t.shape)} {t.dtype} on {t.device} saved unchanged: {why}")
            return (t, None, None)
        if not t.is_floating_point() or t.element_size() <= 1 or _nbytes(t) < min_bytes:
            return (t, None, None)
        # one scale per tensor: its largest magnitude maps to float8's largest value
        amax = t.detach().abs().amax().to(torch.float32).clamp(min=1e-12)
        scale = FP8_MAX / amax
        q = (t.to(torch.float32) * scale).clamp(-FP8_MAX, FP8_MAX).to(f8)
        return (q, scale, t.dtype)

    def unpack(packed):
        q, scale, dtype_ = packed
        if scale is None:
            return q
        return (q.to(torch.float32) / scale).to(dtype_)
    pack.__qualname__ = "fp8.pack"
    unpack.__qualname__ = "fp8.unpack"
    own = mark_inline(pack), mark_inline(unpack)
    pack.kiln_hooks_for = _hooks_for(own, _cast_hooks(torch.bfloat16, min_bytes))
    return own


def fp8(*, min_bytes: int = DEFAULT_MIN_BYTES) -> Policy:
    """Save floating-point activations as float8_e4m3fn with one float32 scale per tensor
    (about 4x smaller than float32, 2x smaller than bfloat16; 3 mantissa bits)."""
    min_bytes = _check_min_bytes(min_bytes)
    return Policy(f"fp8(min_bytes={min_bytes})", _fp8_hooks(min_bytes), min_bytes)


# -- offload ------------------------------------------------------------------------------------

DEFAULT_AHEAD = 2


@functools.lru_cache(maxsize=None)
def _offload_hooks(min_bytes: int, ahead: int) -> tuple:
    from . import stream_ops  # waits: registers the kiln:: custom ops, which only offload uses
    from torch._prims_common import is_non_overlapping_and_dense_or_false as dense

    def pack(t):
        # (a tensor with overlapping or unknown strides is kept: its CPU copy and the copy
        # back must have t's strides, which only a dense layout allows)
        if t.device.type == "cpu" or _nbytes(t) < min_bytes or not dense(t):
            return (t, None)
        return (stream_ops.to_cpu(t, ahead), t.device)

    def unpack(packed):
        t, device = packed
        if device is None:
            return t
        return stream_ops.to_device(t, device, ahead)
    pack.__qualname__ = "offload.pack"
    unpack.__qualname__ = "offload.unpack"
    return mark_inline(pack), mark_inline(unpack)


def offload(*, min_bytes: int = DEFAULT_MIN_BYTES, ahead: int = DEFAULT_AHEAD) -> Policy:
    """Save accelerator activations in pinned CPU memory, copied on a side stream both ways so
    that the copies overlap compute. ``ahead`` bounds the device memory the copies hold: in
    the forward a tensor's memory is released (the compute stream waits for its copy) when the
    ``ahead``-th next tensor starts its copy; in the backward a tensor's copy back starts when
    the ``ahead``-th previous one is first used (the first ``ahead`` at the start of the
    backward), and the compute stream waits for it just before its own first use (Inductor
    keeps this order: graphs with these copies are compiled without its peak-memory
    reordering, which cannot see the memory a copy in flight holds). As eager
    hooks (uncompiled code) each copy finishes at once. Lossless: results equal eager bitwise.
    On a CPU-only run nothing is moved (logged under ``KILN_LOGS=activations``); a graph with
    offloaded activations runs without CUDA graphs (the reason is logged)."""
    min_bytes = _check_min_bytes(min_bytes)
    if isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 1:
        raise ValueError(f"ahead must be an int >= 1 (saved tensors whose copies may be in flight at once), "
                         f"got {ahead!r}")
    if not torch.cuda.is_available() and logs.enabled.activations:
        logs.log("activations", "offload: no accelerator; activations already live in CPU memory "
                                "(the policy changes nothing)")
    return Policy(f"offload(min_bytes={min_bytes}, ahead={ahead})", _offload_hooks(min_bytes, ahead), min_bytes)
