"""Custom ops that move saved activations to pinned CPU memory and back on a side stream.

Why custom ops: an Inductor graph has no stream operations, so the copies of
``kiln.activations.offload()`` are opaque ops (``torch.library``) that Inductor runs as extern
(fallback) kernels in graph order, like any ATen op that it does not generate code for. Their
fake impls give make_fx, the partitioner and Inductor the output metadata. Every op is split in
two: one that STARTS a copy on the device's side stream and returns a token (an empty CPU
tensor that holds the copy in flight as a Python attribute), and one that FINISHES it (makes
the compute stream wait for the copy's event) and returns the copied tensor. The graphs order
the two only through data dependencies, which Inductor keeps:

* forward: ``offload_start(t)`` after t's last use copies t to a staging buffer of its own
  (on the compute stream) and starts the copy to the CPU from there; ``offload_finish(token,
  ..., order)`` runs ``ahead`` offloads later (``order`` holds that later op's token) and
  makes the compute stream wait for the copy. The side stream never touches a buffer of the
  graph: Inductor reuses buffers, and recomputes cheap values into a buffer per consumer,
  without seeing streams.
* backward: ``prefetch(cpu)`` starts the copy back ``ahead`` saved tensors before the first
  use (``prefetch_wait`` of an earlier tensor lists its token in ``order``), and
  ``prefetch_wait(token, ...)`` makes the compute stream wait just before the first use.

The finishing op returns a tensor that no graph value aliases (the one created by the start):
the graph owns it only once the compute stream has waited for its copy. On devices other than CUDA
the copies are plain synchronous copies (no stream; a token holds the result). The ops are
registered when this module is imported (``kiln.activations`` does; a process that loads an
artifact using them imports it from ``aot/export.py``'s target decoding).
"""
from typing import Sequence

import torch

from ..aot.fx_graphs import op_name
from ..process_state import side_streams as _side_streams

_KEY = "_kiln_in_flight"


def side_stream(device: torch.device):
    """The device's copy stream (one per device, made on first use)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _side_streams.get(index)
    if stream is None:
        stream = _side_streams.setdefault(index, torch.cuda.Stream(device=index))   # (one per device)
    return stream


def _token(value: torch.Tensor, event) -> torch.Tensor:
    token = torch.empty(0)
    setattr(token, _KEY, (value, event))
    return token


def _take(token: torch.Tensor, what: str):
    held = token.__dict__.pop(_KEY, None)
    if held is None:
        raise RuntimeError(f"kiln::{what}: the token holds no copy in flight (each token is finished once, "
                           "by the op that its start op feeds)")
    return held


def _empty_like_strided(t: torch.Tensor, device, pin: bool = False) -> torch.Tensor:
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device, pin_memory=pin)


# -- forward: device -> pinned CPU -----------------------------------------------------------------

@torch.library.custom_op("kiln::offload_start", mutates_args=())
def offload_start(t: torch.Tensor, ahead: int) -> torch.Tensor:
    """Start copying ``t`` to pinned CPU memory on the side stream; the token holds the copy.
    ``ahead``: how many later offloads may start before this one is finished (read by the
    graph schedule, aot/saved_hooks/schedule.py)."""
    if t.device.type != "cuda":
        return _token(t.to("cpu", copy=True), None)
    compute = torch.cuda.current_stream(t.device)
    # The side stream reads a copy that only this op owns, never t itself: Inductor manages
    # its buffers without seeing the side stream (it writes a later kernel's output into t's
    # memory as soon as this op, t's last user, has run, and it may even hand this op a
    # buffer of its own, recomputed for it). A device-to-device copy on the compute stream is
    # cheap next to the copy over PCIe, and its memory goes back to the caching allocator,
    # which does not reallocate it before the side stream is done with it (record_stream).
    staged = _empty_like_strided(t, t.device)
    staged.copy_(t)
    side = side_stream(t.device)
    side.wait_stream(compute)
    buf = _empty_like_strided(t, "cpu", pin=True)
    with torch.cuda.stream(side):
        buf.copy_(staged, non_blocking=True)      # (the pinned allocator records the copy's event)
        done = torch.cuda.Event()
        done.record(side)
    staged.record_stream(side)
    return _token(buf, (done, t.device))


@offload_start.register_fake
def _(t, ahead):
    return torch.empty(0)


@torch.library.custom_op("kiln::offload_finish", mutates_args=())
def offload_finish(token: torch.Tensor, size: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                   order: list[torch.Tensor]) -> torch.Tensor:
    """The CPU copy that ``token`` holds (of ``size``, ``stride``, ``dtype``: its metadata for
    tracing); the compute stream waits for the copy from here on, which bounds the device
    memory that copies in flight hold. ``order``: tokens of ops that must be issued first
    (only an ordering)."""
    buf, done = _take(token, "offload_finish")
    if done is not None:
        event, device = done
        torch.cuda.current_stream(device).wait_event(event)
    return buf


@offload_finish.register_fake
def _(token, size, stride, dtype, order):
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


# -- backward: CPU -> device -------------------------------------------------------------------

@torch.library.custom_op("kiln::prefetch", mutates_args=())
def prefetch(cpu: torch.Tensor, device: str, ahead: int) -> torch.Tensor:
    """Start copying ``cpu`` back to ``device`` on the side stream; the token holds the copy."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return _token(cpu.to(dev, copy=True), None)
    compute = torch.cuda.current_stream(dev)
    out = _empty_like_strided(cpu, dev)       # allocated for the compute stream, which reads it
    side = side_stream(dev)
    side.wait_stream(compute)                 # out's memory may still be read by queued kernels
    with torch.cuda.stream(side):
        out.copy_(cpu, non_blocking=True)
        done = torch.cuda.Event()
        done.record(side)
    out.record_stream(side)                   # (a backward that fails before the wait frees it)
    return _token(out, done)


