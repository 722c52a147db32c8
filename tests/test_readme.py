"""The Python examples of the README and of every page in ``docs/`` run, in the order a reader
meets them (the README, then the pages in the order of its topic table), in one namespace."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# (the examples of a later page may use what an earlier one defined)
PAGES = ["graph-breaks.md", "aot.md", "numpy.md", "models.md", "capture.md", "overhead.md", "inductor.md",
         "cudagraphs.md", "dynamic-shapes.md", "fuzzing.md", "cache-and-packages.md", "activation-memory.md",
         "configuration.md", "architecture.md", "compile-time.md", "report.md", "distributed.md"]


def _blocks(path: pathlib.Path) -> list:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_every_docs_page_is_listed_and_linked():
    assert sorted(PAGES) == sorted(p.name for p in DOCS.glob("*.md"))
    readme = README.read_text()
    for page in PAGES:
        assert f"(docs/{page})" in readme, page
    assert len(readme.splitlines()) <= 250


def test_readme_and_docs_python_blocks_run():
    ns: dict = {}
    count = 0
    for path in [README] + [DOCS / p for p in PAGES]:
        for block in _blocks(path):
            exec(compile(block, str(path), "exec"), ns)
            count += 1
    assert count >= 10
    reasons = ns["f"].recompile_reasons
    # mlp was compiled first with the "eager" backend: the counter's first capture says so
    assert reasons[0].startswith("BACKEND_MATCH failed")
    assert reasons[-1] == "EQUALS_MATCH failed: L['scale'] == 0.5 (saw float 2.0)"
    report = ns["report"]
    assert report.graph_break_count == 2 and report.graph_count >= 2
    assert "item()" in report.break_reasons[0].reason   # the print around it then runs natively


def test_relative_links_in_docs_resolve():
    for path in [README] + [DOCS / p for p in PAGES]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.name}: {target}"
