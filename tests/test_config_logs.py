import subprocess
import sys

import pytest
import torch

import kiln
from kiln import logs


def test_config_patch_restores_and_rejects_unknown():
    before = kiln.config.recompile_limit
    with kiln.config.patch(recompile_limit=1):
        assert kiln.config.recompile_limit == 1
    assert kiln.config.recompile_limit == before
    with pytest.raises(ValueError, match="no field"):
        with kiln.config.patch(not_a_field=1):
            pass


def test_environment_overrides_config_and_logs():
    code = ("import kiln, torch\n"
            "print(kiln.config.recompile_limit, kiln.config.remote_cache_timeout, kiln.config.remote_cache)\n"
            "f = kiln.compile(lambda x: x + 1, backend=\"eager\")\n"
            "f(torch.randn(2)); f(torch.randn(3))\n")
    env = {"KILN_RECOMPILE_LIMIT": "3", "KILN_REMOTE_CACHE_TIMEOUT": "0.5", "KILN_REMOTE_CACHE": "", "KILN_LOGS": "graph,guards,recompiles", "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3 0.5"
    assert "[kiln:graph]" in out.stderr and "[kiln:guards]" in out.stderr
    assert "[kiln:recompiles] Recompiling <lambda>" in out.stderr and "size mismatch" in out.stderr


def test_set_logs_validates_topics():
    with pytest.raises(ValueError, match="unknown log topic"):
        kiln.set_logs("graphs")
    kiln.set_logs("all")
    assert all(getattr(logs.enabled, t) for t in logs.TOPICS)
    kiln.set_logs(None)
    assert not any(getattr(logs.enabled, t) for t in logs.TOPICS)


def test_max_instructions_stops_runaway_capture():
    def f(x):
        n = 0
        while n < 10_000_000:
            n += 1
        return x + n

    with kiln.config.patch(max_instructions=10_000):
        with pytest.raises(kiln.Unsupported, match="max_instructions"):
            kiln.compile(f, fullgraph=True, backend="eager")(torch.randn(2))


def test_logs_are_stdlib_logging_records_a_user_can_route(capsys):
    """Each topic is a ``kiln.<topic>`` logger: a handler on ``kiln`` gets the records, and the
    stderr handler can be taken away."""
    import logging

    got = []

    class Collect(logging.Handler):
        def emit(self, record):
            got.append((record.name, record.getMessage()))

    handler = Collect()
    root = logging.getLogger("kiln")
    root.addHandler(handler)
    root.removeHandler(logs.STDERR)
    try:
        logs.set_logs("recompiles")
        f = kiln.compile(lambda x, s: x * s, backend="eager")
        f(torch.ones(2), 2.0)
        f(torch.ones(2), 3.0)
    finally:
        logs.set_logs("")
        root.removeHandler(handler)
        root.addHandler(logs.STDERR)
    assert [name for name, _ in got] == ["kiln.recompiles"]
    assert "EQUALS_MATCH failed" in got[0][1]
    assert "[kiln:" not in capsys.readouterr().err        # (the stderr handler was off)


def test_a_topic_off_prints_nothing_and_on_prints_to_stderr(capsys):
    f = kiln.compile(lambda x, s: x + s, backend="eager")
    f(torch.ones(2), 2.0)
    f(torch.ones(2), 3.0)
    assert "[kiln:recompiles]" not in capsys.readouterr().err
    logs.set_logs("recompiles")
    try:
        f(torch.ones(2), 4.0)
    finally:
        logs.set_logs("")
    assert "[kiln:recompiles] Recompiling" in capsys.readouterr().err
