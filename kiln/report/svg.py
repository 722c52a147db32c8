"""The page's pictures, as inline SVG text: a frame's graphs and breaks as a flow, stage times
as a bar per graph, saved bytes per partition, and the timeline with one lane per process.

Each picture is drawn from the model (``model.py``) with a bounded number of elements (the
timeline buckets its marks per pixel column), so that a large trace keeps a small page.
"""
from __future__ import annotations

import html
import re

STAGE_COLORS = {"capture": "#4e79a7", "aot": "#f28e2b", "partition": "#edc948", "inductor": "#59a14f",
                "load": "#76b7b2"}
OTHER_COLORS = ("#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
MARKS = {"graph_break": ("#e15759", "graph break"), "recompile": ("#b07aa1", "recompile"),
         "cache_miss": ("#f28e2b", "cache miss"), "eager": ("#9c755f", "runs eagerly")}
_RESUME = re.compile(r"^__kiln_resume_.*_line(\d+)$")


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def stage_color(stage: str, names: list) -> str:
    if stage in STAGE_COLORS:
        return STAGE_COLORS[stage]
    return OTHER_COLORS[names.index(stage) % len(OTHER_COLORS)] if stage in names else OTHER_COLORS[0]


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def fmt_bytes(n) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def node_label(function: str) -> str:
    m = _RESUME.match(function or "")
    return f"resumes after line {m.group(1)}" if m else (function or "?")


def flow(frame: dict) -> str:
    """The frame's functions (the frame, then each continuation) as boxes, joined by the breaks
    that lead from one to the next; a frame that runs eagerly is drawn red."""
    functions = list(frame["functions"]) or [frame["function"]]
    by_name = {f: [g for g in frame["graphs"] if g["function"] == f] for f in functions}
    resumes = {}
    for f in functions:
        for g in by_name[f]:
            if g.get("resumes_at") is not None:
                resumes[f] = g["resumes_at"]
        m = _RESUME.match(f)
        if f not in resumes and m:
            resumes[f] = int(m.group(1))
    edges = []
    for b in frame["breaks"]:
        lines = b.get("continues_at") or [b["line"]]   # (a break deep in a call resumes at the call)
        for f, line in resumes.items():
            if line in lines and b["function"] in functions and f != b["function"]:
                edges.append((b["function"], f, b))
    level = {f: 0 for f in functions}
    for _ in functions:         # (longest path; the break graph has no cycles)
        for a, c, _b in edges:
            level[c] = max(level[c], level[a] + 1)
    rows: dict = {}
    for f in functions:
        rows.setdefault(level[f], []).append(f)
    box_w, box_h, gap_y, gap_x, label_w = 300, 46, 56, 30, 360
    cols = max(len(v) for v in rows.values())
    boxes_w = cols * box_w + (cols - 1) * gap_x
    width = boxes_w + 20 + (label_w if edges else 0)     # (the break labels go right of the arrows)
    height = len(rows) * (box_h + gap_y) - gap_y + 20
    pos = {}
    for lv, fs in rows.items():
        row_w = len(fs) * box_w + (len(fs) - 1) * gap_x
        x0 = 10 + (boxes_w - row_w) / 2
        for i, f in enumerate(fs):
            pos[f] = (x0 + i * (box_w + gap_x), 10 + lv * (box_h + gap_y))
    eager_fns = {e["function"] for e in frame["eager"]}
    out = [f'<svg class="flow" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="graphs and breaks of {esc(frame["function"])}">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#666"/></marker></defs>']
    for a, c, b in edges:
        (xa, ya), (xc, yc) = pos[a], pos[c]
        x1, y1, x2, y2 = xa + box_w / 2, ya + box_h, xc + box_w / 2, yc
        out.append(f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2 - 2:.0f}" stroke="#666" '
                   f'stroke-width="1.5" marker-end="url(#arrow)"/>')
        label = f"break at line {b['line']}: {_short(b['reason'], 52)}"
        if b["line"] not in (b.get("continues_at") or [b["line"]]):
            label = f"break ({b['file'].rsplit('/', 1)[-1] if b['file'] else '?'}:{b['line']}): {_short(b['reason'], 44)}"
        out.append(f'<text class="edge" x="{(x1 + x2) / 2 + 8:.0f}" y="{(y1 + y2) / 2 + 4:.0f}" fill="#b3261e" '
                   f'font-size="11">{esc(label)}<title>{esc(b["reason"])}</title></text>')
    for f in functions:
        x, y = pos[f]
        graphs = by_name[f]
        eager = f in eager_fns and not graphs
        fill, stroke = ("#fde8e7", "#e15759") if eager else ("#eef3fb", "#4e79a7")
        sub = "runs eagerly" if eager else (f"{len(graphs)} graph{'s' * (len(graphs) != 1)}, "
                                           f"{sum(g['ops'] or 0 for g in graphs)} ops"
                                           + (f", {len(graphs) - 1} recompile{'s' * (len(graphs) != 2)}"
                                              if len(graphs) > 1 else ""))
        out.append(f'<g class="node"><rect x="{x:.0f}" y="{y:.0f}" width="{box_w}" height="{box_h}" rx="6" '
                   f'fill="{fill}" stroke="{stroke}"/>'
                   f'<text x="{x + 10:.0f}" y="{y + 19:.0f}" font-size="13" font-weight="600">'
                   f'{esc(_short(node_label(f), 40))}</text>'
                   f'<text x="{x + 10:.0f}" y="{y + 36:.0f}" font-size="11" fill="#555">{esc(sub)}</text>'
                   f'<title>{esc(f)}</title></g>')
    out.append("</svg>")
    return "".join(out)


