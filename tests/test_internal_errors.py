"""kiln's own failures never reach the user; the user's own exceptions always do, exactly as
eager raises them, and nothing the program does runs twice.

kiln's failures are injected where they happen in real bugs: invalid generated source, a
generated name never bound, a failure of the generated code at run time, a crash inside the
capture, inside kiln's AOT backend."""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.capture import frame as frame_mod
from kiln.capture import side_effects as side_effects_mod
from kiln.testing import CompileCounter

CALLS: list = []


def simple(x, w):
    CALLS.append("ran")            # a side effect kiln replays after the graph
    return torch.relu(x @ w) * 2


def with_break(x):
    y = x.sin()
    CALLS.append("before")
    print("", end="")              # a graph break
    CALLS.append("after")
    return y + 1


def _args():
    return torch.randn(3, 4), torch.randn(4, 5)


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


def _breaks_side_effects(monkeypatch, prepare: list[str], apply: list[str]):
    """Make every entry's generated code contain these lines (kiln's bug, injected)."""
    original = side_effects_mod.SideEffects.codegen

    def codegen(self, cg):
        p, a = original(self, cg)
        return prepare + p, a + apply
    monkeypatch.setattr(side_effects_mod.SideEffects, "codegen", codegen)


def _log_lines(capsys) -> str:
    return capsys.readouterr().err


# --------------------------------------------------------------------------- at compile time
@pytest.mark.parametrize("bad_line, kind", [
    ("___x = = 1", "SyntaxError"),                     # generated source that is not Python
    ("___eff9 = 0 += 1", "SyntaxError"),
    ("___eff9 = ___never_bound", "NameError"),         # a name the code never binds
])
def test_invalid_generated_code_runs_eagerly(monkeypatch, capsys, bad_line, kind):
    _breaks_side_effects(monkeypatch, [bad_line], [])
    kiln.set_logs("graph_breaks")
    cnt = CompileCounter()
    cf = kiln.compile(simple, backend=cnt)
    x, w = _args()
    torch.testing.assert_close(cf(x, w), torch.relu(x @ w) * 2)
    assert CALLS == ["ran"]
    (entry,) = cf.entries
    assert entry.is_eager and kind in str(entry.eager_reason)
    log = _log_lines(capsys)
    assert "runs eagerly" in log and "kiln internal error" in log and kind in log
    torch.testing.assert_close(cf(x, w), torch.relu(x @ w) * 2)     # warm: the eager entry
    assert CALLS == ["ran", "ran"]


def test_internal_error_in_capture_is_explained_and_fullgraph_raises_unsupported(monkeypatch):
    def broken(*args, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'node'")
    monkeypatch.setattr(frame_mod, "_finish", broken)
    x, w = _args()
    ex = kiln.explain(simple)(x, w)
    torch.testing.assert_close(ex.out, torch.relu(x @ w) * 2)
    assert ex.graph_count == 0 and ex.graph_break_count == 1
    (reason,) = ex.break_reasons
    assert reason.kind == "frame runs eagerly" and "kiln internal error" in reason.reason
    assert "AttributeError" in reason.reason and reason.filename == __file__
    with pytest.raises(kiln.Unsupported, match="kiln internal error") as info:
        kiln.compile(simple, fullgraph=True, backend="eager")(x, w)
    assert isinstance(info.value.__cause__, AttributeError)


def test_internal_error_inside_a_continuation(monkeypatch):
    """kiln's failure compiling the code after a graph break: that continuation runs
    eagerly, and what ran before the break is not repeated."""
    original = frame_mod._finish

    def broken_after_break(fn, *args, **kwargs):
        if "resume" in fn.__qualname__:
            raise RuntimeError("kiln bug in a continuation")
        return original(fn, *args, **kwargs)
    monkeypatch.setattr(frame_mod, "_finish", broken_after_break)
    cf = kiln.compile(with_break, backend="eager")
    x = torch.randn(4)
    torch.testing.assert_close(cf(x), x.sin() + 1)
    assert CALLS == ["before", "after"]
    (entry,) = cf.entries
    (resume,) = entry.resumes
    assert resume.entries[0].is_eager
    torch.testing.assert_close(cf(x), x.sin() + 1)
    assert CALLS == ["before", "after"] * 2


def test_kiln_backend_failure_falls_back(monkeypatch):
    import kiln.aot.dynamic as aot_dynamic

    def broken(*args, **kwargs):
        raise RuntimeError("tracing the joint graph failed")
    monkeypatch.setattr(aot_dynamic, "_run_stages", broken)
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5)
    cf = kiln.compile(simple, backend="aot_eager")
    out = cf(x, w)
    out.sum().backward()
    expected_grad = x.grad.clone()
    x.grad = None
    (torch.relu(x @ w) * 2).sum().backward()
    torch.testing.assert_close(expected_grad, x.grad)
    # the graph runs as captured, or the frame eagerly: either way, said why
    (entry,) = cf.entries
    reason = str(entry.eager_reason) if entry.is_eager else entry.graph_module.meta.get("kiln_aot_fallback")
    assert "joint graph" in reason


