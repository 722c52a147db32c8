"""Activation-memory policies: saved-tensor hooks that kiln inlines into compiled graphs."""
from .report import ActivationReport, report

__all__ = ["ActivationReport", "report"]