def stage_bars(graphs: list, names: list) -> str:
    """One bar per graph: its compile's stages, on one scale for the frame."""
    rows = [g for g in graphs if g.get("stages")]
    if not rows:
        return ""
    label_w, bar_w, row_h = 210, 460, 20
    most = max(sum(g["stages"].values()) for g in rows) or 1.0
    height = row_h * len(rows) + 26
    out = [f'<svg class="stages" xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 90}" height="{height}" '
           f'role="img" aria-label="stage times per graph">']
    for i, g in enumerate(rows):
        y = i * row_h
        name = f"graph {g['graph_id']} · {node_label(g['function'])}"
        out.append(f'<text x="0" y="{y + 14}" font-size="11">{esc(_short(name, 34))}</text>')
        x = float(label_w)
        for stage, secs in g["stages"].items():
            w = bar_w * secs / most
            if w > 0:
                out.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{max(w, 0.5):.1f}" height="{row_h - 6}" '
                           f'fill="{stage_color(stage, names)}"><title>{esc(stage)} {secs:.3f} s</title></rect>')
            x += w
        out.append(f'<text x="{x + 6:.1f}" y="{y + 14}" font-size="11" fill="#555">'
                   f'{sum(g["stages"].values()):.3f} s</text>')
    out.append(_legend([s for s in names if any(s in g["stages"] for g in rows)], names, height - 8, label_w))
    out.append("</svg>")
    return "".join(out)


def _legend(stages: list, names: list, y: float, x0: float = 0) -> str:
    out, x = [], x0
    for s in stages:
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{stage_color(s, names)}"/>'
                   f'<text x="{x + 14}" y="{y}" font-size="11">{esc(s)}</text>')
        x += 24 + 7 * len(s)
    return "".join(out)


def total_stage_bar(stages: dict, names: list) -> str:
    """The whole run's compile seconds, split by stage, as one bar."""
    total = sum(stages.values())
    if not total:
        return ""
    width = 700
    out = [f'<svg class="stages total" xmlns="http://www.w3.org/2000/svg" width="{width}" height="46" role="img" '
           f'aria-label="compile time per stage">']
    x = 0.0
    for s, secs in stages.items():
        w = width * secs / total
        out.append(f'<rect x="{x:.1f}" y="0" width="{max(w, 0.5):.1f}" height="22" fill="{stage_color(s, names)}">'
                   f'<title>{esc(s)} {secs:.3f} s ({secs / total:.0%})</title></rect>')
        if w > 6.5 * (len(s) + 8) + 8:
            out.append(f'<text x="{x + 4:.1f}" y="15" font-size="11" fill="#fff">{esc(s)} {secs:.2f} s</text>')
        x += w
    out.append(_legend(list(stages), names, 42))
    out.append("</svg>")
    return "".join(out)


