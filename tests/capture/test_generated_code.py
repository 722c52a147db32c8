"""The code kiln generates looks like the user's function to everything that looks at it:
code run at a graph break sees the user's module globals; frames, tracebacks, warnings and
logging records carry the user's function names, files and lines; parameters may have any
name; and arguments bind exactly as for the original function."""
from __future__ import annotations

import collections
import dis
import inspect
import logging
import sys
import traceback
import typing
import warnings

import pytest
import torch

import kiln


def _compile(fn):
    return kiln.compile(fn, backend="eager")


# --------------------------------------------------------------------------- module globals
def namedtuple_after_break(x):
    y = x + 1
    print("", end="")                                   # a graph break
    Point = collections.namedtuple("Point", "a b")      # reads its caller's module
    return Point(y, 2)


def frame_facts(x):
    y = x * 2
    print("", end="")
    frame = sys._getframe(0)
    return y, frame.f_globals["__name__"], frame.f_code.co_name, frame.f_code.co_filename


def test_namedtuple_made_after_a_break_belongs_to_the_users_module():
    x = torch.randn(3)
    out = _compile(namedtuple_after_break)(x)
    assert type(out).__module__ == __name__ == type(namedtuple_after_break(x)).__module__
    torch.testing.assert_close(out.a, x + 1)


def test_frames_at_a_break_are_the_users():
    x = torch.randn(3)
    got, expected = _compile(frame_facts)(x), frame_facts(x)
    assert got[1:] == expected[1:] == (__name__, "frame_facts", __file__)


def caller_module():
    return sys._getframe(1).f_globals["__name__"], sys._getframe(1).f_code.co_name


def asks_who_calls(x):
    y = x + 1
    print("", end="")
    return y, caller_module()


def test_callee_that_reads_its_callers_frame_sees_the_user_function():
    x = torch.randn(2)
    assert _compile(asks_who_calls)(x)[1] == asks_who_calls(x)[1] == (__name__, "asks_who_calls")


def stack_names():
    return [f.function for f in inspect.stack()[1:3]]


def uses_inspect_stack(x):
    print("", end="")
    return x, stack_names()


def test_inspect_stack_from_a_callee_names_the_user_function():
    x = torch.randn(2)
    assert _compile(uses_inspect_stack)(x)[1][0] == uses_inspect_stack(x)[1][0] == "uses_inspect_stack"


def _two_up():
    return sys._getframe(2).f_code.co_name, inspect.currentframe().f_back.f_back.f_code.co_name


def _middle(x):
    return x + 1, _two_up()


def calls_a_chain_that_reads_two_frames_up(x):
    return _middle(x * 2)


def makes_a_typed_namedtuple(x):
    row = typing.NamedTuple("Row", [("a", int)])      # names its module after sys._getframe(2)
    return x + 1, row.__module__


@pytest.mark.parametrize("fn", [calls_a_chain_that_reads_two_frames_up, makes_a_typed_namedtuple])
def test_callers_of_a_frame_reader_inside_inlined_calls_are_real_frames(fn):
    """A frame read inside inlined calls runs the outermost of them as it is: its callers are
    real frames up to the compiled function (not the callee compiled on its own, whose entry
    and kiln's wrappers would sit between them)."""
    x = torch.randn(2)
    got, expected = _compile(fn)(x), fn(x)
    assert got[1] == expected[1]
    torch.testing.assert_close(got[0], expected[0])


# --------------------------------------------------------------------------- warnings, logging
def warn_here(x):
    print("", end="")
    warnings.warn("direct", UserWarning)                 # stacklevel=1: this line
    return x + 1


def _warn_caller():
    warnings.warn("from a helper", UserWarning, stacklevel=2)   # points at the caller's line


def warn_in_helper(x):
    y = x * 3
    print("", end="")
    _warn_caller()
    return y


@pytest.mark.parametrize("fn", [warn_here, warn_in_helper])
def test_warnings_point_at_the_users_line(fn):
    x = torch.randn(2)
    with warnings.catch_warnings(record=True) as eager:
        warnings.simplefilter("always")
        fn(x)
    with warnings.catch_warnings(record=True) as compiled:
        warnings.simplefilter("always")
        _compile(fn)(x)
    assert [(w.filename, w.lineno, str(w.message)) for w in compiled] == \
        [(w.filename, w.lineno, str(w.message)) for w in eager]
    assert compiled[0].filename == __file__


LOG = logging.getLogger("kiln.tests.generated_code")


