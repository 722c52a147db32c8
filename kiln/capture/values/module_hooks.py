"""An nn.Module's forward pre-hooks and forward hooks, inlined as ``Module.__call__`` runs them.

Libraries register them on models users compile: Hugging Face's
``gradient_checkpointing_enable`` (``enable_input_require_grads`` on the input embeddings), PEFT,
activation statistics. Each hook is inlined like any call, in ``Module.__call__``'s order:

* a pre-hook ``hook(module, args)`` (``with_kwargs``: ``hook(module, args, kwargs)``) may
  return new arguments (a tuple, or one value that becomes a 1-tuple; with kwargs, an
  ``(args, kwargs)`` pair);
* a forward hook ``hook(module, args, output)`` (``with_kwargs``: ``hook(module, args,
  kwargs, output)``) may return a new output.

Guards: the hook dicts' keys (which hooks, in which order, which take kwargs) and each hook
function's identity, so registering or removing a hook recompiles. Backward hooks (module
full backward hooks) and global module hooks still run the call natively. A hook that cannot be
inlined (one torch marks to run outside compiled graphs, as FSDP2's) breaks the graph at the
module's call, where the hooks run natively around the compiled forward
(``kiln/runtime/hooked_module.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ... import _torch
from ...errors import Unsupported
from ..guards import Guard, GuardKind
from ..sources import AttrSource, ItemSource
from .base import ConstantValue
from .containers import DictValue, TupleValue

_FORWARD_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
                  "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
_BACKWARD_DICTS = ("_backward_hooks", "_backward_pre_hooks")


@dataclass
class Hooks:
    pre: list       # (hook value, takes kwargs)
    post: list


def forward_hooks(tx, module_value) -> Hooks | None:
    """The module's forward hooks, guarded; None (guarded too) when it has no hooks."""
    output = tx.output
    m = module_value.value
    if _torch.module_hooks_empty(m):
        output.guard_module_has_no_hooks(module_value)
        return None
    name = type(m).__name__
    if m._backward_hooks or m._backward_pre_hooks:
        raise Unsupported(f"nn.Module {name} has backward hooks registered")
    src = module_value.source
    if src is None or not output.guards_enabled_for(src):
        raise Unsupported("calling an nn.Module with hooks that cannot be guarded")
    output.guard_no_global_module_hooks()
    for d in _BACKWARD_DICTS + _FORWARD_DICTS:
        output.guards.add(Guard(GuardKind.DICT_KEYS, AttrSource(src, d), list(getattr(m, d, {}))))

    def hooks_of(dict_name: str, kwargs_dict: str) -> list:
        found = []
        for key, fn in getattr(m, dict_name).items():
            hook_src = ItemSource(AttrSource(src, dict_name), key)
            output.guards.add(Guard(GuardKind.ID_MATCH, hook_src, fn))
            found.append((tx.wrap(fn, hook_src), key in getattr(m, kwargs_dict, {})))
        return found
    return Hooks(hooks_of("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs"),
                 hooks_of("_forward_hooks", "_forward_hooks_with_kwargs"))


def call_with_hooks(tx, module_value, hooks: Hooks, args: list, kwargs: dict, call_forward):
    """``Module.__call__`` with ``hooks``: pre-hooks, ``call_forward(args, kwargs)``, hooks."""
    for hook, with_kwargs in hooks.pre:
        if with_kwargs:
            result = tx.call(hook, [module_value, TupleValue(list(args)), _dict_value(kwargs)], {})
            if not _is_none(result):
                pair = _items(result)
                if pair is None or len(pair) != 2 or _items(pair[0]) is None or not isinstance(pair[1], DictValue):
                    raise Unsupported("a forward pre-hook with kwargs returning something other than "
                                      "(args, kwargs)")
                args, kwargs = list(_items(pair[0])), _kwargs_of(pair[1])
        else:
            result = tx.call(hook, [module_value, TupleValue(list(args))], {})
            if not _is_none(result):
                items = _items(result) if _is_tuple(result) else None
                args = list(items) if items is not None else [result]
    out = call_forward(args, kwargs)
    for hook, with_kwargs in hooks.post:
        if with_kwargs:
            result = tx.call(hook, [module_value, TupleValue(list(args)), _dict_value(kwargs), out], {})
        else:
            result = tx.call(hook, [module_value, TupleValue(list(args)), out], {})
        if not _is_none(result):
            out = result
    return out


def _is_none(v) -> bool:
    return isinstance(v, ConstantValue) and v.value is None


def _is_tuple(v) -> bool:
    return isinstance(v, TupleValue) and v.python_type() is tuple


def _items(v):
    return list(v.items) if isinstance(v, TupleValue) else None


def _dict_value(kwargs: dict):
    return DictValue(dict(kwargs))      # (keyword names: Python strings)


def _kwargs_of(d) -> dict:
    if not all(isinstance(k, str) for k in d.items):
        raise Unsupported("a forward pre-hook returning kwargs with non-string keys")
    return dict(d.items)
