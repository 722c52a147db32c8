"""A package saved in one process, under one HOME and cache dir, loads in a fresh process
after a copy elsewhere, under a new HOME and an empty KILN_CACHE_DIR: its calls run with
capture, AOT autograd and Inductor compilation made to fail (none of them runs).

The packages are saved in this process (``_fresh_process.py``'s save functions, with a cache
dir of their own): only the loading side needs a fresh one."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import kiln

import _fresh_process as P

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _save_here(monkeypatch, cwd: pathlib.Path, what: str, d: pathlib.Path, backend: str) -> None:
    """``_fresh_process.py WHAT D BACKEND`` run in this process, its cache dir under ``cwd``."""
    monkeypatch.setattr(kiln.config, "cache_dir", str(cwd / "kiln-cache"))
    kiln.reset()
    try:
        getattr(P, what)(str(d), backend)
    finally:
        kiln.reset()


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
def test_package_loads_elsewhere_without_compiling(tmp_path, monkeypatch, backend):
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "pkgs").mkdir(parents=True)
    _save_here(monkeypatch, a, "save", a / "pkgs", backend)
    shutil.copytree(a / "pkgs", b / "elsewhere")
    shutil.rmtree(a)                                  # nothing of the first place is left
    assert "LOADED OK" in _run(b, "load", str(b / "elsewhere"), backend)
    cache = b / "kiln-cache"
    assert not cache.exists() or not any((cache / "aot").glob("**/*"))   # the cache was not used


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_static_package_loads_without_dynamo_or_inductor(tmp_path, monkeypatch, backend):
    """A static package needs no FakeTensorMode, ShapeEnv or Inductor: its load and first calls
    (inference, and a training step with its backward) import neither torch._dynamo nor
    torch._inductor (seconds of imports). An Inductor package runs
    its generated code and C++ kernels loaded by kiln (``kiln.backends.inductor.generated_module``)."""
    (tmp_path / "pkgs").mkdir()
    _save_here(monkeypatch, tmp_path, "save_light", tmp_path / "pkgs", backend)
    assert "LOADED LIGHT" in _run(tmp_path / "load", "load_light", str(tmp_path / "pkgs"), backend)


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_dynamic_package_serves_new_sizes_and_misses_outside_its_guards(tmp_path, monkeypatch, backend):
    (tmp_path / "pkgs").mkdir()
    _save_here(monkeypatch, tmp_path, "save_dynamic", tmp_path / "pkgs", backend)
    assert "LOADED DYNAMIC" in _run(tmp_path / "load", "load_dynamic", str(tmp_path / "pkgs"), backend)
