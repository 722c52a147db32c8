"""Constructs from real model code (Hugging Face transformers) that kiln got wrong or broke on.

Each case compiles a small function with a counting backend, runs it on fresh inputs, compares
with eager and asserts the number of graphs (and that a warm call compiles nothing new).
"""
from __future__ import annotations

import collections
import contextvars
import dataclasses
import functools
import inspect

import pytest
import torch

import kiln
from kiln.testing import CompileCounter, assert_same


def run_twice(fn, make_args, graphs, *, same_as=None):
    """Compile ``fn``, call it twice on fresh arguments, compare each result with ``same_as``
    (default: ``fn`` run eagerly); ``graphs`` graphs on the first call, none new after."""
    counter = CompileCounter()
    compiled = kiln.compile(fn, backend=counter)
    reference = same_as or fn
    first = None
    for call in range(2):
        args = make_args()
        assert_same(compiled(*args), reference(*args), path=f"call{call}")
        if call == 0:
            first = counter.frame_count
            assert first == graphs, f"expected {graphs} graph(s), got {first}"
        else:
            assert counter.frame_count == first, "a warm call compiled again"
    return compiled


def breaks_of(fn, *args):
    ex = kiln.explain(fn)(*args)
    return ex.graph_count, [b.reason for b in ex.break_reasons], [b.kind for b in ex.break_reasons]


# -- a method implemented in C on an object (transformers' ContextVar.set) -------------------

_var = contextvars.ContextVar("kiln_test_var", default=None)


def set_context_var(x):
    y = x * 2
    _var.set(3)
    return y + 1


def test_c_method_of_an_object_breaks_the_graph_instead_of_recursing():
    # was: "capture of set_context_var recursed too deeply", the whole frame eager
    count, reasons, kinds = breaks_of(set_context_var, torch.randn(3))
    assert count == 2 and kinds == ["graph break"] and "ContextVar.set" in reasons[0]
    _var.set(None)
    run_twice(set_context_var, lambda: (torch.randn(3),), graphs=2)
    assert _var.get() == 3  # the call ran (natively)


# -- a functools.wraps wrapper (transformers' @can_return_tuple, @capture_outputs) -----------