@prefetch.register_fake
def _(cpu, device, ahead):
    return torch.empty(0)


@torch.library.custom_op("kiln::prefetch_wait", mutates_args=())
def prefetch_wait(token: torch.Tensor, cpu: torch.Tensor, device: str,
                  order: list[torch.Tensor]) -> torch.Tensor:
    """The device copy that ``token`` holds; the compute stream waits for it here (just
    before its first use). ``order``: tokens of prefetches that must be issued first."""
    out, done = _take(token, "prefetch_wait")
    if done is not None:
        torch.cuda.current_stream(out.device).wait_event(done)
    return out


@prefetch_wait.register_fake
def _(token, cpu, device, order):
    return _empty_like_strided(cpu, torch.device(device))


# -- what a pack / unpack hook calls ------------------------------------------------------------

OPS = ("kiln::offload_start", "kiln::offload_finish", "kiln::prefetch", "kiln::prefetch_wait")


def in_graph(graph) -> bool:
    """The graph runs these copies (Inductor must keep their schedule: backends/inductor/backend.py)."""
    return any(op_name(n) in OPS for n in graph.nodes)


def to_cpu(t: torch.Tensor, ahead: int) -> torch.Tensor:
    """``t`` copied to pinned CPU memory on the side stream (inlined, the finish is scheduled
    ``ahead`` offloads later; as an eager hook it finishes at once)."""
    t = t.detach()
    token = torch.ops.kiln.offload_start(t, ahead)
    return torch.ops.kiln.offload_finish(token, t.size(), t.stride(), t.dtype, [])


def to_device(cpu: torch.Tensor, device, ahead: int) -> torch.Tensor:
    """``cpu`` copied back to ``device`` (inlined, the copy starts ``ahead`` saved tensors
    before this one's first use)."""
    device = str(device)
    return torch.ops.kiln.prefetch_wait(torch.ops.kiln.prefetch(cpu, device, ahead), cpu, device, [])
