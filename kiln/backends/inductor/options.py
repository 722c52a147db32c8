"""``mode`` and ``options`` of ``backend="inductor"``: the Inductor config a compile runs under.

    kiln.compile(fn, backend="inductor", mode="max-autotune-no-cudagraphs")
    kiln.compile(fn, backend="inductor", options={"max_autotune": True, "cpp.threads": 4})

A mode stands for Inductor's settings for that mode (``torch._inductor.list_mode_options``);
``options`` are Inductor config keys (``torch._inductor.config``), checked here: an unknown key
or a value of the wrong type is a ValueError at ``kiln.compile`` time, naming close matches.

kiln decides two settings itself:

* Inductor's CUDA graphs stay off: kiln owns CUDA graphs (``kiln/cudagraphs``). ``"max-autotune"``
  is therefore ``"max-autotune-no-cudagraphs"`` for Inductor, and ``"reduce-overhead"`` compiles
  as the default mode, its graphs then recorded by kiln (``InductorBackend.cudagraphs``).
* ``fallback_random=True`` unless the options say otherwise: random ops (dropout) run ATen's
  kernels in eager's order, so one seed gives eager's numbers. ``fallback_random=False``
  generates them inside Inductor's kernels instead: faster, the same distribution, other numbers.
* ``combo_kernels=True`` with ``combo_kernels_pointwise_only=True`` unless the options say
  otherwise: pointwise Triton kernels that do not depend on each other (the bf16 casts of
  every weight under autocast, which kiln recomputes in the backward instead of saving them)
  are launched as one kernel. A training step on a GPU at moderate sizes is mostly launch
  time on the CPU. Reductions stay apart: combining them raised GPT-2's peak memory by 8%
  on an H100 (torch 2.11 has no memory gate for combo kernels). C++ kernels (CPU) are never
  combined.
"""
from __future__ import annotations

import difflib
import typing
from typing import Any

from ... import _torch

# Options kiln cannot honour, and why. (Inductor's CUDA-graph options are only named here to be
# refused and kept off: kiln replays CUDA graphs itself and never uses Inductor's.)
_OWN_CUDA_GRAPHS = "kiln manages CUDA graphs itself; Inductor's own CUDA graphs stay off"
_CUDAGRAPH_KEYS = ("triton.cudagraphs", "triton.cudagraph_trees")
_REFUSED = {
    **dict.fromkeys(_CUDAGRAPH_KEYS, _OWN_CUDA_GRAPHS),
    "freezing": "kiln passes parameters and buffers to the graph as inputs (guarded, updated in "
                "place), so they cannot be frozen into it as constants",
}
_DEFAULTS = {"fallback_random": True, "combo_kernels": True, "combo_kernels_pointwise_only": True}
_FIXED = {"triton.cudagraphs": False}


def _check_value(cfg: Any, key: str, name: str, value: Any) -> None:
    if name in _REFUSED and bool(value):
        raise ValueError(f"kiln.compile: Inductor option {key!r}={value!r} is not supported: {_REFUSED[name]}")
    expected = cfg.get_type(name)
    if typing.get_origin(expected) is not None or not isinstance(expected, type):
        return          # Optional[...], list[...]: no reliable isinstance check
    if isinstance(value, bool) and expected is not bool and expected in (int, float):
        raise ValueError(f"kiln.compile: Inductor option {key!r} takes a {expected.__name__}, got bool {value!r}")
    if not isinstance(value, expected) and not (expected is float and type(value) is int):
        raise ValueError(f"kiln.compile: Inductor option {key!r} takes a {expected.__name__}, "
                         f"got {type(value).__name__} {value!r}")


def unknown_option_error(key: str, known: Any) -> ValueError:
    close = difflib.get_close_matches(key.replace("-", "_"), list(known), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else \
        " (torch._inductor.config lists the options)"
    return ValueError(f"kiln.compile: unknown Inductor option {key!r}{hint}")


def inductor_config_patches(mode: str | None, options: dict | None) -> dict:
    """The Inductor config patch for ``mode`` and ``options`` (validated), kiln's decisions
    included."""
    cfg = _torch.inductor_config()
    known = cfg.get_config_copy()
    patches = {k: v for k, v in _DEFAULTS.items() if k in known}   # (a key another torch lacks)
    for k, v in _torch.inductor_mode_options(mode).items():
        if k not in _CUDAGRAPH_KEYS:
            patches[k] = v
    for key, value in (options or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"kiln.compile: option names are strings, not {type(key).__name__} ({key!r})")
        name = key.replace("-", "_")
        if name not in known:
            raise unknown_option_error(key, known)
        _check_value(cfg, key, name, value)
        patches[name] = value
    patches.update(_FIXED)
    return patches
