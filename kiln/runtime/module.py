"""``kiln.compile(module)``: a module whose forward is compiled, and the one function per module
class that all its instances' entries belong to."""
from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Callable

import torch

from ..process_state import module_callers as _module_callers
from .method import CompiledMethod

_callers_lock = threading.Lock()

if TYPE_CHECKING:
    from .function import CompiledFunction


def module_caller(cls: type) -> Callable:
    """One tiny function per module class, so all instances of a class share its entries and
    module hooks are honoured (calling the module goes through the NO_HOOKS guard).

    The table holds the caller weakly: its entries' guards name the class, so a strong value
    would keep the class (and all its methods' closures reach) alive for good. The compiled
    modules hold the caller; once none is left, the class and the caller are freed together."""
    with _callers_lock:     # (one for all threads)
        ref = _module_callers.get(cls)
        fn = ref() if ref is not None else None
        if fn is None:
            def call_module(module, /, *args, **kwargs):
                return module(*args, **kwargs)
            call_module.__qualname__ = f"{cls.__qualname__}.__call__"
            call_module.__module__ = cls.__module__   # (also names its dynamic-shape profile)
            call_module.__kiln_source__ = cls.forward    # (the source a trace shows for it)
            fn = call_module
            _module_callers[cls] = weakref.ref(fn)
    return fn


class CompiledModule(torch.nn.Module):
    """The module returned by ``kiln.compile(module)``: forward is compiled; parameters,
    buffers, submodules and the state_dict are the original module's (same keys)."""

    # the wrapper's own attributes; every other attribute written on it is the module's
    _OWN_ATTRIBUTES = frozenset({"_orig_mod", "_kiln_compiled", "_kiln_ready", "__dict__"})

    def __init__(self, module: torch.nn.Module, compiled: CompiledFunction):
        object.__setattr__(self, "_kiln_ready", False)
        super().__init__()
        self._orig_mod = module
        object.__setattr__(self, "_kiln_compiled", compiled)
        object.__setattr__(self, "_kiln_ready", True)

    @property
    def training(self) -> bool:
        return self._modules["_orig_mod"].training

    @training.setter
    def training(self, value: bool) -> None:
        # (nn.Module.__init__ sets the default on the wrapper: the module keeps its own)
        if self.__dict__.get("_kiln_ready"):
            self._modules["_orig_mod"].training = value

    def __setattr__(self, name, value):
        # ``compiled.step += 1`` writes the module's attribute, which its forward reads, as
        # torch.compile's wrapper does; the wrapper's own names and class attributes stay here
        if name in self._OWN_ATTRIBUTES or hasattr(type(self), name) or not self.__dict__.get("_kiln_ready"):
            return super().__setattr__(name, value)
        setattr(self._modules["_orig_mod"], name, value)

    def __delattr__(self, name):
        if name in self._OWN_ATTRIBUTES or hasattr(type(self), name):
            return super().__delattr__(name)
        delattr(self._modules["_orig_mod"], name)

    def __deepcopy__(self, memo):
        # a copy of the module, compiled by the same function (one per module class: the
        # copy's calls share its entries, as any other instance of the class does)
        import copy

        copied = CompiledModule(copy.deepcopy(self._modules["_orig_mod"], memo), self._kiln_compiled)
        memo[id(self)] = copied
        return copied

    def __dir__(self):
        own = self._modules["_orig_mod"].__dir__()
        seen = set(own)
        return own + [a for a in super().__dir__() if a not in seen]

    def __call__(self, /, *args, **kwargs):
        return self._kiln_compiled(self._modules["_orig_mod"], *args, **kwargs)

    @property
    def forward(self):
        """The original module's forward, compiled: called, it runs as the compiled module
        does; its signature (``inspect.signature``) is the original forward's. (Set, it is
        what was set, as a method replaced on an instance.)"""
        replaced = self.__dict__.get("_kiln_forward")
        if replaced is not None:
            return replaced
        orig = self._modules["_orig_mod"]
        return CompiledMethod(self._kiln_compiled, orig, wrapped=orig.forward)

    @forward.setter
    def forward(self, value):
        self.__dict__["_kiln_forward"] = value

    @forward.deleter
    def forward(self):
        self.__dict__.pop("_kiln_forward", None)

    def __getattr__(self, name):
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    # The original module's view of its state: no "_orig_mod." prefix.
    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        return self._orig_mod.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self._orig_mod.named_buffers(*args, **kwargs)

    def named_modules(self, *args, **kwargs):
        return self._orig_mod.named_modules(*args, **kwargs)

    def named_children(self):
        return self._orig_mod.named_children()

    # Container protocol of the original (Sequential, ModuleList, ...).
    def __getitem__(self, idx):
        return self._orig_mod[idx]

    def __len__(self):
        return len(self._orig_mod)

    def __iter__(self):
        return iter(self._orig_mod)

    @property
    def compiled_function(self) -> CompiledFunction:
        """The CompiledFunction behind forward (one per module class)."""
        return self._kiln_compiled

    @property
    def entries(self):
        return self._kiln_compiled.entries

    def save_package(self, path: str):
        """Save every entry compiled so far (and those of the continuations after graph
        breaks) to the file ``path``, for ``kiln.load_package``. Returns a
        ``kiln.package.SaveReport``: entries saved, and entries left out with the reason."""
        return self._kiln_compiled.artifacts.save_package(self, path)

    @property
    def recompile_reasons(self):
        return self._kiln_compiled.recompile_reasons

    def __repr__(self):
        return f"kiln.CompiledModule({self._orig_mod!r})"
