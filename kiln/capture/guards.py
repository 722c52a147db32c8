"""Guards: every fact about the outside world that a compiled entry relies on.

A guard is data, ``Guard(kind, source, expected)``. The same data

* renders into the one generated check function of an entry (see ``codegen``),
* prints readably (``KILN_LOGS=guards``, ``kiln.explain``),
* explains a failure: which guard, and the value it saw (``KILN_LOGS=recompiles``).

Tensor facts (type, dtype, device, requires_grad, sizes, strides, dispatch keys, and that no
two tensor inputs are the same object) are checked together by one C-level ``TensorGuards``
call over all tensor inputs; global state (grad mode, default dtype, deterministic mode,
TF32 flags, thread count) by one ``GlobalStateGuard``.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import math
import operator
import weakref
from typing import Any

import torch

from .. import _torch
from ..aot.saved_hooks.guard import describe as describe_hooks, hooks_are
from .sources import RenderContext, Source, is_argument_rooted


_ABSENT = object()       # (a key a dict of the guarded function lacks)

class GuardKind(enum.Enum):
    TYPE_MATCH = "TYPE_MATCH"          # type(x) is T
    ID_MATCH = "ID_MATCH"              # x is obj (functions, modules, classes, globals read)
    EQUALS_MATCH = "EQUALS_MATCH"      # type(x) is T and x == v (Python constants)
    LENGTH_MATCH = "LENGTH_MATCH"      # len of a list/tuple's storage
    DICT_KEYS = "DICT_KEYS"            # the keys of a dict, in order
    DICT_KEYS_IDENTITY = "DICT_KEYS_IDENTITY"  # the same, some keys objects compared by identity
                                       # (tensors); expected: the keys
    HASATTR = "HASATTR"                # hasattr(x, name) is expected
    NOT_IN_INSTANCE_DICT = "NOT_IN_INSTANCE_DICT"  # name not in x.__dict__ (the class's
                                       # attribute, a module's forward, is not shadowed on x)
    GLOBAL_ABSENT = "GLOBAL_ABSENT"    # a builtin is not shadowed by a module global
    NO_HOOKS = "NO_HOOKS"              # an nn.Module has no hooks registered
    ALIAS_MATCH = "ALIAS_MATCH"        # two sources are the same object (x is y)
    TENSOR_MATCH = "TENSOR_MATCH"      # dtype/device/shape/stride/requires_grad/type
    GLOBAL_STATE = "GLOBAL_STATE"      # grad mode, default dtype, deterministic mode, ...
    BACKEND_MATCH = "BACKEND_MATCH"    # the entry was compiled for the caller's backend
    FUNCTION_MATCH = "FUNCTION_MATCH"  # the compiled function's code, defaults, kwdefaults
                                       # (expected: (weakref to it, code, defaults, kwdefaults))
    AUTOCAST_STATE = "AUTOCAST_STATE"  # autocast enabled/dtype per device (captured inside autocast)
    SHAPE_ENV = "SHAPE_ENV"            # a relation between symbolic sizes (dynamic shapes)
    SAVED_TENSOR_HOOKS = "SAVED_TENSOR_HOOKS"  # the inlineable saved-tensor hooks active (by
                                       # identity; expected: (pack, unpack) or None)


@dataclasses.dataclass(frozen=True, eq=False)
class Guard:
    kind: GuardKind
    source: Source | None
    expected: Any = None

    def key(self) -> tuple:
        exp = self.expected
        if self.kind in (GuardKind.ID_MATCH, GuardKind.TYPE_MATCH):
            exp = id(exp)
        elif self.kind is GuardKind.ALIAS_MATCH:
            exp = exp  # a Source, hashable
        elif self.kind in (GuardKind.TENSOR_MATCH, GuardKind.GLOBAL_STATE, GuardKind.NO_HOOKS,
                           GuardKind.AUTOCAST_STATE):
            exp = None
        elif self.kind is GuardKind.GLOBAL_ABSENT:
            exp = (id(exp[0]), exp[1])
        elif self.kind is GuardKind.LENGTH_MATCH or self.kind is GuardKind.HASATTR:
            exp = tuple(exp)
        elif self.kind is GuardKind.NOT_IN_INSTANCE_DICT:
            exp = str(exp)
        elif self.kind is GuardKind.EQUALS_MATCH:
            exp = (type(exp), _hashable(exp) if not (type(exp) is float and (exp != exp or exp == 0.0))
                   else repr(exp))
        elif self.kind is GuardKind.FUNCTION_MATCH:
            exp = tuple(id(x) for x in exp)
        elif self.kind is GuardKind.SAVED_TENSOR_HOOKS:
            exp = None if exp is None else (id(exp[0]), id(exp[1]), len(exp[2]))
        elif self.kind is GuardKind.DICT_KEYS:
            exp = tuple((type(k), _hashable(k)) for k in exp)
        elif self.kind is GuardKind.DICT_KEYS_IDENTITY:
            exp = tuple((type(k), id(k) if is_identity_key(k) else _hashable(k)) for k in exp)
        return (self.kind, self.source, exp)

    # -- rendering ---------------------------------------------------------------------
    def render(self, ctx: RenderContext) -> str:
        """A Python boolean expression; raises nothing for the expected objects."""
        return " and ".join(self.render_parts(ctx))

    def render_parts(self, ctx: RenderContext) -> list[str]:
        """The conditions ``render`` joins with ``and``, in order (a check that holds several
        guards states a condition that two of them share once: ``guard_cse``)."""
        k = self.kind
        e = self.source.render(ctx) if self.source is not None else None
        if k is GuardKind.TYPE_MATCH:
            return [f"type({e}) is {ctx.bind(self.expected, 't')}"]
        if k is GuardKind.ID_MATCH:
            ref = _weak_identity(self.source, self.expected)
            if ref is not None:   # an object of the call: the entry must not keep it alive
                return [f"{e} is {ctx.bind(ref, 'wref')}()"]
            return [f"{e} is {ctx.bind(self.expected, 'o')}"]
        if k is GuardKind.EQUALS_MATCH:
            v = self.expected
            if v is None or isinstance(v, bool):
                return [f"{e} is {v!r}"]
            t = ctx.bind(type(v), 't')
            if type(v) is float and (v != v or v == 0.0):
                return [f"type({e}) is {t}", f"{ctx.bind(_float_same, 'feq')}({e}, {ctx.bind(v, 'c')})"]
            if type(v) in (set, frozenset):
                return [f"type({e}) is {t}", f"{ctx.bind(_typed_set, 'tset')}({e}) == {ctx.bind(_typed_set(v), 'c')}"]
            if _equal_yet_different(v):
                return [f"type({e}) is {t}",
                        f"{ctx.bind(_typed_constant, 'tconst')}({e}) == {ctx.bind(_typed_constant(v), 'c')}"]
            lit = repr(v) if type(v) in (int, str) else ctx.bind(v, "c")
            return [f"type({e}) is {t}", f"{e} == {lit}"]
        if k is GuardKind.LENGTH_MATCH:
            n, how = self.expected
            fn = ctx.bind({"list": list.__len__, "tuple": tuple.__len__,
                           "dict": dict.__len__}.get(how, len), "len")
            return [f"{fn}({e}) == {n}"]
        if k is GuardKind.DICT_KEYS:
            return [f"{ctx.bind(_dict_keys_list, 'keys')}({e}) == {ctx.bind(typed_keys(self.expected), 'c')}"]
        if k is GuardKind.DICT_KEYS_IDENTITY:
            flags = tuple(is_identity_key(x) for x in self.expected)
            by_identity = True if all(flags) else flags      # (all: one C-level pass)
            return [f"{ctx.bind(_keys_are, 'idkeys')}({e}, {ctx.bind(tuple(self.expected), 'c')}, "
                    f"{ctx.bind(by_identity, 'c')})"]
        if k is GuardKind.HASATTR:
            name, present = self.expected
            return [f"{'' if present else 'not '}hasattr({e}, {name!r})"]
        if k is GuardKind.NOT_IN_INSTANCE_DICT:
            return [f"{self.expected!r} not in {e}.__dict__"]
        if k is GuardKind.GLOBAL_ABSENT:
            gdict, name = self.expected
            return [f"{name!r} not in {ctx.bind(gdict, 'G')}"]
        if k is GuardKind.NO_HOOKS:
            if self.source is None:
                return [f"{ctx.bind(_no_global_module_hooks, 'nohooks')}()"]
            if e.isidentifier():     # (a local: four attribute reads cost less than a call)
                return ["not (" + " or ".join(f"{e}.{h}" for h in _MODULE_HOOK_DICTS) + ")"]
            return [f"{ctx.bind(_module_has_no_hooks, 'nohooks')}({e})"]
        if k is GuardKind.ALIAS_MATCH:
            return [f"{e} is {self.expected.render(ctx)}"]
        if k is GuardKind.AUTOCAST_STATE:
            return [f"{ctx.bind(_autocast_state, 'autocast')}() == {ctx.bind(self.expected, 'c')}"]
        if k is GuardKind.SAVED_TENSOR_HOOKS:
            check = f"{ctx.bind(hooks_are, 'hooks')}({ctx.bind(self.expected, 'c')})"
            top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
            if self.expected is None and top is not None:
                # no hooks at all (the usual case): one C call, on every call of the entry
                return [f"({ctx.bind(top, 'tophooks')}(True) is None or {check})"]
            return [check]
        if k is GuardKind.FUNCTION_MATCH:
            # the function by weak reference: its entries (which it owns) must not keep it alive
            # (inline, not a call: it runs on every call of the entry; the function is read
            # once, into a local named after its reference)
            fn_ref, code, d, kwd = self.expected
            ref = ctx.bind(fn_ref, 'fnref')
            fn = f"{ref}_fn"
            # (the entry's own signature holds the keyword-only defaults' values: a value
            # replaced in the dict, ``f.__kwdefaults__["k"] = 5``, is a change too)
            values = "".join(f" and {fn}.__kwdefaults__.get({k!r}, {ctx.bind(_ABSENT, 'absent')}) is "
                             f"{ctx.bind(v, 'd')}" for k, v in (kwd or {}).items())
            count = f" and len({fn}.__kwdefaults__) == {len(kwd)}" if kwd else ""
            return [f"(({fn} := {ref}()) is not None and {fn}.__code__ is {ctx.bind(code, 'code')} and "
                    f"{fn}.__defaults__ is {ctx.bind(d, 'd')} and {fn}.__kwdefaults__ is {ctx.bind(kwd, 'd')}"
                    f"{count}{values})"]
        raise AssertionError(f"{k} is rendered by its own mechanism")

    def describe(self) -> str:
        k = self.kind
        src = self.source.describe() if self.source is not None else ""
        exp = self.expected
        if k is GuardKind.TYPE_MATCH:
            return f"{k.value:14} type({src}) is {_qualname(exp)}"
        if k is GuardKind.ID_MATCH:
            if isinstance(exp, _CallObject):
                exp = exp.ref()
                return f"{k.value:14} {src} is " + (_short_repr(exp) if exp is not None else "<a freed object>")
            return f"{k.value:14} {src} is {_short_repr(exp)}"
        if k is GuardKind.EQUALS_MATCH:
            return f"{k.value:14} {src} == {exp!r}"
        if k is GuardKind.LENGTH_MATCH:
            return f"{k.value:14} len({src}) == {exp[0]}"
        if k is GuardKind.DICT_KEYS:
            return f"{k.value:14} keys({src}) == {list(exp)!r}"
        if k is GuardKind.DICT_KEYS_IDENTITY:
            shown = ", ".join(_identity_key_text(x) if is_identity_key(x) else repr(x) for x in exp)
            return f"{k.value:14} keys({src}) are [{shown}] (tensors and modules by identity)"
        if k is GuardKind.HASATTR:
            return f"{k.value:14} hasattr({src}, {exp[0]!r}) is {exp[1]}"
        if k is GuardKind.NOT_IN_INSTANCE_DICT:
            if isinstance(getattr(self.source, "obj", None), type):
                return f"{k.value:14} class {src} defines no {exp!r} (a base class's is used)"
            return f"{k.value:14} {src} has no instance attribute {exp!r} (its class's is used)"
        if k is GuardKind.GLOBAL_ABSENT:
            return f"{k.value:14} {exp[1]!r} is not a module global (builtin {exp[1]} is used)"
        if k is GuardKind.NO_HOOKS:
            if self.source is None:
                return f"{k.value:14} no global nn.Module hooks are registered"
            return f"{k.value:14} {src} has no forward/backward hooks"
        if k is GuardKind.ALIAS_MATCH:
            return f"{k.value:14} {src} is {exp.describe()}"
        if k is GuardKind.TENSOR_MATCH:
            return f"{k.value:14} {src}: {describe_tensor(exp)}"
        if k is GuardKind.SAVED_TENSOR_HOOKS:
            return f"{k.value:14} {describe_hooks(exp)}"
        if k is GuardKind.AUTOCAST_STATE:
            return f"{k.value:14} " + ", ".join(f"{d}: enabled={on} dtype={dt}" for d, (on, dt) in exp.items())
        if k is GuardKind.FUNCTION_MATCH:
            fn = exp[0]()
            name = fn.__qualname__ if fn is not None else "<a freed function>"
            return f"{k.value:14} {name} keeps its __code__, __defaults__ and __kwdefaults__"
        if k is GuardKind.GLOBAL_STATE:
            return f"{k.value:14} {', '.join(f'{a}={b}' for a, b in exp.items())}"
        if k is GuardKind.BACKEND_MATCH:
            return f"{k.value:14} backend is {exp}"
        if k is GuardKind.SHAPE_ENV:
            return f"{k.value:14} {exp}"
        return f"{k.value} {src} {exp!r}"

    def __repr__(self) -> str:
        return f"Guard({self.describe()})"


def ordered_keys(d: dict):
    """``d``'s keys in its iteration order: an OrderedDict's own order (``move_to_end`` changes
    it, not the order of the dict underneath)."""
    return collections.OrderedDict.keys(d) if isinstance(d, collections.OrderedDict) else dict.keys(d)


def _dict_keys_list(d: dict) -> list:
    # (type, key): True == 1 == 1.0, but a dict keyed by True is not one keyed by 1
    return [(k.__class__, k) for k in ordered_keys(d)]


def typed_keys(keys) -> list:
    return [(k.__class__, k) for k in keys]


def is_identity_key(k) -> bool:
    """A dict key found by identity: a tensor (hashed by ``id``; ``==`` would compare its
    elements), an nn.Module that keeps object's hash and equality."""
    return isinstance(k, torch.Tensor) or (isinstance(k, torch.nn.Module) and type(k).__hash__ is object.__hash__
                                           and type(k).__eq__ is object.__eq__)


