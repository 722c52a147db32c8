"""The CI slice of kiln's differential fuzzer: a fixed set of generated programs per backend and
dynamic setting, each run eagerly and compiled (three calls: fresh inputs, fresh inputs again,
another size) and required to agree in everything ``observe.compare`` checks.

Each setting gets its own seeds, so the slice covers different programs everywhere. The long
run is ``python -m tests.fuzz`` (see docs/fuzzing.md)."""
import pytest

from .generator import generate
from .runner import available_backends, run_program

SLICES = [  # (backend, dynamic, seeds)
    ("eager", None, range(0, 10)),
    ("eager", True, range(100, 110)),
    ("aot_eager", None, range(200, 210)),
    ("aot_eager", True, range(300, 310)),
    ("inductor", None, range(402, 403)),   # Inductor compiles for seconds: one program each
    ("inductor", True, range(500, 501)),
]
CASES = [pytest.param(b, d, s, id=f"{b}{'-dynamic' if d else ''}-{s}") for b, d, seeds in SLICES for s in seeds]


@pytest.mark.parametrize("backend,dynamic,seed", CASES)
def test_generated_program_matches_eager(backend, dynamic, seed):
    if backend not in available_backends((backend,)):
        pytest.skip(f"kiln has no {backend!r} backend yet")
    out = run_program(generate(seed), backend, dynamic)
    assert out.status == "ok", out.describe() + "\n\n" + generate(seed).source()
