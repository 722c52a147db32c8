"""kiln's ahead-of-time autograd, in explicit stages.

    state   = create_aot_state(fn, example_inputs)        # fake mode, wrappers, forward metadata
    capture = stage1_graph_capture(state)                 # functional ATen graph (joint or inference)
    # ... inspect or edit capture.graph ...
    compiled = stage2_compile(state, capture, fw_compiler=..., bw_compiler=..., partition_fn=...)
    # or: artifact = stage2_export(state, capture); artifact.to_bytes(); AOTArtifact.from_bytes(b).load()
    state.close()

Every stage result has ``as_text()``. ``kiln.backends.aot_backend`` and the ``"aot_eager"``
backend run these stages for ``kiln.compile``.
"""
from . import config
from .compile import AOTCompiled, run_as_fx, stage2_compile
from .export import AOTArtifact, stage2_export
from .graph_capture import AOTGraphCapture, stage1_graph_capture
from .partition import Partition, default_partition, min_cut_rematerialization_partition
from .state import AOTState, InputInfo, OutputInfo, ViewAndMutationMeta, create_aot_state

__all__ = [
    "create_aot_state", "stage1_graph_capture", "stage2_compile", "stage2_export",
    "AOTState", "AOTGraphCapture", "AOTCompiled", "AOTArtifact", "Partition",
    "InputInfo", "OutputInfo", "ViewAndMutationMeta",
    "default_partition", "min_cut_rematerialization_partition", "run_as_fx", "config",
]
