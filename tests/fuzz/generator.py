"""Seeded random programs for kiln's differential fuzzer.

``generate(seed)`` returns a ``Program``: Python source for ``fn`` (plus an nn.Module, helper
functions and the ``make_inputs`` that builds its arguments), written statement by statement
from a typed scope, so the same seed always gives the same text. The statements cover tensor
ops, views and in-place ops (on inputs too), Python containers, loops and branches (on Python
values, on shapes and on tensor data), closures, modules, mutations of lists/dicts/objects and
globals, graph-break constructs (print, ``float(t)``, ``.tolist()``, numpy, ``comptime``),
grad-mode blocks, exceptions raised and caught, and ``.backward()`` inside the function.

The generator tracks types (``fuzz_types``) only to write programs that eager runs without an
error most of the time; where it cannot be sure (a view modified in place that eager refuses),
eager raises and the runner checks that kiln raises the same type.
"""
from __future__ import annotations

import random
from dataclasses import replace

from .expressions import Expressions, _stable
from .fuzz_types import (D, TORCH_DTYPE, TT, BoxT, DictT, FnT, ListT, ModT, Opaque, PyBool, PyFloat, PyInt,
                         broadcast, join, promote, tri_and, tri_or)
from .program import INDENT, Call, Node, Program

MAX_DEPTH = 2

# The class of the ``box`` argument: a plain object, or one whose attribute access follows its
# own rules (slots, a property, __setattr__, __getattribute__, a dataclass).
BOX_CLASSES = {
    "plain": """\
class Box:
    def __init__(self, t, k):
        self.t = t
        self.k = k""",
    "slots": """\
class Box:
    __slots__ = ("t", "k", "extra", "tag")

    def __init__(self, t, k):
        self.t = t
        self.k = k""",
    "property": """\
class Box:
    def __init__(self, t, k):
        self.t = t
        self._k = k
        self.sets = 0

    @property
    def k(self):
        return self._k

    @k.setter
    def k(self, value):
        self.sets += 1
        self._k = value""",
    "setattr": """\
class Box:
    def __init__(self, t, k):
        self.t = t
        self.k = k

    def __setattr__(self, name, value):
        if name == "k":
            value = value * 2
        object.__setattr__(self, name, value)
        object.__setattr__(self, "last_set", name)""",
    "getattribute": """\
class Box:
    def __init__(self, t, k):
        self.t = t
        self.k = k

    def __getattribute__(self, name):
        if name == "k":
            return object.__getattribute__(self, "k") + 10
        return object.__getattribute__(self, name)""",
    "dataclass": """\
@dataclasses.dataclass
class Box:
    t: torch.Tensor
    k: int""",
}

AUTOGRAD_FUNCTION = """\
class ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, c):
        ctx.save_for_backward(t)
        ctx.c = c
        return t * c + t.sin()

    @staticmethod
    def backward(ctx, g):
        t, = ctx.saved_tensors
        return g * ctx.c + g * t.cos(), None"""

MY_LINEAR = """\
class MyLinear(nn.Linear):
    def forward(self, h):
        print("MyLinear", tuple(h.shape), file=LOG)
        return super().forward(h) * 0.5"""

IMPORTS = [  # (import statement, a use of it on tensor {a})
    ("from torch.nn import functional as FF", "FF.relu({a})"),
    ("from torch.nn import functional", "functional.softplus({a})"),
    ("import torch.nn.functional as F2", "F2.elu({a})"),
    ("from torch.nn.functional import relu6 as act6", "act6({a})"),
    ("from torch import nn as nn2", "nn2.functional.tanh({a})"),
    ("import torch.nn as tnn", "tnn.functional.hardtanh({a})"),
    ("from math import pi", "({a} * pi)"),
    ("import math as m2", "({a} * m2.e)"),
    ("from torch.nn.functional import silu", "silu({a})"),
]


class Scope:
    """What the program can use at one point: typed names, the grad mode (True/False/None),
    names it must not rebind (parameters, closure reads), lists it is iterating."""

    def __init__(self, vars=None, grad=True, kind="fn"):
        self.vars = dict(vars or {})
        self.grad = grad
        self.kind = kind              # "fn", "forward", "helper", "inner"
        self.depth = 0
        self.loop = None              # None, "for", "while"
        self.readonly = set()
        self.iterating = set()
        self.helpers = {}             # helper name -> (dtype, ret_rg)
        self.autograd_fns = []        # torch.autograd.Function classes (``.apply(t, c)``)
        self.assigned = set()
        self.used_global = False

    def child(self, **kw) -> "Scope":
        c = Scope(self.vars, self.grad, self.kind)
        c.depth = self.depth + 1
        c.loop = self.loop
        c.readonly = set(self.readonly)
        c.iterating = set(self.iterating)
        c.helpers = self.helpers
        c.autograd_fns = self.autograd_fns
        c.used_global = self.used_global
        for k, v in kw.items():
            setattr(c, k, v)
        return c

    def set(self, name, typ):
        if isinstance(typ, (ListT, DictT)) and not isinstance(typ.elem, TT):
            typ = Opaque()
        self.vars[name] = typ
        self.assigned.add(name)

    def absorb(self, child, sure=False):
        """Names the child block rebound: their type is the child's (``sure``: the block ran)
        or the join of both paths."""
        for name in child.assigned:
            if name in self.vars:
                self.vars[name] = child.vars[name] if sure else join(self.vars[name], child.vars[name])
                self.assigned.add(name)
        self.used_global = self.used_global or child.used_global

    def tensors(self, pred=None):
        return [(n, t) for n, t in self.vars.items() if isinstance(t, TT) and (pred is None or pred(t))]

    def of(self, cls):
        return [(n, t) for n, t in self.vars.items() if isinstance(t, cls)]

    def rebindable(self, name):
        return name not in self.readonly and ("." not in name or name.startswith("box."))


