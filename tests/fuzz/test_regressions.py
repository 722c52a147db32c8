"""Every failure the fuzzer found, shrunk by hand to a few lines, run the fuzzer's way: eager
against ``kiln.compile`` on the same inputs, comparing outputs, inputs afterwards, globals,
printed text, grad mode, aliasing, exception types and where the traceback ends, and the
``.grad`` of every input after a backward through the outputs (``observe.compare``).

A case is the text of ``make_inputs`` and ``fn`` (with ``PRELUDE``'s names in scope), the
backends and dynamic settings it is checked on, and where the fuzzer found it (the seeds of
``generate``; "first generator" seeds are from an earlier version of the generator).
"""
from dataclasses import dataclass, field

import pytest

from .program import HEADER, Call, SourceProgram, params_of
from .runner import available_backends, run_program

PRELUDE = HEADER + '''

def randn(seed, *shape, rg=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(rg)
'''

# fresh inputs, then another size
CALLS = [Call(101, 3, 2, 0.5, False), Call(103, 5, 2, 0.5, False)]


# Capture-level problems are checked on the "eager" backend, AOT-level ones on "aot_eager"
# (each case names its backends), so that the suite stays fast.
@dataclass
class Case:
    source: str
    found: str                       # the generated program it was shrunk from
    backends: tuple = ("eager", "aot_eager")
    dynamic: tuple = (None,)
    calls: list = field(default_factory=lambda: CALLS)
    known_bug: str | None = None     # an open bug: the case is an xfail that says which


def program_of(source: str, calls) -> SourceProgram:
    text = PRELUDE + "\n" + source.strip() + "\n"
    return SourceProgram(0, text, params_of(text), list(calls))


CASES = {
    # ------------------------------------------------------------------ exceptions, tracebacks
    "bare_raise_after_break_in_handler": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4),)

def fn(x):
    try:
        raise ValueError("again")
    except ValueError:
        LOG.write("reraise\\n")
        raise
''', found="seeds 58, 73, 203, 469 (first generator), all backends", backends=("eager",)),
    "bare_raise_after_break_in_try": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4), k)

def fn(x, k):
    try:
        print("in try", file=LOG)
        if k > 1:
            raise ValueError("again")
    except ValueError:
        LOG.write("reraise\\n")
        raise
    return x
''', found="seeds 261, 547 (first generator), all backends", backends=("eager",), calls=[Call(101, 3, 2, 0.5, False), Call(102, 3, 1, 0.5, False)]),
    "traceback_after_break_names_the_user_function": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4),)

def fn(x):
    y = x * 2
    print("before", file=LOG)
    raise ValueError("stop")
''', found="seed 2, all backends", backends=("eager",)),
    # ------------------------------------------------------------------ views and in-place
    "inplace_on_row_of_tensor_that_requires_grad": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, 4, 4, rg=True),)

def fn(w):
    w = w * 2
    for row in w:
        row[0] = 0.0
    return w
''', found="seeds 84 (first generator), 19, 192, all backends", backends=("eager",)),
    "stack_output_modified_in_place_after_break": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), randn(seed + 1, n, 4).abs())

def fn(x, y):
    t = torch.stack([x, x])
    if y.sum() > 0:
        print("positive", file=LOG)
    t.tanh_()
    return t
''', found="seed 283 (first generator), aot_eager", backends=("aot_eager",)),
    "no_grad_helper_returning_its_detached_input": Case('''
@torch.no_grad()
def helper(t):
    return t

def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True),)

def fn(y):
    y = y.detach()
    t = helper(y)
    t.relu_()
    return t
''', found="seed 485 (first generator), aot_eager", backends=("aot_eager",)),
    "saved_tensor_modified_in_place_after_break": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True),)

def fn(x):
    t = x.sum(-1, keepdim=True)
    print("t", file=LOG)
    t.exp_()
    t.tanh_()
    return t
''', found="seeds 368, 423, 474 (first generator), aot_eager", backends=("aot_eager",)),
    "masked_select_under_no_grad_keeps_grad_mode": Case('''
def helper(t, c):
    return t

def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), randn(seed + 1, n, 4, rg=True))

def fn(x, y):
    with torch.no_grad():
        t8 = helper(y, c=1.0)[y > 0]
    t13 = (x + y).to(device="cpu")
    n = len(t13.tolist())
    return n, t13
''', found="seed 352, aot_eager", backends=("aot_eager",)),
    "ellipsis_index_of_input_is_a_view_not_the_input": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True),)