def partition_bars(partitions: list, limit: int = 60) -> str:
    """Bytes each partition saves for the backward: activations, then saved inputs."""
    rows = partitions[:limit]
    if not rows:
        return ""
    label_w, bar_w, row_h = 230, 420, 20
    most = max((p.get("saved_bytes") or 0) for p in rows) or 1
    height = row_h * len(rows) + 26
    out = [f'<svg class="partitions" xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 170}" '
           f'height="{height}" role="img" aria-label="saved bytes per partition">']
    for i, p in enumerate(rows):
        y = i * row_h
        act, inp = p.get("activation_bytes") or 0, p.get("saved_input_bytes") or 0
        out.append(f'<text x="0" y="{y + 14}" font-size="11">{esc(_short(node_label(p.get("function") or "?"), 36))}'
                   f'</text>')
        wa, wi = bar_w * act / most, bar_w * inp / most
        out.append(f'<rect x="{label_w}" y="{y + 3}" width="{wa:.1f}" height="{row_h - 6}" fill="#e15759">'
                   f'<title>activations {fmt_bytes(act)}</title></rect>'
                   f'<rect x="{label_w + wa:.1f}" y="{y + 3}" width="{wi:.1f}" height="{row_h - 6}" fill="#9bbbe0">'
                   f'<title>inputs {fmt_bytes(inp)}</title></rect>'
                   f'<text x="{label_w + wa + wi + 6:.1f}" y="{y + 14}" font-size="11" fill="#555">'
                   f'{fmt_bytes(act)} + {fmt_bytes(inp)} inputs ({p.get("saved") or 0} values)</text>')
    y = height - 8
    out.append(f'<rect x="{label_w}" y="{y - 9}" width="10" height="10" fill="#e15759"/>'
               f'<text x="{label_w + 14}" y="{y}" font-size="11">activations</text>'
               f'<rect x="{label_w + 100}" y="{y - 9}" width="10" height="10" fill="#9bbbe0"/>'
               f'<text x="{label_w + 114}" y="{y}" font-size="11">saved inputs (parameters, ...)</text>')
    out.append("</svg>")
    return "".join(out)


def timeline(model: dict, width: int = 1100) -> str:
    """One lane per process (per rank when distributed): each graph's compile as a span, and
    marks for breaks, recompiles and cache misses, at most one per pixel and kind."""
    lanes = model["lanes"]
    spans, marks = model["compiles"], []
    for f in model["frames"]:
        for b in f["breaks"]:
            marks.append((b["lane"], b["t"], "graph_break"))
        for e in f["eager"]:
            marks.append((e["lane"], e["t"], "eager"))
    for r in model["recompiles"]:
        marks.append((r["lane"], r["t"], "recompile"))
    for c in model["cache"]:
        if c["action"] == "miss":
            marks.append((c["lane"], c["t"], "cache_miss"))
    end = max([t + d for _, t, d, _ in spans] + [t for _, t, _ in marks] + [e[1] for e in model["events"]] + [1e-3])
    label_w, lane_h = 170, 34
    scale = (width - label_w - 10) / end
    height = lane_h * len(lanes) + 40
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="compile timeline per process">']
    for i, lane in enumerate(lanes):
        y = i * lane_h
        out.append(f'<rect x="{label_w}" y="{y + 2}" width="{width - label_w - 10}" height="{lane_h - 4}" '
                   f'fill="{"#f6f7f9" if i % 2 == 0 else "#eef0f3"}"/>'
                   f'<text x="0" y="{y + lane_h / 2 + 4}" font-size="12">{esc(lane["label"])}</text>')
    seen = set()
    for lane, t, d, label in spans:
        x, w = label_w + max(t - d, 0.0) * scale, max(d * scale, 1.0)
        col = (lane, int(x), int(w))
        if col in seen:
            continue
        seen.add(col)
        y = lane * lane_h
        out.append(f'<rect x="{x:.1f}" y="{y + 8}" width="{w:.1f}" height="{lane_h - 16}" fill="#4e79a7" '
                   f'opacity="0.75"><title>{esc(label)}: {d:.3f} s</title></rect>')
    seen = set()
    for lane, t, kind in marks:
        x = label_w + t * scale
        col = (lane, int(x), kind)
        if col in seen:
            continue
        seen.add(col)
        y = lane * lane_h
        color, name = MARKS[kind]
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y + 3}" y2="{y + lane_h - 3}" stroke="{color}" '
                   f'stroke-width="2"><title>{esc(name)} at {t:.3f} s</title></line>')
    y = height - 10
    out.append(f'<text x="{label_w}" y="{y - 12}" font-size="11" fill="#555">0 s</text>'
               f'<text x="{width - 60}" y="{y - 12}" font-size="11" fill="#555">{end:.2f} s</text>')
    x = label_w
    out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="#4e79a7"/>'
               f'<text x="{x + 14}" y="{y}" font-size="11">a graph\'s compile</text>')
    x += 130
    for color, name in MARKS.values():
        out.append(f'<rect x="{x}" y="{y - 9}" width="3" height="10" fill="{color}"/>'
                   f'<text x="{x + 7}" y="{y}" font-size="11">{esc(name)}</text>')
        x += 20 + 7 * len(name)
    out.append("</svg>")
    return "".join(out)
