"""Guards in a package: each ``GuardKind`` owns how it is saved (``SAVERS``), and a loaded
entry's guard program is rebuilt from that text without any capture.

A guard is saved as its readable text (``describe()``, shown by ``kiln package inspect``),
the Python expression its check renders to (over the entry's namespace, see ``values``) and
what its kind needs to be rebuilt: the tensor metadata TensorGuards is made from, the global
state GlobalStateGuard restores. An identity guard (``x is obj``) is saved only where
``obj`` has a name that finds the same object in a fresh process (a module, a class, a
function by qualified name; an object of the function's globals, closure or defaults);
otherwise the entry is left out and the save report says why.
"""
from __future__ import annotations

from typing import Callable

import torch

from .. import _torch
from ..capture.codegen import MISS, GuardProgram
from ..capture.guards import Guard, GuardKind, TensorMeta, _CallObject
from ..capture.sources import AttrSource, CellSource, ConstSource, ItemSource, Source
from .errors import NotPackageable
from .values import Encoder


def _plain(g: Guard, enc: Encoder) -> dict:
    return {}


def _identity(g: Guard, enc: Encoder) -> dict:
    if isinstance(g.expected, _CallObject):
        obj = g.expected.ref()
        if obj is None:
            raise NotPackageable(f"{g.describe()}: the object was freed")
    else:
        obj = g.expected            # (None itself too: ``x is None`` of a class attribute)
    try:
        return {"object": enc.encode(obj, identity=True)}
    except NotPackageable as e:
        where = _path_from_a_named_object(g.source, enc)
        if where is not None and not _in_the_functions_own_state(where):
            enc.specials[id(obj)] = where     # (the generated code binds the same object)
            return {"object": where}
        raise NotPackageable(f"identity guard {g.describe().split(None, 1)[1]}: {e}") from None


# encodings rooted in the state of the function a package or frame record is loaded against:
# its closure cells, defaults, and the function object itself. Another function with the same
# code (a closure over another callable) has other values there.
_FUNCTION_STATE = frozenset({"fn", "cell", "default", "kwdefault", "defaults", "kwdefaults"})


def _in_the_functions_own_state(path: list) -> bool:
    """Whether ``path`` finds its object through the loaded function's own state. An identity
    guard's object must not be found so: the guard would compare that state with itself, and
    hold for every function of that code (a factory's closure over ``sub`` ran for ``add``)."""
    while isinstance(path, list) and path and path[0] in ("attr", "index", "cell_of", "class_dict"):
        path = path[1]
    return isinstance(path, list) and bool(path) and path[0] in _FUNCTION_STATE


def _path_from_a_named_object(source, enc: Encoder) -> list | None:
    """The encoding of the guarded object as the path the guard reads it by, from an object
    that has a name (``<type PreTrainedConfig>.__dict__['attribute_map']``: a class attribute
    with no name of its own). In a fresh process the same path finds the object the guard then
    compares by identity; its contents are guarded by the checks after it."""
    if isinstance(source, CellSource):      # (a cell of a function found by its name)
        cell = enc.where(source.cell)
        return None if cell is None else ["attr", cell, "cell_contents"]
    if isinstance(source, ConstSource):
        try:
            return enc.encode(source.obj, identity=True)
        except NotPackageable:
            return None
    if isinstance(source, AttrSource):
        base = _path_from_a_named_object(source.base, enc)
        return None if base is None else ["attr", base, source.name]
    if isinstance(source, ItemSource) and type(source.key) in (str, int):
        base = _path_from_a_named_object(source.base, enc)
        return None if base is None else ["index", base, source.key]
    return None


def _type(g: Guard, enc: Encoder) -> dict:
    try:
        return {"type": enc.encode(g.expected, identity=True)}
    except NotPackageable as e:
        raise NotPackageable(f"type guard {g.describe().split(None, 1)[1]}: {e}") from None


def _tensor(g: Guard, enc: Encoder) -> dict:
    m: TensorMeta = g.expected
    if m.type not in (torch.Tensor, torch.nn.Parameter):
        raise NotPackageable(f"tensor guard on {g.source.describe()}: a {m.type.__name__} (only "
                             "torch.Tensor and nn.Parameter inputs are rebuilt on load)")
    if m.special is not None:
        raise NotPackageable(f"tensor guard on {g.source.describe()}: {m.special} (a package rebuilds "
                             "plain strided tensors only)")
    return {"meta": {"parameter": m.type is torch.nn.Parameter, "dtype": str(m.dtype).replace("torch.", ""),
                     "device": str(m.device), "size": list(m.size), "stride": list(m.stride),
                     "requires_grad": m.requires_grad}}


