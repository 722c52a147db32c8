"""The README's Python examples run, in order, in one namespace."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 3
    ns: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), ns)
    reasons = ns["f"].recompile_reasons
    # mlp was compiled first with the "eager" backend: the counter's first capture says so
    assert reasons[0].startswith("BACKEND_MATCH failed")
    assert reasons[-1] == "EQUALS_MATCH failed: L['scale'] == 0.5 (saw float 2.0)"
    report = ns["report"]
    assert report.graph_break_count == 2 and report.graph_count >= 2
    assert "item()" in report.break_reasons[0].reason   # the print around it then runs natively
