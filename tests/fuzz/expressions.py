"""Tensor expressions for the program generator: every candidate operation on a typed operand,
with the type of its result. Only operations that are valid for every size the runner uses
are offered (see ``fuzz_types``)."""
from __future__ import annotations

from dataclasses import replace

from .fuzz_types import D, TT, FnT, ModT, PyFloat, PyInt, broadcast, promote, tri_and, tri_or

# Elementwise float -> float, same shape and dtype. Bounded ones are listed more than once so
# that long chains stay in float32's comfortable range.
UNARY = [
    "torch.sin({a})", "{a}.cos()", "torch.tanh({a})", "torch.tanh({a})", "{a}.sigmoid()",
    "torch.relu({a})", "F.gelu({a})", "F.silu({a})", "{a}.abs()", "(-{a})", "({a} * 0.5)",
    "torch.log1p({a}.abs())", "({a}.abs() + 1e-3).sqrt()", "{a}.clamp(-1.0, 1.0)",
    "torch.square({a})", "F.leaky_relu({a}, 0.1)", "torch.erf({a})", "{a}.clone()",
    "torch.where({a} > 0, {a}, {a} * 0.1)", "{a}.masked_fill({a} < 0, 0.0)", "{a}.exp()",
    "torch.atan({a})", "({a} + 1.0).reciprocal().clamp(-10, 10)", "torch.nan_to_num({a})",
    "F.dropout({a}, 0.25)", "{a}.to(device='cpu')", "{a}.type(torch.float32).to({a}.dtype)",
]
UNARY_DIM = [  # need ndim >= 1
    "{a}.softmax(-1)", "F.normalize({a}, dim=-1)", "{a}.cumsum(-1)", "{a}.flip(-1)",
    "{a}.roll(1, -1)", "F.log_softmax({a}, dim=-1)", "torch.sort({a}, -1).values",
]
BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / ({b}.abs() + 1.0)", "torch.maximum({a}, {b})",
          "torch.minimum({a}, {b})", "torch.where({a} > {b}, {a}, {b})", "torch.add({a}, {b}, alpha=0.5)",
          "torch.atan2({a}, {b})", "torch.lerp({a}, {b}, 0.25)"]
SCALAR_BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "{b} * {a}", "{a} / 2.0", "{a} ** 2",
                 "torch.add({a}, {b})", "{a}.mul({b})", "{b} - {a}"]


def _stable(shape):
    """Dims that are never zero (indexing, max/min reductions are valid on them)."""
    return all(not (isinstance(d, str) and d.startswith("z")) for d in shape)


