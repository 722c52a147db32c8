"""One CUDA graph of one compiled graph, for one input size: how its inputs get in, how its
outputs come out.

Inputs (decided when recording, as the seed's "static inputs"):

* read in place: parameters and buffers (capture tags them ``kiln_static``), and tensors at an
  address the pool tree knows as stable (outputs of another replay, such as the forward's
  saved tensors in the backward; inputs read in place by another recording). A replay needs
  each at the address it was recorded with (``matches``); a new address means a new
  recording.
* read in place, optimistically (inference and forward graphs): another input the caller
  passed on the warm-up call and passes again, at the same address, on the recording call (a
  batch tensor it keeps and refills). Reading it in place is right for whatever tensor is at
  that address; an input at another address later makes the graph record once more, copying
  that input from then on (``CudagraphFunction._record_again``). This saves a copy kernel per
  input and call.
* copied: any other tensor is copied, before each replay, into a buffer the recording owns
  (no copy when the caller passes that buffer itself).

Outputs live in the device's pool (``tree.py``). Each replay returns new tensors on new
storage objects over that memory, so that the next replay can make the previous ones raise
when read (``Generation.invalidate``). Outputs that are inputs (a parameter saved for the
backward) are returned as the caller's tensors.

The call that records returns the tensors its capture made: the allocator counts their memory
as in use while they (or that call's generation) are alive, and as the pool's again after that,
as with torch's tree (``PoolTree.reused_outputs``). A forward's saved tensors are held by its
recording until its backward is recorded (``tree.release_saved``): after that, between steps,
they are dead memory of the pool; recordings captured later may place memory there and overlap
the forward. cuBLAS keeps a workspace per stream: it is dropped before and after each capture
(and warm-up), so that the one a capture makes is pool memory its graph reuses, not memory
held for good (torch's tree does the same).
"""
from __future__ import annotations

import bisect
import functools

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import logs
from .tree import Generation, PoolTree


# one C++ call comparing the data pointers of many inputs (torch >= 2.4)
_ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
# the C replay, without the Python wrapper of torch.cuda.CUDAGraph (its input-liveness
# tracker is never turned on here); resolved lazily: CPU builds have no CUDAGraph
_replay_graph = getattr(getattr(torch._C, "_CUDAGraph", None), "replay", None)
# a storage over pool memory, a tensor on it (a replay's outputs; CUDA builds)
_make_storage = getattr(torch._C, "_construct_storage_from_data_pointer", None)
_make_tensor = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)


# drops cuBLAS's per-stream workspaces (CUDA builds)
_clear_cublas = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)


def clear_cublas_workspaces() -> None:
    """cuBLAS keeps a workspace per (handle, stream) for good: made during a capture it would
    stay allocated in the pool, made during a warm-up it would stay allocated outside; dropped
    here, the graph reuses the captured one as pool memory (torch's tree does the same)."""
    if _clear_cublas is not None and torch.cuda.is_initialized():
        _clear_cublas()


class CannotRecord(Exception):
    """This call cannot be recorded (the reason is the message); it runs without the graph."""


def _non_overlapping(t: torch.Tensor) -> bool:
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1)
    need = 1
    for st, sz in dims:
        if st < need:
            return False
        need = st * sz
    return True


