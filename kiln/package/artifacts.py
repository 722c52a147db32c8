"""What compiled functions ask of this layer (``kiln.runtime.artifacts.Artifacts``): packages
and frame records. ``kiln.compile`` and ``load_package`` give ``ARTIFACTS`` to the functions
they make."""
from __future__ import annotations

from . import frame_records, save


class PackageArtifacts:
    def save_package(self, compiled, path: str):
        return save.save_package(compiled, path)

    def lookup(self, cf, args: tuple, kwargs: dict):
        return frame_records.lookup(cf, args, kwargs)

    def record(self, cf) -> None:
        frame_records.record(cf)


ARTIFACTS = PackageArtifacts()
