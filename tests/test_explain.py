"""kiln.explain: graphs, graph/break counts, break reasons with file/line/source line, guards,
ops per graph, the result, the readable report, and no compiled entries left behind."""
import collections
import os

import pytest
import torch
from torch import nn

import kiln
from kiln import comptime
from kiln.explain import BreakReason, ExplainOutput
from kiln.testing import CompileCounter

THIS_FILE = os.path.abspath(__file__)


def _line(fn, offset):
    return fn.__code__.co_firstlineno + offset


# --------------------------------------------------------------------------- functions
def no_break(x, y):
    return torch.relu(x) @ y + 1


def one_print(x):
    y = x + 1
    print("one_print")
    return y * 2


def helper_prints(t):
    u = t * 3
    print("helper_prints")
    return u + 1


def mixed(x, k):
    y = x + 1
    print("mixed")
    z = helper_prints(y)
    n = k.item()
    return z * n


def comptime_breaks(x):
    y = x.sin()
    comptime.graph_break()
    return y.cos()


def no_tensor_ops(a, b):
    print("no tensor ops")
    return a + b


def generator_fn(x):
    yield x + 1


def kwarg_item(x, k):
    y = x * 2
    return torch.add(y, 1, alpha=k.item())


def branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


class PrintingNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x).relu()
        print("PrintingNet")
        return self.b(h)


# --------------------------------------------------------------------------- tests
def test_no_break_single_graph():
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    ex = kiln.explain(no_break)(x, y)
    assert isinstance(ex, ExplainOutput)
    assert ex.graph_count == 1 and len(ex.graphs) == 1
    assert ex.graph_break_count == 0 and ex.break_reasons == []
    assert ex.ops_per_graph == [3]
    torch.testing.assert_close(ex.out, no_break(x, y))
    assert all(isinstance(g, torch.fx.GraphModule) for g in ex.graphs)
    kinds = {g.describe().split()[0] for g in ex.guards}
    assert "TENSOR_MATCH" in kinds


def test_one_break_reason_with_location(capsys):
    x = torch.randn(4)
    ex = kiln.explain(one_print)(x)
    assert capsys.readouterr().out == "one_print\n"        # the call ran once
    torch.testing.assert_close(ex.out, one_print(x))
    assert ex.graph_count == 2 and ex.ops_per_graph == [1, 1]
    assert ex.graph_break_count == 1
    (b,) = ex.break_reasons
    assert isinstance(b, BreakReason)
    assert b.kind == "graph break"
    assert "print()" in b.reason
    assert os.path.abspath(b.filename) == THIS_FILE
    assert b.lineno == _line(one_print, 2)
    assert b.source_line.strip() == 'print("one_print")'


def test_break_reasons_in_order_including_inlined_helper(capsys):
    x, k = torch.randn(4), torch.tensor(3.0)
    ex = kiln.explain(mixed)(x, k)
    torch.testing.assert_close(ex.out, mixed(x, k))
    # graphs: x + 1 | t * 3 (helper) | u + 1 (helper's continuation) | z * n
    assert ex.graph_count == 4 and ex.ops_per_graph == [1, 1, 1, 1]
    lines = [(b.lineno, b.source_line.strip()) for b in ex.break_reasons]
    helper_line = (_line(helper_prints, 2), 'print("helper_prints")')
    # the outer frame breaks at the call of the helper (located at the print inside it), and
    # the helper, compiled as its own function, breaks at that same print: one break
    assert lines == [(_line(mixed, 2), 'print("mixed")'), helper_line,
                     (_line(mixed, 4), "n = k.item()")]
    assert ex.graph_break_count == len(ex.break_reasons) == 3
    assert "item()" in ex.break_reasons[-1].reason
    assert all(b.kind == "graph break" for b in ex.break_reasons)


def test_report_string_contains_counts_reasons_graphs_and_guards(capsys):
    ex = kiln.explain(one_print)(torch.randn(4))
    report = str(ex)
    assert repr(ex) == report
    assert "Graph count: 2" in report
    assert "Graph break count: 1" in report
    assert "Ops per graph: [1, 1]" in report
    assert "print()" in report
    assert f"{THIS_FILE}:{_line(one_print, 2)}" in report or f"test_explain.py:{_line(one_print, 2)}" in report
    assert 'print("one_print")' in report
    assert "Graph 1:" in report and "Graph 2:" in report
    assert "def forward" in report
    assert f"Guards ({len(ex.guards)}):" in report
    assert "TENSOR_MATCH" in report


def test_report_without_breaks_has_no_reason_section():
    report = str(kiln.explain(no_break)(torch.randn(2, 2), torch.randn(2, 2)))
    assert "Graph break count: 0" in report and "Break reasons" not in report


def test_leaves_no_entries_behind(capsys):
    kiln.explain(mixed)(torch.randn(4), torch.tensor(2.0))
    # a fresh compile captures everything again: nothing reused from the explain run
    cnt = CompileCounter()
    cf = kiln.compile(mixed, backend=cnt)
    cf(torch.randn(4), torch.tensor(2.0))
    assert cnt.frame_count == 4
    assert len(cf.entries) == 1
    assert kiln.explain(mixed)(torch.randn(4), torch.tensor(2.0)).graph_count == 4