def _global_state(g: Guard, enc: Encoder) -> dict:
    return {"expected": {k: str(v) for k, v in g.expected.items()}}


def _function(g: Guard, enc: Encoder) -> dict:
    fn = g.expected[0]()
    if fn is not enc.fn:
        raise NotPackageable(f"{g.describe()}: not the function the package is loaded against")
    return {}


def _absent(g: Guard, enc: Encoder) -> dict:
    return {"globals": enc.encode(g.expected[0], identity=True)}


def _hooks(g: Guard, enc: Encoder) -> dict:
    if g.expected is None:
        return {}
    try:
        return {"hooks": [enc.encode(h, identity=True) for h in g.expected[:2]]}
    except NotPackageable as e:
        raise NotPackageable(f"saved-tensor hooks guard: {e}") from None


def _keys_by_identity(g: Guard, enc: Encoder) -> dict:
    # (a later process has other tensors: a dict keyed by this process's tensors, an optimizer's
    # state, cannot be checked there)
    raise NotPackageable(f"{g.describe()}: a dict keyed by tensors of this process")


# One saver per kind: (guard, encoder) -> the kind's own data (JSON), or NotPackageable.
SAVERS: dict[GuardKind, Callable[[Guard, Encoder], dict]] = {
    GuardKind.TYPE_MATCH: _type,
    GuardKind.ID_MATCH: _identity,
    GuardKind.EQUALS_MATCH: _plain,        # its value is in the rendered expression / namespace
    GuardKind.LENGTH_MATCH: _plain,
    GuardKind.DICT_KEYS: _plain,
    GuardKind.DICT_KEYS_IDENTITY: _keys_by_identity,
    GuardKind.HASATTR: _plain,
    GuardKind.NOT_IN_INSTANCE_DICT: _plain,
    GuardKind.GLOBAL_ABSENT: _absent,
    GuardKind.NO_HOOKS: _plain,
    GuardKind.ALIAS_MATCH: _plain,
    GuardKind.TENSOR_MATCH: _tensor,
    GuardKind.GLOBAL_STATE: _global_state,
    GuardKind.BACKEND_MATCH: _plain,       # the compile key is saved with the package
    GuardKind.FUNCTION_MATCH: _function,
    GuardKind.AUTOCAST_STATE: _plain,
    GuardKind.SHAPE_ENV: _plain,           # its text; the conditions are saved as code
    GuardKind.SAVED_TENSOR_HOOKS: _hooks,
}


def save_guard(g: Guard, enc: Encoder) -> dict:
    saver = SAVERS.get(g.kind)
    if saver is None:
        raise NotPackageable(f"guard kind {g.kind.value} has no package form")
    return {"kind": g.kind.value, "text": g.describe(),
            "source": g.source.describe() if g.source is not None else None, **saver(g, enc)}


def save_program(program: GuardProgram, enc: Encoder) -> dict:
    """The guard program of an entry, as text."""
    guards = [save_guard(g, enc) for g in program.guards]
    metas = {g.source: g for g in program.guards if g.kind is GuardKind.TENSOR_MATCH}
    tensor_metas = []
    for src in program.tensor_sources:
        g = metas.get(src)
        if g is None:
            raise NotPackageable(f"tensor input {src.describe()} has no TENSOR_MATCH guard")
        tensor_metas.append(save_guard(g, enc)["meta"])
    shape = program.shape
    # (check_expr: the guard's condition as the entry's straight-line check states it)
    python = [{"text": g.describe(), "expr": e, "check_expr": c, "source_expr": _source_expr(g.source, program)}
              for g, e, c in zip(program.python_guards, program.exprs, program.check_exprs)]
    return {
        "params": program.params, "fwd": program.fwd, "guards": guards, "python": python,
        "tensor_exprs": program.tensor_exprs, "tensor_names": [s.describe() for s in program.tensor_sources],
        "tensor_metas": tensor_metas, "tensor_dims": program.tensor_dims,
        "global_state": program.global_state.__getstate__(),
        "shape_binds": program.shape_binds, "shape_conds": program.shape_conds,
        "shape_texts": shape.descriptions() if shape is not None else [],
    }


def _source_expr(source, program: GuardProgram) -> str | None:
    if source is None:
        return None
    try:
        return source.render(program.ctx)
    except Exception:
        return None


