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
            "print(kiln.config.recompile_limit)\n"
            "f = kiln.compile(lambda x: x + 1, backend=\"eager\")\n"
            "f(torch.randn(2)); f(torch.randn(3))\n")
    env = {"KILN_RECOMPILE_LIMIT": "3", "KILN_LOGS": "graph,guards,recompiles", "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3"
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
