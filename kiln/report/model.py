"""The facts of a trace, gathered for the page: processes, frames with their graphs, breaks and
source, recompiles, cache misses, partitions, CUDA-graph decisions and the event list.

A *frame* is one compiled function (its ``frame`` name and file): the graphs of its
continuations after graph breaks (``__kiln_resume_<name>_line<N>``, whose records name the
frame they continue) belong to it, as do the graphs of every process that compiled it.
"""
from __future__ import annotations

import collections

MESSAGE_CHARS = 240      # an event row's message; the full text stays in the frame's graphs
STAGE_ORDER = ("capture", "aot", "partition", "inductor", "load")


def _lane_names(trace) -> dict:
    """file index -> (lane label, wall-clock start)."""
    lanes = {}
    for i, _ in enumerate(trace.files):
        lanes[i] = {"pid": None, "rank": None, "started": None, "argv": [], "events": 0}
    for r in trace.records:
        lane = lanes[r["_file"]]
        lane["events"] += 1
        lane["pid"] = r.get("pid", lane["pid"])
        if r.get("rank") is not None:
            lane["rank"] = r["rank"]
        if r["kind"] == "process" and lane["started"] is None:
            lane["started"], lane["argv"] = r.get("started"), r.get("argv") or []
    for lane in lanes.values():
        lane["label"] = (f"rank {lane['rank']} (pid {lane['pid']})" if lane["rank"] is not None
                         else f"pid {lane['pid']}")
    return lanes


def _frame_key(r: dict):
    if r["kind"] == "source":
        return (r.get("frame") or r.get("function"), r.get("frame_file") or r.get("file"))
    return (r.get("frame") or r.get("function"), r.get("file"))


def _new_frame(key, r: dict) -> dict:
    return {"id": 0, "function": key[0], "file": r.get("file"), "line": r.get("line"), "source": None,
            "functions": [], "graphs": [], "breaks": [], "eager": [], "recompiles": [], "guards": 0}


