"""Generated code of a compiled entry.

From one capture's guards, graph and reconstruction expressions we generate Python source
for a function with the user's own signature (so Python does argument binding)::

    def __kiln_entry(x, y, scale=___d0):
        try:
            if not (___gs.check() and type(scale) is ___t1 and scale == 2):
                return ___MISS
            ___in0 = x; ___in1 = y
            if not ___tg.check(___in0, ___in1):
                return ___MISS
        except Exception:
            return ___MISS
        ___out = ___graph(___in0, ___in1)
        return (___out[0], 2)

(shown with the user's parameter names: the source itself spells them ``___p0``... so that
no parameter can shadow a name the generated code uses; see ``alias_parameters``). A guard
that raises counts as failed. Tensor reads are shared between the tensor check and the graph
call. ``compile_function`` turns the source into a function that looks like the user's own
to whatever it calls: the user's globals, names and line numbers, kiln's values bound in a
closure. The same guards also generate a plain ``check`` (for ``kiln.explain`` and tests)
and per-guard evaluators for failure reasons.
"""
from __future__ import annotations

import builtins
import dis
import importlib
from inspect import CO_VARARGS, CO_VARKEYWORDS
import re
import types
from typing import Any, NamedTuple

import torch

from .. import _torch
from ..errors import Unsupported
from .guards import Guard, GuardKind, without_call_objects
from . import module_state
from .guard_cse import straight_line
from .sources import RenderContext, Source, TensorPropertySource
from .values.base import Value

MISS = type("KilnMiss", (), {"__repr__": lambda self: "<kiln MISS>", "__slots__": ()})()


def alias_parameters(code: types.CodeType, ctx: RenderContext) -> None:
    """Give every parameter the alias the generated code uses for it (``___p0``...), before
    anything is rendered. The generated source never spells a user's parameter name, so a
    parameter called ``type`` or ``len`` cannot shadow a builtin the guards call, and names
    that are not identifiers (".0", "@py_assert1") need nothing special; ``compile_function``
    gives the parameters their own names back in the code object."""
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & CO_VARARGS) + bool(code.co_flags & CO_VARKEYWORDS)
    for i, name in enumerate(code.co_varnames[:n]):
        ctx.local_alias.setdefault(name, f"___p{i}")


class EntryCodegen:
    def __init__(self, code: types.CodeType | None = None) -> None:
        self.ctx = RenderContext()
        if code is not None:
            alias_parameters(code, self.ctx)
        self.output_nodes: list = []
        self._output_index: dict = {}
        self.statements: list[str] = []   # run before the return (objects built once)
        self._stashed: dict[int, str] = {}
        self._building: set[int] = set()

    # -- expression helpers used by Value.reconstruct -------------------------------------------
    def bind(self, obj: Any, hint: str = "k") -> str:
        return self.ctx.bind(obj, hint)

    def source_expr(self, source: Source) -> str:
        return source.render(self.ctx)

    def constant_expr(self, v: Any) -> str:
        return self.ctx.constant_expr(v)

    def key_expr(self, k: Any) -> str:
        if isinstance(k, Value):
            return k.reconstruct(self)
        return self.constant_expr(k)

    def stash(self, value, build) -> str:
        """Build an object created in the frame once, into a local, so that identity is kept
        when it is returned or stored in several places."""
        name = self._stashed.get(id(value))
        if name is not None:
            return name
        if id(value) in self._building:
            raise Unsupported("returning an object that contains itself")
        self._building.add(id(value))
        expr = build()
        self._building.discard(id(value))
        name = f"___obj{len(self._stashed)}"
        self._stashed[id(value)] = name
        self.statements.append(f"{name} = {expr}")
        return name

    def graph_output(self, node) -> str:
        i = self._output_index.get(node)
        if i is None:
            i = self._output_index[node] = len(self.output_nodes)
            self.output_nodes.append(node)
        return f"___out[{i}]"