def fn(x):
    for row in x:
        with torch.no_grad():
            f = x.sum().item()
    cfg = (x.dtype, x.device, ...)
    return x[cfg[2]].to(dtype=cfg[0])
''', found="seed 586, aot_eager", backends=("aot_eager",)),
    "inplace_on_slice_of_reshaped_output_after_break": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), randn(seed + 1, 4, rg=True))

def fn(x, v):
    t = torch.sin(x).reshape(-1)
    if (v > 0).any():
        u = t.flatten()
    t[1:] += 1.0
    return t
''', found="seed 414, aot_eager", backends=("aot_eager",)),
    "base_of_split_views_modified_in_place": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True),)

def fn(x):
    t = torch.lerp(x, x, 0.25)
    parts = list(t.split(2, dim=-1))
    t.zero_()
    n = len(x.tolist())
    return t
''', found="seed 401, aot_eager", backends=("aot_eager",)),
    # ------------------------------------------------------------------ autograd
    "backward_inside_does_not_free_other_outputs": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, 4, 4, rg=True),)

def fn(w):
    a = w * 2
    loss = (w * w).sum()
    loss.backward()
    return a
''', found="seeds 99, 157 (first generator), aot_eager", backends=("aot_eager",)),
    "inplace_on_one_output_keeps_backward_of_another": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), randn(seed + 1, n, 4, rg=True))

def fn(x, y):
    a = x.exp()
    b = torch.relu(y)
    print("break", file=LOG)
    b.relu_()
    return a
''', found="seed 430 (first generator), aot_eager", backends=("aot_eager",)),
    "grad_mode_after_break_in_no_grad": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True),)

def fn(x):
    y = torch.tanh(x)
    with torch.no_grad():
        v = float(y.mean())
    return y * v
''', found="fuzz seeds 274, 276, aot_eager", backends=("aot_eager",)),
    "break_outside_the_graph_keeps_dead_inputs_grad_none": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), randn(seed + 1, 4, rg=True))

def fn(x, v):
    t = v * 2
    u = x.sum()
    print("break", file=LOG)
    return t
''', found="fuzz seeds 87, 141, 174, 181, aot_eager", backends=("aot_eager",)),
    "grad_mode_left_off_by_the_function": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True),)

def fn(x):
    torch.set_grad_enabled(False)
    f = float(x.mean())
    return x * f
''', found="seeds 162, 545, aot_eager", backends=("aot_eager",)),
    "import_binds_the_named_submodule": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4),)

def fn(x):
    from torch.nn import functional
    from torch.nn.functional import relu6 as act6
    return functional.softplus(x) + act6(x)
''', found="fuzz seeds 8, 14, 73, 342 (ImportError, AttributeError), all backends", backends=("eager",)),
    "zero_argument_super_after_break": Case('''
class MyLinear(nn.Linear):
    def forward(self, h):
        print("MyLinear", tuple(h.shape), file=LOG)
        return super().forward(h) * 0.5

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.sub = MyLinear(4, 4)

    def forward(self, h):
        return self.sub(h)

def make_inputs(seed, n, k, s, flag):
    torch.manual_seed(seed)
    return (randn(seed, n, 4), Net())

def fn(x, m):
    return m(x)
''', found="fuzz generated programs with MyLinear (super().forward), all backends", backends=("eager",)),
    "custom_autograd_function_apply": Case('''
class ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, c):
        ctx.save_for_backward(t)
        ctx.c = c
        return t * c + t.sin()

    @staticmethod
    def backward(ctx, g):
        t, = ctx.saved_tensors
        return g * ctx.c + g * t.cos(), None

def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True),)

def fn(x):
    return ScaleGrad.apply(x.tanh(), 2.0)
''', found="fuzz seeds 19, 33, 38 (TypeError from super(type, obj)), all backends"),
    "module_globals_seen_at_a_break": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4),)

def fn(x):
    y = x * 2
    Pt = collections.namedtuple("Pt", "a b")
    print("namedtuple", Pt.__module__, file=LOG)
    print("frame", sys._getframe(0).f_globals["__name__"], sys._getframe(0).f_code.co_name, file=LOG)
    return y
''', found="fuzz seeds 6, 50, 54, 170, 209, 212, all backends", backends=("eager",)),
    "locals_has_no_kiln_temporaries": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4), [randn(seed + 1, n, 4)])