# --------------------------------------------------------------------------- user backends
def test_user_backend_error_is_the_users():
    class BackendBug(Exception):
        pass

    def my_backend(gm, example_inputs):
        raise BackendBug("my backend is broken")
    cf = kiln.compile(simple, backend=my_backend)
    with pytest.raises(BackendBug, match="my backend is broken"):
        cf(*_args())
    assert CALLS == []        # the frame did not run (its graph never compiled)


def test_user_backend_returning_a_non_callable_is_a_type_error():
    cf = kiln.compile(simple, backend=lambda gm, ex: 42)
    with pytest.raises(TypeError, match="returned int, not a callable"):
        cf(*_args())


def test_user_compiler_in_aot_backend_is_the_users():
    def fw_compiler(gm, example_inputs):
        raise ValueError("my forward compiler refuses")
    backend = kiln.backends.aot_backend(fw_compiler)
    cf = kiln.compile(simple, backend=backend)
    with pytest.raises(ValueError, match="refuses"):
        cf(*_args())


def test_backend_raising_unsupported_declines_the_graph():
    def declining(gm, example_inputs):
        raise kiln.Unsupported("not for me")
    cf = kiln.compile(simple, backend=declining)
    x, w = _args()
    torch.testing.assert_close(cf(x, w), torch.relu(x @ w) * 2)
    assert cf.entries[0].is_eager


# --------------------------------------------------------------------------- at run time
def test_generated_code_failing_before_effects_runs_eagerly_once(monkeypatch, capsys):
    """The generated code fails at run time before any effect: the call runs eagerly (the
    side effect happens once), and the entry's guards now run the frame eagerly."""
    _breaks_side_effects(monkeypatch, ["___eff9 = 1 // 0"], [])
    kiln.set_logs("graph_breaks")
    cf = kiln.compile(simple, backend="eager")
    x, w = _args()
    torch.testing.assert_close(cf(x, w), torch.relu(x @ w) * 2)
    assert CALLS == ["ran"]
    (entry,) = cf.entries
    assert entry.is_eager and "ZeroDivisionError" in str(entry.eager_reason)
    assert "at run time" in _log_lines(capsys)
    torch.testing.assert_close(cf(x, w), torch.relu(x @ w) * 2)
    assert CALLS == ["ran", "ran"]


def test_run_time_failure_is_explained(monkeypatch):
    _breaks_side_effects(monkeypatch, ["___eff9 = 1 // 0"], [])
    x, w = _args()
    ex = kiln.explain(simple)(x, w)
    assert ex.graph_count == 0
    assert [r.kind for r in ex.break_reasons] == ["frame runs eagerly"]
    assert "at run time" in ex.break_reasons[0].reason


def test_generated_code_failing_after_effects_is_not_repeated(monkeypatch):
    """After the first effect nothing can be re-run: the error propagates, and the side
    effects happened once."""
    _breaks_side_effects(monkeypatch, [], ["1 // 0"])
    cf = kiln.compile(simple, backend="eager")
    with pytest.raises(ZeroDivisionError):
        cf(*_args())
    assert CALLS == ["ran"]


# --------------------------------------------------------------------------- user errors
def raises_value_error(x):
    CALLS.append("ran")
    y = x * 2
    if y.shape[0] == 3:
        raise ValueError("three rows")
    return y


def raises_after_break(x):
    y = x * 2
    CALLS.append("before")
    print("", end="")
    CALLS.append("after")
    raise KeyError("missing")


def indexes(x, idx):
    return x[idx] * 2


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_user_exception_propagates_once(backend):
    cf = kiln.compile(raises_value_error, backend=backend)
    for _ in range(2):
        CALLS.clear()
        with pytest.raises(ValueError, match="three rows"):
            cf(torch.randn(3))
        assert CALLS == ["ran"]
    CALLS.clear()
    with pytest.raises(KeyError, match="missing"):
        kiln.compile(raises_after_break, backend=backend)(torch.randn(2))
    assert CALLS == ["before", "after"]