def test_explain_does_not_touch_existing_compiled_entries(capsys):
    cnt = CompileCounter()
    cf = kiln.compile(one_print, backend=cnt)
    cf(torch.randn(4))
    before = list(cf.entries)
    ex = kiln.explain(one_print)(torch.randn(4))
    assert ex.graph_count == 2
    assert cf.entries == before
    cf(torch.randn(4))
    assert cnt.frame_count == 2          # still warm, on both sides of the break
    assert cf.entries == before


def test_explain_twice_gives_the_same_answer(capsys):
    a = kiln.explain(mixed)(torch.randn(4), torch.tensor(2.0))
    b = kiln.explain(mixed)(torch.randn(4), torch.tensor(2.0))
    assert (a.graph_count, a.graph_break_count, a.ops_per_graph) == (b.graph_count, b.graph_break_count,
                                                                     b.ops_per_graph)
    assert [(r.reason, r.lineno) for r in a.break_reasons] == [(r.reason, r.lineno) for r in b.break_reasons]


def test_comptime_graph_break_is_counted():
    x = torch.randn(4)
    ex = kiln.explain(comptime_breaks)(x)
    torch.testing.assert_close(ex.out, comptime_breaks(x))
    assert ex.graph_count == 2 and ex.graph_break_count == 1
    (b,) = ex.break_reasons
    assert b.reason == "comptime.graph_break()"
    assert b.lineno == _line(comptime_breaks, 2)
    assert b.source_line.strip() == "comptime.graph_break()"


def test_break_without_tensor_ops_has_no_graphs(capsys):
    ex = kiln.explain(no_tensor_ops)(2, 3)
    assert ex.out == 5
    assert ex.graph_count == 0 and ex.graphs == [] and ex.ops_per_graph == []
    assert ex.graph_break_count == 1


def test_frame_running_eagerly_is_reported():
    ex = kiln.explain(generator_fn)(torch.randn(2))
    assert ex.graph_count == 0
    (b,) = ex.break_reasons
    assert b.kind == "frame runs eagerly"
    assert "generator" in b.reason
    assert ex.graph_break_count == 1
    assert "frame runs eagerly" in str(ex)
    assert list(ex.out)[0].shape == (2,)


def test_unplannable_break_is_reported_as_eager_frame():
    x, k = torch.randn(3), torch.tensor(2.0)
    ex = kiln.explain(kwarg_item)(x, k)
    torch.testing.assert_close(ex.out, kwarg_item(x, k))
    kinds = [b.kind for b in ex.break_reasons]
    assert kinds in (["frame runs eagerly"], ["graph break"])
    assert "item()" in ex.break_reasons[0].reason
    assert ex.break_reasons[0].lineno == _line(kwarg_item, 2)


def test_data_dependent_branch(capsys):
    x = torch.rand(4) + 1
    ex = kiln.explain(branch)(x)
    torch.testing.assert_close(ex.out, x + 1)
    assert ex.graph_count == 2 and ex.graph_break_count == 1
    assert "truth value" in ex.break_reasons[0].reason
    assert ex.break_reasons[0].source_line.strip() == "if x.sum() > 0:"


def test_explain_module_and_kwargs(capsys):
    net = PrintingNet()
    x = torch.randn(2, 4)
    ex = kiln.explain(net)(x=x)
    torch.testing.assert_close(ex.out, net(x))
    # the module call breaks at forward (located at its print), and forward, compiled as its
    # own function, breaks at that same print: one break
    assert ex.graph_count == 2 and ex.graph_break_count == 1
    assert [b.lineno for b in ex.break_reasons] == [_line(PrintingNet.forward, 2)]
    # linear + relu | linear
    assert ex.ops_per_graph == [2, 1]


def test_guards_cover_every_frame(capsys):
    ex = kiln.explain(one_print)(torch.randn(4))
    described = [g.describe() for g in ex.guards]
    assert any("one_print" in d for d in described)
    assert any("__kiln_resume_one_print" in d for d in described)


def test_explain_rejects_non_callable():
    with pytest.raises(TypeError):
        kiln.explain(42)


def test_explain_propagates_user_exception():
    def bad(x):
        return x + "a"

    with pytest.raises(TypeError):
        kiln.explain(bad)(torch.randn(2))


def test_explain_output_fields_are_consistent(capsys):
    ex = kiln.explain(mixed)(torch.randn(4), torch.tensor(1.0))
    assert ex.graph_count == len(ex.graphs) == len(ex.ops_per_graph)
    assert ex.graph_break_count == len(ex.break_reasons)
    for g, n in zip(ex.graphs, ex.ops_per_graph):
        assert n == sum(1 for node in g.graph.nodes if node.op in ("call_function", "call_method", "call_module"))
    counts = collections.Counter(b.kind for b in ex.break_reasons)
    assert set(counts) <= {"graph break", "frame runs eagerly"}
