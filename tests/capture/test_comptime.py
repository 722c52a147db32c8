"""comptime: Python run at capture time with a view of kiln's state (graph, locals, guards),
forced graph breaks and breakpoints; every comptime call is a no-op outside capture (eager,
and the compiled code at run time)."""
import builtins

import pytest
import torch

import kiln
from kiln import comptime
from kiln.testing import CompileCounter


def compiled(fn):
    cnt = CompileCounter()
    return kiln.compile(fn, backend=cnt), cnt


# --------------------------------------------------------------------------- context methods
def uses_print_graph(x):
    y = x * 2
    z = y.sin()
    comptime(lambda ctx: ctx.print_graph())
    return z + 1


def test_print_graph_shows_the_graph_so_far(capsys):
    cf, cnt = compiled(uses_print_graph)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), uses_print_graph(x))
    out = capsys.readouterr().out
    assert "def forward" in out and "mul" in out and "sin" in out
    assert "add" not in out            # z + 1 comes after the comptime call
    cf(torch.randn(3))
    assert capsys.readouterr().out == ""       # warm: no capture, nothing printed
    assert cnt.frame_count == 1


def uses_print_locals(x, n, name="abc"):
    y = x + n
    comptime(lambda ctx: ctx.print_locals())
    return y


def test_print_locals(capsys):
    cf, _ = compiled(uses_print_locals)
    cf(torch.randn(2, 3), 5)
    out = capsys.readouterr().out
    lines = dict(ln.split(" = ", 1) for ln in out.strip().splitlines())
    assert set(lines) == {"x", "n", "name", "y"}
    assert lines["n"] == "5" and lines["name"] == "'abc'"
    assert "float32[2, 3]" in lines["x"] and "L['x']" in lines["x"]
    assert "float32[2, 3]" in lines["y"]


def uses_get_local(x, n, flag):
    y = (x * n).to(torch.float64)
    comptime(lambda ctx: RECORD.append({
        "fake": ctx.get_local("y").as_fake(),
        "is_tensor": (ctx.get_local("y").is_tensor(), ctx.get_local("n").is_tensor()),
        "const": ctx.get_local("n").as_python_constant(),
        "flag": ctx.get_local("flag").as_python_constant(),
        "types": (ctx.get_local("n").python_type(), ctx.get_local("y").python_type(),
                  ctx.get_local("flag").python_type()),
        "sources": (ctx.get_local("x").source, ctx.get_local("y").source),
    }))
    return y


RECORD = []


def test_get_local_values():
    RECORD.clear()
    cf, _ = compiled(uses_get_local)
    cf(torch.randn(4, 2), 3, True)
    (rec,) = RECORD
    fake = rec["fake"]
    assert tuple(fake.shape) == (4, 2) and fake.dtype == torch.float64
    assert rec["is_tensor"] == (True, False)
    assert rec["const"] == 3 and rec["flag"] is True
    assert rec["types"] == (int, torch.Tensor, bool)
    x_source, y_source = rec["sources"]
    assert "x" in x_source.describe()
    assert y_source is None               # y is computed, not read from the inputs
    cf(torch.randn(4, 2), 3, True)
    assert len(RECORD) == 1               # warm: comptime does not run again


def uses_get_local_missing(x):
    comptime(lambda ctx: ctx.get_local("nope"))
    return x + 1


def test_get_local_missing_name_is_a_keyerror_at_capture():
    cf, _ = compiled(uses_get_local_missing)
    x = torch.randn(2)
    # the KeyError happens at capture time: either it reaches the caller, or the frame runs
    # eagerly with the error as its reason (the result is then right)
    try:
        out = cf(x)
    except KeyError as e:
        assert "nope" in str(e)
        return
    torch.testing.assert_close(out, x + 1)
    (entry,) = cf.entries
    assert entry.is_eager and "no local 'nope'" in str(entry.eager_reason)


def uses_print_guards(x, n):
    y = x * n
    comptime(lambda ctx: ctx.print_guards())
    return y


