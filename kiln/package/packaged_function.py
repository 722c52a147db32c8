"""A CompiledFunction whose entries come from a package (``load_package``): a call that
matches none of them is logged and compiles, or raises ``PackageMiss``."""
from __future__ import annotations

from .. import logs
from ..runtime.function import CompiledFunction, counting_steps
from .errors import PackageMiss


class PackagedFunction(CompiledFunction):
    """A CompiledFunction loaded from a package: its misses are logged, or raise."""

    def __init__(self, fn, key, dynamic, artifacts, on_miss: str, path: str):
        super().__init__(fn, key, dynamic, artifacts)
        self._on_miss = on_miss
        self._package = path

    @classmethod
    def adopt(cls, compiled: CompiledFunction, on_miss: str, path: str) -> None:
        """Make a continuation's CompiledFunction (made by the break function the package
        rebuilt) miss as the package's functions do."""
        if type(compiled) is CompiledFunction:
            compiled.__class__ = cls
        elif type(compiled) is counting_steps(CompiledFunction):
            compiled.__class__ = counting_steps(cls)
        if isinstance(compiled, cls):
            compiled._on_miss, compiled._package = on_miss, path

    def _miss(self, args: tuple, kwargs: dict):
        mine = [e for e in self._cache.entries if e.key is self._key]
        reason = _nearest_failure(mine, args, kwargs)
        if reason is None:
            reason = "the package has no entry for this function" if not mine else \
                "guards passed on re-check"
        if self._on_miss == "error":
            raise PackageMiss(f"{self._fn.__qualname__}: this call matches none of the {len(mine)} entries "
                              f"of package {self._package}; the nearest entry's failing guard: {reason}. "
                              "Call it as when the package was saved, save a package that covers this "
                              "call, or load with on_miss='compile'")
        if logs.enabled.package:
            logs.event("package", "package", f"miss in package {self._package} for {self._fn.__qualname__} "
                       f"({reason}); compiling", action="miss", path=str(self._package),
                       function=self._fn.__qualname__, reason=str(reason))
        return super()._miss(args, kwargs)

    def __repr__(self):
        return f"<kiln.CompiledFunction {self._fn.__qualname__} from package {self._package}>"


# how far a call got through an entry's checks (they run in this order): the nearest entry
# is the one whose first failing guard comes latest
_STAGES = ("GLOBAL_STATE", None, "TENSOR_MATCH", "SHAPE_ENV")


def _nearest_failure(entries: list, args: tuple, kwargs: dict) -> str | None:
    best, best_stage = None, -1
    for e in entries[:16]:
        why = e.failure_reason(args, kwargs)
        if why is None:
            continue
        kind = why.split(None, 1)[0]
        stage = _STAGES.index(kind) if kind in _STAGES else 1
        if stage > best_stage:
            best, best_stage = why, stage
    return best