def signature_text(code: types.CodeType, defaults: tuple | None, kwdefaults: dict | None,
                   ctx: RenderContext) -> tuple[str, str]:
    """(parameter list, call arguments forwarding them) for a code object's signature."""
    alias_parameters(code, ctx)
    names = [ctx.local_alias.get(n, n) for n in code.co_varnames]
    nargs, nposonly, nkwonly = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    defaults = defaults or ()
    kwdefaults = kwdefaults or {}
    params, fwd = [], []
    first_default = nargs - len(defaults)
    for i in range(nargs):
        p = names[i]
        if i >= first_default:
            params.append(f"{p}={ctx.bind(defaults[i - first_default], 'd')}")
        else:
            params.append(p)
        fwd.append(p)
        if nposonly and i == nposonly - 1:
            params.append("/")
    i = nargs + nkwonly
    star = names[i] if code.co_flags & CO_VARARGS else None
    if star:
        params.append(f"*{star}")
        fwd.append(f"*{star}")
        i += 1
    elif nkwonly:
        params.append("*")
    for user, p in zip(code.co_varnames[nargs:nargs + nkwonly], names[nargs:nargs + nkwonly]):
        params.append(f"{p}={ctx.bind(kwdefaults[user], 'd')}" if user in kwdefaults else p)
        fwd.append(f"{user}={p}")
    if code.co_flags & CO_VARKEYWORDS:
        kw = names[i]
        params.append(f"**{kw}")
        fwd.append(f"**{kw}")
    return ", ".join(params), ", ".join(fwd)


class UnchangedTreeCheck(NamedTuple):
    """The check of a call whose module trees did not change since its last full check
    (``module_state``): the memo's name, the roots' expressions, the tensor inputs taken from
    the snapshot, the statements and tensor reads of the guards it does not cover, and how many
    guards it covers."""
    memo: str
    roots: list[str]
    cached: list[int]
    lines: list[str]
    reads: list[tuple[int, str]]
    covered: int


