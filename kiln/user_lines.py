"""An error raised inside a compiled graph is reported at the user's line.

Eager raises an op's error from the line that called the op. Raised inside a compiled graph,
its traceback ends in the graph's generated code and, above it, in kiln's generated entry,
whose only line is the function's ``def``. Each node of a captured graph records the user's
frame it came from (``USER_FRAME``). When a graph's error leaves kiln, ``at_users_line`` finds
the node that raised (the graph's generated line, through FX's line map) and raises the error
again from a frame at that file, line and function name, with kiln's frames left out, as
eager's traceback would end. Graphs that kiln's stages rewrote (AOT, Inductor) keep no such
record per node: their errors keep their traceback.
"""
from __future__ import annotations

import types

USER_FRAME = "kiln_user_frame"
_DONE = "__kiln_at_users_line__"


def _raising_node(tb: types.TracebackType | None):
    """The node of a captured graph that raised, from the innermost graph frame of ``tb``."""
    found = None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename.startswith("<eval_with_key>"):
            gm = frame.f_locals.get("self")
            line_map = getattr(gm, "_lineno_map", None)
            start = getattr(gm, "_prologue_start", None)
            if line_map and isinstance(start, int):
                # (FX numbers the map from the generated function's first line)
                index = line_map.get(tb.tb_lineno - start)
                if index is not None:
                    nodes = list(gm.graph.nodes)
                    if 0 <= index < len(nodes):
                        found = nodes[index]
        tb = tb.tb_next
    return found


def at_users_line(e: BaseException) -> BaseException:
    """``e`` with a traceback that ends at the user's line of the captured op that raised it;
    ``e`` as it is when it did not come from a captured graph's op."""
    if getattr(e, _DONE, False):
        return e
    try:
        node = _raising_node(e.__traceback__)
        where = node.meta.get(USER_FRAME) if node is not None else None
        if not where:
            return e
        filename, lineno, name = where
        if not lineno or lineno < 2 or not name.isidentifier():
            return e
        source = "\n" * (lineno - 2) + f"def {name}():\n    raise ___error.with_traceback(None)\n"
        scope = {"___error": e}
        exec(compile(source, filename, "exec"), scope)
        try:
            scope[name]()
        except BaseException as raised:       # (the same object, its traceback now the user's line)
            try:
                setattr(raised, _DONE, True)
            except Exception:
                pass
            tb = raised.__traceback__    # (from the user's line on: this function's frame left out)
            return raised.with_traceback(tb.tb_next if tb is not None and tb.tb_next is not None else tb)
    except Exception:   # never worse than the original traceback
        return e
    return e
