"""The public way to ask for inlined saved-tensor hooks."""
from __future__ import annotations

from typing import Callable

import torch

from ..aot.saved_hooks.inlining import mark_inline


def inline_saved_tensors_hooks(fn: Callable) -> Callable:
    """Mark ``fn`` as a saved-tensor hook that kiln may trace and inline into compiled graphs.

    Mark both the pack and the unpack hook, then use them with
    ``torch.autograd.graph.saved_tensors_hooks(pack, unpack)`` as usual: eager code runs them
    as eager hooks, and a kiln-compiled training graph runs them inside its forward (pack,
    after each saved activation) and backward (unpack, before the first use). The hooks must
    be traceable tensor code (they may branch on dtype and size); their Python side effects run
    when they are traced, not on every call. A hook that cannot be traced stays an eager hook
    (the reason is logged under ``KILN_LOGS=aot``). Set ``fn.user_cache_hash = "..."`` for a
    hook whose code reads values kiln cannot hash, to allow the compile cache.
    """
    return mark_inline(fn)


class saved_tensors_hooks(torch.autograd.graph.saved_tensors_hooks):
    """``torch.autograd.graph.saved_tensors_hooks(pack, unpack)`` whose hooks kiln inlines into
    compiled graphs (both are marked with ``inline_saved_tensors_hooks``)::

        def pack(t):   return t.to(torch.bfloat16) if t.dtype == torch.float32 else t
        def unpack(t): return t.to(torch.float32) if t.dtype == torch.bfloat16 else t

        with kiln.saved_tensors_hooks(pack, unpack):
            loss = compiled_step(x)
        loss.backward()

    Keep the same two functions across steps: the active hooks are guarded by identity, and
    new ones recompile. ``user_cache_hash``: a string naming what the hooks compute, for hooks
    the compile cache cannot hash by their code.
    """

    def __init__(self, pack_hook: Callable, unpack_hook: Callable, *, user_cache_hash: str | None = None):
        if user_cache_hash is not None and not isinstance(user_cache_hash, str):
            raise TypeError("user_cache_hash must be a str naming what the hooks compute")
        pack, unpack = mark_inline(pack_hook), mark_inline(unpack_hook)
        if user_cache_hash is not None:
            for fn, what in ((pack, "pack"), (unpack, "unpack")):
                fn.user_cache_hash = f"{user_cache_hash}:{what}"
        super().__init__(pack, unpack)