def test_data_error_in_the_graph_is_the_users():
    """An op that fails on this call's data (an index out of range) raises what eager
    raises; the entry stays compiled."""
    cf = kiln.compile(indexes, backend="eager")
    x = torch.randn(5)
    torch.testing.assert_close(cf(x, torch.tensor([1, 2])), x[torch.tensor([1, 2])] * 2)
    with pytest.raises(IndexError) as kiln_error:
        cf(x, torch.tensor([7]))
    with pytest.raises(IndexError) as eager_error:
        indexes(x, torch.tensor([7]))
    assert str(kiln_error.value) == str(eager_error.value)
    assert not cf.entries[0].is_eager


def test_wrong_arguments_raise_eagers_type_error():
    def f(x, y, *, scale=1.0):
        return x * y * scale
    cf = kiln.compile(f, backend="eager")
    for bad in [((torch.randn(2),), {}), ((torch.randn(2), torch.randn(2)), {"shift": 1})]:
        with pytest.raises(TypeError) as eager_error:
            f(*bad[0], **bad[1])
        with pytest.raises(TypeError) as kiln_error:   # first call (no entry) ...
            cf(*bad[0], **bad[1])
        assert str(kiln_error.value) == str(eager_error.value)
    cf(torch.randn(2), torch.randn(2))
    with pytest.raises(TypeError) as kiln_error:       # ... and through a compiled entry
        cf(torch.randn(2))
    with pytest.raises(TypeError) as eager_error:
        f(torch.randn(2))
    assert str(kiln_error.value) == str(eager_error.value)


def test_constraint_violation_is_still_raised():
    def f(x):
        return x.view(4, 2) if x.shape[0] == 8 else x
    x = torch.randn(8)
    kiln.mark_dynamic(x, 0)
    with pytest.raises(kiln.ConstraintViolation):
        kiln.compile(f, backend="eager")(x)


# --------------------------------------------------------------------------- not compilable
def test_builtins_classes_and_c_callables_run_as_they_are(capsys):
    import functools

    assert kiln.compile(len, backend="eager")([1, 2, 3]) == 3
    assert kiln.compile(getattr, backend="eager")(torch, "add") is torch.add
    assert kiln.compile(int, backend="eager")("7") == 7
    torch.testing.assert_close(kiln.compile(torch.add, backend="eager")(torch.ones(2), 1), torch.full((2,), 2.0))
    torch.testing.assert_close(kiln.compile(functools.partial(torch.mul, 3), backend="eager")(torch.ones(2)),
                               torch.full((2,), 3.0))
    assert kiln.compile(str.upper, backend="eager")("ab") == "AB"
    assert kiln.compile((3).__add__, backend="eager")(4) == 7
    assert isinstance(kiln.compile(torch.nn.Linear, backend="eager")(2, 3), torch.nn.Linear)
    compiled = kiln.compile(len, backend="eager")
    assert compiled.entries == [] and compiled.original is len
    with pytest.raises(TypeError):
        compiled(3)                          # the builtin's own error
    assert kiln.compile(compiled, backend="eager").original is len
    kiln.set_logs("graph_breaks")
    kiln.compile(abs, backend="eager")(-1)
    assert "abs is a builtin function" in capsys.readouterr().err


def test_explain_of_a_builtin_says_why_nothing_is_captured():
    ex = kiln.explain(len)([1, 2])
    assert ex.out == 2 and ex.graph_count == 0
    (reason,) = ex.break_reasons
    assert reason.kind == "runs as it is" and "no Python bytecode" in reason.reason
    assert "runs as it is: len is a builtin function" in str(ex)


@pytest.mark.parametrize("backend", ["counter", "aot_eager", "inductor"])
def test_warnings_as_errors_do_not_fail_the_capture(backend):
    """Under the user's ``warnings.simplefilter("error")`` (pytest's ``-W error``), torch's own
    warnings while kiln converts inputs to fake tensors (a non-leaf's ``.grad`` is read) must
    not turn into an internal error that runs the frame eagerly."""
    import warnings

    def layer(x, w):
        return torch.tanh(x @ w)

    cnt = CompileCounter()
    f = kiln.compile(layer, backend=cnt if backend == "counter" else backend)
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4, requires_grad=True) * 2          # a non-leaf input
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = f(x, w)
        out.sum().backward()
    assert not any(e.is_eager for e in f.entries)
    if backend == "counter":
        assert cnt.frame_count == 1
    w2 = w.detach().clone().requires_grad_()
    want = layer(x.detach(), w2)
    want.sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(w.grad, w2.grad)
