"""NumPy code traced into the graph: an ndarray inside a graph is a tensor.

* ``values.py``: the symbolic values (ndarrays, NumPy functions and classes) and their tracing;
* ``runtime.py``: what the graph calls to run NumPy code on tensors (``torch._numpy``);
* ``conversions.py``: ``Tensor.numpy()``, ``torch.from_numpy`` and the other conversions;
* ``aliasing.py``: views NumPy and the graph would share differently (a graph break);
* ``oracle.py``: NumPy itself checks each traced call at capture time.
"""