class Expressions:
    """Candidates are ``(weight, code, TT)``; ``g`` is the Generator (rng, fresh dims)."""

    def __init__(self, g):
        self.g = g

    # ------------------------------------------------------------------ operands
    def tensors(self, scope, pred=None):
        return [(n, t) for n, t in scope.vars.items()
                if isinstance(t, TT) and (pred is None or pred(t))]

    def scalars(self, scope):
        out = ["0.5", "2", "-1.5", "3.0"]
        for n, t in scope.vars.items():
            if isinstance(t, PyFloat):
                out.append(n)
            elif isinstance(t, PyInt) and "." not in n:
                out.append(n)
        return out

    def fresh_rg(self, scope, *operands):
        return tri_and(scope.grad, tri_or(*[o.rg for o in operands if isinstance(o, TT)]))

    def res(self, scope, shape, dtype, *operands):
        if dtype not in ("f32", "f64"):
            return TT(shape, dtype, False)
        return TT(shape, dtype, self.fresh_rg(scope, *operands))

    # ------------------------------------------------------------------ candidates
    def unary(self, scope, a, t):
        out = []
        if t.is_float:
            for tmpl in UNARY:
                out.append((1, tmpl.format(a=a), self.res(scope, t.shape, t.dtype, t)))
            if t.ndim and _stable(t.shape):
                for tmpl in UNARY_DIM:
                    out.append((1, tmpl.format(a=a), self.res(scope, t.shape, t.dtype, t)))
            other = "f64" if t.dtype == "f32" else "f32"
            cast = {"f64": ["{a}.double()", "{a}.to(torch.float64)"], "f32": ["{a}.float()", "{a}.type(torch.float32)"]}
            for tmpl in cast[other]:
                out.append((1, tmpl.format(a=a), self.res(scope, t.shape, other, t)))
            out.append((1, f"{a}.detach()", TT(t.shape, t.dtype, False)))
            out.append((1, f"({a} > 0)", TT(t.shape, "b")))
            out.append((1, f"{a}.to({a}.dtype)", t))
        elif t.dtype == "b":
            out += [(2, f"{a}.float()", TT(t.shape, "f32")), (1, f"(~{a})", TT(t.shape, "b")),
                    (1, f"{a}.long()", TT(t.shape, "i64")), (1, f"{a}.to(torch.float64)", TT(t.shape, "f64"))]
        else:
            out += [(2, f"{a}.float()", TT(t.shape, "f32")), (1, f"({a} + 1)", TT(t.shape, "i64")),
                    (1, f"({a} * 2)", TT(t.shape, "i64")), (1, f"{a}.double()", TT(t.shape, "f64")),
                    (1, f"({a} % 3)", TT(t.shape, "i64"))]
        return out

    def binary(self, scope, a, t):
        out = []
        if not t.is_float:
            for b, u in self.tensors(scope, lambda u: u.dtype == t.dtype and u.dtype == "b"):
                shape = broadcast(t.shape, u.shape)
                if shape is not None:
                    out.append((1, f"({a} & {b})", TT(shape, "b")))
                    out.append((1, f"({a} | {b})", TT(shape, "b")))
            return out
        for b, u in self.tensors(scope, lambda u: u.is_float):
            shape = broadcast(t.shape, u.shape)
            if shape is None:
                continue
            dtype = promote(t, u)
            for tmpl in self.g.rng.sample(BINARY if u.dtype == t.dtype else BINARY[:-1], 3):
                out.append((1, "(" + tmpl.format(a=a, b=b) + ")", self.res(scope, shape, dtype, t, u)))
            out.append((1, f"({a} > {b})", TT(shape, "b")))
        for b, u in self.tensors(scope, lambda u: u.dtype == "b"):
            shape = broadcast(t.shape, u.shape)
            if shape is not None:
                out.append((2, f"{a}.masked_fill({b}, 0.25)", self.res(scope, shape, t.dtype, t)))
                out.append((1, f"({a} * {b})", self.res(scope, shape, t.dtype, t)))
                for c, v in self.tensors(scope, lambda v: v.dtype == t.dtype and broadcast(shape, v.shape) == shape):
                    out.append((2, f"torch.where({b}, {a}, {c})", self.res(scope, shape, t.dtype, t, v)))
        for s in self.g.rng.sample(self.scalars(scope), 3):
            tmpl = self.g.rng.choice(SCALAR_BINARY)
            out.append((2, "(" + tmpl.format(a=a, b=s) + ")", self.res(scope, t.shape, t.dtype, t)))
        return out

    def reductions(self, scope, a, t):
        if not t.is_float:
            return [(1, f"{a}.sum()", TT((), "i64"))] if t.dtype != "b" else [
                (1, f"{a}.sum()", TT((), "i64")), (1, f"{a}.any()", TT((), "b")), (1, f"{a}.all()", TT((), "b"))]
        r = lambda shape: self.res(scope, shape, t.dtype, t)  # noqa: E731
        out = [(2, f"{a}.sum()", r(())), (2, f"{a}.mean()", r(())), (1, f"{a}.norm()", r(()))]
        if t.ndim:
            last, first = t.shape[:-1], t.shape[1:]
            out += [(2, f"{a}.sum(-1)", r(last)), (1, f"{a}.mean(0)", r(first)),
                    (2, f"{a}.sum(-1, keepdim=True)", r(last + (1,))),
                    (1, f"{a}.mean(dim=0, keepdim=True)", r((1,) + first)),
                    (1, f"torch.logsumexp({a}, -1)", r(last))]
            if _stable(t.shape):
                out += [(1, f"{a}.amax(-1)", r(last)), (1, f"{a}.max(-1).values", r(last)),
                        (1, f"{a}.min()", r(())), (1, f"{a}.argmax(-1)", TT(last, "i64")),
                        (1, f"{a}.gather(-1, {a}.argmin(-1, keepdim=True))", r(last + (1,))),
                        (1, f"{a}.std(-1)", r(last)), (1, f"{a}.prod(-1)", r(last))]
        return out

    def matmuls(self, scope, a, t):
        out = []
        if not t.is_float or t.ndim == 0:
            return out
        for b, u in self.tensors(scope, lambda u: u.dtype == t.dtype and u.ndim == 2 and u.shape[0] == t.shape[-1]):
            shape = t.shape[:-1] + (u.shape[1],)
            res = self.res(scope, shape, t.dtype, t, u)
            out.append((3, f"({a} @ {b})", res))
            out.append((1, f"torch.matmul({a}, {b})", res))
            if t.ndim == 2:
                out.append((1, f"torch.mm({a}, {b})", res))
                out.append((1, f"torch.einsum('ij,jk->ik', {a}, {b})", res))
            if u.shape[0] == u.shape[1]:
                out.append((1, f"F.linear({a}, {b})", res))
        if t.ndim == 2:
            out.append((1, f"({a} @ {a}.t())", self.res(scope, (t.shape[0], t.shape[0]), t.dtype, t)))
            out.append((1, f"({a}.transpose(0, 1) @ {a})", self.res(scope, (t.shape[1], t.shape[1]), t.dtype, t)))
        return out

    def views(self, scope, a, t):
        g = self.g
        view = lambda shape, multi=False: t.view_of(shape, scope.grad, multi)  # noqa: E731
        out = []
        if t.ndim >= 1:
            out.append((1, f"{a}.unsqueeze(0)", view((1,) + t.shape)))
            out.append((1, f"{a}[None]", view((1,) + t.shape)))
            if _stable(t.shape):
                out.append((1, f"{a}[0]", view(t.shape[1:])))
                out.append((1, f"{a}[-1]", view(t.shape[1:])))
                out.append((1, f"{a}.select(0, 0)", view(t.shape[1:])))
                out.append((1, f"{a}[1:]", view((g.fresh_dim("u"),) + t.shape[1:])))
                out.append((1, f"{a}.narrow(0, 0, 1)", view((1,) + t.shape[1:])))
            out.append((1, f"{a}[::2]", view((g.fresh_dim("u"),) + t.shape[1:])))
            out.append((1, f"{a}.reshape(-1)", view((g.fresh_dim("u"),))))
            if t.shape[-1] == D:
                out.append((1, f"{a}[..., :2]", view(t.shape[:-1] + (2,))))
                out.append((1, f"{a}[..., 1:3]", view(t.shape[:-1] + (2,))))
                out.append((1, f"{a}.unflatten(-1, (2, 2))", view(t.shape[:-1] + (2, 2))))
                out.append((1, f"{a}.view(*{a}.shape[:-1], 2, 2).sum(-1)", self.res(scope, t.shape[:-1] + (2,), t.dtype, t)))
                out.append((1, f"{a}[..., [0, 2]]", self.res(scope, t.shape[:-1] + (2,), t.dtype, t)))
                out.append((1, f"{a}.index_select(-1, torch.tensor([3, 1]))", self.res(scope, t.shape[:-1] + (2,), t.dtype, t)))
                out.append((1, f"{a}.chunk(2, -1)[{g.rng.randint(0, 1)}]", view(t.shape[:-1] + (2,), multi=True)))
            out.append((1, f"{a}.contiguous()", view(t.shape)))
            out.append((1, f"{a}.expand(2, *{a}.shape)", replace(view((2,) + t.shape), noinp=True)))
            out.append((1, f"{a}.flatten()", view((g.fresh_dim("u"),))))
        if t.ndim == 2:
            out.append((2, f"{a}.t()", view(t.shape[::-1])))
            out.append((1, f"{a}.transpose(0, 1)", view(t.shape[::-1])))
            out.append((1, f"{a}.T", view(t.shape[::-1])))
            out.append((1, f"{a}.permute(1, 0)", view(t.shape[::-1])))
            out.append((1, f"{a}[:, 0]", view(t.shape[:1])))
            out.append((1, f"{a}.reshape({a}.shape[0], 2, -1)" if t.shape[1] == D else f"{a}.unsqueeze(-1)",
                        view((t.shape[0], 2, 2) if t.shape[1] == D else t.shape + (1,))))
            if t.shape[0] == t.shape[1]:
                out.append((1, f"{a}.diagonal()", view(t.shape[:1])))
            if t.is_float:
                out.append((1, f"{a}.unbind(0)[0]" if _stable(t.shape) else f"{a}.sum(0)",
                            view(t.shape[1:], multi=True) if _stable(t.shape) else self.res(scope, t.shape[1:], t.dtype, t)))
        if t.ndim == 3:
            out.append((1, f"{a}.transpose(-1, -2)", view(t.shape[:-2] + t.shape[:-3:-1])))
            out.append((1, f"{a}.flatten(-2)", view(t.shape[:-2] + (g.fresh_dim("u"),))))
        if t.ndim == 0:
            out.append((1, f"{a}.reshape(1)", view((1,))))
            out.append((1, f"{a}.expand({D})", replace(view((D,)), noinp=True)))
        return out

    def combos(self, scope, a, t):
        """cat / stack / masked select / creation from ``a``."""
        g = self.g
        out = [(1, f"torch.zeros_like({a})", TT(t.shape, t.dtype)),
               (1, f"torch.ones_like({a})", TT(t.shape, t.dtype)),
               (1, f"torch.full_like({a}, 0.5)", TT(t.shape, t.dtype if t.is_float else "f32")
                if t.is_float else TT(t.shape, t.dtype))]
        if not t.is_float:
            return out[:2]
        for b, u in self.tensors(scope, lambda u: u.dtype == t.dtype and u.shape == t.shape):
            if t.ndim:
                out.append((1, f"torch.cat([{a}, {b}], dim=-1)", self.res(scope, t.shape[:-1] + (g.fresh_dim("u"),), t.dtype, t, u)))
                out.append((1, f"torch.cat(({a}, {b}))", self.res(scope, (g.fresh_dim("u"),) + t.shape[1:], t.dtype, t, u)))
            out.append((1, f"torch.stack([{a}, {b}])", self.res(scope, (2,) + t.shape, t.dtype, t, u)))
        if t.ndim:
            out.append((1, f"{a}[{a} > 0]", self.res(scope, (g.fresh_dim("z"),), t.dtype, t)))
            out.append((1, f"{a}.new_zeros({a}.shape)", TT(t.shape, t.dtype)))
        if t.ndim and t.shape[0] == "B":
            out.append((1, f"torch.arange({a}.shape[0], dtype={('torch.float64' if t.dtype == 'f64' else 'torch.float32')})", TT(("B",), t.dtype)))
        return out

    def calls(self, scope, a, t):
        """Modules, helpers and closures that take ``a`` and keep its type."""
        out = []
        for name, f in scope.vars.items():
            if isinstance(f, ModT) and t.is_float and t.dtype == f.dtype and t.ndim == 2 and t.shape[-1] == D:
                out.append((4, f"{name}({a})", TT(t.shape, t.dtype, tri_and(scope.grad, f.ret_rg))))
            elif isinstance(f, FnT) and t.is_float and (f.arg is None or (f.arg.shape == t.shape and f.arg.dtype == t.dtype)):
                rg = tri_and(scope.grad, f.ret_rg)
                out.append((3, f"{name}({a})", TT(t.shape, t.dtype, rg)))
        for name in scope.autograd_fns:
            if t.is_float:
                out.append((3, f"{name}.apply({a}, {self.g.rng.choice(self.scalars(scope))})",
                            TT(t.shape, t.dtype, tri_and(scope.grad, t.rg))))
        for name, (fn_dtype, ret_rg) in scope.helpers.items():
            if t.is_float and t.dtype == fn_dtype and t.ndim == 2 and t.shape[-1] == D:
                c = self.g.rng.choice(self.scalars(scope))
                form = self.g.rng.choice(["{f}({a}, {c})", "{f}({a}, {c})", "{f}(t={a}, c={c})", "{f}(*({a}, {c}))",
                                          "{f}({a}, **{{'c': {c}}})"])
                out.append((3, form.format(f=name, a=a, c=c),
                            TT(t.shape, t.dtype, tri_and(scope.grad, tri_or(ret_rg, t.rg)) if ret_rg is not False else False)))
        return out

    FAMILY_WEIGHTS = {"unary": 4, "binary": 4, "reduce": 2, "matmul": 2, "view": 2, "combo": 1, "call": 2}

    def choose(self, scope, a, t, kinds=None, pred=None):
        """One candidate ``(code, TT)`` on ``a``: a family first (by weight), then an operation
        of it whose result satisfies ``pred``; None when no family has one."""
        fams = {"unary": self.unary, "binary": self.binary, "reduce": self.reductions, "matmul": self.matmuls,
                "view": self.views, "combo": self.combos, "call": self.calls}
        left = [(self.FAMILY_WEIGHTS[k], k) for k in (kinds or fams)]
        while left:
            _, k = self.g.weighted(left)
            left = [x for x in left if x[1] != k]
            cands = [c for c in fams[k](scope, a, t) if pred is None or pred(c[2])]
            if cands:
                _, code, typ = self.g.weighted(cands)
                return code, typ
        return None
