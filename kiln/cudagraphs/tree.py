"""The memory pool of one CUDA device, shared by every recording on it, and the rules that
keep replays from overwriting memory that is still needed.

All recordings of a device (the forward and backward of a step, the graphs one after another
in a step, the recordings for other sizes) are captured into one graph pool (a fresh one only
when ``new_pool`` says so), in order. A
capture's intermediates go back to the pool at once, and later captures may place memory there.
Hence:

    replaying recording R overwrites R's own outputs and, possibly, the outputs of every
    recording captured after R.

This is the path of torch's tree of recordings, kept as one ordered list. Before a replay of
R, ``conflict`` and ``invalidate_from`` look at the last outputs of R and of every later
recording:

* outputs saved for a backward that has not run yet ("protected") must not be overwritten:
  the call runs without the CUDA graph instead (``conflict``);
* outputs the user may still hold ("visible") are invalidated: reading them afterwards
  raises a clear error instead of returning overwritten data.

Outputs are not held for good, as in torch's tree: the allocator counts a recording's output
memory as in use only while the tensors its capture returned are alive (the call that recorded
hands them to the caller; its generation keeps them until the next replay). After that, the
memory is the pool's again, between steps: the peak memory of a step does not count the
gradients a backward hands to ``.grad`` (nor the logits of an inference) twice, and a later
capture may place memory there. Such a capture "reuses" those outputs (``reused_outputs``):

* while the caller holds a replay's output there, the capture goes to a fresh pool instead
  (``new_pool``: a pool per device at a time; a recording keeps the pool it was captured in);
* its call runs without its CUDA graph (``conflict``) while the caller holds an output of a
  later replay there, since a replay's outputs stay valid until that graph (or one recorded
  before it) replays.

The same holds for a forward's saved tensors, which its recording holds until the backward is
recorded (``release_saved_at``): every recording captured later in its pool "overlaps" that
forward: its
replay needs the forward's saved tensors consumed (``conflict``) and invalidates what a
retained graph still holds of them; and no capture may read pool memory in place that no
recording holds (``held_blocks``).
"""
from __future__ import annotations

import weakref

import torch

from ..process_state import pending_backwards as _pending, pool_trees as _trees

_STALE = ("kiln: this tensor is an output of a CUDA-graph replay ({name}) and its memory was "
          "overwritten by a later replay. Outputs of a compiled function run with CUDA graphs "
          "(mode='reduce-overhead') stay valid until the function (or one called before it in the "
          "step) is called again: .clone() an output you keep across calls{grad}.")
_GRAD_HINT = ("; for gradients (as with torch's CUDA graphs): set .grad to None before each "
              "backward (optimizer.zero_grad() does by default), or, for gradient accumulation, "
              "allocate the .grad tensors before the first compiled backward (an eager warm-up step)")


class Generation:
    """The outputs of one replay: storages for those the user may hold, one for those a
    pending backward needs ("protected"). The storages are the replay's own objects over pool
    memory (they own nothing): a tensor on one is alive while the storage has another user
    than this Generation (``_uses``). The backward's call marks its forward's generation
    ``consumed`` (``consume``): what autograd still holds after that (a retained graph) is
    invalidated, not protected, by a replay. (No weak references: one replay makes one
    Generation, on every call.)"""
    __slots__ = ("visible", "protected", "name", "backward", "consumed", "cdata")

    def __init__(self, visible: list, protected, name: str, backward: bool):
        self.visible = visible
        self.protected = protected
        self.name = name
        self.backward = backward
        self.consumed = False
        self.cdata = None
        if protected is not None:
            self.cdata = protected._cdata
            _pending[self.cdata] = self

    def pending(self) -> bool:
        return self.protected is not None and not self.consumed and _uses(self.cdata) > 1

    def alive(self) -> bool:
        """Whether the user still holds one of the visible outputs."""
        for s in self.visible:
            if _uses(s._cdata) > 1:
                return True
        return False

    def invalidate(self) -> None:
        msg = None
        storages = self.visible if self.protected is None else [*self.visible, self.protected]
        for s in storages:
            if _uses(s._cdata) > 1:
                if msg is None:
                    msg = _STALE.format(name=self.name, grad=_GRAD_HINT if self.backward else "")
                _poison(s._cdata, msg)
        if self.cdata is not None and _pending.get(self.cdata) is self:
            _pending.pop(self.cdata, None)     # (a backward on autograd's thread may take it first)
        self.visible, self.protected = [], None

    def visible_alive(self, idxs: list) -> bool:
        """Whether the user holds one of the visible outputs at positions ``idxs``."""
        vis = self.visible
        for j in idxs:
            if j < len(vis) and _uses(vis[j]._cdata) > 1:
                return True
        return False

    def invalidate_saved(self) -> None:
        """Only the saved tensors (a recording that overlaps their memory replays)."""
        s = self.protected
        if s is None:
            return
        if _uses(s._cdata) > 1:
            _poison(s._cdata, _STALE.format(name=self.name, grad=""))
        if _pending.get(self.cdata) is self:
            _pending.pop(self.cdata, None)
        self.protected = None


