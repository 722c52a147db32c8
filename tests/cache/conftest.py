import shutil
import socket
import subprocess
import time

import pytest

import kiln
from kiln.cache import store


@pytest.fixture(autouse=True)
def _fresh_cache_stats(monkeypatch):
    """Each cache test counts hits, misses and warnings of its own, with frame records on
    (the default, which tests/conftest.py turns off for the rest of the suite)."""
    monkeypatch.setattr(kiln.config, "cache_frames", True)
    monkeypatch.setenv("KILN_CACHE_FRAMES", "1")
    kiln.cache.reset_stats()
    store._warned.clear()
    yield


# -- a real Redis server for the remote cache's tests (tests/cache/test_remote_*.py) -------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(tmp_dir, *extra: str):
    """A redis-server of its own on a free port of 127.0.0.1, persistence off: (process, url).
    Skips the test when redis-server or redis-py is missing."""
    pytest.importorskip("redis", reason="the remote cache's tests need redis-py (pip install kiln[redis])")
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("the remote cache's tests need redis-server (Debian: apt-get install redis-server)")
    import redis
    for _ in range(5):                                  # (a port taken meanwhile: another one)
        port = _free_port()
        proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", str(tmp_dir), *extra],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                client.ping()
                client.close()
                return proc, f"redis://127.0.0.1:{port}/0"
            except redis.ConnectionError:
                time.sleep(0.02)
        proc.kill()
        proc.wait()
    pytest.fail("could not start redis-server")


def stop_redis(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One redis-server for the session (this worker's), as a URL."""
    proc, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    stop_redis(proc)


@pytest.fixture
def remote(redis_server, monkeypatch):
    """The remote cache on, over an emptied server (``config`` and, for subprocesses, the
    environment): its URL."""
    from kiln import remote_cache
    monkeypatch.setattr(kiln.config, "remote_cache", redis_server)
    monkeypatch.setenv("KILN_REMOTE_CACHE", redis_server)
    remote_cache.forget_failures()
    remote_cache.clear()
    yield redis_server
    remote_cache.forget_failures()
