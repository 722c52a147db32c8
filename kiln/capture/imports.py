"""``import`` statements inside a captured function, as ``__import__`` and ``IMPORT_FROM``
run them.

``IMPORT_NAME name (level, fromlist)`` returns the top-level package for ``import a.b.c``
(no fromlist), and the module ``a.b`` itself for ``from a.b import c``; a relative import
(``level > 0``) first resolves ``name`` against the importing module's package.
``IMPORT_FROM c`` reads the attribute ``c`` of that module, falling back to
``sys.modules['a.b.c']`` (a submodule imported but not bound on its package yet).

Only imports that find everything already in ``sys.modules`` are captured: they have no side
effect, and each module the code then uses is guarded to be ``sys.modules[name]`` again (the
object a later import returns). An import that would load a module runs natively (a graph
break), as does any import while ``__import__`` is not the builtin one.
"""
from __future__ import annotations

import builtins
import sys

from ..errors import Unsupported
from .guards import GuardKind
from .sources import AttrSource, ConstSource, ItemSource
from .values.objects import PythonModuleValue


def import_name(tx, name: str, fromlist, level: int):
    """The value ``IMPORT_NAME`` pushes."""
    _check_import_hook(tx)
    absolute = _resolve(tx, name, level)
    module = _loaded(absolute)
    if fromlist:
        if "*" in fromlist:
            raise Unsupported("from ... import * inside a function")
        if hasattr(module, "__path__"):
            # __import__ loads submodules named in the fromlist that the package lacks
            for sub in fromlist:
                if not _has_attribute(module, sub) and f"{absolute}.{sub}" not in sys.modules:
                    raise Unsupported(f"from {absolute} import {sub}: a submodule not yet imported")
        return module_value(tx, absolute)
    if level:   # (not produced by the compiler: relative imports always have a fromlist)
        return module_value(tx, absolute)
    top = absolute.partition(".")[0]
    _loaded(top)
    return module_value(tx, top)


def import_from(tx, module, name: str):
    """The value ``IMPORT_FROM name`` pushes for a module value on the stack."""
    if not isinstance(module, PythonModuleValue):
        raise Unsupported(f"IMPORT_FROM on {module.describe()}")
    mod = module.value
    if _has_attribute(mod, name):
        return module.getattr(tx, name)
    pkg = getattr(mod, "__name__", None)
    full = f"{pkg}.{name}" if isinstance(pkg, str) else None
    if full is not None and full in sys.modules:
        # a submodule not (yet) set on its package: CPython reads it from sys.modules
        tx.output.builder.guard(GuardKind.HASATTR, module.source, (name, False))
        return module_value(tx, full)
    where = f" from {pkg!r}" if isinstance(pkg, str) else ""
    raise tx.user_exception(ImportError(f"cannot import name {name!r}{where}", name=pkg))


def module_value(tx, absolute: str):
    """``sys.modules[absolute]``, guarded to stay that module object."""
    source = ItemSource(AttrSource(ConstSource(sys), "modules"), absolute)
    return tx.wrap(sys.modules[absolute], source)


def _loaded(absolute: str):
    module = sys.modules.get(absolute)
    if module is None:
        raise Unsupported(f"import of a module not yet imported ({absolute})")
    spec = getattr(module, "__spec__", None)
    if getattr(spec, "_initializing", False):
        raise Unsupported(f"import of a module still being initialized ({absolute})")
    return module


def _has_attribute(module, name: str) -> bool:
    try:
        getattr(module, name)
        return True
    except AttributeError:
        return False


def _check_import_hook(tx) -> None:
    """Imports go through ``__builtins__['__import__']``: model only the builtin one, and
    guard that it stays so."""
    hook = tx.f_builtins.get("__import__")
    if hook is not builtins.__import__:
        raise Unsupported("import while __import__ is replaced")
    tx.output.builder.guard(GuardKind.ID_MATCH, ItemSource(ConstSource(tx.f_builtins), "__import__"),
                            builtins.__import__)


def _resolve(tx, name: str, level: int) -> str:
    """The absolute module name (importlib's ``_resolve_name`` with ``_calc___package__``)."""
    if level == 0:
        if not name:
            raise tx.user_exception(ValueError("Empty module name"))
        return name
    g = tx.f_globals
    package = g.get("__package__")
    spec = g.get("__spec__")
    if package is None:
        if spec is not None:
            package = spec.parent
        else:
            package = g.get("__name__")
            if package is None:
                raise Unsupported("relative import without __name__ in globals")
            if "__path__" not in g:
                package = package.rpartition(".")[0]
    elif spec is not None and package != spec.parent:
        raise Unsupported("relative import where __package__ != __spec__.parent (a warning)")
    if not isinstance(package, str):
        raise tx.user_exception(TypeError("package must be a string"))
    if not package:
        raise tx.user_exception(ImportError("attempted relative import with no known parent package"))
    bits = package.rsplit(".", level - 1)
    if len(bits) < level:
        raise tx.user_exception(ImportError("attempted relative import beyond top-level package"))
    base = bits[0]
    return f"{base}.{name}" if name else base

