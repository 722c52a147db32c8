"""Packages: compiled functions saved to one file and loaded in a fresh process with no
capture, tracing or lowering.

    report = compiled.save_package("model.kiln")      # SaveReport: saved and left-out entries
    fast = kiln.load_package("model.kiln", model)    # matched by the saved guards first

Modules: ``fileformat`` (the file: its members in the artifact envelope, versions), ``values``
(the objects generated code reads, by value, by location or by name), ``guards`` (each guard
kind's saved form; the rebuilt guard program), ``graphs`` (captured graph + backend
artifact), ``entries`` (one entry and its continuations), ``identity`` (is it the same
function), ``save``, ``load`` (with ``packaged_function``: what it returns), ``report``,
``frame_records`` (the entries of a function kept for a warm process, in package form),
``artifacts`` (what compiled functions ask of this layer). A package holds code: load only
packages you trust.
"""
from .errors import PackageError, PackageMismatch, PackageMiss
from .load import load_package
from .report import SaveReport
from .save import save_package

__all__ = ["save_package", "load_package", "SaveReport", "PackageError", "PackageMismatch", "PackageMiss"]
