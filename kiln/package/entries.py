"""One compiled entry in a package, and back.

Saved: the generated code (the entry's Python source, as compiled), every name it reads
(its namespace, ``values``), its guard program (``guards``), its graph (``graphs``), and for
an entry that ends in a graph break, the break plan and the entries of each continuation
(recursively: they are compiled functions of their own). Loaded: the same source compiled
again over the decoded namespace (``kiln.capture.rebuild``, as at capture): no capture,
no tracing.
"""
from __future__ import annotations

import types
import weakref
from typing import Callable

from ..capture.entry import Entry, loaded_entry
from ..capture.guards import _float_same
from ..capture.rebuild import entry_context, names_read, rebuild_break_function, rebuild_entry
from ..errors import Unsupported
from ..runtime.function import CompiledFactory
from ..runtime.function_cache import cache_for
from .errors import NotPackageable, PackageError
from .graphs import load_graph, save_graph
from .guards import LoadedProgram, save_program
from .packaged_function import PackagedFunction
from .values import Decoder, Encoder, same

_VALUE_HINTS = ("c",)   # names bound by value (constants); every other hint is used by identity


def _hint(name: str) -> str:
    return name.strip("_").rstrip("0123456789")


def _namespace_of(entry: Entry) -> dict:
    """The names an entry's generated code reads, with their objects: those bound in its
    closure by ``compile_function``, and its parameters' default values (read once, when the
    function was made: from the guard program's namespace)."""
    fn = entry.fn
    ns = {n: c.cell_contents for n, c in zip(fn.__code__.co_freevars, fn.__closure__ or ())}
    more = entry.program.ctx.namespace
    program = entry.program
    # the entry's code, and the per-guard expressions that explain a failure after a load
    texts = [fn.__kiln_source__, *program.exprs, *program.tensor_exprs,
             *getattr(program, "shape_binds", []), *getattr(program, "shape_conds", [])]
    for text in texts:
        try:
            names = names_read(text)
        except SyntaxError:
            continue
        for n in names:
            if n not in ns and n in more:
                ns[n] = more[n]
    return ns


def save_entries(entries: list[Entry], fn: types.FunctionType, add_blob: Callable[[bytes], int],
                 left_out: list, keep: Callable[[Entry], bool] | None = None,
                 shared: dict | None = None) -> list[dict]:
    """The saved form of ``fn``'s entries; one that cannot be saved is appended to
    ``left_out`` as (function, guard text, reason). ``keep``: which entries to save (also
    among the continuations'), default all.

    A continuation that several entries break into (each recompile of a loop body with a
    graph break in it resumes in the same continuation) is saved once: its first group of
    entries gets an ``id``, later ones are ``{"function", "ref": id}`` (``shared``: id of
    the continuation -> its group id). Saved again under every entry, a loop of k breaks
    with two entries each took 2^k saves (fuzz seed 2248)."""
    out = []
    shared = {} if shared is None else shared
    for entry in entries:
        if entry.replaced_by is not None or (keep is not None and not keep(entry)):
            continue
        try:
            out.append(save_entry(entry, fn, add_blob, left_out, keep, shared=shared))
        except NotPackageable as e:
            left_out.append((fn.__qualname__, entry.describe_guards(), str(e)))
        except Exception as e:     # kiln's own failure: the entry is left out, never the save
            left_out.append((fn.__qualname__, entry.describe_guards(),
                             f"kiln could not save it ({type(e).__name__}: {e}); please report this"))
    return out


class _SavedCode:
    """What an entry saves that does not change once it is captured: its code, namespace,
    guard program and graph data (the compiled payload is read at each save: it grows when a
    backward is compiled at run time). A frame record is written again after every compile of
    its function, with all its entries: encoding each of them anew made a model whose layers
    are compiled one by one quadratic in its depth. Each save still checks that the objects
    the namespace names are found where their encoding says."""

    def __init__(self, fn: types.FunctionType, enc: Encoder, saved: dict):
        self.fn, self.enc, self.saved = fn, enc, saved
        self.graph: dict = {}       # (graphs.save_graph's memo of the entry's graph)


# encodings of a value (not of where an object is found), and the specials the loader makes
_BY_VALUE = frozenset({"special", "v", "const", "float", "complex", "bytes", "dtype", "device", "size"})
_SAVED_CODE: "weakref.WeakKeyDictionary[Entry, _SavedCode]" = weakref.WeakKeyDictionary()