# how many holders a StorageImpl has (its users: tensors, storage objects)
_uses = torch._C._storage_Use_Count

# makes reading a storage's data raise ``msg`` (a CUDA build's binding)
_poison = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)

# (_pending: protected storage, its StorageImpl address -> the generation whose saved tensors
# it holds)


def consume(args: list, probes: list) -> None:
    """A backward graph is called with ``args``: the forward generation whose saved tensors
    they are is no longer pending. ``probes``: the argument positions that found one before
    (tried first; the others only when they find none)."""
    if not _pending:
        return
    for i in probes:
        if i < len(args) and _take(args[i]):
            return
    for i, a in enumerate(args):
        if i not in probes and _take(a):
            probes.append(i)
            return


def _take(a) -> bool:
    if not isinstance(a, torch.Tensor):
        return False
    g = _pending.pop(a.untyped_storage()._cdata, None)
    if g is None:
        return False
    g.consumed = True
    return True


class PoolTree:
    """The graph pool of one device and its recordings, in capture order."""

    def __init__(self, device: torch.device):
        self.device = device
        self._handle = None
        self._recordings: list[weakref.ref] = []
        # data pointers of the inputs recordings read in place (parameters and buffers), and
        # of the output memory they own: an input found there at a later capture is read in
        # place too (no copy), e.g. the forward's saved tensors in the backward
        self.static_ptrs: set[int] = set()
        self.owned_bases: set[int] = set()
        # forwards whose saved tensors' memory a backward's capture took over (weak)
        self._released: list = []
        self._saved: list = []             # (forward, its saved tensors' blocks)

    @property
    def handle(self):
        """The graph pool the next recording of this device is captured into."""
        if self._handle is None:
            self._handle = torch.cuda.graph_pool_handle()
        return self._handle

    def new_pool(self) -> None:
        """Captures from now on go to a fresh pool: the current one's free memory holds outputs
        the caller still holds (``reused_outputs``). Recordings keep their own pool; the order
        of the recordings stays one list (invalidating across pools is only cautious)."""
        self._handle = None

    def add(self, recording) -> int:
        """Append a new recording; returns its position (dead ones keep theirs: positions
        never move). It overlaps every forward whose saved tensors' memory was given up before
        (``release_saved``) in its pool."""
        self._recordings.append(weakref.ref(recording))
        recording.overlaps = [ref for ref in self._released
                              if ref() is not None and ref().pool == recording.pool]
        return len(self._recordings) - 1

    def saved_blocks(self, forward, blocks: list) -> None:
        """``forward`` holds its saved tensors in ``blocks`` ([start, end) pointers)."""
        self._saved = [(r, b) for r, b in self._saved if r() is not None]
        self._saved.append((weakref.ref(forward), blocks))

    def release_saved_at(self, ptrs: list, backward) -> None:
        """``backward`` was recorded reading ``ptrs`` in place: each forward whose saved tensors
        have all been read by the backward graphs recorded so far stops holding them
        (``release_saved``). A forward's backward can be several graphs (one per segment,
        kiln.aot.segments), each reading some of the saved tensors: a block released after the
        first would lie in memory the allocator has back when the next one is recorded."""
        for ref, blocks in self._saved:
            fw = ref()
            if fw is None or fw is backward or not fw.held_saved:
                continue
            read = {k for k, (b, e) in enumerate(blocks) if any(b <= p < e for p in ptrs)}
            if not read:
                continue
            fw.saved_read = getattr(fw, "saved_read", frozenset()) | read
            if len(fw.saved_read) == len(blocks):
                fw.held_saved = []
                self.release_saved(fw)

    def held_blocks(self) -> list:
        """[start, end) of the pool memory the allocator counts as in use: outputs whose
        capture-time tensors are alive, saved tensors until released; sorted: a capture may
        read pool memory in place only there."""
        blocks = set()
        for ref in self._recordings:
            r = ref()
            if r is not None:
                for start, end, weak in r.out_blocks:
                    if not weak.expired():
                        blocks.add((start, end))
                for h in r.held_saved:
                    s = h.untyped_storage()
                    blocks.add((s.data_ptr(), s.data_ptr() + s.nbytes()))
        return sorted(blocks)

    def reused_outputs(self, pool) -> tuple[list, str | None]:
        """Before a capture into ``pool``: the outputs of earlier recordings there whose memory
        the allocator has back (their capture-time tensors died), which the capture may reuse,
        as [(weak recording, [visible output positions])]; and why the capture must not be made
        there (the caller holds a replay's output in that memory), or None."""
        reuses = []
        for ref in self._recordings:
            r = ref()
            if r is None or r.pool != pool:
                continue
            idxs = [j for j, (_, _, weak) in enumerate(r.out_blocks) if weak.expired()]
            if not idxs:
                continue
            g = r.generation
            if g is not None and g.visible_alive(idxs):
                return [], (f"an output of the {r.facts.name}'s last replay is still held, in memory the pool "
                            "has back (a capture there could overwrite it)")
            reuses.append((ref, idxs))
        return reuses, None

    def release_saved(self, forward) -> None:
        """``forward``'s saved tensors are no longer held by its recording: later captures
        may place memory there (they overlap it: ``add``)."""
        ref = weakref.ref(forward)
        if ref not in self._released:
            self._released.append(ref)

    def _from(self, recording) -> list:
        """``recording`` and every recording captured after it, alive."""
        out = []
        for ref in self._recordings[recording.position:]:
            r = ref()
            if r is not None:
                out.append(r)
        return out

    def conflict(self, recording) -> str | None:
        """Why replaying ``recording`` now would overwrite tensors still needed: saved for a
        pending backward, or (a backward graph run twice in one backward pass) the gradients
        of its previous replay, which autograd is still accumulating."""
        if recording.backward:
            g = recording.generation
            if g is not None and g.alive():
                return ("its previous replay's gradients are still alive (one backward pass runs this backward "
                        "graph twice, e.g. a module called twice before backward())")
        for ref, idxs in recording.reuses:
            r = ref()
            g = r.generation if r is not None else None
            if g is not None and g.visible_alive(idxs):
                return (f"an output of the {r.facts.name}'s last replay is still held, in memory this recording "
                        "reuses (it was captured after that output died); drop or .clone() it before calling")
        if not _pending:        # (the common case: nothing saved is waiting for a backward)
            return None
        for r in self._from(recording):
            g = r.generation
            if g is not None and g.pending():
                what = "its previous call's" if r is recording else f"the later-recorded {r.facts.name}'s"
                return (f"{what} outputs are saved for a backward that has not run yet (the replay "
                        "would overwrite them; run backward() before calling again, or run under "
                        "torch.no_grad() when no backward will follow)")
        for ref in recording.overlaps:
            r = ref()
            g = r.generation if r is not None else None
            if g is not None and g.pending():
                return (f"the {r.facts.name}'s outputs are saved for a backward that has not run yet, in memory "
                        "this recording reuses (run backward() before calling it)")
        return None

    def invalidate_from(self, recording) -> None:
        """``recording`` is about to replay: outputs it may overwrite become errors to read."""
        recs = self._recordings
        for k in range(recording.position, len(recs)):
            r = recs[k]()
            if r is not None:
                g = r.generation
                if g is not None:
                    g.invalidate()
                    r.generation = None
        for ref in recording.overlaps:
            r = ref()
            if r is not None and r.generation is not None:
                r.generation.invalidate_saved()

    def owns(self, t: torch.Tensor, backward: bool = False) -> bool:
        """Whether ``t`` is stable memory: an output of a replay, or (for a backward, whose
        saved tensors include the forward's parameters) an input some forward reads in place."""
        try:
            return t.untyped_storage().data_ptr() in self.owned_bases or \
                (backward and t.data_ptr() in self.static_ptrs)
        except Exception:
            return False


def tree_for(device: torch.device) -> PoolTree:
    """The pool tree of a CUDA device (forgotten by ``kiln.reset``: recordings alive keep their
    own pool reference)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    tree = _trees.get(index)
    if tree is None:
        tree = _trees.setdefault(index, PoolTree(torch.device("cuda", index)))
    return tree
