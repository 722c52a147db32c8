"""The compiled graph of an entry in a package: the captured FX graph (pickled: its code and
constants) and the backend's artifact, the same bytes the compile cache stores for it
(``kiln.cache.offer``), loaded by the backend's own ``load_artifact`` (no AOT tracing, no
Inductor lowering). A graph whose compiled form has no saved form (a dynamic graph before
the cache stores those, a user backend) leaves its entry out, with the backend's reason."""
from __future__ import annotations

import io
import pickle
from typing import Callable

import torch

from ..cache import PAYLOAD_ATTR
from .errors import NotPackageable


def save_graph(gm: torch.fx.GraphModule, compiled: Callable, add_blob: Callable[[bytes], int]) -> dict:
    if compiled is gm or getattr(compiled, "__self__", None) is gm:
        kind = "module" if compiled is gm else "forward"   # the eager backend: the graph as it is
        payload = None
    else:
        dump = getattr(compiled, PAYLOAD_ATTR, None)
        if dump is None:
            raise NotPackageable(f"the backend's compiled graph ({type(compiled).__name__}) has no saved "
                                 "form (only kiln's eager, aot_eager and inductor backends have one)")
        try:
            payload = dump(compiled)
        except ValueError as e:
            raise NotPackageable(f"its graph cannot be saved: {e}") from None
        kind = "artifact"
    try:
        buf = io.BytesIO()
        pickle.dump(gm, buf, protocol=4)
    except Exception as e:
        raise NotPackageable(f"the captured graph cannot be pickled ({type(e).__name__}: {e})") from None
    out = {"kind": kind, "graph": add_blob(buf.getvalue()), "code": gm.code.strip()}
    if payload is not None:
        out["artifact"] = add_blob(payload)
    return out


def load_graph(saved: dict, blobs: Callable[[int], bytes], backend) -> tuple[torch.fx.GraphModule, Callable]:
    gm = pickle.loads(blobs(saved["graph"]))
    if saved["kind"] == "module":
        return gm, gm
    if saved["kind"] == "forward":
        return gm, gm.forward
    loader = getattr(backend, "load_artifact", None)
    if loader is None:
        raise ValueError(f"backend {backend!r} cannot load a saved graph")
    return gm, loader(blobs(saved["artifact"]), gm)
