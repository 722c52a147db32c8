"""What a call did, as plain data that can be compared with another run's.

``observe(fn, args, namespace, grad)`` calls ``fn(*args)`` with grad mode ``grad`` and records:
the result or the exception type, the arguments afterwards (tensors: values, dtype, shape,
requires_grad, is_leaf, ``.grad``; lists, dicts, user objects and modules recursively), the
program's globals (``STATE``, ``LOG``, ...), what was printed to stdout, the grad mode after the
call, which outputs are inputs or share their storage, and, when outputs require grad, the
``.grad`` of every argument after a backward of a fixed weighting of them.

``compare(expected, actual)`` returns ``None`` or a ``Mismatch`` naming the first difference."""
from __future__ import annotations

import contextlib
import io
import math
import re
import traceback
import types
from dataclasses import dataclass, field

import torch

_NUMBER = re.compile(r"-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan|-?inf")


@dataclass
class Mismatch:
    kind: str          # "outputs", "inputs", "globals", "printed", "grad_mode", "exception", "aliasing", "grads", "backward"
    path: str
    detail: str

    def __str__(self):
        return f"{self.kind} at {self.path}: {self.detail}"


@dataclass
class Observation:
    exception: object = None          # exception type name, or None
    exception_msg: str = ""
    outputs: object = None
    args: object = None
    globals: object = None
    printed: str = ""
    grad_mode: bool = True
    aliasing: object = None
    raised_at: object = None          # innermost frame of the program in the traceback
    backward_exception: object = None
    backward_msg: str = ""
    grads: object = None
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- snapshots
class TensorSnap:
    __slots__ = ("dtype", "shape", "requires_grad", "is_leaf", "value", "grad")

    def __init__(self, t: torch.Tensor, with_grad=True):
        self.dtype = t.dtype
        self.shape = tuple(t.shape)
        self.requires_grad = t.requires_grad
        self.is_leaf = _safe(lambda: t.is_leaf)   # raises for a multi-output view changed in place
        self.value = t.detach().clone()
        g = t.grad if (with_grad and self.is_leaf is True) else None
        self.grad = TensorSnap(g, with_grad=False) if g is not None else None


def _safe(get):
    try:
        return get()
    except Exception as e:  # noqa: BLE001 - the error is the observation
        return f"raises {type(e).__name__}"


def snapshot(obj, depth=0):
    if depth > 12:
        return ("deep",)
    if isinstance(obj, torch.Tensor):
        return TensorSnap(obj)
    if isinstance(obj, torch.nn.Module):
        plain = {k: snapshot(v, depth + 1) for k, v in vars(obj).items()
                 if not k.startswith("_") and k != "training"}
        return ("module", type(obj).__name__, obj.training,
                [(n, snapshot(p, depth + 1)) for n, p in obj.named_parameters()],
                [(n, snapshot(b, depth + 1)) for n, b in obj.named_buffers()], plain)
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [snapshot(v, depth + 1) for v in obj])
    if isinstance(obj, dict):
        return ("dict", [(repr(k), snapshot(v, depth + 1)) for k, v in obj.items()])
    if isinstance(obj, io.StringIO):
        return ("text", obj.getvalue())
    if obj is None or isinstance(obj, (bool, int, float, str, complex)):
        return obj
    if isinstance(obj, (torch.dtype, torch.device)):
        return ("const", str(obj))
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, types.ModuleType)):
        return ("callable", getattr(obj, "__qualname__", type(obj).__name__))
    attrs = _user_attributes(obj)
    if attrs is not None:
        return ("object", type(obj).__name__, {k: snapshot(v, depth + 1) for k, v in attrs.items()})
    return ("opaque", type(obj).__name__)


def _attributes(obj):
    """An object's stored attributes: its __dict__ and its filled __slots__ (read around any
    custom __getattribute__), or None for objects with neither."""
    slots = [n for c in type(obj).__mro__ for n in getattr(c, "__slots__", ()) if n != "__dict__"]
    d = object.__getattribute__(obj, "__dict__") if _has_dict(obj) else None
    if d is None and not slots:
        return None
    out = dict(d or {})
    for n in slots:
        try:
            out[n] = object.__getattribute__(obj, n)
        except AttributeError:
            pass
    return out


def _user_attributes(obj):
    """Attributes of a user object (not a tensor, module, container, function or class)."""
    if isinstance(obj, (torch.Tensor, torch.nn.Module, list, tuple, dict, str, int, float, type, types.ModuleType,
                        types.FunctionType, types.BuiltinFunctionType, types.MethodType, io.StringIO)) or obj is None:
        return None
    return _attributes(obj)


def _has_dict(obj):
    try:
        object.__getattribute__(obj, "__dict__")
        return True
    except AttributeError:
        return False


