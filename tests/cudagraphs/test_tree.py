"""The pool tree's rules (kiln/cudagraphs/tree.py) on CPU storages: which outputs a replay
invalidates, which it must not overwrite (a pending backward), and the backward's consumption
of its forward's saved tensors. No GPU: the rules only look at storages (the CUDA binding that
makes an invalidated storage raise is replaced by a recorder; test_cuda.py reads them)."""
from __future__ import annotations

import types

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.cudagraphs import tree as T


class FakeRecording:
    def __init__(self, name, backward=False):
        self.facts = types.SimpleNamespace(name=name)
        self.backward = backward
        self.generation = None
        self.out_blocks, self.held_saved, self.reuses, self.pool = [], [], [], None

    def replay(self, visible=0, saved=False):
        """A replay's outputs: new tensors on new storages (as recording.py makes them)."""
        vis = [torch.randn(4) for _ in range(visible)]
        sav = torch.randn(8) if saved else None
        self.generation = T.Generation([t.untyped_storage() for t in vis],
                                       sav.untyped_storage() if sav is not None else None,
                                       self.facts.name, self.backward)
        return vis, sav


@pytest.fixture
def poisoned(monkeypatch):
    """StorageImpl address -> message, for each storage a replay invalidated."""
    seen: dict = {}
    monkeypatch.setattr(T, "_poison", lambda cdata, msg: seen.__setitem__(cdata, msg))
    T._pending.clear()
    yield seen
    T._pending.clear()


def block(t):
    """(start, end, weak reference) of ``t``'s storage, as ``Recording.out_blocks`` holds it."""
    s = t.untyped_storage()
    return (s.data_ptr(), s.data_ptr() + s.nbytes(), StorageWeakRef(s))


def cd(t):
    return t.untyped_storage()._cdata


def test_a_replay_invalidates_its_own_and_later_outputs_only(poisoned):
    tree = T.PoolTree(torch.device("cpu"))
    a, b = FakeRecording("first"), FakeRecording("second")
    a.position, b.position = tree.add(a), tree.add(b)
    (ya,), _ = a.replay(visible=1)
    (yb,), _ = b.replay(visible=1)
    assert tree.conflict(b) is None
    tree.invalidate_from(b)                # b replays: a's output (recorded before) stays valid
    assert cd(yb) in poisoned and cd(ya) not in poisoned
    assert "overwritten by a later replay" in poisoned[cd(yb)] and "clone()" in poisoned[cd(yb)]
    (yb2,), _ = b.replay(visible=1)
    tree.invalidate_from(a)                # a replays: b (recorded after a) may be overwritten
    assert cd(ya) in poisoned and cd(yb2) in poisoned


def test_dead_outputs_are_not_touched(poisoned):
    tree = T.PoolTree(torch.device("cpu"))
    a = FakeRecording("first")
    a.position = tree.add(a)
    a.replay(visible=2)                    # outputs dropped at once
    tree.invalidate_from(a)
    assert poisoned == {}


def test_saved_tensors_of_a_pending_backward_are_protected_until_consumed(poisoned):
    tree = T.PoolTree(torch.device("cpu"))
    fw, bw = FakeRecording("forward"), FakeRecording("backward", backward=True)
    fw.position, bw.position = tree.add(fw), tree.add(bw)
    _, saved = fw.replay(visible=1, saved=True)
    assert "backward that has not run yet" in tree.conflict(fw)
    probes: list = []
    T.consume([torch.ones(1), saved], probes)      # the backward's call
    assert probes == [1] and tree.conflict(fw) is None
    tree.invalidate_from(fw)       # a retained graph would now read an error, not other data
    assert cd(saved) in poisoned


def test_dead_saved_tensors_do_not_conflict(poisoned):
    tree = T.PoolTree(torch.device("cpu"))
    fw = FakeRecording("forward")
    fw.position = tree.add(fw)
    _, saved = fw.replay(saved=True)
    del saved
    assert tree.conflict(fw) is None


def test_backward_run_twice_in_one_pass_keeps_its_gradients(poisoned):
    tree = T.PoolTree(torch.device("cpu"))
    bw = FakeRecording("backward", backward=True)
    bw.position = tree.add(bw)
    (g,), _ = bw.replay(visible=1)
    assert "gradients are still alive" in tree.conflict(bw)
    del g
    assert tree.conflict(bw) is None
    (g,), _ = bw.replay(visible=1)
    bw.generation.invalidate()
    assert "zero_grad" in poisoned[cd(g)]      # the gradient message says what to do