class SavedGuard(Guard):
    """A guard as loaded from a package: its kind and text (for descriptions and failure
    reasons; the check itself is in the generated code)."""

    @classmethod
    def make(cls, kind: GuardKind, source, text: str, expected=None) -> "SavedGuard":
        g = cls(kind, source, expected)
        object.__setattr__(g, "text", text)
        return g

    def describe(self) -> str:
        return self.text


class RenderedSource(Source):
    """A source saved as the expression it rendered to (over the entry's namespace)."""

    def __init__(self, expr: str, text: str):
        self.expr, self.text = expr, text

    def render(self, ctx) -> str:
        return self.expr

    def describe(self) -> str:
        return self.text


def _example(meta: dict) -> torch.Tensor:
    """A tensor with the type, dtype, device and requires_grad TensorGuards compares, and no
    data (its sizes and strides are given to TensorGuards explicitly: a package of a large
    model does not allocate its parameters again to rebuild the guards)."""
    t = torch.empty(0, dtype=getattr(torch, meta["dtype"]), device=meta["device"])
    if meta["parameter"]:
        return torch.nn.Parameter(t, requires_grad=meta["requires_grad"])
    return t.requires_grad_(meta["requires_grad"])


class LoadedProgram(GuardProgram):
    """An entry's guard program rebuilt from a package: the same checks, prelude and failure
    reasons as the captured one (see ``GuardProgram``), made from text."""

    def __init__(self, saved: dict, ctx):
        self.params, self.fwd, self.ctx = saved["params"], saved["fwd"], ctx
        self.shape = None
        self.tensor_dims = saved["tensor_dims"]
        self.global_state = _torch.GlobalState.from_state(saved["global_state"])
        metas = saved["tensor_metas"]
        dims = self.tensor_dims or ([m["size"] for m in metas], [m["stride"] for m in metas])
        self.tensor_guards = _torch.make_tensor_guards([_example(m) for m in metas], dims)
        ctx.namespace["___gs"] = self.global_state
        ctx.namespace["___tg"] = self.tensor_guards
        ctx.namespace["___MISS"] = MISS
        # (failure() compares GLOBAL_STATE's described state with the current one)
        self.guards = [SavedGuard.make(GuardKind(g["kind"]), None, g["text"],
                                       _TextState(g["expected"]) if "expected" in g else None)
                       for g in saved["guards"]]
        self.python_guards = [SavedGuard.make(GuardKind.EQUALS_MATCH,
                                              RenderedSource(p["source_expr"], "") if p["source_expr"] else None,
                                              p["text"]) for p in saved["python"]]
        self.exprs = [p["expr"] for p in saved["python"]]
        self.tensor_exprs = saved["tensor_exprs"]
        self.tensor_sources = [RenderedSource(e, n) for e, n in zip(saved["tensor_exprs"], saved["tensor_names"])]
        # the check: one condition per guard (the entry's own code, saved whole, has the
        # straight-line form; this serves ``make_check``)
        self.check_lines = [f"if not ({' and '.join(self.exprs)}):", "    return ___MISS"] if self.exprs else []
        self.check_tensor_exprs = self.tensor_exprs
        self.check_exprs = [p.get("check_expr", p["expr"]) for p in saved["python"]]
        self.shape_binds, self.shape_conds = saved["shape_binds"], saved["shape_conds"]
        self._shape_texts = saved["shape_texts"]

    def _shape_failure(self, args, kwargs) -> str | None:
        reads = [f"    ___in{i} = {e}" for i, e in enumerate(self.tensor_exprs)]
        body = "\n".join([f"def ___eval({self.params}):", *reads, *[f"    {b}" for b in self.shape_binds],
                          f"    return [{', '.join(self.shape_conds)}]"])
        try:
            ok = self._helper(body)(*args, **kwargs)
        except Exception as ex:
            return f"SHAPE_ENV failed: cannot evaluate ({type(ex).__name__}: {ex})"
        for holds, text in zip(ok, self._shape_texts or self.shape_conds):
            if not holds:
                return f"SHAPE_ENV failed: {text}"
        return None


class _TextState(dict):
    """GLOBAL_STATE's expected values as saved: text, compared with the current values as text."""

    def items(self):
        return [(k, _AsText(v)) for k, v in super().items()]


class _AsText(str):
    def __ne__(self, other):
        return str(self) != str(other)

    def __eq__(self, other):
        return str(self) == str(other)

    __hash__ = str.__hash__