class GuardProgram:
    """The guards of an entry, compiled: check code, and failure explanation."""

    def __init__(self, guards: list[Guard], tensor_sources: list[Source], tensor_guards,
                 global_state, ctx: RenderContext, params: str, shape=None, fwd: str = ""):
        self.guards = guards
        self.fwd = fwd       # the call arguments that forward the parameters (``x, *a, k=k``)
        self.tensor_dims = None   # TensorGuards' (sizes, strides) with None where symbolic
        self.shape = shape   # shape_guards.ShapeGuards of a dynamic capture, else None
        self.tensor_sources = tensor_sources
        self.tensor_guards = tensor_guards
        self.global_state = global_state
        self.ctx = ctx
        self.params = params
        self.ctx.namespace["___gs"] = global_state
        self.ctx.namespace["___tg"] = tensor_guards
        self.ctx.namespace["___MISS"] = MISS
        self.python_guards = [g for g in guards if g.kind not in (
            GuardKind.TENSOR_MATCH, GuardKind.GLOBAL_STATE, GuardKind.BACKEND_MATCH, GuardKind.SHAPE_ENV)]
        self.exprs = [g.render(ctx) for g in self.python_guards]
        # the check itself: shared reads in locals, shared conditions once (guard_cse.py)
        self.check_lines, self.check_tensor_exprs, self.check_exprs = straight_line(
            self.python_guards, tensor_sources, ctx)
        # and the check of a call whose module trees did not change (module_state.py)
        self.unchanged_tree = None
        cover = module_state.coverage(self.python_guards, tensor_sources)
        if cover is not None:
            rest = [g for i, g in enumerate(self.python_guards) if i not in cover.guards]
            cached = set(cover.tensors)
            kept = [i for i in range(len(tensor_sources)) if i not in cached]
            lines, exprs, _ = straight_line(rest, [tensor_sources[i] for i in kept], ctx)
            self.unchanged_tree = UnchangedTreeCheck(
                ctx.bind(module_state.ModuleStateMemo(cover.plans), "msm"), [r.render(ctx) for r in cover.roots],
                cover.tensors, lines, list(zip(kept, exprs)), len(cover.guards))
        # rendered: what is kept from here on holds the call's objects weakly
        self.guards = without_call_objects(guards)
        self.python_guards = without_call_objects(self.python_guards)
        self.tensor_exprs = [s.render(ctx) for s in tensor_sources]
        self.shape_binds, self.shape_conds = shape.code(self._render_shape_source) if shape else ([], [])

    def _render_shape_source(self, source: Source) -> str:
        # a size of a tensor input is read from the local the tensor check already holds
        if isinstance(source, TensorPropertySource) and source.base in self.tensor_sources:
            i = self.tensor_sources.index(source.base)
            return f"___in{i}.{source.prop}({'' if source.idx is None else source.idx})"
        return source.render(self.ctx)

    def prelude(self, indent: str = "    ") -> list[str]:
        """Lines that return ___MISS when a guard fails; leave tensors in ___t0.. locals."""
        lines = [f"{indent}try:", f"{indent}    if not ___gs.check():", f"{indent}        return ___MISS"]
        all_reads = [f"___in{i} = {e}" for i, e in enumerate(self.check_tensor_exprs)]
        unchanged = getattr(self, "unchanged_tree", None)     # (a loaded program has none)
        if unchanged is None:
            lines += [f"{indent}    {line}" for line in (*self.check_lines, *all_reads)]
        else:
            memo, roots, cached, fast_lines, fast_reads, _ = unchanged
            held = "".join(f"___in{i}, " for i in cached)
            same = " and ".join(f"{memo}.unchanged({r}, ___ms[{k}])" for k, r in enumerate(roots))
            lines += [f"{indent}    ___ms = {memo}.state",
                      f"{indent}    if ___ms is not None and {same}:",
                      f"{indent}        {memo}.used = True",
                      *([f"{indent}        {held}= ___ms[-1]"] if held else []),
                      *(f"{indent}        {line}" for line in fast_lines),
                      *(f"{indent}        ___in{i} = {e}" for i, e in fast_reads),
                      f"{indent}    else:",
                      f"{indent}        {memo}.state = None",      # (a changed tree is not held)
                      *(f"{indent}        {line}" for line in (*self.check_lines, *all_reads)),
                      f"{indent}        {memo}.record(({''.join(r + ', ' for r in roots)}), ({held}))"]
        if self.check_tensor_exprs:
            names = ", ".join(f"___in{i}" for i in range(len(self.tensor_exprs)))
            lines.append(f"{indent}    if not ___tg.check({names}):")
            lines.append(f"{indent}        return ___MISS")
        lines += [f"{indent}    {b}" for b in self.shape_binds]
        if self.shape_conds:
            lines.append(f"{indent}    if not ({' and '.join(self.shape_conds)}):")
            lines.append(f"{indent}        return ___MISS")
        lines.append(f"{indent}except Exception:")
        lines.append(f"{indent}    return ___MISS")
        return lines

    def make_check(self, name: str, like: types.CodeType | None = None, f_globals: dict | None = None):
        body = [f"def {name}({self.params}):", *self.prelude(), "    return True"]
        fn = compile_function("\n".join(body), name, self.ctx.namespace, aliases=self.ctx.local_alias,
                              like=like, f_globals=f_globals)

        def check(*args, **kwargs):
            return fn(*args, **kwargs) is True
        check.__kiln_source__ = fn.__kiln_source__
        return check

    def failure(self, args: tuple, kwargs: dict) -> str | None:
        """Which guard fails for these arguments, and the value it saw (None: all hold)."""
        if not self.global_state.check():
            now = _torch.global_state_description()
            g = next(g for g in self.guards if g.kind is GuardKind.GLOBAL_STATE)
            diff = {k: (v, now[k]) for k, v in g.expected.items() if now.get(k) != v}
            parts = ", ".join(f"{k}: expected {a}, got {b}" for k, (a, b) in diff.items())
            return f"GLOBAL_STATE changed ({parts or 'torch-level state'})"
        for guard, expr in zip(self.python_guards, self.exprs):
            ok, seen = self._evaluate(expr, guard.source, args, kwargs)
            if not ok:
                return f"{guard.describe().split(None, 1)[0]} failed: {guard.describe().split(None, 1)[1]}" + (
                    f" (saw {seen})" if seen is not None else "")
        if self.tensor_exprs:
            tensors = []
            for e in self.tensor_exprs:
                fn = self._helper(f"def ___eval({self.params}):\n    return {e}")
                try:
                    tensors.append(fn(*args, **kwargs))
                except Exception as ex:
                    return f"TENSOR_MATCH failed: cannot read {e} ({type(ex).__name__}: {ex})"
            names = [s.describe() for s in self.tensor_sources]
            why = _torch.tensor_guard_failure(self.tensor_guards, tensors, names)
            if why is not None:
                return f"TENSOR_MATCH failed: {why}"
        if self.shape_conds:
            return self._shape_failure(args, kwargs)
        return None

    def _shape_failure(self, args, kwargs) -> str | None:
        """The first shape guard that fails, with the sizes it saw."""
        reads = [f"    ___in{i} = {e}" for i, e in enumerate(self.tensor_exprs)]
        binds = [f"    {b}" for b in self.shape_binds]
        names = [b.split(" = ", 1)[0] for b in self.shape_binds]
        # the values seen: each symbol's, and each checked source's (a specialized int input)
        names += [self._render_shape_source(src) for src, _ in self.shape.checks]
        body = "\n".join([f"def ___eval({self.params}):", *reads, *binds,
                          f"    return [{', '.join(self.shape_conds)}], [{', '.join(names)}]"])
        try:
            ok, values = self._helper(body)(*args, **kwargs)
        except Exception as ex:
            return f"SHAPE_ENV failed: cannot evaluate ({type(ex).__name__}: {ex})"
        texts = self.shape.descriptions()
        nb = len(self.shape.bindings)
        bound = [f"{src.describe()} = {v}" for (_, src), v in zip(self.shape.bindings, values)]
        checked = [(src.describe(), v) for (src, _), v in zip(self.shape.checks, values[nb:])]
        for holds, text in zip(ok, texts):
            if not holds:
                # every symbol's value, and that of a checked source the condition names
                seen = dict.fromkeys(bound + [f"{d} = {v}" for d, v in checked if d in text])
                return f"SHAPE_ENV failed: {text} (saw {', '.join(seen)})"
        return None

    def _helper(self, src: str):
        """A function of the entry's signature evaluating guard expressions (for reasons)."""
        return compile_function(src, "___eval", self.ctx.namespace, aliases=self.ctx.local_alias)

    def _evaluate(self, expr: str, source, args, kwargs) -> tuple[bool, str | None]:
        fn = self._helper(f"def ___eval({self.params}):\n    return bool({expr})")
        try:
            ok = fn(*args, **kwargs)
        except Exception as ex:
            return False, f"{type(ex).__name__}: {ex}"
        seen = None
        if not ok and source is not None:
            getter = self._helper(f"def ___eval({self.params}):\n    return {source.render(self.ctx)}")
            try:
                v = getter(*args, **kwargs)
                r = _quiet_repr(v)
                seen = f"{type(v).__name__} {r if len(r) < 80 else r[:77] + '...'}"
            except Exception as ex:
                seen = f"{type(ex).__name__}: {ex}"
        return bool(ok), seen


