"""The errors of packages (``kiln.save_package`` / ``kiln.load_package``)."""
from __future__ import annotations

from ..errors import KilnError


class PackageError(KilnError):
    """A package file that cannot be used: not a kiln package, damaged (truncated, changed
    bytes: its content hash does not match), or saved by another kiln, torch or Python version
    or for another device kind. Nothing of it has run. Save the package again with this setup."""


class PackageMismatch(PackageError):
    """The function or module given to ``kiln.load_package`` is not the one the package was
    saved from: the message names what differs (qualified name, signature, the code of the
    function or of a function it inlined). Pass ``check_source=False`` to load anyway (only if
    you know the difference does not matter)."""


class PackageMiss(KilnError):
    """A call of a function loaded with ``on_miss="error"`` that matches none of the package's
    entries; the message names the nearest entry's failing guard."""


class NotPackageable(Exception):
    """kiln-internal: why one entry cannot be saved (it is left out, with this reason in the
    save report)."""
