"""Whose failure is it: kiln's own, or the user's?

kiln's own failures never reach the user. An exception raised while kiln captures a frame,
generates its code, builds its guards or compiles its graph with one of kiln's backends is
kiln's: the frame runs eagerly instead (``kiln.Unsupported`` under ``fullgraph=True``). The
user's exceptions propagate unchanged:

* those the program raises when it runs (eager would raise them too);
* those raised by the user's own code that kiln runs while compiling: a backend passed to
  ``kiln.compile``, a compiler passed to ``kiln.backends.aot_backend``, a ``comptime``
  callback. ``call_user`` runs such code and marks what it raises, so that kiln's handlers on
  the way (which treat every other exception as kiln's) let it through.

At run time the generated entry of a frame may fail too. Whether the call can then simply be
run eagerly depends on what the entry did before failing: the entry sets ``EFFECTS_MARK``
right before its first step with an effect outside the frame (an input mutated in place, the
random generator advanced, grad mode changed, a side effect written back, the native code at a
graph break). ``failed_before_effects`` reads it from the failed frame.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

from .errors import Unsupported

_USER_MARK = "__kiln_users_error__"

# a local of generated entries: assigned right before their first effect
EFFECTS_MARK = "___effects"


def call_user(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run the user's own code on kiln's behalf; what it raises is the user's."""
    try:
        return fn(*args, **kwargs)
    except Unsupported:
        raise                      # kiln's own signal (comptime.graph_break(), a backend declining)
    except Exception as e:
        mark_users(e)
        raise


def user_callable(fn: Callable | None) -> Callable | None:
    """``fn`` wrapped so that its exceptions are the user's (see ``call_user``)."""
    if fn is None:
        return None

    def users_code(*args, **kwargs):
        return call_user(fn, *args, **kwargs)
    users_code.__wrapped__ = fn
    users_code.__name__ = getattr(fn, "__name__", type(fn).__name__)
    return users_code


def mark_users(e: BaseException) -> None:
    try:
        e.__dict__[_USER_MARK] = True
    except Exception:  # an exception object without a __dict__: counted as kiln's
        pass


def is_users(e: BaseException) -> bool:
    try:
        return bool(e.__dict__.get(_USER_MARK, False))
    except Exception:
        return False


def is_kiln_backend(backend: Callable) -> bool:
    """Backends kiln provides ("eager", "aot_eager", "inductor", those made by
    ``kiln.backends.aot_backend``, explain's): their failures are kiln's. Any other callable
    is the user's code."""
    module = getattr(backend, "__module__", None)
    if not isinstance(module, str):
        module = getattr(type(backend), "__module__", "") or ""
    return module == "kiln" or module.startswith("kiln.")


def internal_error(e: BaseException, what: str):
    """The ``Unsupported`` that stands for kiln's own failure ``e`` (chained to it)."""
    u = Unsupported(f"kiln internal error while {what} ({type(e).__name__}: {e}); "
                    "the frame runs eagerly (please report this as a kiln bug)")
    u.__cause__ = e
    u.internal = True
    return u


def forget_frames(exc: BaseException | None) -> None:
    """Cut an exception kept after its capture (an entry's break reason) loose from that
    capture: its traceback holds the capture's frames, the exceptions chained to it hold
    kiln's state (a ``BreakHere`` holds the interpreter), and through them the call's
    arguments would stay alive. kiln's own failure keeps its traceback as text
    (``exc.internal_traceback``); a user exception it carries (``UserException.exc``) loses
    its traceback too."""
    import traceback

    if exc is None:
        return
    if getattr(exc, "internal", False) and exc.__cause__ is not None \
            and getattr(exc, "internal_traceback", None) is None:
        exc.internal_traceback = "".join(traceback.format_exception(exc.__cause__))
    inner = getattr(exc, "exc", None)
    if isinstance(inner, BaseException):
        inner.__traceback__ = None
        inner.__context__ = inner.__cause__ = None
    exc.__traceback__ = None
    exc.__cause__ = exc.__context__ = None


def failed_before_effects(code, exc: BaseException) -> bool:
    """True when ``exc`` was raised by the generated entry with code ``code`` (or below it)
    before the entry's first effect: running the frame eagerly instead repeats nothing.
    False when the exception was raised binding the arguments (the user's TypeError), after
    an effect, or is the user's by mark or by nature (out of memory)."""
    if is_users(exc) or isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return False
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is code:
            return EFFECTS_MARK not in frame.f_locals
        tb = tb.tb_next
    return False


# -- effects of a captured graph -----------------------------------------------------------------

_STATE_METHODS = frozenset({"register_hook", "retain_grad", "backward", "record_stream",
                            "requires_grad_", "share_memory_", "set_", "resize_"})
_RANDOM_WORDS = ("rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "exponential",
                 "geometric", "cauchy", "poisson", "rrelu", "random", "seed", "shuffle")


def graph_has_effects(graph) -> bool:
    """Whether running the FX graph changes anything outside its outputs: a tensor mutated
    in place (an input, or a view of one), the random generator advanced, grad mode or
    autocast toggled. Conservative: an op it cannot tell about by name counts as pure only
    when its name says nothing of the above."""
    import torch
    import torch.amp.autocast_mode as am

    state_fns = (torch._C._set_grad_enabled, am._enter_autocast, am._exit_autocast)
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        target = node.target
        if target in state_fns or target is operator.setitem or "out" in node.kwargs:
            return True
        if isinstance(target, torch._ops.OpOverload):
            if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
                return True
            name = target._schema.name
        elif isinstance(target, str):
            name = target
        else:
            name = getattr(target, "__name__", None) or str(target)
        name = name.lower()
        if name in _STATE_METHODS or name.endswith("_") and not name.endswith("__"):
            return True
        if any(w in name for w in _RANDOM_WORDS):
            return True
    return False