# values whose repr runs no user code
_PLAIN_REPR = (int, float, complex, bool, str, bytes, type(None), type(...), slice, range, type,
               types.FunctionType, types.BuiltinFunctionType, types.ModuleType, torch.dtype, torch.device,
               torch.Size)


def _quiet_repr(v, depth: int = 0) -> str:
    """``repr(v)`` for the values of the builtin types, and ``object.__repr__`` for the rest:
    explaining a failed guard must not run the user's ``__repr__`` (side effects, a
    ``__repr__`` that reorders an OrderedDict as it reads it)."""
    t = type(v)
    if t in _PLAIN_REPR:
        return repr(v)
    if t is torch.Tensor or t is torch.nn.Parameter:
        return f"{t.__name__}({str(v.dtype).replace('torch.', '')}{list(v.shape)}, {v.device})"
    if t in (tuple, list) and depth < 2:
        inner = ", ".join(_quiet_repr(x, depth + 1) for x in v[:8]) + (", ..." if len(v) > 8 else "")
        return f"({inner}{',' if t is tuple and len(v) == 1 else ''})" if t is tuple else f"[{inner}]"
    if t is dict and depth < 2:
        items = list(v.items())
        inner = ", ".join(f"{_quiet_repr(k, depth + 1)}: {_quiet_repr(x, depth + 1)}" for k, x in items[:8])
        return "{" + inner + (", ..." if len(items) > 8 else "") + "}"
    return object.__repr__(v)