def _saved_code(entry: Entry, fn: types.FunctionType) -> _SavedCode:
    memo = _SAVED_CODE.get(entry)
    if memo is not None and memo.fn is fn:
        # (what the code reads must still be found where its encoding says: a name rebound
        # since the first save finds another object)
        encoded = memo.saved["namespace"]
        for name, obj in _namespace_of(entry).items():
            if name in encoded and encoded[name][0] not in _BY_VALUE:
                _check_comes_back(name, obj, encoded[name], fn)
        return memo
    program = entry.program
    enc = Encoder(fn)
    for module, qualname in entry.inlined.values():
        if module:
            enc.add_function(module, qualname)
    enc.specials[id(program.global_state)] = ["special", "gs"]
    enc.specials[id(program.tensor_guards)] = ["special", "tg"]
    # (an entry that cannot be saved is tried again at the next save: the reason may pass,
    # a name rebound for a while)
    memo = _SAVED_CODE[entry] = _SavedCode(fn, enc, _encode_code(entry, fn, enc, program))
    return memo


def _encode_code(entry: Entry, fn: types.FunctionType, enc: Encoder, program) -> dict:
    source = entry.fn.__kiln_source__
    saved_program = save_program(program, enc)   # (first: a guard that cannot be saved says so)
    namespace = {}
    for name, obj in _namespace_of(entry).items():
        if name == "___graph":
            namespace[name] = ["special", "graph"]
        elif name == "___break":
            namespace[name] = ["special", "break"]
        elif isinstance(obj, types.MethodType) and isinstance(obj.__self__, CompiledFactory):
            namespace[name] = ["special", "callee"]
        else:
            try:
                namespace[name] = enc.encode(obj, identity=_hint(name) not in _VALUE_HINTS)
            except NotPackageable as e:
                raise NotPackageable(f"generated code reads {name}: {e}") from None
            _check_comes_back(name, obj, namespace[name], fn)
    source = _equal_for_identical_values(source, saved_program, namespace)
    return {"source": source, "readable": entry.source, "name": source.split("(", 1)[0][4:], "namespace": namespace,
            "program": saved_program,
            "guards_text": [g.describe() for g in entry.guards],
            "eager_reason": str(entry.eager_reason) if entry.eager_reason is not None else None,
            "graph_break": str(entry.graph_break) if entry.graph_break is not None else None,
            "graph": None, "break": None}


def save_entry(entry: Entry, fn: types.FunctionType, add_blob: Callable[[bytes], int], left_out: list,
               keep: Callable[[Entry], bool] | None = None, *, shared: dict) -> dict:
    memo = _saved_code(entry, fn)
    enc, namespace = memo.enc, memo.saved["namespace"]
    saved = dict(memo.saved)
    if entry.compiled_graph is not None and "___graph" in namespace:
        saved["graph"] = save_graph(entry.graph_module, entry.compiled_graph, add_blob, enc, memo.graph)
    if "___break" in namespace:
        code, plan = entry.break_plan
        if code is not fn.__code__:
            raise NotPackageable("a graph break inside an inlined function's frame")
        groups = []
        for r in entry.resumes:
            if id(r) in shared:
                groups.append({"function": r.original.__qualname__, "ref": shared[id(r)]})
                continue
            shared[id(r)] = gid = len(shared)     # (before its entries: a loop refers back to it)
            groups.append({"function": r.original.__qualname__, "id": gid,
                           "entries": save_entries(r.entries, r.original, add_blob, left_out, keep, shared)})
        saved["break"] = {"plan": enc.encode(plan), "resumes": groups}
    return saved


def resume_groups(saved: list[dict]):
    """Every saved group of continuation entries, once (a ``ref`` is not followed)."""
    for s in saved:
        for group in (s.get("break") or {}).get("resumes", ()):
            if "entries" in group:
                yield group
                yield from resume_groups(group["entries"])


def link_shared_groups(saved: list[dict]) -> None:
    """Point each ``ref`` group of a loaded manifest at the group it refers to
    (``group["linked"]``), for the entries' graph breaks to load."""
    groups = list(resume_groups(saved))
    by_id = {g["id"]: g for g in groups if "id" in g}
    for s in (*saved, *(e for g in groups for e in g["entries"])):
        for group in (s.get("break") or {}).get("resumes", ()):
            if "ref" in group:
                target = by_id.get(group["ref"])
                if target is None:
                    raise PackageError(f"a graph break refers to continuation group {group['ref']}, "
                                       "which the package does not have; save the package again")
                group["linked"] = target


def install(cache, entries: list[Entry]) -> None:
    """Add loaded entries to a function's cache, after those it has (an entry the function
    has already, the same code under the same guards, is not added twice)."""
    have = {_identity(e) for e in cache.entries}
    new = [e for e in entries if _identity(e) not in have]
    for e in new:
        e.captured_for = loaded_entry
    cache.extend(new)


def _identity(e: Entry) -> tuple:
    return (e.key, e.fn.__kiln_source__, tuple(g.describe() for g in e.guards))


def _check_comes_back(name: str, obj, enc: list, fn) -> None:
    """What is saved must find ``obj`` itself (or an equal value) again: checked here, in the
    saving process, against the same function."""
    if enc[0] in ("special", "memo", "module_state"):
        return                     # (gs, tg: rebuilt by the guard program; a memo starts empty)
    try:
        back = Decoder(fn).decode(enc)
    except Exception as e:
        raise NotPackageable(f"{name} cannot be found again ({type(e).__name__}: {e})") from None
    if not same(back, obj):
        raise NotPackageable(f"{name} ({type(obj).__name__}) does not come back as itself")


