"""Shrink a failing program while it keeps failing the same way (or, for a program that only
loses a compile to a kiln internal error, while it hits the same internal error).

Works on the program's source (a generated seed, or a file the long run wrote): it deletes
statements at any depth (classes and helpers included), replaces compound statements by their
bodies, and drops calls from the plan, keeping each change after which the program still fails
with the same kind of difference (and, for a crash, kiln's same exception type). Every
candidate is run for real, eager against kiln.

    python -m tests.fuzz.minimize SEED --backend aot_eager [--dynamic]
    python -m tests.fuzz.minimize --file fuzz-failures/aot_eager/seed_12.py --backend aot_eager
"""
from __future__ import annotations

import argparse
import ast
import re
import warnings
from dataclasses import replace

from .generator import generate
from .program import SourceProgram, params_of
from .runner import Outcome, run_program


def _key(o: Outcome):
    if o.status == "ok" and o.internal:      # a compile lost to a kiln internal error
        return ("internal", o.internal[0])
    if o.status not in ("wrong", "crash"):
        return None
    m = o.mismatch
    if m.kind in ("exception", "backward"):   # the same exception types on both sides
        return (o.status, m.kind, re.findall(r"(?:eager|kiln) raised (\w+)", m.detail))
    return (o.status, m.kind, m.path.split("/")[0])


def _stmt_lists(tree):
    """Every list of statements in the tree, outermost first."""
    out = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                out.append(stmts)
        if isinstance(node, ast.Try):
            for h in node.handlers:
                out.append(h.body)
    return out


def _essential(stmt):
    return isinstance(stmt, ast.FunctionDef) and stmt.name in ("fn", "make_inputs")


def _candidates(text):
    """Source texts one edit smaller than ``text``: each statement deleted, each compound
    statement replaced by its body."""
    n_lists = len(_stmt_lists(ast.parse(text)))
    for li in range(n_lists):
        length = len(_stmt_lists(ast.parse(text))[li])
        for si in range(length):
            for mode in ("delete", "unwrap"):
                tree = ast.parse(text)
                stmts = _stmt_lists(tree)[li]
                if si >= len(stmts):
                    break
                stmt = stmts[si]
                if _essential(stmt):
                    continue
                if mode == "delete":
                    new = []
                else:
                    new = [s for f in ("body", "orelse", "finalbody") for s in (getattr(stmt, f, None) or [])
                           if isinstance(s, ast.stmt)]
                    if isinstance(stmt, ast.Try):
                        new += [s for h in stmt.handlers for s in h.body]
                    if not new or isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
                        continue
                stmts[si:si + 1] = new
                if not stmts:
                    stmts.append(ast.Pass())
                yield ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def minimize(prog, backend: str, dynamic=None, log=None, budget=500):
    """The smallest program (a ``SourceProgram``) found that fails as ``prog`` does."""
    if not isinstance(prog, SourceProgram):
        prog = SourceProgram(prog.seed, prog.source(), list(prog.params), list(prog.calls))
    first = run_program(prog, backend, dynamic)
    target = _key(first)
    if target is None:
        return prog, first
    best, best_out, tries = prog, first, 0

    def attempt(cand):
        nonlocal tries, best, best_out
        tries += 1
        try:
            o = run_program(cand, backend, dynamic)
        except Exception:  # noqa: BLE001 - a candidate that breaks the runner is just rejected
            return False
        if _key(o) == target:
            best, best_out = cand, o
            if log:
                log(f"  {tries} tries: {len(best.text.splitlines())} lines, {len(best.calls)} calls")
            return True
        return False

    failing = best.calls[first.call]
    for calls in ([failing], best.calls[: first.call + 1]):
        if len(calls) < len(best.calls) and attempt(best.replace(calls=list(calls))):
            break
    if len(best.calls) == 1 and (failing.kw or not failing.grad):
        for simpler in (replace(failing, kw=False), replace(failing, grad=True)):
            attempt(best.replace(calls=[simpler]))
    changed = True
    while changed and tries < budget:
        changed = False
        for cand_text in _candidates(best.text):
            if tries >= budget:
                break
            if attempt(best.replace(text=cand_text, params=params_of(cand_text))):
                changed = True
                break
    return best, best_out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("seed", type=int, nargs="?")
    ap.add_argument("--file", help="a failing program written by the long run")
    ap.add_argument("--backend", default="aot_eager")
    ap.add_argument("--dynamic", action="store_true")
    ap.add_argument("--budget", type=int, default=500)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    prog = SourceProgram.from_file(args.file) if args.file else generate(args.seed)
    small, out = minimize(prog, args.backend, True if args.dynamic else None, log=print, budget=args.budget)
    print(f"# {out.describe()}")
    print(f"# calls: {small.calls}")
    print(small.source())


if __name__ == "__main__":
    main()
