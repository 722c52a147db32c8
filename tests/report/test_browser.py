"""The report opened in headless Chromium: what the page's script draws, and no script error."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from kiln.report import build_report, render_report

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (.ci/run installs it: apt-get install chromium)")


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


def _dom(tmp_path, page: str) -> str:
    """The rendered DOM, without the page's scripts (its data and code are not what it shows);
    asserts that the script ran to its end and recorded no error."""
    run = _chromium(tmp_path, "--dump-dom", f"file://{page}")
    assert run.returncode == 0, run.stderr[-2000:]
    dom = re.sub(r"<script\b.*?</script>", "", run.stdout, flags=re.S)
    errors = re.search(r'<pre id="errors"([^>]*)>(.*?)</pre>', dom, re.S)
    assert errors is not None and errors.group(2) == "" and "hidden" in errors.group(1), errors
    assert 'data-ready="1"' in dom                          # the script ran to its end
    return dom


def test_rendered_page_shows_graphs_and_breaks(real_trace, tmp_path):
    trace_dir, _ = real_trace
    page = build_report(trace_dir, str(tmp_path / "report.html"))
    dom = _dom(tmp_path, page)
    assert 'id="frame-0"' in dom and 'class="flow"' in dom  # the first frame is drawn open, with its flow
    assert "graph break" in dom and "print(" in dom and "break at line" in dom
    assert "resumes after line" in dom and "recompile" in dom
    assert 'class="stages' in dom and 'class="timeline"' in dom and 'class="partitions"' in dom
    # a recompile's guard, a cache miss's diff (sizes, or inputs: a dynamic graph takes its symbols)
    assert "TENSOR_MATCH" in dom and ("sizes" in dom or "inputs" in dom)


def test_search(real_trace, tmp_path):
    trace_dir, _ = real_trace
    page = build_report(trace_dir, str(tmp_path / "report.html"))
    dom = _dom(tmp_path, page + "#search=size%20mismatch")
    results = re.search(r'<section id="results">(.*?)</section>', dom, re.S)
    assert results is not None, "no search results drawn"
    assert "match(es)" in results.group(1) and "recompile" in results.group(1)
    assert "size mismatch" in results.group(1)


def test_large_page_renders_without_error(tmp_path):
    from .test_report import _synthetic

    trace_dir = str(tmp_path / "big")
    _synthetic(trace_dir, 10_000)
    page = build_report(trace_dir, str(tmp_path / "big.html"))
    dom = _dom(tmp_path, page)
    assert dom.count('class="frame"') == 30                # drawn a page at a time
    assert "show 200 more" in dom


def test_screenshot(real_trace, tmp_path):
    trace_dir, _ = real_trace
    page = build_report(trace_dir, str(tmp_path / "report.html"))
    png = tmp_path / "report.png"
    run = _chromium(tmp_path, f"--screenshot={png}", "--window-size=1400,1000", f"file://{page}")
    assert run.returncode == 0 and png.stat().st_size > 10_000, run.stderr[-2000:]
    if os.environ.get("KILN_REPORT_SCREENSHOT"):        # (a person looks at it: docs/report.md)
        shutil.copy(png, os.environ["KILN_REPORT_SCREENSHOT"])


def test_a_script_error_shows_in_the_page(tmp_path):
    """The checks above can fail: a page whose data lacks what the script reads shows the error."""
    trace_dir = tmp_path / "trace"
    trace_dir.mkdir()
    (trace_dir / "t.jsonl").write_text('{"v":1,"seq":0,"t":0,"pid":1,"rank":null,"kind":"message",'
                                       '"topic":"graph","message":"m"}\n')
    text = (tmp_path / "page.html")
    text.write_text(re.sub(r'(<script type="application/json" id="data">).*?(</script>)', r"\1{}\2",
                           render_report(str(trace_dir)), flags=re.S))
    run = _chromium(tmp_path, "--dump-dom", f"file://{text}")
    errors = re.search(r'<pre id="errors"([^>]*)>(.*?)</pre>', run.stdout, re.S)
    assert errors is not None and "script error" in errors.group(2)
