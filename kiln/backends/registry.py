"""Backend registry: names -> backend callables."""
from __future__ import annotations

from typing import Callable

_BACKENDS: dict[str, Callable] = {}


def register_backend(name: str, fn: Callable | None = None, *, cache_key: str | None = None):
    """Register ``fn`` under ``name`` (usable as a decorator).

    ``cache_key`` (a string naming what the backend's code does; change it when the code
    changes) declares the backend cacheable: it is set as ``fn.cache_key``. kiln stores AOT
    results, so a backend made by ``kiln.backends.aot_backend`` is then cached; any other backend is
    compiled every time, and ``KILN_LOGS=cache`` says why."""
    if not isinstance(name, str) or not name:
        raise TypeError("register_backend(name, fn): name must be a non-empty string")
    if cache_key is not None and not isinstance(cache_key, str):
        raise TypeError(f"register_backend(..., cache_key=...): a string, not {type(cache_key).__name__}")

    def deco(f):
        if not callable(f):
            raise TypeError(f"backend {name!r} must be callable (gm, example_inputs) -> callable")
        if cache_key is not None:
            try:
                f.cache_key = cache_key
            except (AttributeError, TypeError) as e:
                raise TypeError(f"register_backend({name!r}, cache_key=...): cannot set cache_key on "
                                f"{type(f).__name__} ({e}); give it a cache_key attribute") from None
        _BACKENDS[name] = f
        return f
    return deco(fn) if fn is not None else deco


def lookup_backend(backend: str | Callable, mode: str | None = None,
                   options: dict | None = None) -> tuple[Callable, str]:
    """(backend callable, display name) for a name or a callable.

    A backend with a ``configure(mode, options)`` method (``"inductor"``) returns from it the
    backend for that mode and those options, validating them; other backends get them only
    through the compile key."""
    if isinstance(backend, str):
        _load_builtins()
        fn = _BACKENDS.get(backend)
        if fn is None:
            raise ValueError(f"unknown kiln backend {backend!r}; available: {', '.join(list_backends())}. "
                             "A backend can also be any callable (gm, example_inputs) -> callable.")
        return _configured(fn, mode, options), backend
    if callable(backend):
        name = getattr(backend, "__name__", None) or type(backend).__name__
        return _configured(backend, mode, options), name
    raise TypeError(f"backend must be a backend name or a callable (gm, example_inputs) -> callable, "
                    f"not {type(backend).__name__}")


def _configured(fn: Callable, mode: str | None, options: dict | None) -> Callable:
    configure = getattr(fn, "configure", None)
    if callable(configure) and (mode not in (None, "default") or options):
        return configure(mode=mode, options=options)
    return fn


def list_backends() -> list[str]:
    _load_builtins()
    return sorted(_BACKENDS)


def _load_builtins() -> None:
    from . import eager  # noqa: F401  cycle: each built-in backend registers itself here
    from . import aot  # noqa: F401  cycle: registers "aot_eager" here
    from . import inductor  # noqa: F401  cycle: registers "inductor" here
