"""kiln's ahead-of-time autograd, in explicit stages.

    state   = create_aot_state(fn, example_inputs)        # fake mode, wrappers, forward metadata
    capture = stage1_graph_capture(state)                 # functional ATen graph (joint or inference)
    # ... inspect or edit capture.graph ...
    compiled = stage2_compile(state, capture, fw_compiler=..., bw_compiler=..., partition_fn=...)
    # or: artifact = stage2_export(state, capture); artifact.to_bytes(); AOTArtifact.from_bytes(b).load()

No mode stays active between the stage calls: each stage enters what it traces under (the
fake mode, the python dispatcher...) and exits it before returning, as JAX's
``lowered.compile()`` chain does; ``with create_aot_state(...) as state:`` works too and only
marks the state finished at its end (``state.close()``).

Every stage result has ``as_text()``. ``kiln.backends.aot_backend`` and the ``"aot_eager"``
backend run these stages for ``kiln.compile``; a graph they fail on runs as captured
(``dynamic.compile_graph``), and a call the compiled graphs do not fit runs ``state.fn``
(``runtime.RunAsCaptured``). The compiled backward follows eager's autograd where it is
observable: grad-mode changes inside the graph, ``.grad`` None for leaves backward() does not
reach, views as eager made them, and version-counter checks (``versions.py``).

Dynamic graphs (placeholders with symbolic example values, from a dynamic capture) are traced
with their symbols: the graphs take the SymInts as inputs and serve every size, and the
callable checks each call against the traced shapes (``symbolic.py``). The backend compiles per
concrete shapes where that is not possible (``dynamic.py``). Dynamic graphs are not exported.
"""
import importlib as _importlib

from ..lazy_imports import submodule

# Each name is imported with its own module at its first use: a warm start loads compiled
# graphs (``export``, ``function``, ``runtime``) without importing the tracing stages.
_HOME = {
    "AOTCompiled": ".compile", "run_as_fx": ".compile", "stage2_compile": ".compile",
    "PerShapeCompiled": ".dynamic", "compile_graph": ".dynamic",
    "AOTArtifact": ".export", "stage2_export": ".export",
    "RunAsCaptured": ".runtime",
    "AOTGraphCapture": ".graph_capture", "stage1_graph_capture": ".graph_capture",
    "Partition": ".partition", "default_partition": ".partition",
    "min_cut_rematerialization_partition": ".partition",
    "create_aot_state": ".prepare",
    "AOTState": ".state", "InputInfo": ".state", "OutputInfo": ".state", "ViewAndMutationMeta": ".state",
    "SymbolicUnsupported": ".symbolic",
}


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None and not name.startswith("__"):   # a stage's module (``kiln.aot.dynamic``)
        return submodule(__name__, name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))


__all__ = [
    "create_aot_state", "stage1_graph_capture", "stage2_compile", "stage2_export",
    "AOTState", "AOTGraphCapture", "AOTCompiled", "AOTArtifact", "Partition",
    "InputInfo", "OutputInfo", "ViewAndMutationMeta",
    "default_partition", "min_cut_rematerialization_partition", "run_as_fx",
    "compile_graph", "PerShapeCompiled", "SymbolicUnsupported", "RunAsCaptured",
]
