"""A graph as readable text: its code, with the type of each placeholder."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx


def describe_val(v: Any) -> str:
    if isinstance(v, (torch.SymInt, torch.SymBool)):
        return f"{type(v).__name__[3:].lower()} {v}"      # "int s6377"
    if isinstance(v, torch.Tensor):
        dt = str(v.dtype).replace("torch.", "")
        shape = "x".join(str(s) for s in v.shape) or "scalar"
        return f"{dt}[{shape}]"
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(describe_val(x) for x in v) + ")"
    return type(v).__name__ if v is not None else "None"


def graph_text(gm: torch.fx.GraphModule, title: str) -> str:
    """Readable code of a graph, with the type of each placeholder."""
    lines = [f"# {title}"]
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            tags = []
            if n.meta.get("kiln_static"):
                tags.append("parameter/buffer")
            if n.meta.get("kiln_mutated"):
                tags.append("mutated")
            if n.meta.get("kiln_requires_grad"):
                tags.append("requires_grad")
            extra = f"  ({', '.join(tags)})" if tags else ""
            lines.append(f"#   {n.name}: {describe_val(n.meta.get('val'))}{extra}")
    code = gm.code.strip("\n")
    lines.append(code)
    return "\n".join(lines)
