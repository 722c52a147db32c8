"""Python objects by name, as a fresh process finds them: ``resolve_name(module, qualname)``,
and the functions one name reaches through decorators (``functions_under``): the wrapper the
name finds (``functools.wraps`` gave it the function's qualified name), the function in its
``__wrapped__``, and a function a wrapper keeps in a closure cell (``huggingface_hub``'s
``strict`` keeps the ``__setattr__`` it replaced there); the named function a nested one is
defined in (``defining_name``)."""
from __future__ import annotations

import importlib
import types


def resolve_name(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def defining_name(qualname: str) -> str | None:
    """The qualified name of the function that defines a nested one (``make.<locals>.inner``:
    ``make``), where that function has a name; None otherwise."""
    if ".<locals>." not in qualname:
        return None
    outer = qualname.split(".<locals>.", 1)[0]
    return outer if "<" not in outer else None


def functions_under(obj, depth: int = 4) -> list[types.FunctionType]:
    """``obj`` (a function, a method, a property's getter) and the functions it wraps, a few
    levels deep, outermost first."""
    found, seen = [], set()
    todo = [(obj, 0)]
    while todo:
        obj, level = todo.pop(0)
        if obj is None or id(obj) in seen or level > depth:
            continue
        seen.add(id(obj))
        if isinstance(obj, property):
            obj = obj.fget
        obj = getattr(obj, "__func__", obj)
        if not isinstance(obj, types.FunctionType):
            # a wrapper that is not a Python function (``functools.lru_cache``'s) still names
            # what it wraps
            todo.append((getattr(obj, "__wrapped__", None), level + 1))
            continue
        found.append(obj)
        todo.append((getattr(obj, "__wrapped__", None), level + 1))
        for cell in obj.__closure__ or ():
            try:
                inner = cell.cell_contents
            except ValueError:          # (an empty cell)
                continue
            if isinstance(inner, (types.FunctionType, types.MethodType)):
                todo.append((inner, level + 1))
    return found