def test_print_guards(capsys):
    cf, _ = compiled(uses_print_guards)
    cf(torch.randn(3), 2)
    out = capsys.readouterr().out
    assert "TENSOR_MATCH" in out and "L['x']" in out
    assert "L['n'] == 2" in out


def uses_ctx_print(x):
    y = x.sum(0)
    comptime(lambda ctx: ctx.print(ctx.get_local("y")))
    comptime(lambda ctx: ctx.print("plain text"))
    return y


def test_ctx_print(capsys):
    cf, _ = compiled(uses_ctx_print)
    cf(torch.randn(2, 5))
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Tensor(") and "float32[5]" in out[0]
    assert out[1] == "plain text"


def uses_ctx_graph_break(x):
    y = x + 1
    comptime(lambda ctx: ctx.graph_break())
    return y * 2


def test_ctx_graph_break(capsys):
    cf, cnt = compiled(uses_ctx_graph_break)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(cf(x), uses_ctx_graph_break(x))
    assert cnt.frame_count == 2
    (entry,) = cf.entries
    assert entry.graph_break.construct == "comptime.graph_break()"
    assert entry.graph_break.lineno == uses_ctx_graph_break.__code__.co_firstlineno + 2


def uses_ctx_breakpoint(x):
    y = x * 3
    comptime(lambda ctx: ctx.breakpoint())
    return y


def uses_breakpoint_shortcut(x):
    y = x * 3
    comptime.breakpoint()
    return y


@pytest.mark.parametrize("fn", [uses_ctx_breakpoint, uses_breakpoint_shortcut], ids=["ctx", "shortcut"])
def test_breakpoint_calls_builtin_breakpoint_at_capture_only(fn, monkeypatch):
    calls = []
    monkeypatch.setattr(builtins, "breakpoint", lambda *a, **k: calls.append((a, k)))
    x = torch.randn(2)
    torch.testing.assert_close(fn(x), x * 3)
    assert calls == []                     # eager: nothing
    cf, cnt = compiled(fn)
    torch.testing.assert_close(cf(x), x * 3)
    assert len(calls) == 1                 # capture
    cf(torch.randn(2))
    assert len(calls) == 1                 # warm call: nothing
    assert cnt.frame_count == 1


# --------------------------------------------------------------------------- shortcuts
def uses_shortcuts(x, n):
    y = x.exp()
    comptime.print(y)
    comptime.print(n)
    comptime.print_graph()
    comptime.print_locals()
    comptime.print_guards()
    return y * n


def test_shortcut_methods(capsys):
    cf, cnt = compiled(uses_shortcuts)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x, 2), uses_shortcuts(x, 2))
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("Tensor(") and "float32[3]" in lines[0]
    assert lines[1] == "2"
    assert "def forward" in out and "exp" in out
    assert "y = Tensor(" in out and "n = 2" in out
    assert "TENSOR_MATCH" in out
    assert cnt.frame_count == 1


def uses_graph_break_shortcut(x):
    a = x + 1
    comptime.graph_break()
    b = a * 2
    comptime.graph_break()
    return b - 1


def test_graph_break_shortcut_counts_graphs(capsys):
    cf, cnt = compiled(uses_graph_break_shortcut)
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(cf(x), uses_graph_break_shortcut(x))
    assert cnt.frame_count == 3


def test_graph_break_counted_by_explain():
    ex = kiln.explain(uses_graph_break_shortcut)(torch.randn(4))
    assert ex.graph_count == 3 and ex.graph_break_count == 2
    assert [b.reason for b in ex.break_reasons] == ["comptime.graph_break()"] * 2
    first = uses_graph_break_shortcut.__code__.co_firstlineno
    assert [b.lineno for b in ex.break_reasons] == [first + 2, first + 4]


def test_graph_break_under_fullgraph_raises():
    cf = kiln.compile(uses_graph_break_shortcut, fullgraph=True, backend=CompileCounter())
    with pytest.raises(kiln.Unsupported, match=r"comptime\.graph_break\(\)"):
        cf(torch.randn(4))