def _identity_key_text(k) -> str:
    if isinstance(k, torch.Tensor):
        return f"<{type(k).__name__} {tuple(k.shape)}>"
    return f"<{type(k).__name__} at {id(k):#x}>"


def _keys_are(d: dict, expected: tuple, by_identity) -> bool:
    """``d``'s keys are ``expected``, in order: each key whose flag in ``by_identity`` is set (all
    of them where it is True) the very object, the others of the same class and equal."""
    keys = ordered_keys(d)
    if len(keys) != len(expected):
        return False
    if by_identity is True:
        return all(map(operator.is_, keys, expected))
    for k, e, identity in zip(keys, expected, by_identity):
        if identity:
            if k is not e:
                return False
        elif k.__class__ is not e.__class__ or k != e:
            return False
    return True


def _float_same(a, b: float) -> bool:
    # == alone confuses -0.0 with 0.0 and never matches nan
    if b != b:
        return a != a
    return a == b and (b != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b))


def _equal_yet_different(v) -> bool:
    """Whether ``v`` has ``==`` peers that behave otherwise: ranges equal as sequences
    (``range(0) == range(-10)``), slices and tuples of other-typed or signed-zero parts,
    complex numbers with a signed zero or nan."""
    t = type(v)
    if t in (range, slice, complex):
        return True
    if t is tuple:
        return any(_equal_yet_different(x) or (type(x) is float and (x != x or x == 0.0)) for x in v)
    return False