_SAME = "___pkg_same_value"
_VALUE_TYPES = (int, float, complex, str, bytes)


def _equal_for_identical_values(source: str, program: dict, namespace: dict) -> str:
    """An identity guard on an immutable value (``type(cfg).__dict__['eps'] is 1e-05``: a
    class attribute) cannot hold for an object of another process, and need not: the same
    type and value behave the same. Its check becomes ``same_value(x, v)`` in the saved code."""
    for name, enc in list(namespace.items()):
        if enc[0] not in ("v", "float", "complex", "bytes") or _hint(name) in _VALUE_HINTS or \
                (enc[0] == "v" and type(enc[1]) is bool):
            continue
        suffix = f" is {name}"
        for i, p in enumerate(program["python"]):
            if not p["expr"].endswith(suffix):
                continue
            # the failure explanation's expression, and the condition as the entry's check
            # states it (over the check's locals)
            for key in ("expr", "check_expr"):
                text = p.get(key)
                if text is None or not text.endswith(suffix):
                    continue
                new = f"{_SAME}({text[:-len(suffix)]}, {name})"
                source = _replace_condition(source, text, new)
                p = {**p, key: new}
            program["python"][i] = p
            namespace[_SAME] = ["name", __name__, "same_value"]
    return source


def _replace_condition(source: str, text: str, new: str) -> str:
    """``source`` with the condition ``text`` replaced (not where it is the start of a longer
    name: ``x is ___o5`` is not in ``x is ___o50``)."""
    import re

    return re.sub(re.escape(text) + r"(?![\w])", lambda _: new, source)


def same_value(a, b) -> bool:
    """``a`` has the type and value of ``b`` (nan is nan; -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return _float_same(a, b)
    return a == b


def load_entries(saved: list[dict], fn: types.FunctionType, compiled, blobs, origin: str | None = None) -> list[Entry]:
    """The entries that load; one that does not (a name it reads is gone from this process, a
    backend that cannot load its artifact) is skipped with a warning: calls it would have
    matched compile (or raise PackageMiss). ``origin``: where they come from, for the warning
    (default: ``compiled``'s package)."""
    out, failed = [], []
    for s in saved:
        try:
            out.append(load_entry(s, fn, compiled, blobs, origin))
        except Exception as e:
            failed.append(f"{type(e).__name__}: {e}")
    if failed:
        import warnings

        where = origin or f"package {getattr(compiled, '_package', '')}"
        warnings.warn(f"kiln: {len(failed)} entries of {fn.__qualname__} in {where} "
                      f"could not be loaded (first: {failed[0]}); calls they match compile as usual",
                      RuntimeWarning, stacklevel=4)
    return out


def load_entry(saved: dict, fn: types.FunctionType, compiled, blobs, origin: str | None = None) -> Entry:
    """``compiled``: the CompiledFunction of ``fn`` these entries go to (its key, backend and
    continuation factory)."""
    key = compiled.key
    made: dict = {}

    def graph():
        made["gm"], made["compiled"] = load_graph(saved["graph"], blobs, key.backend, Decoder(fn))
        return made["compiled"]

    def break_fn():
        plan = Decoder(fn).decode(saved["break"]["plan"])
        bfn, resumes = rebuild_break_function(fn, plan, key, compiled.factory)
        for r, group in zip(resumes, saved["break"]["resumes"]):
            if isinstance(compiled, PackagedFunction):   # (a frame record's continuations stay plain)
                PackagedFunction.adopt(r, compiled._on_miss, compiled._package)
            group = group.get("linked", group)      # (a continuation saved once: link_shared_groups)
            install(cache_for(r.original), load_entries(group["entries"], r.original, r, blobs, origin))
        made["resumes"] = tuple(resumes)
        return bfn

    ctx = entry_context(fn)
    specials = {"graph": graph, "break": break_fn, "callee": lambda: compiled.factory.callee}
    dec = Decoder(fn, specials)
    for name, enc in saved["namespace"].items():
        if enc[:2] in (["special", "gs"], ["special", "tg"]):
            continue                               # (made by the program, below)
        ctx.namespace[name] = dec.decode(enc)
    program = LoadedProgram(saved["program"], ctx)
    src = saved["source"]
    entry = rebuild_entry(fn, key, src, saved["name"], ctx, program, made.get("gm"), made.get("compiled"))
    if saved["eager_reason"] is not None:
        entry.eager_reason = Unsupported(saved["eager_reason"])
    if saved["graph_break"] is not None:
        entry.graph_break = Unsupported(saved["graph_break"])
    entry.resumes = made.get("resumes", ())
    entry.loaded_from_package = True
    return entry