class Generator:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.n = 0
        self.ex = Expressions(self)
        self.prelude: list = []

    # ------------------------------------------------------------------ small helpers
    def fresh(self, prefix):
        self.n += 1
        return f"{prefix}{self.n}"

    def fresh_dim(self, kind):
        """An unknown size: "u" (at least 1) or "z" (may be 0)."""
        self.n += 1
        return f"{kind}{self.n}"

    def pick(self, named):
        """One of ``(name, type)``; attributes of modules and objects (``m.buf``) less often,
        so that programs mostly compute on their own values."""
        plain = [p for p in named if "." not in p[0]]
        return self.rng.choice(plain if plain and self.chance(0.85) else named)

    def chance(self, p):
        return self.rng.random() < p

    def weighted(self, cands):
        """Pick from ``(weight, ...)`` tuples."""
        total = sum(c[0] for c in cands)
        r = self.rng.random() * total
        for c in cands:
            r -= c[0]
            if r <= 0:
                return c
        return cands[-1]

    # ------------------------------------------------------------------ program
    def program(self) -> Program:
        rng = self.rng
        self.base = "f64" if self.chance(0.3) else "f32"
        scope = Scope(kind="fn")
        params, mk = self.inputs(scope)
        if self.chance(0.35):
            self.helper(scope)
        if self.chance(0.12):
            self.prelude.append(Node(AUTOGRAD_FUNCTION.splitlines(), tags=frozenset({"autograd_function"})))
            scope.autograd_fns.append("ScaleGrad")
        body = self.block(scope, rng.randint(3, 8))
        body.append(self.return_stmt(scope))
        n0 = rng.choice([2, 3, 4, 5])
        k0, s0, flag0 = rng.choice([1, 2, 3]), rng.choice([0.5, -1.5, 2.0]), self.chance(0.5)
        k1 = k0 if self.chance(0.6) else rng.choice([1, 2, 3])
        s1 = s0 if self.chance(0.7) else rng.choice([0.5, -1.5, 2.0])
        flag1 = flag0 if self.chance(0.7) else not flag0
        calls = [Call(101, n0, k0, s0, flag0),
                 Call(102, n0, k0, s0, flag0, grad=not self.chance(0.1), kw=self.chance(0.3)),
                 Call(103, n0 + rng.choice([1, 3]), k1, s1, flag1)]
        return Program(self.seed, self.prelude, mk, params, body, calls)

    def inputs(self, scope):
        rng, base = self.rng, self.base
        other = "f64" if base == "f32" else "f32"
        mk = ["g = torch.Generator().manual_seed(seed)",
              "",
              "def r(*shape, dtype=torch.float32, rg=False):",
              "    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(rg)",
              ""]
        params, values = [], []
        # the inputs' layouts come from a stream of their own, so that a seed's program text
        # stays what it was before layouts were drawn
        layouts = random.Random(self.seed * 7919 + 13)

        def tensor(name, shape_code, shape, dtype, rg):
            # an input that does not require grad is sometimes a strided view of a larger
            # buffer (transposed, a column slice with an offset, every other column), as the
            # last token of a growing sequence or a slice of a fused projection reaches a model
            layout = None if rg or layouts.random() > 0.3 else layouts.choice(["t", "slice", "step"])
            dt = TORCH_DTYPE[dtype]
            if layout is None or len(shape) != 2 or shape[1] != D:
                mk.append(f"{name} = r({shape_code}, dtype={dt}, rg={rg})")
            elif layout == "t":
                first = shape_code.split(",")[0]
                mk.append(f"{name} = r({D}, {first}, dtype={dt}).t()")
            elif layout == "slice":
                first = shape_code.split(",")[0]
                mk.append(f"{name} = r({first}, {D} + 3, dtype={dt})[:, 1:{D} + 1]")
            else:
                first = shape_code.split(",")[0]
                mk.append(f"{name} = r({first}, 2 * {D}, dtype={dt})[:, ::2]")
            params.append(name)
            values.append(name)
            scope.set(name, TT(shape, dtype, rg, leaf=rg, inp=True))

        tensor("x", f"n, {D}", ("B", D), base, self.chance(0.6))
        if self.chance(0.6):
            tensor("y", f"n, {D}", ("B", D), other if self.chance(0.2) else base, self.chance(0.5))
        if self.chance(0.6):
            tensor("w", f"{D}, {D}", (D, D), base, self.chance(0.5))
        if self.chance(0.3):
            tensor("v", f"{D}", (D,), base, self.chance(0.5))
        if self.chance(0.07):
            params.append("x2")
            values.append("x")
            scope.set("x2", scope.vars["x"])
        if self.chance(0.35):
            length, rg = rng.choice([2, 3]), self.chance(0.4)
            mk.append(f"xs = [r(n, {D}, dtype={TORCH_DTYPE[base]}, rg={rg}) for _ in range({length})]")
            params.append("xs")
            values.append("xs")
            scope.set("xs", ListT(TT(("B", D), base, rg, leaf=rg, inp=True), length, inp=True))
        if self.chance(0.25):
            rg = self.chance(0.4)
            mk.append(f"d = {{'a': r(n, {D}, dtype={TORCH_DTYPE[base]}, rg={rg}), "
                      f"'b': r(n, {D}, dtype={TORCH_DTYPE[base]}, rg={rg})}}")
            params.append("d")
            values.append("d")
            scope.set("d", DictT(TT(("B", D), base, rg, leaf=rg, inp=True), frozenset({"a", "b"}), inp=True))
        if self.chance(0.25):
            kind = rng.choice(sorted(BOX_CLASSES))
            self.prelude.append(Node(BOX_CLASSES[kind].splitlines(), tags=frozenset({"object_" + kind})))
            mk.append(f"box = Box(r(n, {D}, dtype={TORCH_DTYPE[base]}), k)")
            params.append("box")
            values.append("box")
            scope.set("box", BoxT(TT(("B", D), base, False, inp=True), inp=True))
            scope.set("box.t", TT(("B", D), base, False, inp=True))
            scope.set("box.k", PyInt(lo=1))
        if self.chance(0.3):
            self.module(scope, mk)
            params.append("m")
            values.append("m")
        for name, typ, p in (("k", PyInt(lo=1), 0.5), ("s", PyFloat(), 0.4), ("flag", PyBool(), 0.3)):
            if self.chance(p):
                params.append(name)
                values.append(name)
                scope.set(name, typ)
        mk.append(f"return ({', '.join(values)},)")
        scope.readonly |= {"x", "m"}
        return params, mk

    # ------------------------------------------------------------------ module and helpers
    def module(self, scope, mk):
        rng, dt = self.rng, self.base
        init = ["class Net(nn.Module):",
                "    def __init__(self):",
                "        super().__init__()",
                f"        self.lin = nn.Linear({D}, {D})",
                f"        self.scale = nn.Parameter(torch.randn({D}))",
                f"        self.register_buffer('buf', torch.zeros({D}))",
                "        self.calls = 0"]
        sub = rng.choice([None, "seq", "norm", "list", "mylinear"])
        if sub == "seq":
            init.append(f"        self.sub = nn.Sequential(nn.Linear({D}, {D}), nn.Tanh())")
        elif sub == "norm":
            init.append(f"        self.sub = nn.LayerNorm({D})")
        elif sub == "list":
            init.append(f"        self.blocks = nn.ModuleList([nn.Linear({D}, {D}) for _ in range(2)])")
        elif sub == "mylinear":
            self.prelude.append(Node(MY_LINEAR.splitlines(), tags=frozenset({"super"})))
            init.append(f"        self.sub = MyLinear({D}, {D})")
        fs = Scope(kind="forward")
        fs.set("h", TT(("M", D), dt, True))          # forward starts with h = self.lin(h)
        fs.set("self.lin.weight", TT((D, D), dt, True, leaf=True))
        fs.set("self.scale", TT((D,), dt, True, leaf=True))
        fs.set("self.buf", TT((D,), dt, False, inp=True))
        fs.set("self.calls", PyInt())
        fs.readonly |= {"self.lin.weight", "self.scale", "self.buf", "self.calls"}
        fs.module_sub = sub
        body = [Node(["h = self.lin(h)"])] + self.block(fs, rng.randint(1, 4), module=True) + [Node(["return h"])]
        ret_rg = fs.vars["h"].rg
        self.prelude.append(Node(init + [""], [("    def forward(self, h):", [_Shift(body)])],
                                 tags=frozenset({"module"})))
        mk.append("torch.manual_seed(seed)")
        mk.append(f"m = Net().to({TORCH_DTYPE[dt]})")
        if self.chance(0.2):
            mk.append("m.lin.bias.requires_grad_(False)")
        if self.chance(0.15):
            mk.append("m.eval()")
        scope.set("m", ModT(dt, ret_rg))
        scope.set("m.lin.weight", TT((D, D), dt, True, leaf=True, inp=True))
        scope.set("m.buf", TT((D,), dt, False, inp=True))
        scope.set("m.calls", PyInt())
        scope.readonly |= {"m.lin.weight", "m.buf", "m.calls"}

    def helper(self, scope):
        name = self.fresh("helper")
        hs = Scope(kind="helper")
        hs.set("t", TT(("H", D), self.base, None, leaf=True, inp=True))
        hs.set("c", PyFloat())
        hs.helpers = dict(scope.helpers)
        deco = self.chance(0.2)
        if deco:
            hs.grad = False
        body = self.block(hs, self.rng.randint(1, 3))
        ret = hs.vars.get("t")
        if not (isinstance(ret, TT) and ret.shape == ("H", D) and ret.dtype == self.base):
            body = [Node([f"t = t * c"])]
            ret = TT(("H", D), self.base, None)
        body.append(Node(["return t"]))
        header = (["@torch.no_grad()"] if deco else []) + [f"def {name}(t, c):"]
        self.prelude.append(Node(header[:-1], [(header[-1], body)], tags=frozenset({"helper"})))
        scope.helpers[name] = (self.base, False if deco else ret.rg)

    # ------------------------------------------------------------------ blocks
    def block(self, scope, n, module=False):
        out = []
        for _ in range(n):
            for _attempt in range(20):
                node = self.statement(scope, module)
                if node is not None:
                    out.append(node)
                    break
        return out

    def statement(self, scope, module=False):
        nested = scope.depth < MAX_DEPTH
        kinds = [
            (14, self.s_assign), (8, self.s_reassign), (5, self.s_inplace), (3, self.s_pyscalar),
            (3, self.s_list), (2, self.s_dict), (2, self.s_object), (2, self.s_global),
            (3, self.s_print), (3, self.s_scalar_break), (1, self.s_other_break),
            (2, self.s_backward), (1, self.s_raise_out), (1, self.s_import), (1, self.s_introspect),
            (1, self.s_constants), (3, self.s_python),
        ]
        if nested:
            kinds += [(3, self.s_for), (1, self.s_while), (4, self.s_if), (2, self.s_if_data),
                      (3, self.s_grad_block), (2, self.s_try), (2, self.s_accumulate)]
            if scope.kind in ("fn", "forward"):
                kinds += [(2, self.s_closure), (1, self.s_nonlocal), (1, self.s_lambda)]
        if module:
            kinds += [(8, self.s_module)]
        if scope.loop == "for":
            kinds += [(1, self.s_loop_jump)]
        if scope.kind == "fn" and scope.depth > 0:
            kinds += [(1, self.s_early_return)]
        _, fn = self.weighted(kinds)
        return fn(scope)

    # ------------------------------------------------------------------ expressions
    def expr(self, scope, depth=0, pred=None):
        """A random tensor expression: ``(code, TT)``."""
        ts = scope.tensors(lambda t: not isinstance(t, Opaque))
        if not ts:
            return None
        floats = [p for p in ts if p[1].is_float]
        a, t = self.pick(floats if floats and self.chance(0.85) else ts)
        if depth < 1 and self.chance(0.35):
            inner = self.expr(scope, depth + 1)
            if inner is not None:
                a, t = inner
                if not a.isidentifier():
                    a = f"({a})"
        return self.ex.choose(scope, a, t, pred=pred)

    def keep_type_expr(self, scope, name, t):
        """An expression of the same shape and dtype as ``name``, built from it."""
        same = lambda u: u.shape == t.shape and u.dtype == t.dtype  # noqa: E731
        if t.is_float and self.chance(0.3):
            other = self.expr(scope, 1, pred=lambda u: u.is_float and broadcast(u.shape, t.shape) == t.shape
                              and promote(t, u) == t.dtype)
            if other is not None:
                op = self.rng.choice(["+", "-", "*"])
                return f"{name} {op} {other[0]}", TT(t.shape, t.dtype, self.ex.fresh_rg(scope, t, other[1]))
        return self.ex.choose(scope, name, t, ["unary", "binary", "matmul", "call"], pred=same)

    def cond(self, scope):
        """A Python condition known at capture time (values, shapes, flags)."""
        c = []
        for n, t in scope.vars.items():
            if isinstance(t, PyInt):
                c.append(f"{n} > {self.rng.choice([1, 2, 3])}")
            elif isinstance(t, PyFloat):
                c.append(f"{n} > 0")
            elif isinstance(t, PyBool):
                c += [n, f"not {n}"]
            elif isinstance(t, TT) and t.ndim and "." not in n:
                c += [f"{n}.shape[0] > {self.rng.choice([2, 3, 4])}", f"{n}.dim() == 2",
                      f"{n}.requires_grad", f"{n}.dtype == torch.float64"]
            elif isinstance(t, ListT):
                c.append(f"len({n}) > 2")
            elif isinstance(t, DictT):
                c.append(f"'c' in {n}")
            elif isinstance(t, ModT):
                c.append(f"{n}.training")
        c += ["torch.is_grad_enabled()", 'STATE["calls"] % 2 == 1']
        return self.rng.choice(c)

    # ------------------------------------------------------------------ simple statements
    def s_assign(self, scope):
        e = self.expr(scope)
        if e is None:
            return None
        name = self.fresh("t")
        scope.set(name, e[1])
        return Node([f"{name} = {e[0]}"], tags=_expr_tags(e[0]))

    def s_reassign(self, scope):
        ts = [(n, t) for n, t in scope.tensors() if scope.rebindable(n)]
        if not ts:
            return None
        name, t = self.pick(ts)
        e = self.keep_type_expr(scope, name, t)
        if e is None:
            return None
        typ = TT(t.shape, t.dtype, e[1].rg)
        scope.set(name, typ)
        if name.startswith("box."):
            scope.set("box", BoxT(typ, inp=True))
        return Node([f"{name} = {e[0]}"], tags=_expr_tags(e[0]) | ({"mutate_object"} if "." in name else set()))

    def s_inplace(self, scope):
        def ok(t):
            if not t.is_float or t.noinp:
                return False
            return scope.grad is False or not (t.leaf or t.mview or t.ngview)
        ts = scope.tensors(ok)
        if not ts:
            return None
        name, t = self.pick(ts)
        others = scope.tensors(lambda u: u.is_float and broadcast(u.shape, t.shape) == t.shape)
        b, u = self.rng.choice(others) if others else (None, None)
        if b == name:
            b, u = None, None
        ops = ["{a}.mul_(0.5)", "{a}.add_(1.0)", "{a}.clamp_(-1.0, 1.0)", "{a}.zero_()", "{a}.fill_(0.25)",
               "{a}.tanh_()", "{a}.sigmoid_()", "{a}.relu_()", "{a}.div_(2.0)", "{a} *= 2", "{a} -= 0.5",
               "{a}.masked_fill_({a} > 0.5, 0.0)", "{a}.exp_()", "{a}.neg_()"]
        if t.ndim and _stable(t.shape):
            ops += ["{a}[0] = 0.0", "{a}[-1].mul_(3.0)", "{a}[1:] += 1.0"]
        if t.ndim >= 2 and t.shape[-1] == D:
            ops += ["{a}[:, 1] = 2.0", "{a}[..., :2].mul_(-1.0)", "{a}.t().add_(0.5)"]
        if b is not None:
            ops += ["{a}.add_({b})", "{a}.mul_({b})", "{a}.copy_({b})", "{a} += {b}", "{a}.sub_({b}, alpha=0.5)",
                    "{a}.addcmul_({b}, {b}, value=0.1)", "{a}.lerp_({b}, 0.5)" if u.dtype == t.dtype else "{a}.add_({b})"]
        if name in scope.readonly and "." not in name:
            ops = [op for op in ops if "=" not in op.split("]")[-1]]   # `a *= 2` would rebind the name
        tmpl = self.rng.choice(ops)
        code = tmpl.format(a=name, b=b)
        extra = u.rg if "{b}" in tmpl else False
        rg = tri_or(t.rg, tri_and(scope.grad, extra))
        if "zero_" in code or "fill_" in code:
            rg = t.rg
        scope.vars[name] = replace(t, rg=rg)
        tags = {"inplace"} | ({"mutate_input"} if t.inp else set())
        return Node([code], tags=frozenset(tags))

    def s_pyscalar(self, scope):
        rng = self.rng
        ts = scope.tensors(lambda t: t.ndim > 0)
        opts = []
        if ts:
            a, t = self.pick(ts)
            opts += [(f"{a}.shape[0]", PyInt(dim=t.shape[0], lo=1 if _stable(t.shape[:1]) else 0)),
                     (f"{a}.size(-1)", PyInt(dim=t.shape[-1], lo=1 if _stable(t.shape[-1:]) else 0)),
                     (f"{a}.dim()", PyInt(lo=1)), (f"{a}.numel()", PyInt(lo=0)), (f"len({a})", PyInt(lo=0))]
        for n, t in scope.vars.items():
            if isinstance(t, PyInt):
                opts.append((f"{n} + 1", PyInt(lo=t.lo + 1)))
                opts.append((f"{n} * 2", PyInt(lo=t.lo * 2)))
            elif isinstance(t, PyFloat):
                opts.append((f"{n} * 2.0 - 1", PyFloat()))
            elif isinstance(t, ListT):
                opts.append((f"len({n})", PyInt(lo=t.length or 0)))
        if not opts:
            return None
        code, typ = rng.choice(opts)
        name = self.fresh("f" if isinstance(typ, PyFloat) else "n")
        scope.set(name, typ)
        return Node([f"{name} = {code}"])

    def s_list(self, scope):
        rng = self.rng
        lists = [(n, t) for n, t in scope.of(ListT)]
        ts = scope.tensors(lambda t: not t.noinp)
        opts = []
        if ts:
            a, t = self.pick(ts)
            same = [n for n, u in scope.tensors() if u.shape == t.shape and u.dtype == t.dtype]
            b = rng.choice(same)
            opts.append(("make", lambda: ([f"{{L}} = [{a}, {b}]"], ListT(join(t, scope.vars[b]), 2))))
            if t.ndim >= 1 and t.shape[-1] == D and t.is_float:
                opts.append(("make", lambda: ([f"{{L}} = list({a}.split(2, dim=-1))"],
                                              ListT(t.view_of(t.shape[:-1] + (2,), scope.grad, multi=True), 2))))
            if t.ndim >= 2 and _stable(t.shape) and t.is_float:
                opts.append(("make", lambda: ([f"{{L}} = list({a}.unbind(0))"],
                                              ListT(t.view_of(t.shape[1:], scope.grad, multi=True), None))))
        for n, lt in lists:
            e = lt.elem
            if lt.length is not None and lt.length >= 1:
                opts.append(("use", lambda n=n, lt=lt: ([f"{{t}} = {n}[0]"], lt.elem)))
                if e.is_float:
                    opts.append(("use", lambda n=n, lt=lt: ([f"{{t}} = sum({n})"], self.ex.res(scope, lt.elem.shape, lt.elem.dtype, lt.elem))))
                    opts.append(("use", lambda n=n, lt=lt: ([f"{{t}} = torch.stack({n}, dim=0)"],
                                                            self.ex.res(scope, (lt.length,) + lt.elem.shape, lt.elem.dtype, lt.elem))))
            if e.is_float:
                opts.append(("comp", lambda n=n, lt=lt: self._comprehension(scope, n, lt)))
                if e.ndim:
                    opts.append(("use", lambda n=n, lt=lt: ([f"{{t}} = torch.cat({n}, dim=-1)"],
                                                            self.ex.res(scope, lt.elem.shape[:-1] + (self.fresh_dim("u"),), lt.elem.dtype, lt.elem))))
            if n not in scope.iterating:
                same = [m for m, u in scope.tensors() if u.shape == e.shape and u.dtype == e.dtype and not u.noinp]
                if same:
                    b = rng.choice(same)
                    bt = scope.vars[b]
                    grow = lambda k, lt=lt: None if lt.length is None else lt.length + k  # noqa: E731
                    opts.append(("mut", lambda n=n, lt=lt, b=b, bt=bt: ([f"{n}.append({b})"], ListT(join(lt.elem, bt), grow(1), lt.inp))))
                    opts.append(("mut", lambda n=n, lt=lt, b=b, bt=bt: ([f"{n}.insert(0, {b})"], ListT(join(lt.elem, bt), grow(1), lt.inp))))
                    opts.append(("mut", lambda n=n, lt=lt, b=b, bt=bt: ([f"{n}.extend([{b}, {b}])"], ListT(join(lt.elem, bt), grow(2), lt.inp))))
                    if lt.length:
                        opts.append(("mut", lambda n=n, lt=lt, b=b, bt=bt: ([f"{n}[-1] = {b}"], ListT(join(lt.elem, bt), lt.length, lt.inp))))
                if lt.length is not None and lt.length >= 2 and scope.loop is None:
                    opts.append(("mut", lambda n=n, lt=lt: ([f"{n}.pop()"], ListT(lt.elem, lt.length - 1, lt.inp))))
                    opts.append(("mut", lambda n=n, lt=lt: ([f"del {n}[0]"], ListT(lt.elem, lt.length - 1, lt.inp))))
                    opts.append(("unpack", lambda n=n, lt=lt: self._unpack(scope, n, lt)))
                opts.append(("mut", lambda n=n, lt=lt: ([f"{n}.reverse()"], lt)))
        if not opts:
            return None
        kind, make = rng.choice(opts)[:2]
        res = make()
        if res is None:
            return None
        lines, typ = res
        if kind == "make" or kind == "comp":
            name = self.fresh("L")
            scope.set(name, typ)
            lines = [ln.replace("{L}", name) for ln in lines]
        elif kind == "use":
            name = self.fresh("t")
            scope.set(name, typ)
            lines = [ln.replace("{t}", name) for ln in lines]
        elif kind == "mut":
            target = lines[0].replace("del ", "").split(".")[0].split("[")[0]
            scope.set(target, typ)
        tags = {"list"} | ({"mutate_input"} if kind == "mut" and getattr(typ, "inp", False) else set())
        return Node(lines, tags=frozenset(tags))

    def _comprehension(self, scope, n, lt):
        inner = scope.child()
        inner.set("e", lt.elem)
        e = self.keep_type_expr(inner, "e", lt.elem)
        if e is None:
            return None
        form = self.rng.choice(["[{e} for e in {n}]", "[{e} for i, e in enumerate({n}) if i >= 0]",
                                "[({e}) * (i + 1) for i, e in enumerate({n})]"])
        return ["{L} = " + form.replace("{e}", e[0]).replace("{n}", n)], ListT(TT(lt.elem.shape, lt.elem.dtype, e[1].rg), lt.length)

    def _unpack(self, scope, n, lt):
        a, b = self.fresh("t"), self.fresh("L")
        scope.set(a, lt.elem)
        scope.set(b, ListT(lt.elem, lt.length - 1))
        return [f"{a}, *{b} = {n}"], lt

    def s_dict(self, scope):
        rng = self.rng
        ds = scope.of(DictT)
        ts = scope.tensors(lambda t: t.is_float)
        if not ts:
            return None
        if not ds or self.chance(0.3):
            a, t = self.pick(ts)
            name = self.fresh("dd")
            if ds and self.chance(0.5):
                dn, dt = rng.choice(ds)
                inner = scope.child()
                inner.set("val", dt.elem)
                e = self.keep_type_expr(inner, "val", dt.elem)
                if e is None:
                    return None
                scope.set(name, DictT(TT(dt.elem.shape, dt.elem.dtype, e[1].rg), dt.keys))
                return Node([f"{name} = {{key: {e[0]} for key, val in {dn}.items()}}"], tags=frozenset({"dict"}))
            scope.set(name, DictT(t, frozenset({"p"})))
            return Node([f"{name} = {{'p': {a}}}"], tags=frozenset({"dict"}))
        dn, dt = rng.choice(ds)
        same = [n for n, u in scope.tensors() if u.shape == dt.elem.shape and u.dtype == dt.elem.dtype]
        opts = []
        if dt.keys:
            key = rng.choice(sorted(dt.keys))
            opts.append(("get", f"{{t}} = {dn}['{key}']", dt.elem))
            opts.append(("get", f"{{t}} = {dn}.get('zz', {dn}['{key}'])", dt.elem))
        if same and dn not in scope.iterating:
            b = rng.choice(same)
            key = rng.choice(["c", "a", "q"])
            opts.append(("set", f"{dn}['{key}'] = {b}", DictT(join(dt.elem, scope.vars[b]), dt.keys | {key}, dt.inp)))
            opts.append(("set", f"{dn}.update(c={b})", DictT(join(dt.elem, scope.vars[b]), dt.keys | {"c"}, dt.inp)))
            if "c" in dt.keys:
                opts.append(("set", f"del {dn}['c']", DictT(dt.elem, dt.keys - {"c"}, dt.inp)))
            if dt.keys:
                k2 = rng.choice(sorted(dt.keys))
                opts.append(("set", f"{dn}.pop('{k2}')", DictT(dt.elem, dt.keys - {k2}, dt.inp)))
            opts.append(("set", f"{dn}.setdefault('c', {b})", DictT(join(dt.elem, scope.vars[b]), dt.keys | {"c"}, dt.inp)))
        if not opts:
            return None
        kind, code, typ = rng.choice(opts)
        if kind == "get":
            name = self.fresh("t")
            scope.set(name, typ)
            return Node([code.replace("{t}", name)], tags=frozenset({"dict"}))
        scope.set(dn, typ)
        return Node([code], tags=frozenset({"dict"} | ({"mutate_input"} if dt.inp else set())))

    def s_object(self, scope):
        rng = self.rng
        opts = []
        ts = scope.tensors(lambda t: t.is_float)
        if "box" in scope.vars and ts:
            a, _ = self.pick(ts)
            opts += [["box.k += 1"], [f"box.extra = {a}.sum()"], [f"setattr(box, 'tag', box.k * 2)"],
                     ["box.t = box.t * 2"] if scope.rebindable("box.t") else ["box.k = box.k - 1"],
                     [f"{{t}} = getattr(box, 't') + box.k"]]
        if "m" in scope.vars and scope.kind == "fn":
            opts += [["m.calls += 1"], ["m.tag = 'seen'"],
                     ["with torch.no_grad():", "    m.lin.weight.mul_(0.9)"], ["m.buf.add_(1.0)"]]
        if not opts:
            return None
        lines = rng.choice(opts)
        if "{t}" in lines[0]:
            name = self.fresh("t")
            t = scope.vars["box.t"]
            scope.set(name, TT(t.shape, t.dtype, False))
            lines = [lines[0].replace("{t}", name)]
        return Node(lines, tags=frozenset({"mutate_object", "mutate_input"}))

    def s_global(self, scope):
        rng = self.rng
        ts = scope.tensors(lambda t: t.ndim > 0)
        opts = [['STATE["calls"] += 1'], ['STATE["hist"].append(len(STATE["hist"]))']]
        if ts:
            a, _ = self.pick(ts)
            opts += [[f'STATE["hist"].append({a}.shape[0])'], [f'STATE["last"] = {a}.shape']]
        if not scope.used_global and scope.kind == "fn" and scope.depth == 0:
            scope.used_global = True
            opts.append(["global TOTAL", "TOTAL = globals().get('TOTAL', 0) + 1"])
        return Node(rng.choice(opts), tags=frozenset({"mutate_global"}))

    def s_print(self, scope):
        rng = self.rng
        ts = scope.tensors()
        if not ts:
            return None
        a, t = self.pick(ts)
        opts = [f'print("{a}", tuple({a}.shape), {a}.dtype, file=LOG)',
                f'print("{a}.requires_grad", {a}.requires_grad, file=LOG)',
                f'print("grad mode", torch.is_grad_enabled(), file=LOG)',
                f'LOG.write(f"{a}: {{{a}.shape}}\\n")',
                f'print("{a}", {a}.shape)']
        opts.append(f'print("sum", float({a}.sum()), file=LOG)')
        return Node([rng.choice(opts)], tags=frozenset({"break", "print"}))

    def s_scalar_break(self, scope):
        rng = self.rng
        ts = scope.tensors(lambda t: t.is_float)
        if not ts:
            return None
        a, t = self.pick(ts)
        opts = [(f"float({a}.mean())", PyFloat()), (f"{a}.sum().item()", PyFloat()),
                (f"int(({a} > 0).sum())", PyInt(lo=0)), (f"round(float({a}.abs().max()), 3)" if t.ndim == 0 or _stable(t.shape) else f"float({a}.sum())", PyFloat())]
        if t.ndim == 1 and _stable(t.shape):
            opts.append((f"sum({a}.tolist())", PyFloat()))
        if t.ndim >= 1:
            opts.append((f"len({a}.tolist())", PyInt(lo=0)))
        code, typ = rng.choice(opts)
        name = self.fresh("f" if isinstance(typ, PyFloat) else "n")
        scope.set(name, typ)
        return Node([f"{name} = {code}"], tags=frozenset({"break", "item"}))

    def s_other_break(self, scope):
        rng = self.rng
        ts = scope.tensors(lambda t: t.is_float)
        opts = [["comptime.graph_break()"]]
        if ts:
            a, t = self.pick(ts)
            name = self.fresh("t")
            opts.append([f"{name} = torch.as_tensor({a}.detach().numpy() * 2.0)"])
            lines = rng.choice(opts)
            if name in lines[0]:
                scope.set(name, TT(t.shape, t.dtype, False))
            return Node(lines, tags=frozenset({"break"}))
        return Node(opts[0], tags=frozenset({"break"}))

    def s_backward(self, scope):
        if scope.grad is not True or scope.kind == "forward":
            return None
        ts = scope.tensors(lambda t: t.is_float and t.rg is True)
        if not ts:
            return None
        a, t = self.pick(ts)
        loss = self.fresh("loss")
        retain = "retain_graph=True" if self.chance(0.8) else ""
        lines = [f"{loss} = ({a} * {a}).sum()"]
        leaves = [n for n, u in scope.tensors() if n in ("x", "y", "w", "v") and u.leaf and u.rg is True]
        if leaves and self.chance(0.4):
            leaf = self.rng.choice(leaves)
            g = self.fresh("g")
            lines.append(f"{g}, = torch.autograd.grad({loss}, [{leaf}], allow_unused=True, retain_graph=True)")
            lines.append(f'print("grad is None", {g} is None, file=LOG)')
        else:
            lines.append(f"{loss}.backward({retain})")
            if leaves:
                leaf = self.rng.choice(leaves)
                lines.append(f'print("{leaf}.grad", None if {leaf}.grad is None else float({leaf}.grad.sum()), file=LOG)')
        return Node(lines, tags=frozenset({"backward_inside"}))

    def s_raise_out(self, scope):
        cond = self.cond(scope)
        exc = self.rng.choice(["ValueError", "RuntimeError", "KeyError"])
        return Node([], [(f"if {cond}:", [Node([f'raise {exc}("stop {self.n}")'])])], tags=frozenset({"raise"}))

    def s_module(self, scope):
        rng = self.rng
        dt = scope.vars["h"].dtype if isinstance(scope.vars.get("h"), TT) else None
        if dt is None:
            return None
        sub = getattr(scope, "module_sub", None)
        opts = [["h = h * self.scale"], ["h = h + self.buf"], ["h = self.lin(h) + h"], ["self.calls += 1"],
                ["with torch.no_grad():", "    self.buf.mul_(0.9).add_(h.detach().mean(0) * 0.1)"],
                ["if self.training:", "    h = h * 0.5"], ["h = F.linear(h, self.lin.weight)"]]
        if sub in ("seq", "norm", "mylinear"):
            opts.append(["h = self.sub(h)"])
        if sub == "list":
            opts.append(["for blk in self.blocks:", "    h = h + torch.tanh(blk(h))"])
        lines = rng.choice(opts)
        h = scope.vars["h"]
        if lines[0].startswith("h ="):
            scope.set("h", TT(h.shape, h.dtype, tri_or(h.rg, scope.grad)))
        return Node(lines, tags=frozenset({"module"}))

    def s_loop_jump(self, scope):
        return Node([], [(f"if {self.cond(scope)}:", [Node([self.rng.choice(["continue", "break"])])])])

    def s_early_return(self, scope):
        ts = scope.tensors()
        if not ts:
            return None
        a, _ = self.pick(ts)
        return Node([], [(f"if {self.cond(scope)}:", [Node([f"return {a}"])])], tags=frozenset({"early_return"}))

    def s_import(self, scope):
        ts = scope.tensors(lambda t: t.is_float)
        if not ts:
            return None
        a, t = self.pick(ts)
        imp, use = self.rng.choice(IMPORTS)
        name = self.fresh("t")
        scope.set(name, self.ex.res(scope, t.shape, t.dtype, t))
        return Node([imp, f"{name} = {use.format(a=a)}"], tags=frozenset({"import"}))

    def s_introspect(self, scope):
        opts = [['print("module", __name__, file=LOG)'],
                ['print("frame", sys._getframe(0).f_globals["__name__"], sys._getframe(0).f_code.co_name, file=LOG)'],
                ['print("locals", sorted(locals()), file=LOG)'],
                ['print("globals", sorted(k for k in globals() if not k.startswith("__")), file=LOG)'],
                [f'Pt = collections.namedtuple("Pt", "a b")', 'print("namedtuple", Pt.__module__, Pt(1, 2), file=LOG)']]
        return Node(self.rng.choice(opts), tags=frozenset({"introspect"}))

    def s_constants(self, scope):
        ts = scope.tensors(lambda t: t.is_float and t.ndim >= 1 and _stable(t.shape))
        if not ts:
            return None
        a, t = self.pick(ts)
        cfg, name = self.fresh("cfg"), self.fresh("t")
        other = "f64" if t.dtype == "f32" else "f32"
        legacy = {"f64": "torch.DoubleTensor", "f32": "torch.FloatTensor"}[other]
        opts = [([f'{cfg} = {{"dtype": {TORCH_DTYPE[other]}, "dev": torch.device("cpu"), "sl": slice(0, 1), "cls": torch.Tensor}}',
                  f'{name} = {a}.to({cfg}["dtype"]) if isinstance({a}, {cfg}["cls"]) else {a}'], t.result(dtype=other)),
                ([f'{cfg} = {{"sl": slice(0, 1), "dev": torch.device("cpu")}}',
                  f'{name} = {a}[{cfg}["sl"]].to({cfg}["dev"])'], t.view_of((1,) + t.shape[1:], scope.grad)),
                ([f"{name} = {a}.type({legacy})"], t.result(dtype=other)),
                ([f"{cfg} = ({a}.dtype, {a}.device, ...)", f"{name} = {a}[{cfg}[2]].to(dtype={cfg}[0])"], t.view_of(t.shape, scope.grad)),
                ([f"{name} = {a} * torch.finfo({a}.dtype).eps + {a}"], t.result())]
        lines, typ = self.rng.choice(opts)
        if typ.is_float and typ.rg is not False:
            typ = replace(typ, rg=self.ex.fresh_rg(scope, t))
        scope.set(name, typ)
        return Node(lines, tags=frozenset({"constants"}))

    def s_python(self, scope):
        """Plain Python on ints, floats, strings, tuples, sets: values that later scale tensors."""
        rng = self.rng
        ints = [n for n, t in scope.of(PyInt) if "." not in n] or ["2"]
        floats = [n for n, t in scope.of(PyFloat)] or ["0.5"]
        i, f = rng.choice(ints), rng.choice(floats)
        lists = [n for n, t in scope.of(ListT)]
        ni, nf = self.fresh("n"), self.fresh("f")
        opts = [
            ([f"{ni} = sum(b for _, b in [(j, j * j) for j in range({i} % 4)])"], ni, PyInt()),
            ([f"_q, {ni} = divmod({i} + 7, 3)"], ni, PyInt()),
            ([f"{nf} = max({f}, 0.25) if {i} > 1 else min({f}, -0.25)"], nf, PyFloat()),
            ([f"{nf} = math.sqrt(abs({f}) + 1.0)"], nf, PyFloat()),
            ([f"{ni} = len({{1, 2}} | {{{i}}})"], ni, PyInt(lo=2)),
            ([f"{ni} = 1 if 1 < {i} <= 3 else 0"], ni, PyInt()),
            ([f"{ni} = ({i}, {f})[0] + int({f} > 0)"], ni, PyInt()),
            ([f'tag = f"{{{i}:02d}}-{{{f}:.1f}}"', "print(tag, file=LOG)", f"{ni} = len(tag)"], ni, PyInt(lo=1)),
            ([f"if ({ni} := {i} * 2) > 3:", f"    {ni} -= 1"], ni, PyInt()),
            ([f"{ni} = sorted([{i}, 3, 1], reverse=True)[0]"], ni, PyInt(lo=3)),
            ([f"{nf} = float(sum([{f}] * 3)) / 3"], nf, PyFloat()),
            ([f"{ni} = {{'a': 1, 'b': {i}}}.get('b', 0) * 2"], ni, PyInt()),
        ]
        if lists:
            ln = rng.choice(lists)
            opts.append(([f"{ni} = sum(1 for e in {ln} if e.dim() > 1)"], ni, PyInt()))
            opts.append(([f"{ni} = int(any(e.requires_grad for e in {ln}))"], ni, PyInt()))
        lines, name, typ = rng.choice(opts)
        scope.set(name, typ)
        return Node(lines, tags=frozenset({"python"}))

    # ------------------------------------------------------------------ compound statements
    def _body(self, child, lo=1, hi=3, module=False):
        return self.block(child, self.rng.randint(lo, hi), module)

    def s_for(self, scope):
        rng = self.rng
        opts = []
        ints = [n for n, t in scope.of(PyInt) if "." not in n]
        opts.append(("range", f"range({rng.choice([2, 3] + ints)})"))
        for n, lt in scope.of(ListT):
            opts.append(("list", n))
        for n, t in scope.tensors(lambda t: t.ndim == 2 and t.is_float and _stable(t.shape)):
            opts.append(("tensor", n))
        for n, dt in scope.of(DictT):
            opts.append(("dict", n))
        kind, it = rng.choice(opts)
        child = scope.child(loop="for")
        if kind == "range":
            var = self.fresh("i")
            header = f"for {var} in {it}:"
            child.set(var, PyInt(lo=0))
        elif kind == "list":
            lt = scope.vars[it]
            var = self.fresh("e")
            if self.chance(0.5):
                idx = self.fresh("i")
                header = f"for {idx}, {var} in enumerate({it}):"
                child.set(idx, PyInt(lo=0))
            else:
                header = f"for {var} in {it}:"
            child.set(var, lt.elem)
            child.iterating.add(it)
        elif kind == "tensor":
            t = scope.vars[it]
            var = self.fresh("row")
            header = f"for {var} in {it}:"
            child.set(var, t.view_of(t.shape[1:], scope.grad))
        else:
            dt = scope.vars[it]
            var, key = self.fresh("val"), self.fresh("key")
            header = f"for {key}, {var} in {it}.items():"
            child.set(var, dt.elem)
            child.iterating.add(it)
        body = self._body(child)
        scope.absorb(child)
        return Node([], [(header, body)], tags=frozenset({"loop"}))

    def s_while(self, scope):
        i = self.fresh("i")
        ints = [n for n, t in scope.of(PyInt) if t.lo >= 0 and "." not in n]
        bound = self.rng.choice([2, 3] + ints)
        child = scope.child(loop="while")
        child.set(i, PyInt(lo=0))
        body = self._body(child, 1, 2)
        scope.absorb(child)
        return Node([f"{i} = 0"], [(f"while {i} < {bound}:", body + [Node([f"{i} += 1"])])], tags=frozenset({"loop"}))

    def s_if(self, scope):
        cond = self.cond(scope)
        a, b = scope.child(), scope.child()
        body_a = self._body(a)
        blocks = [(f"if {cond}:", body_a)]
        if self.chance(0.6):
            blocks.append(("else:", self._body(b)))
        scope.absorb(a)
        scope.absorb(b)
        return Node([], blocks, tags=frozenset({"branch"}))

    def s_if_data(self, scope):
        ts = scope.tensors(lambda t: t.is_float)
        if not ts:
            return None
        a_name, t = self.pick(ts)
        cond = self.rng.choice([f"{a_name}.sum() > 0", f"float({a_name}.mean()) > 0", f"({a_name} > 0).any()",
                                f"{a_name}.abs().max().item() > 0.5" if _stable(t.shape) or t.ndim == 0 else f"{a_name}.sum() < 0"])
        a, b = scope.child(), scope.child()
        blocks = [(f"if {cond}:", self._body(a))]
        if self.chance(0.6):
            blocks.append(("else:", self._body(b)))
        scope.absorb(a)
        scope.absorb(b)
        return Node([], blocks, tags=frozenset({"branch", "break", "data_branch"}))

    def s_grad_block(self, scope):
        rng = self.rng
        kind = self.weighted([(4, "no_grad"), (2, "enable_grad"), (2, "set_flag"), (1, "set_literal"),
                              (2, "call_restore"), (0.3, "call_leak")])[1]
        if kind == "set_flag" and not isinstance(scope.vars.get("flag"), PyBool):
            kind = "no_grad"
        literal = rng.choice([False, True])
        grad = {"no_grad": False, "enable_grad": True, "set_flag": None, "set_literal": literal,
                "call_restore": False, "call_leak": False}[kind]
        child = scope.child(grad=grad)
        body = self._body(child)
        tags = frozenset({"grad_block"})
        if kind == "call_leak":
            scope.absorb(child, sure=True)
            scope.grad = False
            return Node(["torch.set_grad_enabled(False)"], [(None, body)], tags=tags | {"grad_leak"})
        scope.absorb(child, sure=True)
        if kind == "call_restore":
            prev = self.fresh("prev")
            return Node([f"{prev} = torch.is_grad_enabled()", "torch.set_grad_enabled(False)"],
                        [(None, body)], [f"torch.set_grad_enabled({prev})"], tags=tags)
        header = {"no_grad": "with torch.no_grad():", "enable_grad": "with torch.enable_grad():",
                  "set_flag": "with torch.set_grad_enabled(flag):",
                  "set_literal": f"with torch.set_grad_enabled({literal}):"}[kind]
        return Node([], [(header, body)], tags=tags)

    def s_try(self, scope):
        rng = self.rng
        kind = rng.choice(["caught", "keyerror", "finally", "reraise", "bad_op"])
        child = scope.child()
        tags = {"try"}
        if kind == "caught":
            body = self._body(child, 1, 2)
            exc = rng.choice(["ValueError", "RuntimeError", "ZeroDivisionError"])
            raiser = [Node([f'raise {exc}("inner")'])] if exc != "ZeroDivisionError" else [Node(["1 / 0"])]
            handler = scope.child()
            hbody = [Node(['print("caught", type(e).__name__, file=LOG)'])] + self._body(handler, 0, 1)
            scope.absorb(child)
            scope.absorb(handler)
            return Node([], [("try:", body + raiser), (f"except {exc} as e:", hbody)], tags=frozenset(tags | {"raise"}))
        if kind == "keyerror":
            ds = scope.of(DictT)
            ts = scope.tensors()
            if not ds or not ts:
                return None
            dn, dt = rng.choice(ds)
            same = [n for n, u in ts if u.shape == dt.elem.shape and u.dtype == dt.elem.dtype]
            if not same:
                return None
            t = self.fresh("t")
            scope.set(t, dt.elem)
            return Node([], [("try:", [Node([f"{t} = {dn}['missing']"])]),
                             ("except KeyError:", [Node([f"{t} = {rng.choice(same)}"])])], tags=frozenset(tags))
        if kind == "finally":
            body = self._body(child, 1, 3)
            scope.absorb(child)
            return Node([], [("try:", body), ("finally:", [Node(['STATE["calls"] += 1'])])], tags=frozenset(tags))
        if kind == "reraise":
            body = self._body(child, 1, 2)
            scope.absorb(child)
            cond = self.cond(scope)
            return Node([], [("try:", body + [Node([], [(f"if {cond}:", [Node(['raise ValueError("again")'])])])]),
                             ("except ValueError:", [Node(['LOG.write("reraise\\n")', "raise"])])],
                        tags=frozenset(tags | {"raise"}))
        ts = scope.tensors(lambda t: t.ndim >= 1)
        if not ts:
            return None
        a, _ = self.pick(ts)
        bad = rng.choice([f"{a}.view(3, 7)", f"{a} @ torch.ones(5, 5, dtype={a}.dtype)", f"{a}.reshape(-1, 0)",
                          f"torch.cat([{a}, {a}.new_ones(5, 5, 5)])"])
        return Node([], [("try:", [Node([f"bad = {bad}"])]),
                         ("except (RuntimeError, ValueError) as e:", [Node(['print("bad op", type(e).__name__, file=LOG)'])])],
                    tags=frozenset(tags | {"bad_op"}))

    def s_accumulate(self, scope):
        rng = self.rng
        srcs = [(n, lt.elem, f"{n}") for n, lt in scope.of(ListT) if lt.length and lt.elem.is_float]
        ts = scope.tensors(lambda t: t.is_float)
        if not ts:
            return None
        acc = self.fresh("acc")
        start = rng.choice(["0", "0.0", "None"])
        if srcs and self.chance(0.6):
            n, elem, it = rng.choice(srcs)
            var = self.fresh("e")
            child = scope.child(loop="for")
            child.set(var, elem)
            child.iterating.add(n)
            header = f"for {var} in {it}:"
        else:
            var = self.fresh("i")
            child = scope.child(loop="for")
            child.set(var, PyInt(lo=0))
            header = f"for {var} in range({rng.choice([1, 2, 3])}):"
        e = self.expr(child, 1, pred=lambda u: u.is_float)
        if e is None:
            return None
        code, typ = e
        op = rng.choice(["{acc} += {e}", "{acc} = {acc} + {e}"])
        line = op.format(acc=acc, e=code)
        if start == "None":
            line = f"{acc} = {code} if {acc} is None else {acc} + {code}"
        scope.set(acc, typ)
        return Node([f"{acc} = {start}"], [(header, [Node([line])])], tags=frozenset({"loop", "accumulate"}))

    def s_closure(self, scope):
        ts = scope.tensors(lambda t: t.is_float)
        if not ts:
            return None
        a, t = self.pick(ts)
        name = self.fresh("inner")
        child = scope.child(kind="inner", loop=None)
        child.readonly |= set(scope.vars)
        child.depth = MAX_DEPTH - 1
        arg = TT(t.shape, t.dtype, None, leaf=True, inp=True)
        child.set("t", arg)
        child.readonly.discard("t")
        body = self._body(child, 1, 2)
        ret = child.vars["t"]
        body.append(Node(["return t"]))
        child.assigned.discard("t")
        scope.absorb(child)
        scope.set(name, FnT(TT(t.shape, t.dtype), ret.rg if isinstance(ret, TT) else None))
        out = self.fresh("t")
        scope.set(out, TT(t.shape, t.dtype, tri_and(scope.grad, ret.rg if isinstance(ret, TT) else None)))
        return Node([], [(f"def {name}(t):", body)], [f"{out} = {name}({a})"], tags=frozenset({"closure"}))

    def s_nonlocal(self, scope):
        ts = scope.tensors(lambda t: t.is_float)
        if not ts:
            return None
        a, t = self.pick(ts)
        cnt, name, out = self.fresh("cnt"), self.fresh("bump"), self.fresh("t")
        scope.set(cnt, PyInt(lo=0))
        scope.set(out, TT(t.shape, t.dtype, tri_and(scope.grad, t.rg)))
        body = [Node([f"nonlocal {cnt}", f"{cnt} += 1", f"return t * {cnt}"])]
        return Node([f"{cnt} = 0"], [(f"def {name}(t):", body)], [f"{out} = {name}({name}({a}))"],
                    tags=frozenset({"closure", "nonlocal"}))

    def s_lambda(self, scope):
        name = self.fresh("act")
        tmpl = self.rng.choice(["torch.tanh(t) * 0.5", "t.relu() + 1", "F.gelu(t)", "t * t"])
        scope.set(name, FnT(None, None))
        return Node([f"{name} = lambda t: {tmpl}"], tags=frozenset({"closure"}))

    # ------------------------------------------------------------------ return
    def return_stmt(self, scope):
        rng = self.rng
        vals = [(n, t) for n, t in scope.vars.items()
                if isinstance(t, (TT, PyInt, PyFloat, ListT, DictT)) and "." not in n]
        recent = [v for v in vals if v[0] not in ("x", "y", "w", "v", "xs", "d", "x2", "k", "s")]
        pool = recent if recent and self.chance(0.9) else vals
        if not pool or self.chance(0.04):
            return Node(["return None"])
        picks = rng.sample(pool, min(len(pool), rng.choice([1, 1, 2, 3])))
        names = [p[0] for p in picks]
        form = rng.choice(["single", "tuple", "tuple", "dict", "list"])
        if len(names) == 1 and form != "dict":
            return Node([f"return {names[0]}"])
        if form == "dict":
            return Node(["return {" + ", ".join(f"'{n}': {n}" for n in names) + "}"])
        if form == "list":
            return Node(["return [" + ", ".join(names) + "]"])
        return Node(["return " + ", ".join(names)])


class _Shift(Node):
    """Renders children one level deeper than its position (methods inside a class)."""

    def __init__(self, body):
        super().__init__([], [(None, body)])

    def render(self, depth):
        return super().render(depth + 1) or [INDENT * (depth + 1) + "pass"]


def _expr_tags(code):
    tags = set()
    if any(s in code for s in (".t()", ".T", "transpose", "permute", "[", "unsqueeze", "narrow", "select",
                               "chunk", "split", "unbind", "expand", "view", "reshape", "flatten", "diagonal")):
        tags.add("view")
    if "@" in code or "matmul" in code or "mm(" in code or "linear" in code or "einsum" in code:
        tags.add("matmul")
    if any(s in code for s in (".sum(", ".mean(", "amax", ".max(", ".min(", "norm", "logsumexp", "std", "prod")):
        tags.add("reduction")
    if any(s in code for s in (".float()", ".double()", ".long()", ".to(torch", ".type(")):
        tags.add("cast")
    if "m(" in code or "helper" in code:
        tags.add("call")
    return frozenset(tags)


def generate(seed: int) -> Program:
    prog = Generator(seed).program()
    return prog.replace(tags=frozenset(prog.all_tags()))
