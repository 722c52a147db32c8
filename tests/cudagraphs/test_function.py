"""The per-call decisions of ``CudagraphFunction`` (kiln/cudagraphs/function.py) on CPU, with
the recording replaced by a fake that runs the graph: warm-up and recording in call order
(steps.py), optimistic in-place inputs and their fallback to a copy, skips with reasons."""
from __future__ import annotations

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.cudagraphs import function as F
from kiln.cudagraphs import steps
from kiln.cudagraphs.reasons import GraphFacts

order: list = []


class FakeTree:
    def conflict(self, rec):
        return None

    def owns(self, t, backward=False):
        return False


class FakeRecording:
    """Reads in place what ``classify`` finds stable (static or optimistic), copies the rest."""
    simple_match = False
    reuses: list = []
    def __init__(self, facts, tree, static_idxs, protected_from, backward):
        self.facts, self.tree, self.static_idxs = facts, FakeTree(), static_idxs

    def classify(self, args, stable=frozenset()):
        self.inplace = [i for i, a in enumerate(args) if i in self.static_idxs or i in stable]
        self.optimistic = [i for i in self.inplace if i not in self.static_idxs]
        self.copied = [i for i in range(len(args)) if i not in self.inplace]
        self.ptrs = [args[i].data_ptr() for i in self.inplace]

    def record(self, inner, args):
        order.append(self.facts.name)
        return inner(args)

    def matches(self, args):
        return all(args[i].data_ptr() == p for i, p in zip(self.inplace, self.ptrs))

    def mismatched(self, args):
        return [i for i, p in zip(self.inplace, self.ptrs) if args[i].data_ptr() != p]

    def replay(self, args):
        return [a * 2 for a in args]


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    monkeypatch.setattr(F, "Recording", FakeRecording)
    monkeypatch.setattr(F, "tree_for", lambda device: None)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)), raising=False)
    order.clear()
    F.stats.clear()
    yield


def graph(name, kind="inference", static=()):
    facts = GraphFacts(name=name, kind=kind, input_names=["x", "w"], static_inputs=list(static))

    def compiled(args):
        return [a * 2 for a in args]
    compiled._boxed_call = True
    return F.CudagraphFunction(compiled, facts)


def step():
    steps.state.count += 1


def test_graphs_of_a_warm_up_step_record_in_the_next_step_in_call_order():
    fw1, fw2, bw2, bw1 = graph("fw1", "forward"), graph("fw2", "forward"), \
        graph("bw2", "backward"), graph("bw1", "backward")
    x = [torch.ones(2)]
    step()
    for g in (fw1, fw2, bw2, bw2, bw1):      # bw2 runs twice in the first step
        g(list(x))
    assert order == [] and F.stats["warmup"] == 5
    step()
    for g in (fw1, fw2, bw2, bw1):
        g(list(x))
    assert order == ["fw1", "fw2", "bw2", "bw1"]


def test_a_caller_without_steps_still_records():
    g = graph("g")
    x = [torch.ones(2)]
    for _ in range(3):                       # (no kiln call between them)
        g(list(x))
    assert order == ["g"]


def test_an_input_that_stays_put_is_read_in_place_then_copied_once_it_moves():
    g = graph("g", static=[1])
    x, w = torch.randn(3), torch.randn(3)
    step(), g([x, w])
    step(), g([x, w])
    (rec,) = g.recordings[None]
    assert rec.optimistic == [0] and rec.copied == []
    step()
    torch.testing.assert_close(g([x, w])[0], x * 2)
    assert F.stats["replay"] == 1
    step()
    y = torch.randn(3)
    torch.testing.assert_close(g([y, w])[0], y * 2)       # x moved: recorded again, copying it
    assert len(g.recordings[None]) == 2 and g.recordings[None][1].copied == [0]
    step(), g([torch.randn(3), w])
    assert len(g.recordings[None]) == 2 and F.stats["replay"] == 2


def test_a_static_input_that_moves_records_again():
    g = graph("g", static=[1])
    x = torch.randn(3)
    for w in (torch.randn(3), torch.randn(3)):
        step(), g([x, w])
    step(), g([x, torch.randn(3)])
    assert len(order) == 2


def test_another_tensor_at_the_same_address_is_copied():
    """Only the tensor the caller passed on the warm-up call, passed again, is read in place:
    a fresh tensor the allocator placed at the same address would likely move next time."""
    g = graph("g", static=[1])
    x, w = torch.randn(3), torch.randn(3)
    step(), g([x, w])
    step(), g([x.view_as(x), w])
    (rec,) = g.recordings[None]
    assert rec.optimistic == [] and rec.copied == [0]


def test_a_backward_input_in_released_saved_memory_is_not_recorded():
    """(The real ``Recording.classify`` on CPU tensors posing as CUDA ones.) A forward's saved
    tensor is read in place while its recording holds it; once a recorded backward released
    it, a new capture reading it would share that memory with its own buffers: refused."""
    from kiln.cudagraphs.recording import CannotRecord, Recording
    from kiln.cudagraphs.tree import PoolTree

    class Held:
        def __init__(self, held, saved):
            self.out_blocks = [(t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr()
                                + t.untyped_storage().nbytes(), StorageWeakRef(t.untyped_storage())) for t in held]
            self.held_saved, self.generation, self.pool = saved, None, None

    tree = PoolTree(torch.device("cpu"))
    saved = torch.randn(16)
    fw = Held([], [saved])
    fw.position = tree.add(fw)
    s = saved.untyped_storage()
    tree.saved_blocks(fw, [(s.data_ptr(), s.data_ptr() + s.nbytes())])
    tree.owned_bases.add(s.data_ptr())
    facts = GraphFacts(name="bw", kind="backward", input_names=["saved", "w"], static_inputs=[1])
    args = [saved[4:], torch.randn(3)]
    rec = Recording(facts, tree, frozenset([1]), None, True)
    rec.classify(args)
    assert rec.inplace == [0, 1] and rec.copied == []
    first_bw = Held([], [])
    first_bw.position = tree.add(first_bw)
    tree.release_saved_at([saved.data_ptr()], first_bw)
    with pytest.raises(CannotRecord, match="the allocator has back"):
        Recording(facts, tree, frozenset([1]), None, True).classify(args)