def build_model(trace) -> dict:
    lanes = _lane_names(trace)
    t0 = min((lane["started"] for lane in lanes.values() if lane["started"] is not None), default=0.0)
    frames: dict = {}
    frame_of_function: dict = {}
    graphs_by_id: dict = {}
    last_graph_of: dict = {}
    recompiles, cache_events, partitions, cudagraphs, activations, packages = [], [], [], [], [], []
    compiles = []           # (lane, end, seconds, label): each compile that reported its stages
    events = []
    stage_totals: dict = collections.defaultdict(float)
    counts = collections.Counter()

    def frame_for(r: dict) -> dict | None:
        fn = r.get("function")
        if r.get("file") is not None:
            key = _frame_key(r)
            frame = frames.get(key)
            if frame is None:
                frame = frames[key] = _new_frame(key, r)
            if fn and r["kind"] != "source" and fn not in frame["functions"]:
                frame["functions"].append(fn)
            if fn:
                frame_of_function[fn] = frame
            return frame
        return frame_of_function.get(fn)

    # each process record starts the clock of the records after it (tracing stopped and started
    # again in one process appends to its file, with a new start)
    base = {i: lane["started"] or t0 for i, lane in lanes.items()}
    for n, r in enumerate(trace.records):
        kind = r["kind"]
        if kind == "process" and isinstance(r.get("started"), (int, float)):
            base[r["_file"]] = r["started"]
        when = base[r["_file"]] - t0 + float(r.get("t") or 0.0)
        counts[kind] += 1
        msg = r.get("message") or ""
        events.append([n, round(when, 6), r["_file"], kind, r.get("topic", ""), r.get("function") or r.get("graph") or "",
                       msg if len(msg) <= MESSAGE_CHARS else msg[:MESSAGE_CHARS] + "…"])
        if kind == "source":
            frame = frame_for(r)
            if frame is not None:     # (the file and line of what the page shows: a module's forward)
                frame["source"] = {"first": r.get("line"), "lines": r.get("lines") or []}
                frame["file"], frame["line"] = r.get("file"), r.get("line")
        elif kind == "graph":
            frame = frame_for(r)
            g = {"graph_id": r.get("graph_id"), "function": r.get("function"), "ops": r.get("ops", 0),
                 "up_to_break": bool(r.get("up_to_break")), "resumes_at": r.get("resumes_at"), "code": msg,
                 "t": when, "lane": r["_file"], "stages": {}, "guards": [], "partition": None, "inductor": []}
            graphs_by_id[(r["_file"], r.get("graph_id"))] = g
            last_graph_of[(r["_file"], r.get("function"))] = g
            if frame is not None:
                frame["graphs"].append(g)
        elif kind == "stage_times":
            stages = {k: float(v) for k, v in (r.get("stages") or {}).items()}
            for k, v in stages.items():
                stage_totals[k] += v
            compiles.append((r["_file"], when, sum(stages.values()), r.get("graph") or r.get("function") or ""))
            g = graphs_by_id.get((r["_file"], r.get("graph_id")))
            if g is not None:
                g["stages"] = stages
        elif kind == "guards":
            frame = frame_for(r)
            g = last_graph_of.get((r["_file"], r.get("function")))
            if g is not None and not g["guards"]:
                g["guards"] = r.get("guards") or []
            if frame is not None:
                frame["guards"] += len(r.get("guards") or [])
        elif kind in ("graph_break", "eager"):
            frame = frame_for(r)
            b = {"function": r.get("function"), "reason": r.get("reason") or msg, "line": r.get("break_line"),
                 "file": r.get("break_file"), "source_line": (r.get("source_line") or "").rstrip(),
                 "context": r.get("context"), "continues_at": r.get("continues_at") or [],
                 "t": when, "lane": r["_file"]}
            if frame is not None:
                target = frame["breaks" if kind == "graph_break" else "eager"]
                if not any(x["function"] == b["function"] and x["line"] == b["line"] and x["reason"] == b["reason"]
                           for x in target):
                    target.append(b)
            elif kind == "eager":
                frames.setdefault(("callables run as they are", None),
                                  _new_frame(("callables run as they are", None), {}))["eager"].append(b)
        elif kind == "recompile":
            frame = frame_for(r)
            rc = {"function": r.get("function"), "file": r.get("file"), "line": r.get("line"),
                  "reason": r.get("reason") or msg, "t": when, "lane": r["_file"]}
            recompiles.append(rc)
            if frame is not None:
                frame["recompiles"].append(rc)
        elif kind == "cache":
            cache_events.append({"action": r.get("action"), "function": r.get("function"), "reason": r.get("reason"),
                                 "diff": r.get("diff") or [], "key": (r.get("key") or "")[:12], "t": when,
                                 "lane": r["_file"]})
        elif kind == "partition":
            p = {k: r.get(k) for k in ("function", "partitioner", "saved", "saved_bytes", "saved_input_bytes",
                                       "activation_bytes", "seconds", "forward", "backward")}
            partitions.append(p)
            g = last_graph_of.get((r["_file"], r.get("function")))
            if g is not None:
                g["partition"] = p
        elif kind == "inductor_code":
            g = last_graph_of.get((r["_file"], r.get("function")))
            if g is not None:
                g["inductor"].append({"kind": r.get("graph_kind"), "path": r.get("path")})
        elif kind == "cudagraph":
            cudagraphs.append({k: r.get(k) for k in ("action", "graph", "reason", "parts")} | {"t": when})
        elif kind == "activations":
            activations.append({k: r.get(k) for k in ("pack", "unpack", "packed", "kept", "bytes_before",
                                                      "bytes_after", "offloaded_bytes")})
        elif kind == "package":
            packages.append({k: r.get(k) for k in ("action", "path", "function", "reason", "entries", "bytes")})

    frame_list = sorted(frames.values(), key=lambda f: (f["graphs"][0]["t"] if f["graphs"] else 1e18))
    for i, f in enumerate(frame_list):
        f["id"] = i
    cache_counts = collections.Counter(e["action"] for e in cache_events)
    lookups = cache_counts["hit"] + cache_counts["miss"]
    frame_lookups = cache_counts["frame_hit"] + cache_counts["frame_miss"]
    stages = [s for s in STAGE_ORDER if s in stage_totals] + sorted(s for s in stage_totals if s not in STAGE_ORDER)
    overview = {
        "processes": len(lanes), "frames": sum(1 for f in frame_list if f["graphs"]),
        "graphs": counts["graph"], "breaks": sum(len(f["breaks"]) for f in frame_list),
        "eager": sum(len(f["eager"]) for f in frame_list), "recompiles": counts["recompile"],
        "compile_seconds": round(sum(stage_totals.values()), 6),
        "stages": {s: round(stage_totals[s], 6) for s in stages},
        "cache": dict(cache_counts),
        "cache_hit_rate": cache_counts["hit"] / lookups if lookups else None,
        "frame_hit_rate": cache_counts["frame_hit"] / frame_lookups if frame_lookups else None,
        "events": len(trace.records), "bad_lines": trace.bad_lines,
    }
    return {"overview": overview, "lanes": [lanes[i] | {"file": trace.files[i]} for i in sorted(lanes)],
            "frames": frame_list, "recompiles": recompiles,
            "cache": [e for e in cache_events if e["action"] not in ("hit", "frame_hit", "frame_recorded")],
            "partitions": partitions, "cudagraphs": cudagraphs, "activations": activations, "packages": packages,
            "events": events, "stage_names": stages, "compiles": compiles}