# --------------------------------------------------------------------------- no-ops outside capture
ALL_CALLS = (
    lambda: comptime(lambda ctx: print("SHOULD NOT RUN")),
    lambda: comptime.print("SHOULD NOT RUN"),
    lambda: comptime.graph_break(),
    lambda: comptime.breakpoint(),
    lambda: comptime.print_graph(),
    lambda: comptime.print_locals(),
    lambda: comptime.print_guards(),
)


def test_every_call_is_a_noop_in_eager(capsys, monkeypatch):
    monkeypatch.setattr(builtins, "breakpoint", lambda *a, **k: pytest.fail("breakpoint called"))
    for call in ALL_CALLS:
        assert call() is None
    assert capsys.readouterr().out == ""
    assert repr(comptime) == "kiln.comptime"


def eager_and_compiled(x):
    comptime(lambda ctx: print("capture-time"))
    comptime.print(x)
    return x + 1


def test_noop_in_eager_and_at_run_time(capsys):
    x = torch.randn(2)
    eager_and_compiled(x)
    assert capsys.readouterr().out == ""
    cf, _ = compiled(eager_and_compiled)
    cf(x)
    out = capsys.readouterr().out
    assert out.startswith("capture-time\nTensor(")
    for _ in range(2):
        torch.testing.assert_close(cf(x), x + 1)
    assert capsys.readouterr().out == ""


# --------------------------------------------------------------------------- closures, helpers, breaks
def closed_over_argument(x):
    def g():
        return x

    comptime.print(x)
    return g() * 2


def test_print_closed_over_argument(capsys):
    cf, cnt = compiled(closed_over_argument)
    x = torch.randn(2, 2)
    torch.testing.assert_close(cf(x), x * 2)
    out = capsys.readouterr().out
    assert out.startswith("Tensor(") and "float32[2, 2]" in out and "L['x']" in out
    assert cnt.frame_count == 1


def closed_over_get_local(x, n):
    def g():
        return x + n

    comptime(lambda ctx: RECORD.append((ctx.get_local("x").as_fake().shape,
                                        ctx.get_local("n").as_python_constant())))
    return g()


def test_get_local_of_cell_variables():
    RECORD.clear()
    cf, _ = compiled(closed_over_get_local)
    x = torch.randn(5)
    torch.testing.assert_close(cf(x, 4), x + 4)
    assert RECORD == [(torch.Size([5]), 4)]


def comptime_helper(x):
    t = x * 2
    comptime(lambda ctx: RECORD.append((tuple(ctx.get_local("t").as_fake().shape),
                                        ctx.get_local("outer_local", stacklevel=1).as_python_constant())))
    return t


def calls_comptime_helper(x):
    outer_local = "hello"
    return comptime_helper(x) + len(outer_local)


def test_get_local_with_stacklevel_in_inlined_helper():
    RECORD.clear()
    cf, cnt = compiled(calls_comptime_helper)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), x * 2 + 5)
    assert RECORD == [((3,), "hello")]
    assert cnt.frame_count == 1


def module_level_comptime_fn(ctx):
    RECORD.append(tuple(ctx.get_local("x").as_fake().shape))


def uses_module_level_fn(x):
    comptime(module_level_comptime_fn)
    return x.cos()


def test_comptime_with_a_module_level_function():
    RECORD.clear()
    cf, _ = compiled(uses_module_level_fn)
    cf(torch.randn(6))
    assert RECORD == [(6,)]


def comptime_after_break(x):
    y = x + 1
    print("break")
    comptime(lambda ctx: ctx.print_graph())
    return y * 2


def test_comptime_in_a_continuation_sees_its_own_graph(capsys):
    cf, cnt = compiled(comptime_after_break)
    cf(torch.randn(3))
    out = capsys.readouterr().out
    assert out.startswith("break\n")
    graph_text = out[len("break\n"):]
    assert "def forward" in graph_text
    assert "add" not in graph_text          # x + 1 is in the graph before the break
    assert cnt.frame_count == 2


def test_print_fake_tensor_of_a_new_dtype(capsys):
    def f(x):
        y = x.to(torch.int32)
        comptime(lambda ctx: print(ctx.get_local("y").as_fake().dtype))
        return y

    cf, _ = compiled(f)
    cf(torch.randn(3))
    assert capsys.readouterr().out.strip() == "torch.int32"