def _span(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return 1 + sum((sz - 1) * st for sz, st in zip(t.shape, t.stride()))


class Recording:
    """A captured CUDA graph with its input plan and output plan."""

    def __init__(self, facts, tree: PoolTree, static_idxs: frozenset, protected_from: int | None,
                 backward: bool):
        self.facts = facts
        self.tree = tree
        self.static_idxs = static_idxs
        self.protected_from = protected_from   # outputs from this index on are saved tensors
        self.backward = backward
        self.generation: Generation | None = None
        self.graph = None
        # per visible output storage: [start, end) and a weak reference to the tensor memory
        # the capture made (alive: the allocator counts the block as in use)
        self.out_blocks: list = []
        self.held_saved: list = []
        # outputs of earlier recordings whose memory this capture may have reused
        # (``PoolTree.reused_outputs``): [(weak recording, [visible output positions])]
        self.reuses: list = []
        self.pool = None            # the graph pool it is captured into

    # -- recording ---------------------------------------------------------------------------
    def classify(self, args: list, stable: frozenset = frozenset()) -> None:
        """Which inputs are read in place and which are copied (before any allocation).
        ``stable``: the other inputs that may be read in place (optimistically)."""
        self.inplace: list[int] = []
        self.ptrs: list[int] = []
        self.copied: list[int] = []
        self.optimistic: list[int] = []
        written = self.facts.written_inputs
        held = None
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            if a.device.type != "cuda":
                raise CannotRecord(f"input {self.facts.input_names[i]} is a {a.device.type} tensor")
            if i in self.static_idxs or self.tree.owns(a, self.backward):
                if i not in self.static_idxs and a.data_ptr() not in self.tree.static_ptrs and a.numel():
                    # pool memory: the capture may allocate there unless a recording holds it (a
                    # forward's saved tensors after its backward was recorded are not held)
                    held = self.tree.held_blocks() if held is None else held
                    k = bisect.bisect_right(held, (a.data_ptr(), float("inf"))) - 1
                    if k < 0 or not held[k][0] <= a.data_ptr() < held[k][1]:
                        raise CannotRecord(f"input {self.facts.input_names[i]} lies in pool memory the allocator "
                                           "has back (an output of an earlier replay, or a saved tensor of a forward "
                                           "whose backward was recorded already): the capture could allocate there")
                self.inplace.append(i)
                self.ptrs.append(a.data_ptr())
            elif i in stable and i not in written:
                self.inplace.append(i)
                self.ptrs.append(a.data_ptr())
                self.optimistic.append(i)
            else:
                self.copied.append(i)
        copied = set(self.copied)
        for i in written:
            if i in copied:
                raise CannotRecord(f"the graph writes to input {self.facts.input_names[i]}, which is neither a "
                                   "parameter/buffer nor an output of another CUDA-graph replay (a replay would "
                                   "write to a copy)")

    def _static_args(self, args: list) -> tuple[list, dict]:
        """The arguments of the capture (copied inputs replaced by the recording's buffers)
        and, per input read in place, (storage pointer, data pointer, the tensor)."""
        self.copies = []      # (index, buffer, flat buffer or None, span, strides)
        static_args = list(args)
        for i in self.copied:
            a = args[i]
            if _non_overlapping(a):
                buf = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                buf.copy_(a)
                self.copies.append((i, buf, None, 0, None))
            else:   # an expanded input: the graph reads it with its strides; copy the memory span
                span = _span(a)
                flat = torch.empty(span, dtype=a.dtype, device=a.device)
                if span:
                    flat.copy_(a.as_strided((span,), (1,)))
                buf = flat.as_strided(a.shape, a.stride())
                self.copies.append((i, buf, flat, span, a.stride()))
            static_args[i] = buf
        inplace = {}
        for i in self.inplace:
            a = static_args[i]
            inplace[i] = (a.untyped_storage().data_ptr(), a.data_ptr(), a)
        return static_args, inplace

    def record(self, inner, args: list) -> list:
        """Capture ``inner`` (a boxed compiled graph) for ``args``, replay it once, return
        this call's outputs."""
        # outputs of earlier recordings whose memory the pool has back may be reused by this
        # capture: none the caller still holds may be there, else the capture takes a fresh pool
        reuses, why = self.tree.reused_outputs(self.tree.handle)
        if why is not None:     # (e.g. the last inference's logits, held while training starts)
            if logs.enabled.cudagraphs:
                logs.event("cudagraphs", "cudagraph", f"the {self.facts.name} is captured into a fresh pool: {why}",
                           action="fresh_pool", graph=self.facts.name, reason=str(why))
            self.tree.new_pool()
            reuses = []
        self.pool = self.tree.handle
        self.reuses = reuses
        # memory given up by forwards whose backward was recorded may be reused by this capture:
        # their saved tensors must not be waiting for a backward (then the call runs as compiled
        # and a later one records)
        for ref in self.tree._released:
            fw = ref()
            if fw is not None and fw.pool == self.pool and fw.generation is not None and fw.generation.pending():
                raise CannotRecord(f"the {fw.facts.name}'s saved tensors wait for their backward, in memory "
                                   "this recording may reuse")
        static_args, inplace = self._static_args(args)
        # (for the one-call address check of ``matches``: None where nothing is checked)
        self.ptr_list = [None] * len(args)
        for i, p in zip(self.inplace, self.ptrs):
            self.ptr_list[i] = p
        self.strided_copies = [(i, strides) for i, buf, flat, span, strides in self.copies if flat is not None]
        # ``matches`` is one C call (the caller makes it directly)
        self.simple_match = _ptrs_equal is not None and bool(self.inplace) and not self.strided_copies
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        clear_cublas_workspaces()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outs = inner(list(static_args))
        finally:
            clear_cublas_workspaces()
        del static_args
        self.graph = graph
        self._replay = graph.replay if _replay_graph is None else functools.partial(_replay_graph, graph)
        self._plan_outputs(list(outs), inplace)
        self.tree.static_ptrs.update(self.ptrs)
        self.position = self.tree.add(self)
        if self.backward:       # its forwards' saved tensors are dead memory between steps now
            self.tree.release_saved_at(self.ptrs, self)
        keep = [args[i] for i in self.alias_args]
        args.clear()
        for ref in self.overlaps:     # (what a retained graph still holds there: an error to read)
            fw = ref()
            if fw is not None and fw.generation is not None:
                fw.generation.invalidate_saved()
        graph.replay()
        result = self._outputs(keep)
        # this call returns the capture's own tensors: the memory is counted as in use while
        # they (or this generation) are alive, not for as long as the recording lives
        for j, (_, _, metas) in enumerate(self.visible):
            for k, _ in metas:
                result[k] = outs[k]
            self.generation.visible[j] = outs[metas[0][0]].untyped_storage()
        return result

    def _plan_outputs(self, outs: list, inplace: dict) -> None:
        inplace_storage = {}
        for i, (sp, _, _) in inplace.items():
            inplace_storage.setdefault(sp, i)
        self.template = list(outs)
        self.alias_args: list[int] = []      # inputs some outputs alias
        self.arg_outputs: list = []          # (output, position in alias_args, view or None)
        groups: dict[int, list] = {}         # storage pointer -> [(k, tensor)]
        held: list = []
        for k, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                continue
            self.template[k] = None
            if o.device.type != "cuda":
                raise CannotRecord(f"output {k} is a {o.device.type} tensor")
            sp = o.untyped_storage().data_ptr()
            i = inplace_storage.get(sp)
            if i is not None:
                _, a_ptr, a = inplace[i]
                if i not in self.alias_args:
                    self.alias_args.append(i)
                pos = self.alias_args.index(i)
                if o is a:
                    self.arg_outputs.append((k, pos, None))
                else:
                    if o.dtype != a.dtype:
                        raise CannotRecord(f"output {k} views input {self.facts.input_names[i]} as another dtype")
                    rel = (o.data_ptr() - a_ptr) // o.element_size()
                    self.arg_outputs.append((k, pos, (tuple(o.shape), tuple(o.stride()), rel)))
                continue
            groups.setdefault(sp, []).append((k, o))
            held.append((k, o))
        # the saved tensors are held until the backward is recorded (``tree.release_saved_at``);
        # the other outputs by the caller (``out_blocks``)
        saved_from = self.protected_from if self.protected_from is not None else len(outs)
        self.held_saved = [o for k, o in held if k >= saved_from]
        device = self.tree.device
        self.visible: list = []      # (pointer, nbytes, [(k, metadata)])
        protected: list = []
        for sp, members in groups.items():
            nbytes = members[0][1].untyped_storage().nbytes()
            metas = [(k, {"size": tuple(o.shape), "stride": tuple(o.stride()), "dtype": o.dtype,
                          "device": device, "storage_offset": o.storage_offset(), "nbytes": nbytes,
                          "data_ptr": sp}) for k, o in members]
            if self.protected_from is not None and any(k >= self.protected_from for k, _ in members):
                protected.append((sp, nbytes, metas))
            else:
                self.visible.append((sp, nbytes, metas))
                self.out_blocks.append((sp, sp + nbytes, StorageWeakRef(members[0][1].untyped_storage())))
        # Saved tensors are never shown to the user: one storage over all of them (one liveness
        # test per replay). Offsets are re-based on the lowest pointer (blocks are 512-byte
        # aligned, so they stay whole elements).
        self.protected = None
        if protected:
            base = min(sp for sp, _, _ in protected)
            end = max(sp + n for sp, n, _ in protected)
            metas = []
            for sp, _, ms in protected:
                for k, m in ms:
                    m = dict(m)
                    size = m["dtype"].itemsize
                    if (sp - base) % size:
                        raise CannotRecord("a saved tensor is not aligned to its element size")
                    m["storage_offset"] += (sp - base) // size
                    m["data_ptr"], m["nbytes"] = base, end - base
                    metas.append((k, m))
            self.protected = (base, end - base, metas)
            blocks = {o.untyped_storage().data_ptr(): o.untyped_storage().nbytes() for o in self.held_saved}
            self.tree.saved_blocks(self, [(p, p + n) for p, n in blocks.items()])
        self.tree.owned_bases.update(sp for sp, _, _ in self.visible)
        if self.protected is not None:
            self.tree.owned_bases.add(self.protected[0])

    # -- replay ------------------------------------------------------------------------------
    def matches(self, args: list) -> bool:
        """Inputs read in place are where they were recorded; copied ones fit their buffers."""
        if self.inplace:
            if _ptrs_equal is not None:
                if not _ptrs_equal(args, self.ptr_list, self.inplace):
                    return False
            else:
                for i, p in zip(self.inplace, self.ptrs):
                    if args[i].data_ptr() != p:
                        return False
        for i, strides in self.strided_copies:
            if args[i].stride() != strides:
                return False
        return True

    def mismatched(self, args: list) -> list[int]:
        return [i for i, p in zip(self.inplace, self.ptrs)
                if not isinstance(args[i], torch.Tensor) or args[i].data_ptr() != p]

    def replay(self, args: list) -> list:
        # Inputs first (an input may be this recording's previous output, still valid until
        # the invalidation below). Inputs read in place are safe from this replay: they were
        # recorded at their address, memory this recording's own allocations never covered.
        for i, buf, flat, span, strides in self.copies:
            a = args[i]
            if a.data_ptr() == buf.data_ptr():
                continue
            if flat is None:
                buf.copy_(a)
            elif span:
                flat.copy_(a.as_strided((span,), (1,)))
        keep = [args[i] for i in self.alias_args] if self.alias_args else None
        args.clear()
        self.tree.invalidate_from(self)
        self._replay()
        return self._outputs(keep)

    def _outputs(self, keep) -> list:
        outs = list(self.template)
        make_storage, make_tensor = _make_storage, _make_tensor
        device = self.tree.device
        storages = []
        for sp, nbytes, metas in self.visible:
            s = make_storage(sp, device, nbytes)
            storages.append(s)
            for k, m in metas:
                outs[k] = make_tensor(m, s)
        saved = None
        if self.protected is not None:
            base, nbytes, metas = self.protected
            saved = make_storage(base, device, nbytes)
            for k, m in metas:
                outs[k] = make_tensor(m, saved)
        for k, pos, view in self.arg_outputs:
            a = keep[pos]
            outs[k] = a if view is None else a.as_strided(view[0], view[1], a.storage_offset() + view[2])
        self.generation = Generation(storages, saved, self.facts.name, self.backward)
        return outs
