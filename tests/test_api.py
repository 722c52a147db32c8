"""kiln.compile's entry points, the eager fallback, fullgraph errors and misuse."""
import copy
import functools
import re
import warnings

import pytest
import torch

import kiln
from kiln.testing import CompileCounter, assert_same


def _f(x, y):
    return torch.sin(x) + y


def test_function_decorator_forms():
    cnt = CompileCounter()

    @kiln.compile(backend="eager")
    def a(x):
        return x * 2

    @kiln.compile(backend=cnt)
    def b(x):
        return x * 3

    x = torch.randn(3)
    assert_same(a(x), x * 2)
    assert_same(b(x), x * 3)
    assert cnt.frame_count == 1
    assert isinstance(a, kiln.CompiledFunction) and a.__name__ == "a"


def test_bound_method_and_callable_object():
    class Scaler:
        def __init__(self, k):
            self.k = k

        def apply(self, x):
            return x * self.k

        def __call__(self, x):
            return x + self.k

    cnt = CompileCounter()
    s = Scaler(3.0)
    x = torch.randn(4)
    assert_same(kiln.compile(s.apply, backend=cnt)(x), s.apply(x))
    assert_same(kiln.compile(s, backend=cnt)(x), s(x))
    assert cnt.frame_count == 2


def test_compiled_module_shares_state():
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    cnt = CompileCounter()
    cm = kiln.compile(m, backend=cnt)
    assert isinstance(cm, torch.nn.Module)
    assert list(cm.state_dict()) == list(m.state_dict())
    assert all(p is q for p, q in zip(cm.parameters(), m.parameters()))
    x = torch.randn(3, 4)
    assert_same(cm(x), m(x))
    with torch.no_grad():  # an in-place update of a parameter is seen without recompiling
        m[0].weight.add_(1.0)
    assert_same(cm(x), m(x))
    sd = {k: torch.randn_like(v) for k, v in m.state_dict().items()}
    cm.load_state_dict(sd)
    assert torch.equal(m[0].weight, sd["0.weight"])
    assert_same(cm(x), m(x))
    assert cnt.frame_count == 1
    assert cm[0] is m[0] and cm.training == m.training


class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.step = 10

    def forward(self, x):
        return self.lin(x) + self.step


def test_attributes_written_on_the_compiled_module_are_the_modules():
    """As torch.compile's wrapper: the forward reads what the user wrote through the wrapper."""
    m = Counting()
    cm = kiln.compile(m, backend="eager")
    x = torch.randn(3, 2)
    assert_same(cm(x), m(x))
    cm.step += 1
    assert m.step == 11 and cm.step == 11
    assert_same(cm(x), m.lin(x) + 11)
    cm.tag = "new"
    assert m.tag == "new"
    del cm.tag
    assert not hasattr(m, "tag")
    cm.eval()
    assert not m.training and not cm.training
    cm.training = True
    assert m.training and cm.training
    assert {"lin", "step", "compiled_function"} <= set(dir(cm))


def test_a_deep_copy_of_a_compiled_module_copies_the_module():
    m = Counting()
    cm = kiln.compile(m, backend="eager")
    x = torch.randn(3, 2)
    cm(x)
    twin = copy.deepcopy(cm)
    assert type(twin) is type(cm) and twin._orig_mod is not m
    with torch.no_grad():
        twin.lin.weight.add_(1.0)
    assert_same(twin(x), twin._orig_mod(x))
    assert_same(cm(x), m(x))
    assert not torch.equal(twin(x), cm(x))