def probe_as_fake_of_int(ctx):
    try:
        ctx.get_local("n").as_fake()
    except TypeError as e:
        RECORD.append(str(e))


def uses_probe(x, n):
    comptime(probe_as_fake_of_int)
    return x * n


def test_as_fake_of_a_non_tensor_raises_at_capture():
    RECORD.clear()
    cf, _ = compiled(uses_probe)
    x = torch.randn(2)
    torch.testing.assert_close(cf(x, 3), x * 3)
    assert len(RECORD) == 1 and "not a tensor" in RECORD[0]


# --------------------------------------------------------------------------- closures
# A callback defined in the compiled function is a closure over its locals (their cells):
# it runs at capture time with the values the capture knows.
def callback_closes_over_cells(x):
    scale = 3
    y = x * scale
    seen = []

    def inner():                      # makes `y` a cell variable too
        return y

    def callback(ctx, tag="default"):
        seen.append(scale)
        RECORD.append((tag, scale * 2, seen, ctx.get_local("y").is_tensor(), type(y).__name__))
    comptime(callback)
    return inner() + len(seen)        # the callback's effect on `seen` is capture time only


def test_callback_closing_over_cell_variables_runs_at_capture():
    RECORD.clear()
    cf, cnt = compiled(callback_closes_over_cells)
    x = torch.randn(3)
    torch.testing.assert_close(cf(x), callback_closes_over_cells(x))
    assert RECORD == [("default", 6, [3], True, "ComptimeVar")]
    assert cnt.frame_count == 1


def callback_after_a_break(x):
    y = x + 1

    def inner():
        return y
    print("", end="")                 # the rest is a continuation: y travels as a cell
    comptime(lambda ctx: RECORD.append(("after break", ctx.get_local("y").is_tensor())))
    comptime(lambda ctx: ctx.print_locals())
    return inner() * 2


def test_callback_in_a_continuation_sees_cell_variables(capsys):
    RECORD.clear()
    cf, cnt = compiled(callback_after_a_break)
    x = torch.randn(2)
    torch.testing.assert_close(cf(x), (x + 1) * 2)
    assert RECORD == [("after break", True)]
    names = [ln.split(" = ", 1)[0] for ln in capsys.readouterr().out.strip().splitlines()]
    assert set(names) == {"x", "y", "inner"}          # no kiln temporaries (___stack, ___cell_)
    assert cnt.frame_count == 2


def _inlined_callee(x):
    z = x.cos()

    def keep():
        return z
    comptime(lambda ctx: RECORD.append(("callee", ctx.get_local("z").is_tensor(),
                                        ctx.get_local("x", stacklevel=1).is_tensor())))
    return keep()


def calls_callee_with_comptime(x):
    return _inlined_callee(x) + 1


def test_callback_in_an_inlined_callee_with_a_closure():
    RECORD.clear()
    cf, cnt = compiled(calls_callee_with_comptime)
    x = torch.randn(2)
    torch.testing.assert_close(cf(x), x.cos() + 1)
    assert RECORD == [("callee", True, True)]
    assert cnt.frame_count == 1


def callback_raises(x):
    comptime(lambda ctx: ctx.get_local("no_such_local"))
    return x + 1


def test_an_error_in_the_callback_is_the_users():
    cf, _ = compiled(callback_raises)
    with pytest.raises(KeyError, match="no_such_local"):
        cf(torch.randn(2))


def test_a_callback_closing_over_a_free_variable_of_the_compiled_function_runs_on_it():
    """``seen`` lives in the caller's frame (a free variable of ``f``): the callback appends
    to that very list at capture time, as a comptime callback does to a global."""
    import torch

    import kiln
    from kiln import comptime

    def outer():
        seen = []

        def f(x):
            comptime(lambda ctx: seen.append("ran"))
            return x + 1
        out = kiln.compile(f, backend="eager")(torch.ones(2))
        return seen, out
    seen, out = outer()
    assert seen == ["ran"]
    torch.testing.assert_close(out, torch.full((2,), 2.0))