_HELPER_MODULES = ("math", "operator", "torch")   # printed sympy expressions may name them


def compile_function(src: str, name: str, namespace: dict, *, aliases: dict[str, str] | None = None,
                     like: types.CodeType | None = None, f_globals: dict | None = None,
                     lines: dict[int, int] | None = None) -> types.FunctionType:
    """Compile generated source that defines the function ``name``.

    ``aliases`` (user parameter name -> the alias the source uses, see ``alias_parameters``):
    the code object's parameters get the user's names back, so keyword arguments and
    binding errors read as the user's function.

    With ``like`` (the user's code object) the function is one the user's program runs
    through: its globals are ``f_globals`` (the user function's own, so code that walks the
    stack sees the user's module), and every other name it reads (kiln's values in
    ``namespace``, builtins) is bound in a closure, never looked up in those globals. Its code
    is named after ``like`` (co_name, co_qualname, co_filename, co_firstlineno) and its lines
    are the user's: ``lines`` maps a line of ``src`` (1-based) to a line of the user's file,
    every other line is the ``def`` line. Without ``like`` (kiln's helpers: guard failure
    explanations) the source runs with ``namespace`` as its globals.

    A name the source reads that is bound nowhere raises ``NameError`` here, at generation
    time, instead of making the generated function fail when it runs."""
    filename = f"<kiln generated {name}>"
    if like is None:
        code = compile(src, filename, "exec")
        ns = dict(namespace)
        ns.setdefault("__builtins__", builtins)
        for n in _check_names(code, namespace, name):
            if n not in ns and not hasattr(builtins, n):
                ns[n] = importlib.import_module(n)
        exec(code, ns)
        fn = ns[name]
        _rename_parameters(fn, aliases)
        fn.__kiln_source__ = src
        return fn
    free = _check_names(compile(src, filename, "exec"), namespace, name)
    values = [_resolve(n, namespace) for n in free]
    body = "\n".join("    " + ln for ln in src.splitlines())
    factory = f"def ___kiln_factory({', '.join(free)}):\n{body}\n    return {name}\n"
    ns = {"__builtins__": builtins}
    exec(compile(factory, filename, "exec"), ns)
    made = ns["___kiln_factory"](*values)
    _rename_parameters(made, aliases)
    code = _as_users_code(made.__code__, like, {k + 1: v for k, v in (lines or {}).items()})
    fn = types.FunctionType(code, f_globals if f_globals is not None else {"__builtins__": builtins},
                            like.co_name, made.__defaults__, made.__closure__)
    fn.__kwdefaults__ = made.__kwdefaults__
    fn.__qualname__ = like.co_qualname
    fn.__kiln_source__ = src
    return fn


def readable_source(src: str, aliases: dict[str, str]) -> str:
    """``src`` with the parameters' aliases spelled as the user's names (for display: the
    compiled code uses the aliases, see ``alias_parameters``)."""
    back = {alias: user for user, alias in aliases.items() if user.isidentifier()}
    if not back:
        return src
    return re.sub(r"\b___p\d+\b", lambda m: back.get(m.group(0), m.group(0)), src)


_LOAD_GLOBAL, _LOAD_NAME, _EXTENDED_ARG = dis.opmap["LOAD_GLOBAL"], dis.opmap["LOAD_NAME"], dis.EXTENDED_ARG