def fn(x, xs):
    ys = [e * 2 for e in xs]
    print("locals", sorted(locals()), file=LOG)
    return x + ys[0]
''', found="fuzz seeds 164, 185, all backends", backends=("eager",)),
    "torch_constants_in_generated_code": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4),)

def fn(x):
    cfg = {"dtype": torch.float64, "dev": torch.device("cpu"), "sl": slice(0, 1), "cls": torch.Tensor}
    a = x.type(torch.DoubleTensor)
    b = x[cfg["sl"]].to(cfg["dev"]).to(cfg["dtype"]) if isinstance(x, cfg["cls"]) else x
    return a + b
''', found="fuzz seed 91 and others (SyntaxError in generated code), all backends", backends=("eager",)),
    "view_made_under_no_grad_stays_non_differentiable": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True),)

def fn(x):
    with torch.no_grad():
        v = x[0]
    print("break", file=LOG)
    return v * 2
''', found="the first fuzz campaign, part 1", backends=("aot_eager",)),
    "store_through_custom_setattr_then_read": Case('''
class Box:
    def __init__(self, k):
        self.k = k

    def __setattr__(self, name, value):
        if name == "k":
            value = value * 2
        object.__setattr__(self, name, value)
        object.__setattr__(self, "last_set", name)

def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4), Box(k))

def fn(x, box):
    box.k = 3
    y = x * box.k
    box.tag = "seen"
    return y, box.last_set
''', found="the first fuzz campaign, part 1; generated Box classes with __setattr__", backends=("eager",)),
    "break_inside_no_grad_before_a_raise": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, 4, 4, rg=True),)

def fn(w):
    w = w * 0.5
    with torch.no_grad():
        if float(w.mean()) > 0:
            raise RuntimeError("stop")
    return w
''', found="fuzz (eager crash: resume bytecode the assembler rejects); seed 147, all backends", backends=("eager",)),
    "dynamic_entry_code_defines_every_name": Case('''
class Net(nn.Module):
    pass

def make_inputs(seed, n, k, s, flag):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, dtype=torch.float32, rg=False):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(rg)
    x = r(n, 4, dtype=torch.float64, rg=True)
    w = r(4, 4, dtype=torch.float64, rg=False)
    xs = [r(n, 4, dtype=torch.float64, rg=False) for _ in range(3)]
    torch.manual_seed(seed)
    m = Net().to(torch.float64)
    return (x, w, x, xs, m, k, s, flag)

def fn(x, w, x2, xs, m, k, s, flag):

    def inner1(t):
        w.div_(2.0)
        return t
    t2 = inner1(x)
    LOG.write(f'x: {x.shape}\\n')
    with torch.no_grad():
        LOG.write(f'w: {w.shape}\\n')
    acc3 = 0
    for i4 in range(2):
        acc3 += torch.maximum(t2, x2)
    return (t2, acc3)
''', found="fuzz (eager crash under dynamic=True: name '___out' is not defined); seed 367", backends=("eager",), dynamic=(True,)),
    "store_through_custom_setattr_in_a_loop": Case('''
class Box:
    def __init__(self, k):
        self.k = k

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value * 2)

def make_inputs(seed, n, k, s, flag):
    return (randn(seed, 4, 4), Box(k))

def fn(w, box):
    for row in w:
        box.k += 1
    return w * box.k
''', found="the first fuzz campaign, part 1; seed 554, aot_eager", backends=("eager",)),
    # ------------------------------------------------------------------ memory
    "inputs_of_the_capturing_call_are_freed": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), randn(seed + 1, 4, 4))

def fn(x, w):
    return torch.tanh(x @ w)
''', found="the first fuzz campaign, part 3; every program at HEAD, all backends"),
    "inputs_of_a_capturing_call_that_raises_are_freed": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), randn(seed + 1, 4, 4))

def fn(x, w):
    y = x @ w
    raise ValueError("stop")
''', found="seeds 606, 617, 618, 623, all backends", backends=("eager",)),
    "inputs_freed_when_an_inlined_closure_raises": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4), randn(seed + 1, 4, 4))

def fn(x, w):
    def inner(t):
        y = undefined_function(x)
    return inner(w)
