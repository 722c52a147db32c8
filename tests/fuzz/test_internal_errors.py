"""The fuzzer lists kiln's internal errors: a frame that ran eagerly because kiln failed is not
a wrong answer, but a compile lost, and the coverage report counts it."""
import pytest

from kiln.backends import registry

from .program import Call, SourceProgram
from .runner import internal_signature, run_program

PROGRAM = '''
import torch


def make_inputs(seed, n, k, s, flag):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 4, generator=g),)


def fn(x):
    return x.sin() * 2
'''


def broken(gm, example_inputs):
    raise TypeError("object of type 'int' has no len()")


broken.__module__ = "kiln.backends.broken"   # a backend of kiln's own: its failure is kiln's


@pytest.fixture
def broken_backend():
    registry.register_backend("broken_for_test", broken)
    yield "broken_for_test"
    registry._BACKENDS.pop("broken_for_test", None)


def test_a_frame_run_eagerly_by_a_kiln_error_is_listed(broken_backend):
    prog = SourceProgram(3, PROGRAM, ["x"], [Call(seed=1, n=3, k=1, s=0.5, flag=False)])
    out = run_program(prog, broken_backend)
    assert out.status == "ok"          # eager ran: the answer is right
    assert out.internal == ["kiln internal error while compiling FN (TypeError: object of type '…' has no len())"]


def test_a_clean_compile_lists_nothing():
    prog = SourceProgram(3, PROGRAM, ["x"], [Call(seed=1, n=3, k=1, s=0.5, flag=False)])
    assert run_program(prog, "eager").internal == []


def test_signatures_drop_names_and_numbers():
    a = internal_signature("kiln internal error while compiling fn_1 (IndexError: index 3 is out of range); "
                           "the frame runs eagerly (please report this as a kiln bug)")
    b = internal_signature("kiln internal error while compiling helper (IndexError: index 7 is out of range); "
                           "the frame runs eagerly (please report this as a kiln bug)")
    assert a == b == "kiln internal error while compiling FN (IndexError: index N is out of range)"


# Seeds whose programs the long run saw lose a compile to a kiln internal error, by setting.
FOUND = [
    # a view of an intermediate whose symbolic size the shape environment specialized to a
    # number: its SymInt geometry reached as_strided
    ("inductor", True, 301513),
    # a row of a tensor iterated in a loop (an unbind view), read by a continuation after its
    # base was written in place: autograd refuses to touch it, and making it a graph input
    # raised (the frame runs eagerly now, and raises where eager raises)
    ("eager", None, 210415),
    ("aot_eager", True, 210415),
]


@pytest.mark.parametrize("backend,dynamic,seed", FOUND, ids=[f"{b}{'-dynamic' if d else ''}-{s}" for b, d, s in FOUND])
def test_programs_that_hit_internal_errors_compile_cleanly(backend, dynamic, seed):
    from .generator import generate
    from .runner import available_backends

    if backend not in available_backends((backend,)):
        pytest.skip(f"kiln has no {backend!r} backend")
    out = run_program(generate(seed), backend, dynamic)
    assert out.status == "ok", out.describe()
    assert out.internal == []