def _flat_tensors(obj, path, out, seen):
    """(path, tensor) for every tensor reachable from ``obj``, in a fixed order."""
    if id(obj) in seen:
        return
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        return
    attrs = _user_attributes(obj)
    if isinstance(obj, (list, tuple, dict, torch.nn.Module)) or attrs is not None:
        seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        for n, p in obj.named_parameters():
            out.append((f"{path}.{n}", p))
        for n, b in obj.named_buffers():
            out.append((f"{path}.{n}", b))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _flat_tensors(v, f"{path}[{i}]", out, seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flat_tensors(v, f"{path}[{k!r}]", out, seen)
    elif attrs is not None:
        for k, v in attrs.items():
            _flat_tensors(v, f"{path}.{k}", out, seen)


def _objects(obj, path, out, depth=0):
    """(path, object) for containers and tensors reachable from ``obj`` (identity checks)."""
    if depth > 6:
        return
    if isinstance(obj, (torch.Tensor, list, dict, torch.nn.Module)) or _user_attributes(obj) is not None:
        out.append((path, obj))
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _objects(v, f"{path}[{i}]", out, depth + 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _objects(v, f"{path}[{k!r}]", out, depth + 1)


def aliasing(outputs, args):
    """For each object in the outputs: the argument it *is*, and for each output tensor, the
    argument tensor whose storage it shares (eager's views of inputs stay views)."""
    arg_objs = []
    for i, a in enumerate(args):
        _objects(a, f"args[{i}]", arg_objs)
        if isinstance(a, torch.nn.Module):
            for n, p in list(a.named_parameters()) + list(a.named_buffers()):
                arg_objs.append((f"args[{i}].{n}", p))
        elif _user_attributes(a) is not None:
            for k, v in _user_attributes(a).items():
                _objects(v, f"args[{i}].{k}", arg_objs)
    by_id = {}
    for p, o in arg_objs:
        by_id.setdefault(id(o), p)
    storages = {}
    for p, o in arg_objs:
        if isinstance(o, torch.Tensor) and o.numel() and o.untyped_storage().data_ptr():
            storages.setdefault(o.untyped_storage().data_ptr(), p)
    rel = []
    outs = []
    _objects(outputs, "out", outs)
    first_seen = {}
    for p, o in outs:
        if id(o) in by_id:
            rel.append((p, "is", by_id[id(o)]))
        elif id(o) in first_seen:
            rel.append((p, "is", first_seen[id(o)]))
        first_seen.setdefault(id(o), p)
        if isinstance(o, torch.Tensor) and o.numel() and o.untyped_storage().data_ptr() in storages:
            rel.append((p, "shares storage with", storages[o.untyped_storage().data_ptr()]))
    return rel


def program_globals(ns: dict):
    return {k: snapshot(v) for k, v in sorted(ns.items())
            if not k.startswith("_") and isinstance(v, (dict, list, int, float, str, io.StringIO, tuple))}


# --------------------------------------------------------------------------- observing a call
def _loss_weights(t: torch.Tensor) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, max(t.numel(), 1), dtype=t.dtype)[: t.numel()].reshape(t.shape)


def observe(fn, args, ns: dict, grad: bool = True, kwargs=None, filename=None) -> Observation:
    obs = Observation()
    out_buf = io.StringIO()
    torch.manual_seed(0)
    with contextlib.redirect_stdout(out_buf):
        prev = torch.is_grad_enabled()
        torch.set_grad_enabled(grad)
        try:
            try:
                result = fn(*args, **(kwargs or {}))
            except Exception as e:  # noqa: BLE001 - compared with the other run
                obs.exception, obs.exception_msg = type(e).__name__, _first_line(e)
                obs.raised_at = _raised_at(e, filename)
                result = None
            obs.grad_mode = torch.is_grad_enabled()
        finally:
            torch.set_grad_enabled(prev)
    obs.printed = out_buf.getvalue()
    obs.outputs = snapshot(result)
    args = list(args) + list((kwargs or {}).values())
    obs.args = snapshot(args)
    obs.globals = program_globals(ns)
    obs.aliasing = aliasing(result, args) if obs.exception is None else []
    # backward through every output that requires grad, with fixed weights
    flat = []
    _flat_tensors(result, "out", flat, set())
    diff = [(p, t) for p, t in flat if t.requires_grad and t.is_floating_point()]
    if diff and obs.exception is None:
        try:
            loss = sum((t * _loss_weights(t)).sum() for _, t in diff)
            loss.backward()
        except Exception as e:  # noqa: BLE001
            obs.backward_exception, obs.backward_msg = type(e).__name__, _first_line(e)
            _flush_failed_backward()
        obs.grads = snapshot(list(args))
    return obs


def _flush_failed_backward() -> None:
    """A backward that raised leaves the rest of its graph's tasks (and through them its nodes
    and the leaves that AccumulateGrad holds) in torch's thread-local CPU ready queue until the
    next backward on this thread runs and drops them. That is eager's behaviour too; without a
    flush the run observed first would have its leftovers dropped by the second run's backward,
    and only the second would look as if it kept its inputs alive (fuzz seed 3467)."""
    leaf = torch.ones((), requires_grad=True)
    leaf.backward()


def _raised_at(e: BaseException, filename):
    """(function name, line) of the innermost traceback frame in the program's file: what a
    user reads first in the traceback."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == filename]
    return (frames[-1].name, frames[-1].lineno, (frames[-1].line or "").strip()) if frames else None


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""


# --------------------------------------------------------------------------- comparing
class _Diff(Exception):
    def __init__(self, path, detail):
        self.path, self.detail = path, detail


def _close_float(a, b):
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)
    return a == b


def _cmp_tensor(a: TensorSnap, b: TensorSnap, path):
    if a.dtype != b.dtype:
        raise _Diff(path, f"dtype {a.dtype} != {b.dtype}")
    if a.shape != b.shape:
        raise _Diff(path, f"shape {a.shape} != {b.shape}")
    if a.requires_grad != b.requires_grad:
        raise _Diff(path, f"requires_grad {a.requires_grad} != {b.requires_grad}")
    if a.is_leaf != b.is_leaf:
        raise _Diff(path, f"is_leaf {a.is_leaf} != {b.is_leaf}")
    try:
        torch.testing.assert_close(b.value, a.value, equal_nan=True)
    except AssertionError as e:
        raise _Diff(path, "values differ: " + " ".join(str(e).split())[:240]) from None
    if (a.grad is None) != (b.grad is None):
        raise _Diff(path + ".grad", f"{'None' if a.grad is None else 'a tensor'} != {'None' if b.grad is None else 'a tensor'}")
    if a.grad is not None:
        _cmp_tensor(a.grad, b.grad, path + ".grad")


def _cmp(a, b, path):
    if isinstance(a, TensorSnap) or isinstance(b, TensorSnap):
        if not (isinstance(a, TensorSnap) and isinstance(b, TensorSnap)):
            raise _Diff(path, f"{_kind(a)} != {_kind(b)}")
        return _cmp_tensor(a, b, path)
    if type(a) is not type(b):
        raise _Diff(path, f"{_kind(a)} != {_kind(b)}")
    if isinstance(a, tuple) and a and a[0] == "text" and len(a) == 2:
        return _cmp_text(a[1], b[1], path)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise _Diff(path, f"length {len(a)} != {len(b)}: {_short(a)} vs {_short(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _cmp(x, y, f"{path}/{i}")
        return
    if isinstance(a, dict):
        if list(a) != list(b):
            raise _Diff(path, f"keys {list(a)} != {list(b)}")
        for k in a:
            _cmp(a[k], b[k], f"{path}.{k}")
        return
    if not _close_float(a, b):
        raise _Diff(path, f"{a!r} != {b!r}")


def _cmp_text(a: str, b: str, path):
    """Printed text: the same words, numbers within float32 tolerance."""
    if a == b:
        return
    wa, wb = _NUMBER.split(a), _NUMBER.split(b)
    na, nb = _NUMBER.findall(a), _NUMBER.findall(b)
    if wa == wb and len(na) == len(nb):
        if all(math.isclose(float(x), float(y), rel_tol=1e-4, abs_tol=1e-4) or x == y for x, y in zip(na, nb)):
            return
    raise _Diff(path, f"printed {a[-300:]!r} != {b[-300:]!r}")


def _kind(x):
    if isinstance(x, TensorSnap):
        return "tensor"
    if isinstance(x, tuple) and x and isinstance(x[0], str):
        return x[0]
    return type(x).__name__


def _short(x):
    s = repr([_kind(v) for v in x]) if isinstance(x, (list, tuple)) else repr(x)
    return s[:120]


def compare(e: Observation, k: Observation):
    if e.exception != k.exception:
        return Mismatch("exception", "call", f"eager raised {e.exception or 'nothing'} ({e.exception_msg[:160]}), "
                                              f"kiln raised {k.exception or 'nothing'} ({k.exception_msg[:300]})")
    if e.exception is not None and e.raised_at != k.raised_at:
        return Mismatch("traceback", "call", f"eager's traceback ends in {e.raised_at}, kiln's in {k.raised_at}")
    checks = [("outputs", e.outputs, k.outputs), ("inputs", e.args, k.args), ("globals", e.globals, k.globals),
              ("printed", ("text", e.printed), ("text", k.printed)), ("grad_mode", e.grad_mode, k.grad_mode),
              ("aliasing", e.aliasing, k.aliasing)]
    for kind, a, b in checks:
        try:
            _cmp(a, b, kind)
        except _Diff as d:
            return Mismatch(kind, d.path, d.detail)
    if e.backward_exception != k.backward_exception:
        return Mismatch("backward", "backward", f"eager raised {e.backward_exception or 'nothing'} ({e.backward_msg[:160]}), "
                                                f"kiln raised {k.backward_exception or 'nothing'} ({k.backward_msg[:300]})")
    try:
        _cmp(e.grads, k.grads, "grads")
    except _Diff as d:
        return Mismatch("grads", d.path, d.detail)
    return None