''', found="seeds 25, 26, all backends", backends=("eager",)),
    "inputs_freed_after_a_break_in_a_loop_of_an_inlined_closure": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), [randn(seed + 1, n, 4), randn(seed + 2, n, 4)])

def fn(x, xs):
    def inner(t):
        for e in xs:
            print("t", t.requires_grad, file=LOG)
    inner(x)
''', found="seeds 56, 66, 101, all backends", backends=("eager",)),
    "inductor_frees_inputs_of_a_graph_that_mutates_after_a_break": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), randn(seed + 1, n, 4, rg=True))

def fn(x, y):
    y = y - x
    print("break", file=LOG)
    y[..., :2].mul_(-1.0)
    return y.sum(-1, keepdim=True)
''', found="seeds 4, 24, inductor (both dynamic settings)", backends=("inductor",)),
    # ------------------------------------------------------------------ Python semantics
    "accumulate_into_python_number": Case('''
def make_inputs(seed, n, k, s, flag):
    return ([randn(seed, n, 4), randn(seed + 1, n, 4)],)

def fn(xs):
    acc = 0
    for e in xs:
        acc += e.sum()
    return acc
''', found="fuzz seeds 9, 463 and 130 more runs at HEAD, all backends", backends=("eager",)),
    "augmented_store_through_custom_getattribute": Case('''
class Box:
    def __init__(self, k):
        self.k = k

    def __getattribute__(self, name):
        if name == "k":
            return object.__getattribute__(self, "k") + 10
        return object.__getattribute__(self, name)

def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4), Box(k))

def fn(x, box):
    box.k += 1
    return x * box.k
''', found="seed 295, dynamic=True, eager and aot_eager", backends=("eager",), dynamic=(None, True)),
    # a graph's autograd node reached the closure cell of a tensor it changed in place: a
    # cycle through C++ kept the call's inputs alive (fixed: graph meta keeps source text)
    # a nested function handed to the resume function after a break: its identity guard (and
    # the cell read by identity) kept the call's tensor alive, and recompiled on every call
    "nested_function_of_the_call_after_a_break": Case('''
def make_inputs(seed, n, k, s, flag):
    x = randn(seed, n, 4, dtype=torch.float64)
    return (x, x)

def fn(x, x2):
    def inner27(t):
        t28 = 0.5 * F.silu(x)
        return t * t28
    x2.exp_()
    print("locals", sorted(locals()), file=LOG)
    return inner27(2.0).sum()
''', found="seed 3242, aot_eager, dynamic None and True", dynamic=(None, True)),
    # an output the graph also used to compute another output was not on that output's
    # autograd path (one autograd node): grad() with respect to it gave None
    "grad_with_respect_to_an_output_that_feeds_another": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, dtype=torch.float64), randn(seed + 1, n, 4, dtype=torch.float64, rg=True))

def fn(x, y):
    y = F.log_softmax(y - x, dim=-1)
    loss1 = (y * y).sum()
    g2, = torch.autograd.grad(loss1, [y], allow_unused=True, retain_graph=True)
    print("grad is None", g2 is None, file=LOG)
    return torch.log1p(x.abs()) + (g2 if g2 is not None else 0)
''', found="seed 3418, inductor", backends=("aot_eager",)),
    # a graph entered under no_grad (a break inside the block) that turns grad mode on and
    # then changes a non-leaf input in place: the functional clone of the input was made in the
    # entry mode and cut its history (x.grad wrong)
    "in_place_after_grad_mode_turns_on_in_a_resumed_graph": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True),)

def fn(x):
    t9 = x * 2
    with torch.set_grad_enabled(False):
        t13 = t9[t9 > 0]
        with torch.enable_grad():
            t9.relu_()
        t14 = t9 ** 2
    return t9
''', found="seed 3484, aot_eager, dynamic None and True", backends=("aot_eager",), dynamic=(None, True)),
    "parts_of_one_graph_saving_each_others_outputs": Case('''
def make_inputs(seed, n, k, s, flag):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, dtype=torch.float32, rg=False):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(rg)
    x = r(n, 4, dtype=torch.float64, rg=True)
    w = r(4, 4, dtype=torch.float64, rg=True)
    return (x, w)

def fn(x, w):
    t2 = w.mul(-1.5)
    t8 = w.transpose(0, 1).exp()
    f9 = round(float(t2.abs().max()), 3)
''', found="seed 3629, aot_eager, dynamic None and True", backends=("aot_eager",), dynamic=(None, True)),
    # a backward that raises (in eager and in kiln) leaves its graph's tasks queued in torch's
    # engine until the next backward; the harness flushes them for both runs alike
    "failed_backward_leaves_tasks_queued": Case('''
