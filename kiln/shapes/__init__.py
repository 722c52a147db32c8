"""Dynamic shapes: which sizes are symbolic (the policy), the per-tensor marks that override
it, and the profile of dims found dynamic that survives restarts."""
from .marks import mark_dynamic, mark_static

__all__ = ["mark_dynamic", "mark_static"]
