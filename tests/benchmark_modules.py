"""Loading a script of ``benchmarks/`` as a module in a test: the scripts are not a package, and
they import their helpers (``cells``, ``hf_training``, ...) from their own directory."""
import importlib.util
import pathlib
import sys

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as the module ``kiln_bench_<name>`` (registered in ``sys.modules``,
    so that what it pickles or packages finds its classes by the module's name)."""
    spec = importlib.util.spec_from_file_location(f"kiln_bench_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return mod
