"""Why a key missed: its parts against the nearest stored entry of the same function."""
from __future__ import annotations

from . import store


def _diff(path: str, old, new, out: list) -> None:
    if old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for k in list(old) + [k for k in new if k not in old]:
            if k not in old:
                out.append(f"{path} {k}: (absent) -> {new[k]}")
            elif k not in new:
                out.append(f"{path} {k}: {old[k]} -> (absent)")
            else:
                _diff(f"{path} {k}".strip(), old[k], new[k], out)
        return
    if isinstance(old, list) and isinstance(new, list) and path == "inputs":
        if len(old) != len(new):
            out.append(f"inputs: {len(old)} -> {len(new)} inputs")
            return
        for i, (a, b) in enumerate(zip(old, new)):
            _diff(f"input {i}", a, b, out)
        return
    if isinstance(old, str) and isinstance(new, str) and "\n" in old + new:
        a, b = old.splitlines(), new.splitlines()
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                out.append(f"{path} line {i}: {x.strip()} -> {y.strip()}")
                return
        out.append(f"{path}: {len(a)} -> {len(b)} lines")
        return
    out.append(f"{path}: {_short(old)} -> {_short(new)}")


def _short(v) -> str:
    s = "[" + ", ".join(map(str, v)) + "]" if isinstance(v, list) else str(v)
    return s if len(s) <= 80 else s[:77] + "..."


def differences(old: dict, new: dict) -> list[str]:
    """One line per differing leaf of two keys' parts (``input 2 dtype: float32 -> bfloat16``)."""
    out: list[str] = []
    _diff("", old, new, out)
    return out


def nearest(function: str, parts: dict) -> list[str] | None:
    """The differences to the stored entry of ``function`` with the fewest (None: no entry)."""
    best = None
    for _, path in store.entries():
        header = store.read_header(path)
        if not header or header.get("function") != function:
            continue
        diffs = differences(header.get("parts", {}), parts)
        if best is None or len(diffs) < len(best):
            best = diffs
    return best


def describe(function: str, diffs: list[str] | None) -> str:
    """``nearest``'s answer as one line."""
    if diffs is None:
        return f"no entry stored for {function}"
    if not diffs:
        return "an entry with this key exists but could not be used"
    return "; ".join(diffs) + "; all else equal"

