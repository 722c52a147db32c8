"""kiln's import graph between its packages, imports inside functions counted.

    python tools/import_graph.py            # totals, the cycles, the files with most deferred imports
    python tools/import_graph.py --edges    # every edge between packages, with its imports
    python tools/import_graph.py --deferred # every import inside a function, with its reason

A package is a directory under kiln/ (``kiln.capture``) or a top-level module (``kiln.config``).
An import inside a function is a *deferred* import: it counts as an edge all the same, since it
runs (and needs the other package) whenever the function does. Each one says on its line, in a
comment, why it waits (a cycle it breaks, a cost it defers); ``--deferred`` lists them and exits
with status 1 when one gives no reason.
"""
from __future__ import annotations

import ast
import collections
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kiln")


def _package(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "kiln"
    return parts[1]


def _module_of(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return rel[:-9] if rel.endswith(".__init__") else rel


def _imported(node, module: str, is_init: bool) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")
            if not is_init:
                base = base[:-1]
            base = base[:len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            return [_submodule(target, a.name) for a in node.names]
        return [_submodule(node.module or "", a.name) for a in node.names]
    return [a.name for a in node.names]


def _submodule(module: str, name: str) -> str:
    """``from module import name``: the module ``name`` when it is one, else ``module``."""
    path = os.path.join(os.path.dirname(ROOT), *f"{module}.{name}".split("."))
    return f"{module}.{name}" if os.path.isdir(path) or os.path.exists(path + ".py") else module


def scan(root: str = ROOT):
    """(edges: (src, dst) -> [(file, line, deferred)], deferred imports per file)."""
    edges, deferred, _ = _scan(root)
    return edges, deferred


def deferred_imports(root: str = ROOT) -> list[tuple[str, int, str, str]]:
    """Every import of kiln's own inside a function: (file, line, its text, the comment on its
    line: the reason it waits, or "")."""
    return _scan(root)[2]


def _scan(root: str):
    edges = collections.defaultdict(list)
    deferred = collections.Counter()
    listed = []
    for dirpath, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            module = _module_of(path)
            text = open(path).read()
            lines = text.splitlines()
            tree = ast.parse(text)
            inside = set()
            for fn in ast.walk(tree):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inside.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                targets = [t for t in _imported(node, module, f == "__init__.py") if t.split(".")[0] == "kiln"]
                if targets and id(node) in inside:
                    rel = os.path.relpath(path, os.path.dirname(root))
                    deferred[rel] += 1
                    line = lines[node.lineno - 1]
                    code, _, comment = line.partition("#")
                    listed.append((rel, node.lineno, code.strip(), comment.strip()))
                for t in targets:
                    src, dst = _package(module), _package(t)
                    if src != dst:
                        edges[(src, dst)].append((os.path.relpath(path, os.path.dirname(root)), node.lineno,
                                                  id(node) in inside))
    return edges, deferred, sorted(listed)


def cycles(edges) -> list[set]:
    import networkx as nx

    g = nx.DiGraph(list(edges))
    return [c for c in nx.strongly_connected_components(g) if len(c) > 1]


def main(argv: list[str]) -> int:
    edges, deferred = scan()
    sccs = cycles(edges)
    print("imports inside functions (kiln's own):", sum(deferred.values()))
    print("packages in cycles:", [sorted(c) for c in sccs] or "none")
    if "--deferred" in argv:
        unexplained = 0
        for path, line, code, reason in deferred_imports():
            unexplained += not reason
            print(f"  {path}:{line}: {code}  # {reason or '(NO REASON GIVEN)'}")
        print("without a reason:", unexplained)
        return 1 if unexplained else 0
    if "--edges" in argv:
        for (src, dst), where in sorted(edges.items()):
            cyc = any(src in c and dst in c for c in sccs)
            print(f"{src} -> {dst}{'  (in a cycle)' if cyc else ''}")
            for path, line, inside in where:
                print(f"    {path}:{line}{'  deferred' if inside else ''}")
    else:
        for path, n in deferred.most_common(15):
            print(f"  {n:3d} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