def global_names(code: types.CodeType) -> list[str]:
    """Names the code (and code nested in it) reads as globals, in first-use order (for the
    module code of a ``def``: its default values too).

    Read from the raw instructions, not ``dis.get_instructions``, which builds an object per
    instruction: the check function of a large model has tens of thousands, and a package
    load makes one per frame. (CPython 3.11+: two bytes per code unit, the inline caches
    zeroed in ``co_code``; LOAD_GLOBAL's argument is the name's index shifted left by one.)"""
    out: dict[str, None] = {}
    raw, names, ext = code.co_code, code.co_names, 0
    for i in range(0, len(raw), 2):
        op, arg = raw[i], raw[i + 1] | ext
        if op == _EXTENDED_ARG:
            ext = arg << 8
            continue
        ext = 0
        if op == _LOAD_GLOBAL:
            out[names[arg >> 1]] = None
        elif op == _LOAD_NAME:
            out[names[arg]] = None
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.update(dict.fromkeys(global_names(c)))
    return list(out)


def _check_names(module_code: types.CodeType, namespace: dict, name: str) -> list[str]:
    """The free names of the generated module code defining ``name`` (checked bound)."""
    names = [n for n in global_names(module_code) if n != name]
    for n in names:
        if n not in namespace and not hasattr(builtins, n) and n not in _HELPER_MODULES:
            raise NameError(f"generated code of {name} reads {n!r}, which it never binds")
    return names


def _resolve(n: str, namespace: dict):
    if n in namespace:
        return namespace[n]
    if hasattr(builtins, n):
        return getattr(builtins, n)
    return importlib.import_module(n)


def _rename_parameters(fn: types.FunctionType, aliases: dict[str, str] | None) -> None:
    if not aliases:
        return
    back = {alias: user for user, alias in aliases.items()}
    code = fn.__code__
    names = tuple(back.get(n, n) for n in code.co_varnames)
    if names != code.co_varnames:
        if len(set(names)) != len(names):
            raise NameError(f"a parameter of {code.co_name} has the name of a generated local")
        fn.__code__ = code.replace(co_varnames=names)
        if fn.__kwdefaults__:
            fn.__kwdefaults__ = {back.get(k, k): v for k, v in fn.__kwdefaults__.items()}


def _as_users_code(code: types.CodeType, like: types.CodeType, lines: dict[int, int]) -> types.CodeType:
    """``code`` named after the user's ``like``, with its lines mapped to the user's (no
    column positions: they would point into the generated source). Only the location table
    is rewritten (``code.replace``): the instructions stay as compiled, so this is cheap even
    for the check functions of large models (thousands of guards)."""
    first = like.co_firstlineno
    per_unit = [first if start is None else lines.get(start, first) for start, *_ in code.co_positions()]
    return code.replace(co_name=like.co_name, co_qualname=like.co_qualname, co_filename=like.co_filename,
                        co_firstlineno=first, co_linetable=_line_only_table(per_unit, first))


def _line_only_table(per_unit: list[int], first: int) -> bytes:
    """A location table (``co_linetable``, the format of CPython 3.11 and later: see
    CPython's ``Objects/locations.md``) giving code unit ``i`` the line ``per_unit[i]`` and
    no columns: runs of one line, at most 8 code units per entry, each entry the "no column"
    kind (13) with the line as a signed varint delta from the previous entry's line."""
    out = bytearray()
    prev = first
    i, n = 0, len(per_unit)
    while i < n:
        line = per_unit[i]
        j = i + 1
        while j < n and j - i < 8 and per_unit[j] == line:
            j += 1
        out.append(0x80 | (13 << 3) | (j - i - 1))
        delta = line - prev
        v = (delta << 1) if delta >= 0 else ((-delta) << 1) | 1
        while v >= 0x40:
            out.append(0x40 | (v & 0x3F))
            v >>= 6
        out.append(v)
        prev = line
        i = j
    return bytes(out)
