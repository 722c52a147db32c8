"""The structured trace (kiln/trace.py, fed by kiln/logs.py): one file per process, written in
batches, switched by ``kiln.config.trace_dir``."""
from __future__ import annotations

import json
import os

import torch

import kiln
from kiln import logs, trace


def _records(directory: str) -> list:
    out = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            out += [json.loads(line) for line in f]
    return out


def test_config_switches_tracing_and_the_topics(tmp_path):
    assert trace.writer is None and not logs.enabled.graph
    with kiln.config.patch(trace_dir=str(tmp_path)):
        assert trace.writer is not None and logs.enabled.graph and logs.enabled.cudagraphs
        kiln.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    assert trace.writer is None and not logs.enabled.graph      # off again: the topics too
    (name,) = os.listdir(tmp_path)
    assert name == f"kiln-trace-{os.getpid()}.jsonl"
    recs = _records(str(tmp_path))
    assert recs[0]["kind"] == "process" and [r["seq"] for r in recs] == list(range(len(recs)))
    assert any(r["kind"] == "graph" for r in recs)


def test_stderr_shows_only_the_chosen_topics(tmp_path, capsys):
    kiln.set_logs("recompiles")
    with kiln.config.patch(trace_dir=str(tmp_path)):
        f = kiln.compile(lambda x: x * 2, backend="eager")
        f(torch.ones(2))
        f(torch.ones(3, 2))
    err = capsys.readouterr().err
    assert "[kiln:recompiles]" in err and "[kiln:graph]" not in err and "[kiln:guards]" not in err
    kinds = {r["kind"] for r in _records(str(tmp_path))}
    assert {"graph", "guards", "recompile"} <= kinds


def test_records_are_written_in_batches(tmp_path):
    w = trace.TraceWriter(str(tmp_path))        # (its first record: the process)
    for i in range(trace.BATCH - 2):
        w.record("message", "graph", f"m{i}", {})
    assert not os.path.exists(w.path)           # buffered
    w.record("message", "graph", "last of the batch", {})
    with open(w.path) as f:
        assert len(f.readlines()) == trace.BATCH
    w.record("message", "graph", "one more", {})
    w.flush()
    with open(w.path) as f:
        assert len(f.readlines()) == trace.BATCH + 1


def test_a_rank_names_the_file(tmp_path):
    import torch.distributed as dist

    w = trace.TraceWriter(str(tmp_path))
    w.record("message", "graph", "before init", {})
    w.flush()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        w.record("message", "graph", "after init", {})
        w.flush()
    finally:
        dist.destroy_process_group()
    assert os.listdir(tmp_path) == [f"kiln-trace-{os.getpid()}-rank0.jsonl"]
    recs = _records(str(tmp_path))
    assert [r["rank"] for r in recs] == [None, None, 0] and recs[0]["kind"] == "process"


def test_a_directory_it_cannot_write_stops_tracing_not_the_compile(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with kiln.config.patch(trace_dir=str(blocker / "sub")):
        out = kiln.compile(lambda x: x - 1, backend="eager")(torch.ones(2))
        trace.flush()
    assert torch.equal(out, torch.zeros(2))
    assert "tracing stops" in capsys.readouterr().err


def test_a_forked_child_writes_its_own_file(tmp_path):
    with kiln.config.patch(trace_dir=str(tmp_path)):
        logs.event("graph", "message", "parent, before the fork")
        pid = os.fork()
        if pid == 0:            # the child: one record of its own, then out without cleanup
            try:
                logs.event("graph", "message", "child")
                trace.flush()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    assert sorted(os.listdir(tmp_path)) == sorted([f"kiln-trace-{os.getpid()}.jsonl", f"kiln-trace-{pid}.jsonl"])
    with open(tmp_path / f"kiln-trace-{pid}.jsonl") as f:
        child = [json.loads(line) for line in f]
    assert [r["kind"] for r in child] == ["process", "message"] and child[1]["message"] == "child"
    assert all(r["pid"] == pid for r in child)
    parent = [r["message"] for r in _records(str(tmp_path)) if r["pid"] == os.getpid()]
    assert "parent, before the fork" in parent and "child" not in parent


def _prints(y):
    print("a break inside a call")
    return y * 2


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        y = _prints(y)
        return y.relu()


def test_a_module_frame_shows_its_forward_and_a_deep_break_its_call(tmp_path):
    net = _Net()
    with kiln.config.patch(trace_dir=str(tmp_path)):
        out = kiln.compile(net, backend="eager")(torch.ones(2, 3))
    torch.testing.assert_close(out, net(torch.ones(2, 3)))
    recs = _records(str(tmp_path))
    sources = {r["frame"]: r for r in recs if r["kind"] == "source"}
    caller = sources["_Net.__call__"]     # (the module's caller, kiln's: its source is the forward)
    assert caller["file"] == __file__ and any("def forward(self, x):" in ln for ln in caller["lines"])
    forward_line = _Net.forward.__code__.co_firstlineno
    brk = next(r for r in recs if r["kind"] == "graph_break" and r["frame"] == "_Net.forward")
    assert brk["break_line"] == _prints.__code__.co_firstlineno + 1
    assert brk["continues_at"] == [forward_line + 2]        # the line that calls _prints
    cont = next(r for r in recs if r["kind"] == "graph" and r["function"].startswith("__kiln_resume_forward"))
    assert cont["frame"] == "_Net.forward" and cont["resumes_at"] == forward_line + 2
