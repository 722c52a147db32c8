"""``kiln report``: the page built from a real run's trace, read back with an HTML parser."""
from __future__ import annotations

import json
import os
import time
from html.parser import HTMLParser

import torch

from kiln import cli, trace
from kiln.report import build_report
from . import schema_check, workload


class _Page(HTMLParser):
    """The page's data (``script#data``), its external references and its text."""

    def __init__(self):
        super().__init__()
        self.data = None
        self.refs: list[str] = []
        self.tags: list[str] = []
        self._in_data = False
        self._chunks: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        for name in ("src", "href"):
            if a.get(name):
                self.refs.append(a[name])
        if tag == "link":
            self.refs.append(a.get("href") or "link")
        self._in_data = tag == "script" and a.get("id") == "data"

    def handle_data(self, data):
        if self._in_data:
            self._chunks.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._in_data:
            self.data = json.loads("".join(self._chunks))
            self._in_data = False


def _parse(path: str) -> _Page:
    page = _Page()
    with open(path, encoding="utf-8") as f:
        page.feed(f.read())
    return page


def test_trace_on_changes_no_result(real_trace):
    _, results = real_trace
    for out, ref, grad, ref_grad in results:
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(grad, ref_grad)


def test_report_of_a_real_run(real_trace, tmp_path):
    trace_dir, _ = real_trace
    out = build_report(trace_dir, str(tmp_path / "report.html"))
    page = _parse(out)
    assert page.refs == []                      # nothing fetched: no src, no href, no link
    d = page.data
    o = d["overview"]
    assert o["graphs"] >= 4 and o["breaks"] == 1 and o["recompiles"] >= 1
    assert o["compile_seconds"] > 0 and {"capture", "aot", "partition"} <= set(o["stages"])
    frame = next(f for f in d["frames"] if f["function"] == "step")
    assert frame["file"] == workload.__file__.replace(".pyc", ".py")
    (brk,) = frame["breaks"]
    assert "print" in brk["reason"] and "print(" in brk["source_line"]
    assert frame["source"]["lines"][brk["line"] - frame["source"]["first"]].strip().startswith("print(")
    assert any(f.startswith("__kiln_resume_step_line") for f in frame["functions"])
    assert "<svg" in frame["flow_svg"] and "break at line" in frame["flow_svg"]
    assert "<svg" in frame["stages_svg"]
    graph = frame["graphs"][0]
    assert "relu" in graph["code"] and graph["guards"] and graph["stages"]
    assert graph["partition"] is not None and "def forward" in graph["partition"]["backward"]
    assert frame["recompiles"] and "TENSOR_MATCH" in frame["recompiles"][0]["reason"]
    misses = [c for c in d["cache"] if c["action"] == "miss"]
    # the nearest entry's diff (its sizes, or its inputs: a dynamic graph takes its size symbols)
    assert any(any("sizes" in x or "inputs" in x for x in c["diff"]) for c in misses), misses
    assert d["partitions"] and "<svg" in d["svg"]["partitions"] and "<svg" in d["svg"]["timeline"]
    assert len(d["lanes"]) == 1 and d["lanes"][0]["pid"] == os.getpid()


