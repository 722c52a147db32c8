"""A compiled entry keeps none of the tensors of the call that created it alive: not the
inputs, not the outputs, not the intermediates (capture tables, fake tensors and their
ShapeEnv, break reasons and their tracebacks, generated closures are all checked here by
``weakref`` after ``gc.collect()``)."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

import kiln
from kiln.testing import CompileCounter

def matmul_relu(x, w):
    y = x @ w
    return torch.relu(y).sum(1)


def with_break(x):
    y = x * 2
    print("", end="")      # a graph break
    return y + 1


def keeps_intermediate(x):
    y = torch.sin(x)       # intermediates: saved for the backward under aot_eager
    z = y * 3
    return z.cos() * y


def runs_eagerly(x):
    yield x * 2        # a generator: the frame runs eagerly


def eager_frame(x):
    return [t for t in _eager_helper(x)]


def _eager_helper(x):
    yield x + 1


def calls_callee(x):
    return _callee(x) * 2


def _callee(x):
    y = x + 1
    print("", end="")      # breaks inside the callee: it becomes its own compiled function
    return y


def attr_store(holder, x):
    holder.t = x * 2       # a side effect on an object passed in
    return holder.t + 1


class Holder:
    pass


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x))


def _call_and_forget(compiled, make_args):
    """Run one call and return weak references to its tensors (inputs, outputs, and the
    tensors held by the objects it was given)."""
    args = make_args()
    out = compiled(*args)
    refs = []
    for a in args:
        if isinstance(a, torch.Tensor):
            refs.append(weakref.ref(a))
        elif isinstance(a, list):
            refs += [weakref.ref(t) for t in a if isinstance(t, torch.Tensor)]
        elif isinstance(a, Holder):
            refs.append(weakref.ref(a))
            refs.append(weakref.ref(a.t))
    outs = out if isinstance(out, (list, tuple)) else [out]
    refs += [weakref.ref(o) for o in outs if isinstance(o, torch.Tensor)]
    if isinstance(out, torch.Tensor) and out.requires_grad:
        out.sum().backward()
    del args, out, outs
    return refs


def _assert_freed(refs):
    # until nothing more is found: freeing one cycle (a compiled continuation) can release
    # the next (its own continuations, torch tensors whose PyObject was preserved by C++),
    # which a single collection does not see. What is still alive then is reachable.
    for _ in range(10):
        if not gc.collect():
            break
    alive = [i for i, r in enumerate(refs) if r() is not None]
    assert not alive, f"tensors kept alive after the call: {alive} of {len(refs)}"


CASES = [
    ("graph", matmul_relu, lambda: (torch.randn(4, 8, requires_grad=True), torch.randn(8, 8))),
    ("graph break", with_break, lambda: (torch.randn(4, 8),)),
    ("intermediates", keeps_intermediate, lambda: (torch.randn(16, requires_grad=True),)),
    ("generator runs eagerly", lambda x: list(runs_eagerly(x)), lambda: (torch.randn(3),)),
    ("break in a callee", calls_callee, lambda: (torch.randn(5),)),
    ("side effect on an argument", attr_store, lambda: (Holder(), torch.randn(3))),
]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("name, fn, make", CASES, ids=[c[0] for c in CASES])
def test_entry_keeps_no_tensor_of_the_call(name, fn, make, backend, dynamic):
    cf = kiln.compile(fn, backend=backend, dynamic=dynamic)
    _assert_freed(_call_and_forget(cf, make))
    assert cf.entries, "the entry itself stays"
    # and the entry still works for a new call
    args = make()
    torch.testing.assert_close(cf(*args), fn(*args))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_module_inputs_are_not_kept(backend):
    model = Block()
    compiled = kiln.compile(model, backend=backend)
    _assert_freed(_call_and_forget(compiled, lambda: (torch.randn(2, 8, requires_grad=True),)))
    _assert_freed(_call_and_forget(compiled, lambda: (torch.randn(2, 8),)))


def test_entry_that_runs_eagerly_keeps_nothing():
    def unsupported(x):
        return eager_frame(x)[0] * 2
    cf = kiln.compile(unsupported, backend="eager")
    _assert_freed(_call_and_forget(cf, lambda: (torch.randn(3),)))


def test_an_internal_failure_keeps_nothing(monkeypatch):
    """The eager entry made after kiln's own failure keeps no traceback frames of it."""
    from kiln.capture import frame

    def broken(*a, **k):
        raise RuntimeError("kiln bug")
    monkeypatch.setattr(frame, "_finish", broken)
    cf = kiln.compile(matmul_relu, backend="eager")
    _assert_freed(_call_and_forget(cf, lambda: (torch.randn(4, 8), torch.randn(8, 8))))
    assert cf.entries[0].is_eager


def test_compiled_function_and_its_closure_are_not_kept():
    """Dropping a compiled closure and its function frees the tensor the closure holds."""
    def make():
        big = torch.randn(64)

        def f(x):
            return x + big
        return f, weakref.ref(big)

    f, big_ref = make()
    counter = CompileCounter()
    cf = kiln.compile(f, backend=counter)
    cf(torch.randn(64))
    assert counter.frame_count == 1
    del f, cf, counter        # (the counter keeps the graphs it saw)
    _assert_freed([big_ref])


def _loops_in_a_callee(x, xs):
    def inner(t):
        for _ in xs:
            print("", end="")     # a break in each iteration of the callee's loop
        return t
    return inner(x)


def test_callee_closure_with_breaks_in_a_loop_keeps_nothing():
    cf = kiln.compile(_loops_in_a_callee, backend="eager")
    _assert_freed(_call_and_forget(cf, lambda: (torch.randn(2), [torch.randn(2), torch.randn(2)])))
