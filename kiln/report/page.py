"""The report as one HTML file: the model as JSON inside the page, ``page.css`` and ``page.js``
inline, the pictures as inline SVG. Nothing is fetched: the file opens from disk, offline.

What is shown at once is small (the overview, the first frames, the first events); the rest
is built by the page's script when a section is opened or scrolled to, so a trace of many
thousands of events opens as fast as a small one.
"""
from __future__ import annotations

import html
import json
import os
import time

from . import svg

_HERE = os.path.dirname(os.path.abspath(__file__))


def _asset(name: str) -> str:
    with open(os.path.join(_HERE, name), encoding="utf-8") as f:
        return f.read()


def _json_for_script(value) -> str:
    """JSON that cannot end its ``<script>`` element early."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return text.replace("<", "\\u003c")     # ("<" only occurs inside JSON strings)


def page_data(model: dict, title: str) -> dict:
    names = model["stage_names"]
    for f in model["frames"]:
        f["flow_svg"] = svg.flow(f) if f["graphs"] or f["eager"] else ""
        f["stages_svg"] = svg.stage_bars(f["graphs"], names)
    return {
        "title": title, "built": time.strftime("%Y-%m-%d %H:%M:%S"),
        "overview": model["overview"], "lanes": model["lanes"], "frames": model["frames"],
        "recompiles": model["recompiles"], "cache": model["cache"], "cudagraphs": model["cudagraphs"],
        "activations": model["activations"], "packages": model["packages"],
        # (the graphs' code is in each graph's partition already: the list keeps only sizes)
        "partitions": [{k: v for k, v in p.items() if k not in ("forward", "backward")} for p in model["partitions"]],
        "events": model["events"], "stage_names": names,
        "svg": {"stages": svg.total_stage_bar(model["overview"]["stages"], names),
                "timeline": svg.timeline(model), "partitions": svg.partition_bars(model["partitions"])},
    }


def render(model: dict, title: str) -> str:
    data = page_data(model, title)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        # (no network: the page may load nothing but itself)
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
        f"<title>{html.escape(title)}</title><style>{_asset('page.css')}</style></head>\n<body>"
        "<header><h1>kiln compile report</h1><div id=\"subtitle\"></div>"
        "<input id=\"search\" type=\"search\" placeholder=\"Search everything (functions, reasons, guards, code)…\" "
        "autocomplete=\"off\"></header>"
        "<nav id=\"nav\"></nav><main id=\"main\"><noscript>This report draws itself with JavaScript; the facts are "
        "also in the trace files it was built from.</noscript></main>"
        "<pre id=\"errors\" hidden></pre>"
        f"<script type=\"application/json\" id=\"data\">{_json_for_script(data)}</script>"
        f"<script>{_asset('page.js')}</script></body></html>\n")
