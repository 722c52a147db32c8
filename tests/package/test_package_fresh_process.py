"""A package saved in one process, under one HOME and cache dir, loads in a fresh process
after a copy elsewhere, under a new HOME and an empty KILN_CACHE_DIR: its calls run with
capture, AOT autograd and Inductor compilation made to fail (none of them runs)."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _run(cwd: pathlib.Path, *args: str) -> str:
    home = cwd / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "KILN_CACHE_DIR": str(cwd / "kiln-cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    env.pop("KILN_LOGS", None)
    out = subprocess.run([sys.executable, str(HERE / "_fresh_process.py"), *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_package_loads_elsewhere_without_compiling(tmp_path, backend):
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "pkgs").mkdir(parents=True)
    assert "SAVED" in _run(a, "save", str(a / "pkgs"), backend)
    shutil.copytree(a / "pkgs", b / "elsewhere")
    shutil.rmtree(a)                                  # nothing of the first place is left
    assert "LOADED OK" in _run(b, "load", str(b / "elsewhere"), backend)
    cache = b / "kiln-cache"
    assert not cache.exists() or not any((cache / "aot").glob("**/*"))   # the cache was not used


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_static_package_loads_without_dynamo_or_inductor(tmp_path, backend):
    """A static package needs no FakeTensorMode, ShapeEnv or Inductor: its load and first calls
    (inference, and a training step with its backward) import neither torch._dynamo nor
    torch._inductor (seconds of imports). An Inductor package runs
    its generated code and C++ kernels loaded by kiln (``kiln.backends.inductor.generated_module``)."""
    (tmp_path / "pkgs").mkdir()
    assert "SAVED" in _run(tmp_path, "save_light", str(tmp_path / "pkgs"), backend)
    assert "LOADED LIGHT" in _run(tmp_path / "load", "load_light", str(tmp_path / "pkgs"), backend)


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_dynamic_package_serves_new_sizes_and_misses_outside_its_guards(tmp_path, backend):
    (tmp_path / "pkgs").mkdir()
    assert "SAVED" in _run(tmp_path, "save_dynamic", str(tmp_path / "pkgs"), backend)
    assert "LOADED DYNAMIC" in _run(tmp_path / "load", "load_dynamic", str(tmp_path / "pkgs"), backend)