def _passthrough(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


@_passthrough
def wrapped(x, scale=2.0):
    return x * scale


def test_wrapper_is_bound_with_its_own_signature_not_the_wrapped_one():
    # was: the arguments were bound to wrapped's (x, scale), the code reads (args, kwargs):
    # NameError from the generated entry
    run_twice(wrapped, lambda: (torch.randn(3),), graphs=1)
    run_twice(lambda x: wrapped(x, scale=3.0), lambda: (torch.randn(3),), graphs=1)


# -- torch.compiler.is_compiling() -------------------------------------------------------------

class _CompileableVar:
    """transformers' CompileableContextVar: a global under a compiler, a ContextVar else."""

    def __init__(self):
        self.var = contextvars.ContextVar("kiln_test_compileable", default=None)
        self.value = None

    def set(self, value):
        if torch.compiler.is_compiling():
            self.value = value
            return None
        return self.var.set(value)


_compileable = _CompileableVar()


def uses_compiler_path(x):
    _compileable.set(x.shape[0])
    return x + 1


def branches_on_is_compiling(x):
    if torch.compiler.is_compiling():
        x = x + 1
    return x


def branches_on_is_dynamo_compiling(x):
    if torch.compiler.is_dynamo_compiling():  # only TorchDynamo: stays False under kiln
        x = x * 100
    return x


def test_is_compiling_is_true_during_capture_like_torch_compile():
    # library code takes the path it wrote for compilers: no ContextVar, no graph break
    count, reasons, _ = breaks_of(uses_compiler_path, torch.randn(3))
    assert (count, reasons) == (1, [])
    run_twice(uses_compiler_path, lambda: (torch.randn(3),), graphs=1)
    assert _compileable.value == 3
    # the same answer as torch.compile
    dynamo = torch.compile(branches_on_is_compiling, backend="eager")
    run_twice(branches_on_is_compiling, lambda: (torch.randn(3),), graphs=1, same_as=dynamo)
    torch._dynamo.reset()
    run_twice(branches_on_is_dynamo_compiling, lambda: (torch.randn(3),), graphs=0)  # returns x


def device_kinds(x):
    # torch.utils._foreach_utils (every foreach optimizer step) lists the device kinds
    names = ["cuda", "xpu", torch._C._get_privateuse1_backend_name()]
    return x + len(names[-1])


def test_the_out_of_tree_device_name_is_read_at_capture():
    count, reasons, _ = breaks_of(device_kinds, torch.randn(3))
    assert (count, reasons) == (1, [])
    run_twice(device_kinds, lambda: (torch.randn(3),), graphs=1)


# -- attributes that a tensor does not have --------------------------------------------------

def tensor_attrs(x):
    y = x * 2
    a = hasattr(y, "jax")            # transformers.utils.import_utils.is_jax_jitting
    b = hasattr(x, "jax")
    c = getattr(y, "scale", 3.0)
    return y + a + b + c


def test_missing_tensor_attribute_is_an_attribute_error():
    # was: "unknown tensor attribute 'jax'", a graph break at each hasattr
    run_twice(tensor_attrs, lambda: (torch.randn(3),), graphs=1)


def test_tensor_instance_attribute_is_read_and_guarded():
    f = kiln.compile(tensor_attrs, backend="eager")
    plain, tagged = torch.randn(3), torch.randn(3)
    tagged.jax = True
    assert_same(f(plain), tensor_attrs(plain))
    assert_same(f(tagged), tensor_attrs(tagged))   # hasattr(x, "jax") is now True: recompiles
    assert_same(f(plain), tensor_attrs(plain))


# -- getattr(obj, name, default) guards the absence --------------------------------------------

class _Holder:
    pass


def getattr_default(x, holder):
    return x * getattr(holder, "scale", 2.0) + getattr(x, "shift", 0.0)


def test_getattr_default_guards_that_the_attribute_stays_absent():
    # was: no guard, so the default stayed baked in after the attribute appeared (wrong answer)
    f = kiln.compile(getattr_default, backend="eager")
    holder, x = _Holder(), torch.randn(3)
    assert_same(f(x, holder), getattr_default(x, holder))
    holder.scale = 5.0
    assert_same(f(x, holder), getattr_default(x, holder))
    x.shift = 1.0
    assert_same(f(x, holder), getattr_default(x, holder))


# -- attributes of a dict-subclass dataclass (transformers' ModelOutput) -----------------------

@dataclasses.dataclass
class _Output(collections.OrderedDict):
    hidden: torch.Tensor | None = None
    extra: torch.Tensor | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                collections.OrderedDict.__setitem__(self, field.name, value)


def read_output(out):
    return out.hidden[:, 0] * 2 + out["hidden"].sum()


def read_missing_field(out):
    return out.extra


def test_dict_subclass_fields_are_attributes_not_methods():
    # was: out.hidden became "Method(...hidden)" (the dataclass default on the class), and
    # indexing it broke the graph
    assert breaks_of(read_output, _Output(hidden=torch.randn(2, 3))) == (1, [], [])
    run_twice(read_output, lambda: (_Output(hidden=torch.randn(2, 3)),), graphs=1)
    run_twice(read_missing_field, lambda: (_Output(hidden=torch.randn(2, 3)),), graphs=0)


# -- hasattr on an nn.Module for an attribute it does not have ---------------------------------

def module_hasattr(m, x):
    if hasattr(m, "_loss_function"):    # transformers' PreTrainedModel.loss_function
        x = x + 1
    return m(x) * getattr(m, "_scale", 2.0)


def test_missing_module_attribute_needs_no_break_and_is_guarded():
    # was: Module.__getattr__ was inlined and its `raise AttributeError(...)` broke the graph
    lin = torch.nn.Linear(3, 3)
    count, reasons, _ = breaks_of(module_hasattr, lin, torch.randn(3))
    assert (count, reasons) == (1, [])
    run_twice(module_hasattr, lambda: (lin, torch.randn(3)), graphs=1)
    f = kiln.compile(module_hasattr, backend="eager")
    x = torch.randn(3)
    lin._loss_function = None
    lin._scale = 5.0
    with torch.no_grad():
        assert_same(f(lin, x), module_hasattr(lin, x))



# -- hasattr on a dict subclass whose instance has attributes (diffusers' FrozenDict) -----------

class _FrozenConfig(collections.OrderedDict):
    """Its items are also attributes (diffusers' FrozenDict, a model's config)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for key, value in self.items():
            setattr(self, key, value)


_CONFIG = _FrozenConfig(scale=2.0)


def config_hasattr(x):
    # diffusers' ModelMixin.__getattr__ asks this of its config for every attribute it misses
    if hasattr(_CONFIG, "_diffusers_hook"):
        x = x - 1
    return x * (_CONFIG.scale if hasattr(_CONFIG, "scale") else 1.0) + getattr(_CONFIG, "shift", 0.5)


def test_missing_attribute_of_a_dict_subclass_instance_needs_no_break_and_is_guarded():
    count, reasons, _ = breaks_of(config_hasattr, torch.randn(3))
    assert (count, reasons) == (1, [])
    run_twice(config_hasattr, lambda: (torch.randn(3),), graphs=1)
    f = kiln.compile(config_hasattr, backend="eager")
    x = torch.randn(3)
    assert_same(f(x), config_hasattr(x))
    _CONFIG.shift = 4.0              # the attribute appears: the guard fails, a recompile
    try:
        assert_same(f(x), config_hasattr(x))
    finally:
        del _CONFIG.shift


# -- a module imported inside the function, live across a graph break ------------------------

def import_across_break(x):
    import math

    y = x * 2
    print("", end="")  # a graph break while `math` is a local
    return y + math.pi


def test_imported_module_survives_a_graph_break():
    # was: "returning PyModule(math) from a compiled function": the frame ran eagerly
    count, reasons, kinds = breaks_of(import_across_break, torch.randn(3))
    assert count == 2 and kinds == ["graph break"]
    run_twice(import_across_break, lambda: (torch.randn(3),), graphs=2)


# -- inspect.signature of a known function (transformers' apply_chunking_to_forward) ----------

def _helper(a, *rest, scale=3):
    return a


class _Chunked(torch.nn.Module):
    def chunk(self, x):
        return x * 2

    def forward(self, x):
        n = len(inspect.signature(self.chunk).parameters)        # bound: self dropped
        params = inspect.signature(_helper).parameters
        var = sum(p.kind == p.VAR_POSITIONAL for p in params.values())
        return self.chunk(x) + n + var + ("scale" in params) + params["scale"].default


def test_inspect_signature_of_a_known_function_is_evaluated_at_capture():
    # was: "call to standard-library function inspect.signature (runs natively)": a break
    model = _Chunked()
    assert breaks_of(model, torch.randn(3)) == (1, [], [])
    run_twice(model, lambda: (torch.randn(3),), graphs=1)


def test_inspect_signature_sees_changed_defaults():
    model = _Chunked()
    f = kiln.compile(model, backend="eager")
    x = torch.randn(3)
    assert_same(f(x), model(x))
    old = _helper.__kwdefaults__
    try:
        _helper.__kwdefaults__ = {"scale": 10}
        assert_same(f(x), model(x))
    finally:
        _helper.__kwdefaults__ = old


# -- slicing an nn.ModuleList (Llama: self.layers[: config.num_hidden_layers]) -----------------

class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(3, 3) for _ in range(4)])
        self.used = 3

    def forward(self, x):
        for layer in self.layers[: self.used]:
            x = layer(x)
        tail = self.layers[1:]
        x = x + len(tail) + tail[-1](x)
        for layer in tail[::2]:
            x = layer(x)
        return x


def sliced_layers(stack):
    return stack.layers[1:3]


def test_module_list_slice_needs_no_break():
    # was: "creating an instance of torch.nn.modules.container.ModuleList": a break
    stack = _Stack()
    assert breaks_of(stack, torch.randn(2, 3)) == (1, [], [])
    with torch.no_grad():
        run_twice(stack, lambda: (torch.randn(2, 3),), graphs=1)
    got = kiln.compile(sliced_layers, backend="eager")(stack)       # escapes: a new ModuleList, same modules
    assert type(got) is torch.nn.ModuleList and list(got) == list(stack.layers[1:3])


# -- instances of dict subclasses created inside (transformers' ModelOutput pattern) -------------

import collections as _collections
import dataclasses as _dataclasses


class _MiniOutputBase(_collections.OrderedDict):
    """A miniature ModelOutput: a dataclass over OrderedDict whose attributes and items mirror
    each other through __setattr__/__setitem__ overrides and super() calls."""

    def __post_init__(self):
        for f in _dataclasses.fields(self):
            v = self.__dict__.get(f.name)
            if v is not None:
                self[f.name] = v

    def __setattr__(self, name, value):
        names = {f.name for f in _dataclasses.fields(self)}
        if name in names and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)


@_dataclasses.dataclass
class _HiddenOutput(_MiniOutputBase):
    hidden: torch.Tensor = None
    extra: torch.Tensor = None
    note: str = None


def _make_output(x):
    h = x * 2
    out = _HiddenOutput(hidden=h, note="ok")
    out["extra"] = h + 1
    return out, out.hidden.sum() + out["extra"].sum(), list(out.keys())


def test_dict_subclass_dataclass_created_inside_is_captured():
    cnt = CompileCounter()
    cf = kiln.compile(_make_output, backend=cnt, fullgraph=True)
    for _ in range(2):
        x = torch.randn(3)
        got, total, keys = cf(x)
        exp, etotal, ekeys = _make_output(x)
        assert type(got) is _HiddenOutput and keys == ekeys == list(got.keys())
        torch.testing.assert_close(total, etotal)
        torch.testing.assert_close(got.hidden, exp.hidden)
        torch.testing.assert_close(got["extra"], exp["extra"])
        assert got.note == exp.note == "ok" and got.extra is got["extra"]
    assert cnt.frame_count == 1


# -- context managers chosen at run time (transformers 5.17: `return nullcontext()`) -----------

import contextlib as _contextlib


def _maybe_no_grad(x, use):
    ctx = torch.no_grad() if use else _contextlib.nullcontext()
    with ctx:
        y = x * 2
        print("inside")          # a break inside the block, with the context in a local
        z = y + 1
    return z, torch.is_grad_enabled()


def test_context_manager_in_a_local_across_a_break(capsys):
    cnt = CompileCounter()
    cf = kiln.compile(_maybe_no_grad, backend=cnt)
    for use in (False, True, True):
        x = torch.randn(3, requires_grad=True)
        got, exp = cf(x, use), _maybe_no_grad(x, use)
        torch.testing.assert_close(got[0], exp[0])
        assert got[0].requires_grad == exp[0].requires_grad and got[1] == exp[1]
    assert all(not e.is_eager and e.graph_break is not None for e in cf.entries)
    assert cnt.frame_count == 4  # both sides of the break, for each kind of context


def _nullcontext_value(x):
    with _contextlib.nullcontext(5) as v:
        return x * v


def test_nullcontext_is_captured():
    cnt = CompileCounter()
    cf = kiln.compile(_nullcontext_value, backend=cnt, fullgraph=True)
    x = torch.randn(2)
    torch.testing.assert_close(cf(x), x * 5)
    assert cnt.frame_count == 1


# huggingface_hub's strict dataclasses validate a config field a model sets in its forward
# (BERT's classification head sets ``problem_type``): a dict of validators keyed by typing
# constructs and classes, looked up with ``typing.get_origin`` of the field's annotation.
import collections.abc  # noqa: E402
import typing  # noqa: E402

_VALIDATORS = {typing.Union: lambda v: v, typing.Literal: lambda v: v, list: lambda v: v * 2,
               collections.abc.Sequence: lambda v: v}
_ORIGINS = [typing.get_origin(typing.Optional[int]), typing.get_origin(list[int])]   # Union, list


def _validate(x):
    validator = _VALIDATORS.get(_ORIGINS[0])
    other = _VALIDATORS[_ORIGINS[1]]
    return validator(x) + other(x)


def test_a_dict_keyed_by_typing_constructs_and_classes_is_read_without_a_break():
    run_twice(_validate, lambda: (torch.randn(3),), graphs=1)
    assert breaks_of(_validate, torch.randn(3)) == (1, [], [])


_ANNOTATION = typing.Optional[int]


def _validate_by_origin(x):
    """``typing.get_origin`` in the graph: ``__origin__`` of a typing construct is a constant."""
    validator = _VALIDATORS.get(typing.get_origin(_ANNOTATION))
    other = _VALIDATORS[typing.get_origin(list[int])]
    return validator(x) + other(x)


def test_the_origin_of_a_typing_construct_is_a_dict_key_without_a_break():
    run_twice(_validate_by_origin, lambda: (torch.randn(3),), graphs=1)
    assert breaks_of(_validate_by_origin, torch.randn(3)) == (1, [], [])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_dropout_that_keeps_its_input_returns_the_input_itself(backend):
    """Eager's dropout returns its input tensor itself when not training or when p == 0
    (``nn.Dropout`` in eval, Hugging Face's attention dropout of 0.0): a write to the result is
    a write to the input. torch's decomposition returns a copy, and the write was lost."""
    import torch.nn.functional as F

    def f(x, y, z):
        a = F.dropout(x, 0.1, training=False)
        a.add_(1)
        b = torch.nn.Dropout(0.0)(y)
        b.mul_(2)
        c = torch.dropout(z, 0.3, False)
        return a * 2, b is y, c is z, torch.alpha_dropout(z, 0.2, False) is z

    compiled = kiln.compile(f, backend=backend)
    for _ in range(2):
        args = [torch.randn(3, 4) for _ in range(3)]
        mine = [a.clone() for a in args]
        want, got = f(*args), compiled(*mine)
        assert_same(got, want)
        for a, m in zip(args, mine):
            torch.testing.assert_close(m, a)
