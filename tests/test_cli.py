import subprocess
import sys


def test_kiln_info_and_backends():
    out = subprocess.run([sys.executable, "-m", "kiln.cli", "info"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "torch" in out.stdout and "eager" in out.stdout
    out = subprocess.run([sys.executable, "-m", "kiln.cli", "backends"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "eager" in out.stdout.split()
    out = subprocess.run([sys.executable, "-m", "kiln.cli"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "usage" in out.stderr