def make_inputs(seed, n, k, s, flag):
    g = torch.Generator().manual_seed(seed)
    
    def r(*shape, dtype=torch.float32, rg=False):
        return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(rg)
    
    x = r(n, 4, dtype=torch.float64, rg=True)
    return (x, k, s,)

def fn(x, k, s):
    def inner3(t):
        n4 = k + 1
        return t
    t5 = inner3(x)
    t10 = ((-1.5 * x))[::2]
    t5 = F.silu(t5)
    loss11 = (t10 * t10).sum()
    g12, = torch.autograd.grad(loss11, [x], allow_unused=True, retain_graph=True)
    print("grad is None", g12 is None, file=LOG)
    t10.relu_()
    with torch.no_grad():
        x.relu_()
        if t10.requires_grad:
            n13 = int((t10 > 0).sum())
            L14 = [x, x]
        if (n15 := k * 2) > 3:
            n15 -= 1
    with torch.set_grad_enabled(True):
        t5.sigmoid_()
    t21 = ((t10[::2]).transpose(0, 1) @ (t10[::2]))
    return t10, t5
''', found="seed 3467, aot_eager, dynamic None and True", backends=("aot_eager",),
        calls=[Call(101, 5, 3, -1.5, False), Call(102, 5, 3, -1.5, False), Call(103, 8, 3, -1.5, True)]),
    "aot_eager_keeps_inputs_of_closures_after_a_break": Case('''
def helper1(t, c):
    return t

def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), randn(seed + 1, n, 4))

def fn(x, y):
    def inner13(t):
        t = t * helper1(x, **{'c': -1.5})
        return t
    t14 = inner13(y)
    def inner15(t):
        if y.requires_grad:
            t = t - y.flip(-1)
        else:
            f17 = round(float(y.abs().max()), 3)
            t14.relu_()
        from torch.nn.functional import relu6 as act6
        t18 = act6(t)
        return t
    return inner15(x)
''', found="seed 3068, aot_eager, dynamic None and True", backends=("aot_eager",),
        dynamic=(None, True)),
    "inputs_outlive_a_chain_of_continuations": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True, dtype=torch.float64), randn(seed + 1, 4, 4, rg=True, dtype=torch.float64))

def fn(x, w):
    n1 = len(x)
    def inner9(t):
        for i11 in range(n1):
            loss13 = (x * x).sum()
            print('w.grad', None if w.grad is None else float(w.grad.sum()), file=LOG)
    t14 = inner9(x)
''', found="seed 7046, aot_eager, dynamic None and True (break functions held their continuations "
              "as code constants: one level freed per collection)",
        backends=("aot_eager",), calls=[Call(101, 12, 1, 0.5, True)]),
    "in_place_copy_from_an_overlapping_view": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4), randn(seed + 1, n, 4, rg=True))

def fn(x, y):
    for i3 in range(3):
        t8 = x.select(0, 0)
        x.copy_(t8)
        t9 = x.sum(-1)
    n10 = int((y > 0).sum())
    return x * n10
''', found="seed 7133, aot_eager, dynamic None and True (eager refuses the partial overlap; the "
              "graph raised it with a traceback at the def line)", backends=("aot_eager",)),
    "output_backwarded_again_after_a_backward_inside": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, 4, 4, rg=True), randn(seed + 1, 4, rg=True))

def fn(w, v):
    t = v - w
    loss = (t * t).sum()
    loss.backward()
    return t
''', found="seed 6271, aot_eager (the node of t saves nothing: eager backwards it again)",
        backends=("aot_eager",), dynamic=(None, True)),
    "output_changed_in_place_after_a_break_needed_by_another_output_only": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, 4, 4, rg=True),)

def fn(w):
    low = w.min()
    w = w ** 2
    act = torch.nn.functional.silu(w)
    print("break", file=LOG)
    low *= 2
    return torch.einsum('ij,jk->ik', act, w)