def _typed_constant(x):
    """A key equal for constants that behave alike: each part with its type, floats by repr
    (-0.0 and nan apart), a range by its start, stop and step."""
    t = type(x)
    if t is range:
        return (range, x.start, x.stop, x.step)
    if t is slice:
        return (slice, _typed_constant(x.start), _typed_constant(x.stop), _typed_constant(x.step))
    if t is tuple:
        return (tuple, *(_typed_constant(i) for i in x))
    if t in (float, complex):
        return (t, repr(x))
    return (t, x)


def _typed_set(s) -> frozenset:
    return frozenset((k.__class__, k) for k in s)


def _autocast_state() -> dict:
    return {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")}


class _CallObject:
    """The expected object of an identity guard, when it came from the call's arguments: held
    weakly, for descriptions only (the check itself was rendered already)."""
    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref


def without_call_objects(guards: list) -> list:
    """``guards`` for keeping in an entry (descriptions, failure reasons): an identity guard on
    an object of the call (a function passed in) holds it weakly. A function made in the
    caller holds its closure, and so the call's tensors."""
    out = []
    for g in guards:
        if g.kind is GuardKind.ID_MATCH and not isinstance(g.expected, _CallObject):
            ref = _weak_identity(g.source, g.expected)
            if ref is not None:
                g = Guard(g.kind, g.source, _CallObject(ref))
        out.append(g)
    return out


def _weak_identity(source, obj):
    """A weak reference for an identity check of an object reached from the call's arguments
    (a function passed in, or held by an argument), None when the check may hold ``obj``:
    what globals, closures and constants reach lives as long as they do anyway."""
    import types as _types
    if not is_argument_rooted(source) or isinstance(obj, (type, _types.ModuleType)):
        return None
    try:
        return weakref.ref(obj)
    except TypeError:   # not weakly referenceable (builtins, dtypes): kept
        return None


_MODULE_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _module_has_no_hooks(m: torch.nn.Module) -> bool:
    return not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or m._backward_pre_hooks)