def logs_something(x):
    y = x - 1
    print("", end="")
    LOG.warning("value computed")
    return y


def test_logging_records_name_the_users_function_and_module():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append((record.module, record.funcName, record.lineno, record.pathname))

    handler = Keep()
    LOG.addHandler(handler)
    try:
        x = torch.randn(2)
        logs_something(x)
        _compile(logs_something)(x)
    finally:
        LOG.removeHandler(handler)
    assert records[0] == records[1]
    assert records[1][1] == "logs_something" and records[1][3] == __file__


# --------------------------------------------------------------------------- tracebacks
def raises_after_break(x):
    y = x * 2
    print("", end="")
    z = y + 1
    raise ValueError(f"bad value {z.shape[0]}")


def test_traceback_after_a_break_reads_like_eagers():
    with pytest.raises(ValueError) as info:
        _compile(raises_after_break)(torch.randn(4))
    frames = traceback.extract_tb(info.value.__traceback__)
    text = "".join(traceback.format_tb(info.value.__traceback__))
    # (kiln's own frames, runtime/function.py's __call__, are kiln's files; none is a generated name)
    for generated in ("__kiln_entry", "__kiln_eager", "__kiln_break", "__kiln_resume", "kiln generated"):
        assert generated not in text
    mine = [f for f in frames if f.filename == __file__ and f.name != "test_traceback_after_a_break_reads_like_eagers"]
    assert mine and {f.name for f in mine} == {"raises_after_break"}
    raise_line = raises_after_break.__code__.co_firstlineno + 4
    assert (mine[-1].lineno, mine[-1].line) == (raise_line, 'raise ValueError(f"bad value {z.shape[0]}")')
    assert all(f.lineno >= raises_after_break.__code__.co_firstlineno for f in mine)


def test_generated_entries_carry_the_users_names_and_globals():
    cf = _compile(raises_after_break)
    with pytest.raises(ValueError):
        cf(torch.randn(4))
    (entry,) = cf.entries
    code = entry.fn.__code__
    assert (code.co_name, code.co_filename, code.co_firstlineno) == (
        "raises_after_break", __file__, raises_after_break.__code__.co_firstlineno)
    assert entry.fn.__globals__ is raises_after_break.__globals__
    # kiln's own values come from the closure, never from the user's globals
    assert not [i for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")]
    (resume,) = entry.resumes
    assert resume.entries[0].fn.__code__.co_name == "raises_after_break"


# --------------------------------------------------------------------------- parameter names
def builtin_named_params(type, len, getattr=None, *args, Exception=1.0, **kwargs):
    return type * Exception + len


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_parameters_named_like_builtins(backend):
    cf = kiln.compile(builtin_named_params, backend=backend)
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(cf(a, b, Exception=2.0), a * 2.0 + b)
    torch.testing.assert_close(cf(type=a, len=b, Exception=2.0), a * 2.0 + b)
    torch.testing.assert_close(cf(a, b, Exception=3.0), a * 3.0 + b)   # guard on a float: recompiles
    assert len(cf.entries) == 2


def test_user_global_shadowing_a_builtin_does_not_reach_the_guards():
    namespace = {"torch": torch, "type": lambda v: "shadowed", "len": None, "hasattr": None}
    exec("def f(x, n):\n    return x * n\n", namespace)
    cf = _compile(namespace["f"])
    x = torch.randn(2)
    torch.testing.assert_close(cf(x, 2), x * 2)
    torch.testing.assert_close(cf(x, 3), x * 3)
    torch.testing.assert_close(cf(x, 2), x * 2)
    assert len(cf.entries) == 2


def test_binding_errors_are_the_originals():
    def f(x, /, y, *, z):
        return x + y + z
    cf = _compile(f)
    cf(torch.randn(2), torch.randn(2), z=torch.randn(2))
    for args, kwargs in [((torch.randn(2),), {"y": 1}), ((), {"x": 1, "y": 2, "z": 3})]:
        with pytest.raises(TypeError) as eager:
            f(*args, **kwargs)
        with pytest.raises(TypeError) as compiled:
            cf(*args, **kwargs)
        assert str(compiled.value) == str(eager.value)


def test_source_reads_with_the_users_parameter_names():
    def scaled(x, scale=2.0):
        return x * scale
    cf = _compile(scaled)
    cf(torch.randn(2))
    src = cf.entries[0].source
    assert src.startswith("def __kiln_entry(x, scale=") and "L['x']" not in src and "___p0" not in src
