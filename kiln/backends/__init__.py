"""Backends: ``(gm: torch.fx.GraphModule, example_inputs: list) -> callable``.

Built in: ``"eager"`` runs the captured graph as is; ``"aot_eager"`` runs it through kiln's
AOT autograd (functional ATen forward and backward graphs, run as FX). ``aot_backend(...)``
builds AOT backends with your own compilers and partitioner. Any callable with the backend
signature is a backend too; ``register_backend`` gives one a name.
"""
from .aot import aot_backend
from .registry import list_backends, lookup_backend, register_backend

__all__ = ["aot_backend", "list_backends", "lookup_backend", "register_backend"]
