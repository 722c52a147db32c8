"""The memory pool of one CUDA device, shared by every recording on it, and the rules that
keep replays from overwriting memory that is still needed.

All recordings of a device (the forward and backward of a step, the graphs one after another
in a step, the recordings for other sizes) are captured into one graph pool, in order. A
recording holds the tensors it allocated as outputs for as long as it lives, so no later
capture can place anything there; the memory it used for intermediates goes back to the pool
and later captures may use it, for their own intermediates or for their outputs. Hence:

    replaying recording R overwrites R's own outputs and, possibly, the outputs of every
    recording captured after R (never those captured before it).

This is the path of torch's tree of recordings, kept as one ordered list. Before a replay of
R, ``prepare_replay`` looks at the last outputs of R and of every later recording:

* outputs saved for a backward that has not run yet ("protected") must not be overwritten:
  the call runs without the CUDA graph instead (``conflict``);
* outputs the user may still hold ("visible") are invalidated: reading them afterwards
  raises a clear error instead of returning overwritten data.
"""
from __future__ import annotations

import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

_STALE = ("kiln: this tensor is an output of a CUDA-graph replay ({name}) and its memory was "
          "overwritten by a later replay. Outputs of a compiled function run with CUDA graphs "
          "(mode='reduce-overhead') stay valid until the function (or one called before it in the "
          "step) is called again: .clone() an output you keep across calls{grad}.")
_GRAD_HINT = ("; for gradients (as with torch's CUDA graphs): set .grad to None before each "
              "backward (optimizer.zero_grad() does by default), or, for gradient accumulation, "
              "allocate the .grad tensors before the first compiled backward (an eager warm-up step)")


class Generation:
    """The outputs of one replay: storages for those the user may hold, one for those a
    pending backward needs ("protected"). Weak: they die with the last tensor on them. The
    backward's call marks its forward's generation ``consumed`` (``consume``): what autograd
    still holds after that (a retained graph) is invalidated, not protected, by a replay."""
    __slots__ = ("visible", "protected", "name", "backward", "consumed", "cdata")

    def __init__(self, visible: list, protected, name: str, backward: bool):
        self.visible = [StorageWeakRef(s) for s in visible]
        self.protected = StorageWeakRef(protected) if protected is not None else None
        self.name = name
        self.backward = backward
        self.consumed = False
        self.cdata = None
        if protected is not None:
            self.cdata = protected._cdata
            _pending[self.cdata] = self

    def pending(self) -> bool:
        return self.protected is not None and not self.consumed and not self.protected.expired()

    def invalidate(self) -> None:
        msg = None
        refs = self.visible if self.protected is None else [*self.visible, self.protected]
        for ref in refs:
            if not ref.expired():
                if msg is None:
                    msg = _STALE.format(name=self.name, grad=_GRAD_HINT if self.backward else "")
                _poison(ref.cdata, msg)
        if self.cdata is not None and _pending.get(self.cdata) is self:
            del _pending[self.cdata]
        self.visible, self.protected = [], None


# makes reading a storage's data raise ``msg`` (a CUDA build's binding)
_poison = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)

# protected storage (its StorageImpl address) -> the generation whose saved tensors it holds
_pending: dict = {}


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

    @property
    def handle(self):
        """The graph pool every recording of this device is captured into."""
        if self._handle is None:
            self._handle = torch.cuda.graph_pool_handle()
        return self._handle

    def add(self, recording) -> int:
        """Append a new recording; returns its position (dead ones keep theirs: positions
        never move)."""
        self._recordings.append(weakref.ref(recording))
        return len(self._recordings) - 1

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
        g = recording.generation
        if recording.backward and g is not None and any(not ref.expired() for ref in g.visible):
            return ("its previous replay's gradients are still alive (one backward pass runs this backward "
                    "graph twice, e.g. a module called twice before backward())")
        for r in self._from(recording):
            g = r.generation
            if g is not None and g.pending():
                what = "its previous call's" if r is recording else f"the later-recorded {r.facts.name}'s"
                return (f"{what} outputs are saved for a backward that has not run yet (the replay "
                        "would overwrite them; run backward() before calling again, or run under "
                        "torch.no_grad() when no backward will follow)")
        return None

    def invalidate_from(self, recording) -> None:
        """``recording`` is about to replay: outputs it may overwrite become errors to read."""
        for r in self._from(recording):
            g = r.generation
            if g is not None:
                g.invalidate()
                r.generation = None

    def owns(self, t: torch.Tensor, backward: bool = False) -> bool:
        """Whether ``t`` is stable memory: an output of a replay, or (for a backward, whose
        saved tensors include the forward's parameters) an input some forward reads in place."""
        try:
            return t.untyped_storage().data_ptr() in self.owned_bases or \
                (backward and t.data_ptr() in self.static_ptrs)
        except Exception:
            return False


_trees: dict = {}


def tree_for(device: torch.device) -> PoolTree:
    index = device.index if device.index is not None else torch.cuda.current_device()
    tree = _trees.get(index)
    if tree is None:
        tree = _trees[index] = PoolTree(torch.device("cuda", index))
    return tree


def reset_trees() -> None:
    """Forget the pools (kiln.reset): recordings alive keep their own pool reference."""
    _trees.clear()
    _pending.clear()