def test_a_recording_after_a_release_overlaps_the_forward(poisoned):
    """The backward's capture took the forward's saved memory: it and later recordings may
    overwrite the saved tensors, so they wait for the backward (conflict) and invalidate what a
    retained graph holds; recordings made before the release do not."""
    tree = T.PoolTree(torch.device("cpu"))
    early, fw = FakeRecording("inference"), FakeRecording("forward")
    early.position, fw.position = tree.add(early), tree.add(fw)
    tree.release_saved(fw)
    bw, later = FakeRecording("backward", backward=True), FakeRecording("other")
    bw.position, later.position = tree.add(bw), tree.add(later)
    assert early.overlaps == [] and [r() for r in bw.overlaps] == [fw] and [r() for r in later.overlaps] == [fw]
    _, saved = fw.replay(visible=1, saved=True)
    assert "saved for a backward" in tree.conflict(later)
    T.consume([saved], [])
    assert tree.conflict(later) is None
    tree.invalidate_from(later)          # the retained graph's saved tensors: an error to read
    assert cd(saved) in poisoned


def test_recording_the_backward_releases_the_forwards_saved_memory():
    """Once a backward reading a forward's saved tensors is recorded, the forward stops holding
    them: their blocks leave ``held_blocks`` (no later capture reads them in place) and later
    recordings overlap the forward."""
    tree = T.PoolTree(torch.device("cpu"))
    fw, bw = FakeRecording("forward"), FakeRecording("backward", backward=True)
    out, saved = torch.randn(4), torch.randn(8)
    fw.out_blocks, fw.held_saved = [block(out)], [saved]
    fw.position = tree.add(fw)
    s = saved.untyped_storage()
    tree.saved_blocks(fw, [(s.data_ptr(), s.data_ptr() + s.nbytes())])

    def starts():
        return [b for b, _ in tree.held_blocks()]
    assert s.data_ptr() in starts() and out.untyped_storage().data_ptr() in starts()
    bw.position = tree.add(bw)
    tree.release_saved_at([saved[2:].data_ptr()], bw)       # reads a view of it in place
    assert fw.held_saved == [] and s.data_ptr() not in starts()
    assert bw.overlaps == []                                # captured before the release
    later = FakeRecording("later")
    later.position = tree.add(later)
    assert [r() for r in later.overlaps] == [fw]


def test_outputs_whose_capture_tensors_died_are_reused_by_later_captures(poisoned):
    """A recording's output memory goes back to the pool when the tensors its capture made die
    (as in torch's tree): a later capture may reuse it. That capture is refused while the caller
    holds a replay's output there, and its replays wait while the caller holds one."""
    tree = T.PoolTree(torch.device("cpu"))
    first = FakeRecording("first")
    first.position = tree.add(first)
    captured = torch.randn(4)                      # the tensor the capture made (held by the caller)
    first.out_blocks = [block(captured)]
    assert tree.reused_outputs(None) == ([], None)     # still counted as in use: nothing to reuse
    assert [s for s, _ in tree.held_blocks()] == [captured.untyped_storage().data_ptr()]
    del captured                                   # the allocator has the memory back
    assert tree.held_blocks() == []
    (y,), _ = first.replay(visible=1)              # a replay's output, held by the caller
    reuses, why = tree.reused_outputs(None)
    assert reuses == [] and "first's last replay is still held" in why
    assert tree.reused_outputs("another pool") == ([], None)      # (a capture there cannot reuse it)
    del y
    reuses, why = tree.reused_outputs(None)
    assert why is None and [(r(), idxs) for r, idxs in reuses] == [(first, [0])]
    later = FakeRecording("later")
    later.position = tree.add(later)
    later.reuses = reuses
    assert tree.conflict(later) is None
    (y,), _ = first.replay(visible=1)
    assert "still held, in memory this recording reuses" in tree.conflict(later)
    assert tree.conflict(first) is None            # its own replay just invalidates
    tree.invalidate_from(first)
    assert cd(y) in poisoned and tree.conflict(later) is None
