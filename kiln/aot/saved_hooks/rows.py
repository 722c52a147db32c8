"""One row per compiled graph whose saved-tensor hooks stage 2 inlined: what the hooks did to
its saved activations. ``kiln.activations.report()`` shows them."""
from __future__ import annotations

from ...process_state import activation_rows as rows


def record(info) -> None:
    """One graph's inlined hooks (``saved_hooks.InlinedHooks``), from stage 2."""
    rows.append({"pack": info.policy or info.pack, "unpack": info.unpack, "packed": len(info.packed),
                 "kept": len(info.kept), "bytes_before": info.bytes_before, "bytes_after": info.bytes_after,
                 "offloaded_bytes": info.offloaded_bytes, "policy": info.policy})
