"""Build step for kiln's one C extension (``kiln/capture/_module_state.c``, CPython 3.11 and
3.12). It is optional: where it cannot be built, kiln still works and checks every guard of
an entry on every call (see kiln/capture/module_state.py). Everything else is in
pyproject.toml."""
import sys

from setuptools import Extension, setup

ext_modules = []
if (3, 11) <= sys.version_info[:2] <= (3, 12) and sys.implementation.name == "cpython":
    ext_modules.append(Extension("kiln.capture._module_state", ["kiln/capture/_module_state.c"],
                                 optional=True))

setup(ext_modules=ext_modules)