def test_module_training_step_gradients_match_eager():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ref.load_state_dict(m.state_dict())
    cm = kiln.compile(m, backend="eager")
    x = torch.randn(5, 4)
    cm(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_compile_partial():
    cnt = CompileCounter()
    p = kiln.compile(functools.partial(_f, y=torch.ones(3)), backend=cnt)
    x = torch.randn(3)
    assert_same(p(x), _f(x, torch.ones(3)))
    assert cnt.frame_count == 1


def test_reset_drops_entries():
    cnt = CompileCounter()
    cf = kiln.compile(_f, backend=cnt)
    x = torch.randn(3)
    cf(x, x.clone())
    cf(x, x.clone())
    assert cnt.frame_count == 1
    kiln.reset()
    assert cf.entries == []
    cf(x, x.clone())
    assert cnt.frame_count == 2


@pytest.mark.parametrize("bad, exc, pattern", [
    (3, TypeError, "expects a Python function"),
    ("f", TypeError, "expects a Python function"),
])
def test_misuse_raises_clear_errors(bad, exc, pattern):
    with pytest.raises(exc, match=pattern):
        kiln.compile(bad, backend="eager")


def test_bad_options():
    with pytest.raises(ValueError, match="unknown kiln backend 'nope'.*available: .*eager"):
        kiln.compile(_f, backend="nope")
    with pytest.raises(TypeError, match="backend must be"):
        kiln.compile(_f, backend=3)
    with pytest.raises(ValueError, match="unknown mode"):
        kiln.compile(_f, mode="fast", backend="eager")
    with pytest.raises(ValueError, match="dynamic must be"):
        kiln.compile(_f, dynamic="yes", backend="eager")
    with pytest.raises(TypeError, match="options must be a dict"):
        kiln.compile(_f, options=[1], backend="eager")


def test_backend_returning_non_callable_is_reported():
    cf = kiln.compile(_f, backend=lambda gm, ex: 3)
    with pytest.raises(TypeError, match="not a callable"):
        cf(torch.randn(2), torch.randn(2))


def test_user_type_error_is_the_users():
    cf = kiln.compile(_f, backend="eager")
    with pytest.raises(TypeError):
        cf(torch.randn(2))


def _prints(x):
    y = x + 1
    print("hello")
    return y * 2


def test_print_breaks_the_graph_and_both_sides_compile(capsys):
    cnt = CompileCounter()
    cf = kiln.compile(_prints, backend=cnt)
    kiln.set_logs("graph_breaks")
    x = torch.randn(3)
    assert_same(cf(x), _prints(x))
    err = capsys.readouterr().err
    assert "graph break in _prints" in err and "print()" in err and "test_api.py" in err
    assert cnt.frame_count == 2          # x + 1 before the print, y * 2 after it
    (entry,) = cf.entries
    assert "print" in str(entry.graph_break) and not entry.is_eager
    y = torch.randn(3)
    assert_same(cf(y), _prints(y))       # warm: no capture on either side of the break
    assert cnt.frame_count == 2
    assert "hello" in capsys.readouterr().out


def test_fullgraph_raises_unsupported_with_location():
    cf = kiln.compile(_prints, fullgraph=True, backend="eager")
    with pytest.raises(kiln.Unsupported) as info:
        cf(torch.randn(3))
    e = info.value
    assert "print()" in str(e)
    assert e.filename.endswith("test_api.py") and e.lineno == _prints.__code__.co_firstlineno + 2
    assert 'print("hello")' in str(e)


def _data_dependent(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def test_tensor_dependent_branch_falls_back_to_eager():
    cf = kiln.compile(_data_dependent, backend="eager")
    for _ in range(3):
        x = torch.randn(4)
        assert_same(cf(x), _data_dependent(x))
    with pytest.raises(kiln.Unsupported, match="truth value of a tensor"):
        kiln.compile(_data_dependent, fullgraph=True, backend="eager")(torch.randn(4))


def _item(x):
    return x * x.sum().item()


def test_item_falls_back_to_eager():
    x = torch.randn(4)
    assert_same(kiln.compile(_item, backend="eager")(x), _item(x))
    with pytest.raises(kiln.Unsupported, match=r"item\(\)"):
        kiln.compile(_item, fullgraph=True, backend="eager")(x)


def _gen(x):
    yield x + 1


async def _coro(x):
    return x + 1


def test_generators_and_coroutines_run_eagerly():
    x = torch.randn(2)
    out = list(kiln.compile(_gen, backend="eager")(x))
    assert_same(out, [x + 1])
    with pytest.raises(kiln.Unsupported, match="generator"):
        kiln.compile(_gen, fullgraph=True, backend="eager")(x)
    with pytest.raises(kiln.Unsupported, match="coroutine"):
        kiln.compile(_coro, fullgraph=True, backend="eager")(x)
    import asyncio

    assert_same(asyncio.run(kiln.compile(_coro, backend="eager")(x)), x + 1)


def test_mutation_of_input_list_and_dict_is_replayed():
    def f(xs, d, x):
        xs.append(x * 2)
        d["y"] = x + 1
        del d["drop"]
        return len(xs)

    cnt = CompileCounter()
    cf = kiln.compile(f, backend=cnt, fullgraph=True)
    x = torch.randn(3)
    xs, d = [x], {"drop": 1, "keep": 2}
    xs2, d2 = [x], {"drop": 1, "keep": 2}
    assert cf(xs, d, x) == f(xs2, d2, x)
    assert_same(xs, xs2)
    assert_same(d, d2)
    assert cnt.frame_count == 1


def test_returned_object_identity_is_kept():
    def f(x):
        lst = [x + 1]
        return lst, lst, x

    out = kiln.compile(f, fullgraph=True, backend="eager")(x := torch.randn(2))
    assert out[0] is out[1] and out[2] is x


def test_in_place_op_on_input_returns_the_input():
    def f(x):
        y = x.add_(1)
        return y, y is x

    x = torch.zeros(3)
    y, same = kiln.compile(f, fullgraph=True, backend="eager")(x)
    assert y is x and same is True and torch.equal(x, torch.ones(3))


def test_no_recapture_on_warm_calls():
    cnt = CompileCounter()
    cf = kiln.compile(_f, backend=cnt)
    for _ in range(20):
        cf(torch.randn(3), torch.randn(3))
    assert cnt.frame_count == 1 and len(cf.entries) == 1


def test_keyword_arguments_named_as_kilns_own_parameters_reach_the_function():
    """``self``, ``module`` and ``fn`` are the user's keywords, not the wrappers'."""
    f = kiln.compile(lambda **kw: kw["self"] + kw["fn"] * 2, backend="eager")
    x = torch.randn(3)
    assert_same(f(self=x, fn=x), x + x * 2)

    class TakesModule(torch.nn.Module):
        def forward(self, module=None, fn=None):
            return module * 2 + fn

    m = TakesModule()
    assert_same(kiln.compile(m, backend="eager")(module=x, fn=x), m(module=x, fn=x))


def test_torch_jit_trace_of_a_compiled_function_traces_the_function():
    # (under the tracer sizes are traced values: the call runs as it is, nothing is captured)
    counter = kiln.testing.CompileCounter()

    def f(x):
        return x * 2 + x.shape[0]

    compiled = kiln.compile(f, backend=counter, dynamic=True)
    traced = torch.jit.trace(compiled, torch.randn(3), check_trace=False)
    x = torch.randn(3)
    torch.testing.assert_close(traced(x), f(x))
    assert counter.frame_count == 0
    torch.testing.assert_close(compiled(x), f(x))
    assert counter.frame_count == 1


def test_compiling_a_compiled_object_compiles_its_original():
    """As torch.compile takes a compiled module: the original, under the new settings."""
    counter = kiln.testing.CompileCounter()
    twice = kiln.compile(kiln.compile(_f, backend="eager"), backend=counter)
    a, b = torch.randn(2), torch.randn(2)
    torch.testing.assert_close(twice(a, b), _f(a, b))
    assert counter.frame_count == 1 and twice.original is _f
    lin = torch.nn.Linear(3, 3)
    again = kiln.compile(kiln.compile(lin, backend="eager"), backend=counter)
    x = torch.randn(2, 3)
    torch.testing.assert_close(again(x), lin(x))
    assert again._orig_mod is lin
    assert kiln.compile(kiln.compile(len, backend="eager"), backend="eager")([1, 2]) == 2


def test_defaults_changed_in_place_after_the_first_call_are_seen():
    """``f.__kwdefaults__["k"] = 5`` and a compiled partial's ``keywords`` changed in place
    take effect at the next call, as in eager (the entry's signature held the old values)."""
    def f(x, *, k=2):
        return x * k

    c = kiln.compile(f, backend="eager")
    x = torch.ones(2)
    assert_same(c(x), x * 2)
    f.__kwdefaults__["k"] = 5
    assert_same(c(x), x * 5)
    p = functools.partial(lambda x, k: x * k, k=2)
    cp = kiln.compile(p, backend="eager")
    assert_same(cp(x), x * 2)
    p.keywords["k"] = 6
    assert_same(cp(x), x * 6)
    assert_same(cp(x, k=3), x * 3)


def test_compiled_methods_and_forwards_keep_their_signature():
    """``inspect.signature`` of ``kiln.compile(model.forward)`` and of a compiled module's
    ``forward`` is the original forward's: Hugging Face's ``generate`` checks the keyword
    arguments it passes (``pixel_values``) against it and refused them."""
    import inspect

    class M(torch.nn.Module):
        def forward(self, input_ids=None, pixel_values=None, *, attention_mask=None, **kwargs):
            return input_ids * 2

    m = M()
    want = inspect.signature(m.forward)
    method = kiln.compile(m.forward, backend="eager")
    module = kiln.compile(m, backend="eager")
    assert inspect.signature(method) == want
    assert inspect.signature(module.forward) == want
    assert method.__name__ == "forward"
    x = torch.arange(3)
    assert_same(method(x), x * 2)
    assert_same(module.forward(x), x * 2)
    assert_same(module(input_ids=x), x * 2)
