"""The static types the program generator tracks, so that what it writes is valid Python and
valid torch for every size the runner calls it with.

A tensor's shape is a tuple of dims: an ``int`` (a fixed size), ``"B"`` (the batch size, which
changes between calls) or another string (an unknown size: a slice, a concatenation). The
generator only combines shapes that match dim for dim (or broadcast through a fixed 1), so a
program never depends on two sizes happening to be equal.

``rg`` (requires grad) is ``True``, ``False`` or ``None`` (depends on the path taken). The flags
say which in-place operations eager would refuse: ``leaf`` (a leaf that requires grad, or a view
of one), ``mview`` (one output of chunk/split/unbind), ``ngview`` (a view made under no_grad of
a tensor that requires grad). ``inp`` marks an input or a view of one (in-place changes it).
"""
from __future__ import annotations

from dataclasses import dataclass

D = 4          # the fixed feature size of every program
FLOATS = ("f32", "f64")
TORCH_DTYPE = {"f32": "torch.float32", "f64": "torch.float64", "i64": "torch.int64", "b": "torch.bool"}
_CATEGORY = {"b": 0, "i64": 1, "f32": 2, "f64": 2}
_RANK = {"b": 0, "i64": 1, "f32": 2, "f64": 3}


def tri_or(*values):
    """Three-valued OR over True/False/None."""
    if any(v is True for v in values):
        return True
    if all(v is False for v in values):
        return False
    return None


def tri_and(*values):
    if any(v is False for v in values):
        return False
    if all(v is True for v in values):
        return True
    return None


def tri_join(a, b):
    return a if a == b else None


@dataclass(frozen=True)
class TT:
    shape: tuple
    dtype: str = "f32"
    rg: object = False
    leaf: bool = False
    mview: bool = False
    ngview: bool = False
    inp: bool = False
    noinp: bool = False      # expanded: eager refuses any in-place write

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS

    def result(self, shape=None, dtype=None, rg=None):
        """A fresh (non-view) tensor computed from this one."""
        return TT(self.shape if shape is None else shape, dtype or self.dtype, rg)

    def view_of(self, shape, grad, multi=False):
        """A view of this tensor taken in grad mode ``grad``."""
        rg = tri_and(self.rg, grad) if self.is_float else False
        return TT(shape, self.dtype, rg, leaf=self.leaf,
                  mview=self.mview or (multi and self.rg is not False),
                  ngview=self.ngview or (grad is not True and self.rg is not False), inp=self.inp,
                  noinp=self.noinp)


@dataclass(frozen=True)
class PyInt:
    dim: object = None       # the shape dim it equals, when it was read from a shape
    lo: int = 0               # a lower bound on its value (for range() and indexing)


@dataclass(frozen=True)
class PyFloat:
    pass


@dataclass(frozen=True)
class PyBool:
    pass


@dataclass(frozen=True)
class ListT:
    elem: TT
    length: object = None     # int when known on every path
    inp: bool = False


@dataclass(frozen=True)
class DictT:
    elem: TT
    keys: frozenset = frozenset()   # keys present on every path
    inp: bool = False


@dataclass(frozen=True)
class BoxT:
    t: TT
    inp: bool = False


@dataclass(frozen=True)
class ModT:
    dtype: str = "f32"
    ret_rg: object = None     # whether forward's result requires grad (called in grad mode)


@dataclass(frozen=True)
class FnT:
    arg: object               # TT the closure was written for; None: any float tensor
    ret_rg: object = None


@dataclass(frozen=True)
class Opaque:
    """A name that must not be used again (its type differs between paths)."""


def join(a, b):
    """The type of a variable after two paths that gave it types ``a`` and ``b``."""
    if a == b:
        return a
    if isinstance(a, TT) and isinstance(b, TT) and a.shape == b.shape and a.dtype == b.dtype:
        return TT(a.shape, a.dtype, tri_join(a.rg, b.rg), a.leaf or b.leaf, a.mview or b.mview,
                  a.ngview or b.ngview, a.inp or b.inp, a.noinp or b.noinp)
    if isinstance(a, ListT) and isinstance(b, ListT):
        elem = join(a.elem, b.elem)
        if isinstance(elem, TT):
            return ListT(elem, a.length if a.length == b.length else None, a.inp or b.inp)
    if isinstance(a, DictT) and isinstance(b, DictT):
        elem = join(a.elem, b.elem)
        if isinstance(elem, TT):
            return DictT(elem, a.keys & b.keys, a.inp or b.inp)
    if isinstance(a, BoxT) and isinstance(b, BoxT):
        t = join(a.t, b.t)
        if isinstance(t, TT):
            return BoxT(t, a.inp or b.inp)
    if isinstance(a, PyInt) and isinstance(b, PyInt):
        return PyInt(a.dim if a.dim == b.dim else None, min(a.lo, b.lo))
    return Opaque()


def broadcast(*shapes):
    """The broadcast shape, or None when the shapes do not broadcast for every size."""
    nd = max(len(s) for s in shapes)
    out = []
    for i in range(1, nd + 1):
        dims = [s[-i] for s in shapes if len(s) >= i]
        dims = [d for d in dims if d != 1] or [1]
        if any(d != dims[0] for d in dims):
            return None
        out.append(dims[0])
    return tuple(reversed(out))


def promote(*operands):
    """torch's result dtype. Operands are ``TT`` or the strings "int"/"float" (Python
    numbers). Zero-dim tensors and Python numbers only win with a higher category."""
    dimmed = [o.dtype for o in operands if isinstance(o, TT) and o.ndim > 0]
    zero = [o.dtype for o in operands if isinstance(o, TT) and o.ndim == 0]
    scalars = [o for o in operands if isinstance(o, str)]
    result = max(dimmed, key=_RANK.get) if dimmed else None
    if zero:
        z = max(zero, key=_RANK.get)
        if result is None or _CATEGORY[z] > _CATEGORY[result]:
            result = z
    for s in scalars:
        cat = 2 if s == "float" else 1
        if result is None or cat > _CATEGORY[result]:
            result = "f32" if cat == 2 else "i64"
    return result