def _no_global_module_hooks() -> bool:
    return not any(_torch.global_module_hooks())


def _hashable(v: Any) -> Any:
    try:
        hash(v)
        return v
    except TypeError:
        return ("unhashable", id(v))


def _qualname(t: Any) -> str:
    return f"{getattr(t, '__module__', '?')}.{getattr(t, '__qualname__', t)}"


def _short_repr(v: Any) -> str:
    import types as _types

    if isinstance(v, _types.ModuleType):
        return f"<module {v.__name__}>"
    if isinstance(v, type) or callable(v) and hasattr(v, "__qualname__"):
        return f"<{type(v).__name__} {_qualname(v)}>"
    r = repr(v)
    return r if len(r) < 60 else r[:57] + "..."


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """What TENSOR_MATCH checks, kept for printing and for explaining failures."""
    type: type
    dtype: torch.dtype
    device: torch.device
    size: tuple
    stride: tuple
    requires_grad: bool
    symbolic_size: tuple | None = None     # sizes as the graph sees them ("s4821"), if dynamic
    symbolic_stride: tuple | None = None
    # what else TENSOR_MATCH's dispatch keys tell apart (a conjugate or negative view, an
    # inference tensor, a layout other than strided), or None: a package cannot rebuild those
    special: str | None = None

    @staticmethod
    def of(t: torch.Tensor, sizes: tuple | None = None, strides: tuple | None = None) -> "TensorMeta":
        """``t``'s meta; ``sizes``/``strides``: the symbolic ones the graph sees (dynamic)."""
        sym_size = None if sizes is None else tuple(str(s) for s in sizes)
        sym_stride = None if strides is None else tuple(str(s) for s in strides)
        return TensorMeta(type(t), t.dtype, t.device, tuple(t.size()), tuple(t.stride()),
                          t.requires_grad, sym_size, sym_stride, _special(t))


