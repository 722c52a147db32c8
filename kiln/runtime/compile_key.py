"""What an entry was compiled for: backend, mode, options, fullgraph, dynamic, and the settings
that shape a capture (``config.capture_settings()`` when ``kiln.compile`` ran)."""
from __future__ import annotations

import weakref

from ..config import config


class CompileKey:
    """What an entry was compiled for. Interned, so BACKEND_MATCH is an identity test."""

    # weak: a key lives as long as an entry or a compiled function uses it (a backend object
    # the user drops, with the graphs it may keep, is not kept here)
    _interned: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()

    def __init__(self, backend, backend_name, fullgraph, mode, options, dynamic=None, settings=()):
        self.backend = backend
        self.backend_name = backend_name
        self.fullgraph = fullgraph
        self.mode = mode
        self.options = options
        self.dynamic = dynamic
        self.settings = settings

    @classmethod
    def get(cls, backend, backend_name, fullgraph, mode, options, dynamic=None) -> "CompileKey":
        opts = tuple(sorted((options or {}).items(), key=lambda kv: kv[0]))
        settings = config.capture_settings()
        try:
            k = (id(backend), backend_name, fullgraph, mode, opts, dynamic, settings)
            hash(k)
        except TypeError:
            return cls(backend, backend_name, fullgraph, mode, options, dynamic, settings)
        hit = cls._interned.get(k)
        if hit is None or hit.backend is not backend:
            hit = cls._interned[k] = cls(backend, backend_name, fullgraph, mode, options, dynamic, settings)
        return hit

    def __repr__(self):
        extra = "".join([", fullgraph=True" if self.fullgraph else "",
                         f", mode={self.mode!r}" if self.mode else "",
                         f", options={self.options!r}" if self.options else "",
                         f", dynamic={self.dynamic}" if self.dynamic is not None else ""])
        return f"{self.backend_name!r}{extra}"