def test_schema_validates_every_record_of_a_real_trace(real_trace):
    trace_dir, _ = real_trace
    schema = schema_check.load_schema()
    kinds = set()
    for path in workload.trace_paths(trace_dir):
        with open(path, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                kinds.add(rec["kind"])
                assert schema_check.errors(rec, schema) == [], rec
    assert {"process", "source", "graph", "guards", "graph_break", "recompile", "stage_times", "cache",
            "partition"} <= kinds


def test_schema_check_finds_errors():
    schema = schema_check.load_schema()
    good = {"v": 1, "seq": 0, "t": 0.0, "pid": 1, "rank": None, "kind": "recompile", "topic": "recompiles",
            "message": "m", "function": "f", "reason": "r"}
    assert schema_check.errors(good, schema) == []
    assert schema_check.errors({**good, "kind": "nonsense"}, schema)
    assert schema_check.errors({k: v for k, v in good.items() if k != "reason"}, schema)
    assert schema_check.errors({**good, "seq": "0"}, schema)


def test_cli_report(real_trace, tmp_path, capsys):
    trace_dir, _ = real_trace
    out = str(tmp_path / "r.html")
    assert cli.main(["report", trace_dir, "-o", out]) == 0
    assert capsys.readouterr().out.strip() == out and os.path.getsize(out) > 0
    assert cli.main(["report", str(tmp_path / "nothing-here")]) == 1


def _synthetic(directory: str, n: int) -> None:
    """``n`` records through the real writer: frames with graphs, breaks, recompiles and misses."""
    w = trace.TraceWriter(directory, {"kiln": "0"})
    code = "def forward(self, x):\n" + "".join(f"    t{i} = torch.ops.aten.add(x, {i})\n" for i in range(20))
    i = 0
    while i < n:
        f = f"fn_{i % 300}"
        where = {"function": f, "frame": f, "file": f"/src/model_{i % 300}.py", "line": 10}
        if i % 300 == i:
            w.record("source", "trace", "s", {**where, "frame_file": where["file"],
                                              "lines": [f"def {f}(x):", "    y = x + 1", "    print(y)", "    return y"]})
        w.record("graph", "graph", code, {**where, "graph_id": i, "ops": 20, "up_to_break": True, "resumes_at": None})
        w.record("stage_times", "perf", "t", {**where, "graph": f, "graph_id": i,
                                              "stages": {"capture": 0.01, "aot": 0.02, "inductor": 0.05}})
        w.record("guards", "guards", "g", {**where, "guards": [f"TENSOR_MATCH L['x'] {j}" for j in range(8)]})
        w.record("graph_break", "graph_breaks", "b", {**where, "reason": "print()", "break_file": where["file"],
                                                       "break_line": 12, "source_line": "    print(y)"})
        w.record("recompile", "recompiles", "r", {**where, "reason": "TENSOR_MATCH failed", "entries": 1})
        w.record("cache", "cache", "miss", {"action": "miss", "function": f, "key": "ab" * 20,
                                            "reason": "input 0 sizes", "diff": ["input 0 sizes: [2] -> [3]"]})
        w.record("partition", "aot", "p", {"function": f, "saved_bytes": 4096, "saved_input_bytes": 1024,
                                           "activation_bytes": 3072, "saved": 3, "forward": code, "backward": code})
        i += 7
    w.flush()


def test_ten_thousand_events_build_fast_into_a_small_page(tmp_path):
    trace_dir = str(tmp_path / "big")
    _synthetic(trace_dir, 10_000)
    started = time.perf_counter()
    out = build_report(trace_dir, str(tmp_path / "big.html"))
    seconds = time.perf_counter() - started
    size = os.path.getsize(out)
    assert seconds < 5, seconds
    assert size < 12 * 1024 * 1024, size
    d = _parse(out).data
    assert d["overview"]["events"] > 10_000 and len(d["frames"]) == 300
    schema = schema_check.load_schema()         # (the synthetic records are records kiln could write)
    with open(workload.trace_paths(trace_dir)[0], encoding="utf-8") as f:
        for line in f:
            assert schema_check.errors(json.loads(line), schema) == []


def test_a_file_traced_twice_keeps_one_clock(tmp_path):
    """Tracing stopped and started again appends to the process's file with a new start: the
    later records are placed after the earlier ones."""
    from kiln.report.model import build_model
    from kiln.report.traces import read_trace

    for name in ("first", "second"):
        w = trace.TraceWriter(str(tmp_path), {"kiln": "0"})
        w.record("graph", "graph", name, {"function": name, "frame": name, "file": "/a.py", "line": 1,
                                          "graph_id": 1, "ops": 1, "up_to_break": False})
        w.flush()
        time.sleep(0.05)
    frames = build_model(read_trace(str(tmp_path)))["frames"]
    assert [f["function"] for f in frames] == ["first", "second"]
    assert frames[1]["graphs"][0]["t"] >= frames[0]["graphs"][0]["t"] + 0.05
