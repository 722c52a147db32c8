"""``kiln package inspect FILE``: a package's manifest, readable (nothing in it is run)."""
from __future__ import annotations

from . import fileformat


def manifest_text(path: str) -> str:
    pkg = fileformat.read(path)       # (verified: format, version, content hash)
    m = pkg.manifest
    env, ident, key = m["environment"], m["identity"], m["key"]
    sizes = pkg.blob_sizes()
    lines = [f"kiln package {path}",
             f"  saved with   kiln {env['kiln']}, torch {env['torch']}, python {env['python']}, "
             f"{env['machine']}, device {env['device_kind']}" + (f" ({env['cuda']})" if env.get("cuda") else ""),
             f"  {m['kind']:12} {ident['qualname']}{ident['signature']}  code {ident['code']}",
             f"  compiled     backend={key['backend']!r} mode={key['mode']!r} options={key['options']!r} "
             f"fullgraph={key['fullgraph']} dynamic={key['dynamic']}",
             f"  artifacts    {len(sizes)} ({sum(sizes)} bytes)"]
    for name, h in ident["inlined"].items():
        lines.append(f"  inlined      {name}  code {h}")
    _entries(lines, m["entries"], ident["qualname"], pkg, "  ")
    for lo in m["left_out"]:
        lines.append(f"  left out     an entry of {lo['function']}: {lo['reason']}")
    return "\n".join(lines)


def _entries(lines: list, entries: list, name: str, pkg, indent: str) -> None:
    for i, e in enumerate(entries):
        what = "runs eagerly: " + e["eager_reason"] if e["eager_reason"] else \
            ("graph break: " + e["graph_break"].splitlines()[0] if e["graph_break"] else "graph")
        lines.append(f"{indent}entry {i} of {name} ({what})")
        lines.append(f"{indent}  guards:")
        lines += [f"{indent}    {g}" for g in e["guards_text"]]
        graph = e["graph"]
        if graph is not None:
            sizes = [len(pkg.blob(graph[k])) for k in ("constants", "artifact") if k in graph]
            lines.append(f"{indent}  graph ({graph['kind']}, {' + '.join(map(str, sizes))} bytes):")
            lines += [f"{indent}    {ln}" for ln in graph["code"].splitlines()]
        lines.append(f"{indent}  generated code:")
        lines += [f"{indent}    {ln}" for ln in e["readable"].splitlines()]
        for group in (e["break"] or {}).get("resumes", ()):
            if "ref" in group:
                lines.append(f"{indent}  continuation {group['function']}: its entries as listed above")
                continue
            _entries(lines, group["entries"], group["function"], pkg, indent + "  ")
