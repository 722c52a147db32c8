"""Backends: ``(gm: torch.fx.GraphModule, example_inputs: list) -> callable``.

Built in: ``"eager"`` runs the captured graph as is. Any callable with that signature is a
backend too; ``register_backend`` gives one a name.
"""
from .registry import list_backends, lookup_backend, register_backend

__all__ = ["list_backends", "lookup_backend", "register_backend"]