''', found="seed 414037, aot_eager, dynamic None and True (the segmented graph's backward, run as one "
              "fused graph, checked the version of every saved value: also those only the gradient of "
              "another output reads)", backends=("aot_eager", "inductor"), dynamic=(None, True)),
    "backward_again_through_a_segment_a_handed_gradient_ran": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, 4, 4, rg=True),)

def fn(w):
    w = 3.0 * w
    loss = (w * w).sum()
    loss.backward()
    return w.mean(dim=0, keepdim=True)
''', found="seeds 230152, 423045, aot_eager and inductor (eager's node of 3.0 * w saved the scalar and "
              "ran in the first backward, through the loss's gradient; the segment's compiled node saves "
              "nothing, so the second backward went through)", backends=("aot_eager", "inductor"),
        dynamic=(None, True)),
    "saved_value_is_the_input_the_graph_wrote": Case('''
class Box:
    def __init__(self, t):
        self.t = t

def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True, dtype=torch.float64), Box(randn(seed + 1, n, 4, dtype=torch.float64)))

def fn(x, box):
    box.t[0] = 0.0
    box.t = box.t / (x.abs() + 1.0)
    return {'t': box.t}
''', found="seed 423031, inductor (Inductor wrote the input in place and returned it as the saved "
              "value; the runtime bumped its version after the save, so backward() raised)",
        backends=("aot_eager", "inductor"), dynamic=(None, True)),
    "inplace_operator_on_a_partly_overlapping_view": Case('''
class Box:
    def __init__(self, k):
        self.k = k

def make_inputs(seed, n, k, s, flag):
    return (randn(seed, 4), Box(k))

def fn(v, box):
    t = v[None]
    box.tag = box.k * 2
    v[1:] += 1.0
    t += v
''', found="seed 406105, eager and aot_eager (``t += v`` is ``t.__iadd__(v)``, which the in-place checks "
              "did not see: eager refuses the overlap, aot_eager returned a value and the eager backend "
              "raised from the graph, before the attribute was stored)"),
    "inplace_operators_check_as_inplace_methods": Case('''
def make_inputs(seed, n, k, s, flag):
    return (torch.arange(n), randn(seed, 1, 4))

def fn(i, x):
    try:
        i *= 2.5
    except RuntimeError:
        LOG.write("int *= float refused\\n")
    e = x.expand(3, 4)
    e += 1
    return e
''', found="sibling of seed 406105 (``int_tensor *= 2.5`` and ``expanded += 1`` raise in eager; compiled "
              "they returned values)"),
    "equal_outputs_are_two_tensors": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), [randn(seed + 1, n, 4)])

def fn(x, xs):
    xs.extend([x, x])
    return [torch.erf(e) for e in xs], {'p': x}
''', found="seed 1097, aot_eager, dynamic None and True (the min-cut's CSE merged the two erf(x): one "
              "tensor returned twice)", backends=("aot_eager",), dynamic=(None, True)),
    "view_of_an_intermediate_written_in_place_in_a_dynamic_graph": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True, dtype=torch.float64), randn(seed + 1, 4, 4, rg=True, dtype=torch.float64))

def fn(y, w):
    t = y[..., [0, 2]].transpose(0, 1)
    w2 = w @ w
    t.masked_fill_(t > 0.5, 0.0)
    return (w2, t)
''', found="seed 76358, aot_eager, dynamic None (from the second size) and True (the dynamic graph "
              "returned the view's base transposed; the view taken again with as_strided read the wrong "
              "elements)", backends=("aot_eager",), dynamic=(None, True)),
    "later_output_reads_an_earlier_one_without_its_gradient": Case('''
def make_inputs(seed, n, k, s, flag):
    return (randn(seed, n, 4, rg=True), randn(seed + 1, n, 4))

def fn(x, y):
    t = x * 2
    u = torch.zeros_like(t) * x + y
    LOG.write("after\\n")
    return t, u
''', found="seed 76711, aot_eager, dynamic None and True (the second output came from a segment node "
              "without a differentiable input: no grad_fn, x's gradient through it lost)",
         backends=("aot_eager",), dynamic=(None, True)),
}


PARAMS = [pytest.param(name, b, d, id=f"{name}-{b}{'-dynamic' if d else ''}",
                       marks=[pytest.mark.xfail(reason=c.known_bug, strict=False)] if c.known_bug else [])
          for name, c in CASES.items() for b in c.backends for d in c.dynamic]


@pytest.mark.parametrize("name,backend,dynamic", PARAMS)
def test_fuzz_regression(name, backend, dynamic):
    if backend not in available_backends((backend,)):
        pytest.skip(f"kiln has no {backend!r} backend yet")
    case = CASES[name]
    out = run_program(program_of(case.source, case.calls), backend, dynamic)
    assert out.status == "ok", f"{out.describe()}\n(found as {case.found})"