def _special(t: torch.Tensor) -> str | None:
    kinds = [what for what, test in (("a conjugate view", t.is_conj), ("a negative view", t.is_neg),
                                     ("an inference tensor", t.is_inference)) if test()]
    if t.layout != torch.strided:
        kinds.append(f"layout {t.layout}")
    return ", ".join(kinds) or None


def describe_tensor(m: TensorMeta) -> str:
    kind = "" if m.type is torch.Tensor else f"{m.type.__name__} "
    size = list(m.symbolic_size) if m.symbolic_size else list(m.size)
    stride = list(m.symbolic_stride) if m.symbolic_stride else list(m.stride)
    txt = ", ".join(str(x) for x in size)
    return (f"{kind}{str(m.dtype).replace('torch.', '')}[{txt}] stride=[{', '.join(str(x) for x in stride)}] "
            f"{m.device} requires_grad={m.requires_grad}")


class GuardSet:
    """Guards of one capture, deduplicated, in the order they were installed (a base is
    always installed before anything read through it, so evaluation order is safe)."""

    def __init__(self) -> None:
        self._guards: dict[tuple, Guard] = {}

    def add(self, guard: Guard) -> None:
        self._guards.setdefault(guard.key(), guard)

    def __iter__(self):
        return iter(self._guards.values())

    def __len__(self) -> int:
        return len(self._guards)

    def describe(self) -> str:
        return "\n".join(g.describe() for g in self)
