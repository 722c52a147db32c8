"""The state a trace runs under: mkldnn off (and aten.lstm's hidden-state defect worked
around), the random generators restored, saved-tensor hooks left for run time."""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch

aten = torch.ops.aten


@contextlib.contextmanager
def no_mkldnn_decompositions():
    """While tracing: torch's ``aten.lstm`` decomposition picks ``mkldnn_rnn_layer`` on CPU
    in inference mode (``train=False``: no workspace) when the input does not require grad,
    even where the weights do; its backward then fails on the missing workspace. With mkldnn
    off it decomposes into differentiable ATen ops. (Only the trace: kernels at run time are
    unaffected.)"""
    prior = torch._C._get_mkldnn_enabled()   # (torch.backends.mkldnn.flags warns about TF32)
    torch._C._set_mkldnn_enabled(False)
    try:
        if lstm_hidden_defect():
            with _lstm_hidden_shaped_as_given():
                yield
        else:
            yield
    finally:
        torch._C._set_mkldnn_enabled(prior)


# aten.lstm's Python kernels (torch._decomp, run by the Python dispatcher while tracing), and
# where their hidden-state argument is
_LSTM_OVERLOADS = (("input", 1), ("data", 2))
_LSTM_KEYS = ("Autograd", "CompositeImplicitAutograd")


@functools.lru_cache(None)
def lstm_hidden_defect() -> bool:
    """Whether torch's ``aten.lstm`` decomposition, on the path ``no_mkldnn_decompositions``
    takes, returns h_n and c_n with an extra dimension: torch 2.11's ``one_layer_lstm``
    squeezes dimension 1 instead of 0, so they came out ``(layers, 1, batch, hidden)`` for
    ``(layers, batch, hidden)``, a wrong answer. Probed once, on a tiny LSTM."""
    kernel = torch.ops.aten.lstm.input.py_kernels.get(torch._C.DispatchKey.Autograd)
    if kernel is None:
        return False
    x, h = torch.zeros(3, 2, 4), torch.zeros(1, 2, 5)
    params = [torch.zeros(20, 4), torch.zeros(20, 5), torch.zeros(20), torch.zeros(20)]
    prior = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        with torch.no_grad():
            _, hn, _ = kernel(x, (h, h), params, True, 1, 0.0, False, False, False)
    except Exception:
        return False
    finally:
        torch._C._set_mkldnn_enabled(prior)
    return hn.dim() != h.dim()


@contextlib.contextmanager
def _lstm_hidden_shaped_as_given():
    """While tracing: torch's Python ``aten.lstm`` kernels, with h_n and c_n reshaped to the
    hidden states passed in (the same elements, layer-major: only the shape was wrong)."""
    ops = [(getattr(torch.ops.aten.lstm, overload), hx_at) for overload, hx_at in _LSTM_OVERLOADS]
    replaced = []
    for op, hx_at in ops:
        for name in _LSTM_KEYS:
            key = getattr(torch._C.DispatchKey, name)
            kernel = op.py_kernels.get(key)
            if kernel is not None:
                replaced.append((op, key, kernel))
                op.py_kernels[key] = _hidden_shaped_as_given(kernel, hx_at)
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, key, kernel in replaced:
            op.py_kernels[key] = kernel
        for op, _ in ops:
            op._dispatch_cache.clear()


def _hidden_shaped_as_given(kernel: Callable, hx_at: int) -> Callable:
    def lstm(*args, **kwargs):
        out, h, c = kernel(*args, **kwargs)
        h0, c0 = args[hx_at]
        if h.dim() != h0.dim():
            h = h.reshape(h0.shape)
        if c.dim() != c0.dim():
            c = c.reshape(c0.shape)
        return out, h, c
    return lstm


@contextlib.contextmanager
def preserve_rng_state():
    """Tracing must not consume random numbers: restore the CPU (and CUDA) generators after."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        cpu = torch.random.get_rng_state().clone()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        with _disable_current_modes():
            torch.random.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def saved_tensor_hooks_deferred():
    """Saved-tensor hooks are not traced into the graphs: they run at runtime around the
    compiled autograd.Function (the backward's saved tensors are packed there)."""
    setter = getattr(torch._C._autograd, "_saved_tensors_hooks_set_tracing", None)
    if setter is None:  # pragma: no cover
        yield
        return
    prior = setter(True)
    try:
        yield
    finally:
        setter(prior)


def mark_forward_nodes() -> None:
    """Tag every node the current make_fx trace made so far as forward (``kiln_phase``): a
    joint function calls it between running the function and taking its gradients."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode    # (sympy: not at a warm start)

    mode = get_proxy_mode()
    if mode is not None:
        for n in mode.tracer.graph.nodes:
            n.meta.setdefault("kiln_phase", "forward")
