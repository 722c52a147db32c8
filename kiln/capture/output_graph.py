"""The state of one capture: the FX graph being built, fake tensors, graph inputs, guards
and side effects."""
from __future__ import annotations

import keyword
import re
import sys
import types

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from .. import _torch
from ..aot.saved_hooks.inlining import active as active_saved_hooks
from ..aot.saved_hooks.guard import guard_value
from ..config import config
from ..inplace_ops import inplace_name
from ..inplace_ops import mutates as _mutates
from ..shapes.marks import marked_dynamic
from ..user_lines import USER_FRAME
from ..errors import FrameRunsEagerly, Unsupported
from .graph_constants import fx_argument
from .guards import Guard, GuardKind, GuardSet, TensorMeta
from .interpreter import UserException
from .numpy.conversions import torch_function_on_numpy
from .numpy.values import NdarrayValue
from .side_effects import SideEffects
from .sources import (STORAGE_OFFSET, AttrSource, CaptureObjectSource, ConstSource, GlobalSource, ItemSource,
                      Source, TensorPropertySource)
from .values.base import ConstantValue, NullValue, Value
from .values.builder import STATE_READERS, Builder, is_trusted_module, wrap_pure_result
from .values import foreach_scalars
from .values.containers import DictValue, ListValue, NamedTupleValue, SetValue, TupleValue
from .values.overlap import has_internal_overlap, may_partially_overlap
from .values.symbolic import SymNodeValue, SymRangeValue, SymSliceValue, size_value, wrap_sym
from .values.tensor import TensorValue


class TensorInput:
    """A tensor read from the outside world: one graph placeholder and one TENSOR_MATCH."""

    def __init__(self, source: Source, value: TensorValue, static: bool, meta: TensorMeta,
                 real: torch.Tensor, dims: list | None = None):
        self.source = source
        self.real = real  # only during capture: dropped once the entry is built
        self.value = value
        self.value_fake = value.fake
        # the input's geometry as it comes in (the program may change the fake's in place:
        # ``x.t_()``); guards and the entry's layouts are about the caller's tensor
        self.sizes = tuple(value.fake.size())
        self.strides = tuple(value.fake.stride())
        self.storage_offset = value.fake.storage_offset()
        self.static = static  # a parameter or buffer of an nn.Module (cudagraphs needs this)
        self.meta = meta
        self.dims = dims      # DimDynamic per dim, None when static
        self.marked_dynamic = frozenset()
        self.size_symbols: list = []
        # the caller's tensor where ``real`` stands for it: an AsyncCollectiveTensor, which the
        # guards check and the entry waits for before the graph call (``real`` is the waited one)
        self.waited_from: torch.Tensor | None = None
        self.waits = False        # (kept once the capture's tensors are dropped)

    @property
    def guarded(self) -> torch.Tensor:
        """The tensor the guards check: the caller's."""
        return self.real if self.waited_from is None else self.waited_from

    @property
    def dynamic(self) -> bool:
        return self.dims is not None


class SymbolInput:
    """A shape symbol the graph takes as an input (an int the entry reads from a size or
    an int argument, and passes to the graph)."""

    def __init__(self, symbol, node):
        self.symbol = symbol
        self.node = node


class IntInput:
    """A Python int read from the outside world and made symbolic."""

    def __init__(self, source: Source, fake):
        self.source = source
        self.fake = fake


class OutputGraph:
    def __init__(self, fn_name: str, policy=None):
        self.graph = torch.fx.Graph()
        self.fake_mode = _torch.new_fake_mode()
        self.shape_env = self.fake_mode.shape_env
        self.shape_env.location = self._location   # the user's line behind each shape guard
        self.tx_stack: list = []                   # the frames being interpreted, innermost last
        self.policy = policy                       # kiln.shapes.policy.ShapePolicy or None: static
        self.symbol_nodes: dict = {}               # sympy.Symbol -> its placeholder
        self.symbol_inputs: list[SymbolInput] = []
        self.int_inputs: list[IntInput] = []
        self.shape_guards = None                   # set once the capture is finished
        self.guards = GuardSet()
        self.side_effects = SideEffects()
        # generators made in the captured code run lazily (interpreter.SuspendedGenerator); a
        # capture that must hand a suspended one to the code after it (a graph break, a
        # generator returned or stored) is captured again with these codes' generators made
        # natively
        self.native_generators: frozenset = frozenset()
        self.suspended_generators: list = []
        self.builder = Builder(self)
        self.tensor_inputs: list[TensorInput] = []
        # storages (of fakes) that must not be written in place: max(a, b) of tensors is a
        # select where eager returns a or b itself (see _minmax_of_tensors in values/builtins.py)
        self.frozen_storages: list = []
        # id() of values whose identity exists only during the capture: id(object) -> token
        self.capture_ids: dict = {}
        self.fn_name = fn_name
        self.instructions = 0
        self._names: set[str] = set()
        self._grad_enabled_at_start = torch.is_grad_enabled()
        self.global_state = _torch.global_state_snapshot()
        self.guards.add(Guard(GuardKind.GLOBAL_STATE, None, _torch.global_state_description()))
        self.module_hooks_guarded = False
        self.replaying = False   # a restarted capture, replaying up to a graph break
        self.autocast_stack: list = []
        self.constant_attrs: dict[str, object] = {}   # get_attr name -> constant (to_fx)
        # the functions inlined into this capture: code -> (module name, qualname); a package
        # checks on load that their code is still the same (kiln/package/identity.py)
        self.inlined: dict = {}
        self.recompute_regions = 0   # checkpointed calls captured (values/checkpoint.py numbers them)
        self.control_flow_ops = 0    # cond, while_loop, scan, map and flex_attention calls captured (numbering their subgraphs)
        # calls of candidate repeated blocks (regions.py): their nodes, outlined when the graph is done
        self.region_spans: list = []
        self.region_open = False
        # while a flex_attention score_mod/mask_mod is traced: how ``tensor[index]`` is captured
        # there (see values/higher_order_flex.py), or None
        self.subgraph_getitem = None
        self._constant_nodes: dict[str, torch.fx.Node] = {}
        # autocast's dtype is not part of the tensor dispatch keys that TENSOR_MATCH checks:
        # a capture that starts inside autocast also guards the autocast state
        self.autocast_at_start = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                                  for d in ("cpu", "cuda")}
        if any(on for on, _ in self.autocast_at_start.values()):
            self.guards.add(Guard(GuardKind.AUTOCAST_STATE, None, self.autocast_at_start))
        # inlineable saved-tensor hooks are compiled into the graphs (aot/saved_hooks.py): other
        # hooks, or none, recompile. Only graphs that can save tensors (grad mode on) depend on them.
        hooks = active_saved_hooks()
        if hooks is not None or self._grad_enabled_at_start:
            self.guards.add(Guard(GuardKind.SAVED_TENSOR_HOOKS, None, guard_value(hooks)))

    # -- bookkeeping ---------------------------------------------------------------------------
    def count_instruction(self) -> None:
        self.instructions += 1
        if self.instructions > config.max_instructions:
            raise Unsupported(f"capture ran more than config.max_instructions={config.max_instructions} "
                              "instructions (an unbounded loop?)")

    def is_trusted_module(self, mod: types.ModuleType) -> bool:
        return is_trusted_module(mod)

    def is_trusted_globals(self, g: dict) -> bool:
        mod = sys.modules.get(g.get("__name__", ""))
        return mod is not None and mod.__dict__ is g and is_trusted_module(mod)

    def guards_enabled_for(self, source: Source) -> bool:
        """No guards under the globals of torch and the standard library (their names are
        assumed not to be re-bound, as torch.compile assumes)."""
        root = source
        while hasattr(root, "base"):
            root = root.base
        if isinstance(root, GlobalSource):
            return not self.is_trusted_globals(root.globals_dict)
        return not isinstance(root, CaptureObjectSource)

    def release(self) -> None:
        """The capture is over: drop every reference to the outside world it gathered (the
        objects it wrapped, their values, the frames, the recorded side effects), so an entry
        that keeps the graph (its fake tensors reach this object through their ShapeEnv)
        keeps none of the call's tensors alive. Guards hold what they need themselves."""
        self.shape_env.location = None
        self.builder.by_id.clear()
        self.builder.by_source.clear()
        self.tx_stack.clear()
        self.side_effects = SideEffects()
        for inp in self.tensor_inputs:
            inp.real = inp.waited_from = None

    def restore_grad_mode(self) -> None:
        self.restore_autocast()
        torch._C._set_grad_enabled(self._grad_enabled_at_start)

    # -- graph inputs -----------------------------------------------------------------------------
    def add_tensor_input(self, t: torch.Tensor, source: Source, static: bool) -> TensorValue:
        if _torch.is_fake(t):
            raise Unsupported("a fake tensor as input")
        if t.is_sparse or t.layout != torch.strided:
            raise Unsupported(f"a tensor with layout {t.layout}")
        waited_from = None
        if type(t) is _torch.async_collective_tensor_class():
            # a reduced tensor whose wait is deferred (RowwiseParallel's output run natively):
            # the graph takes the plain tensor it stands for, waited for at the entry
            waited_from = t
            with torch.set_grad_enabled(self._grad_enabled_at_start):
                t = _torch.waited_collective(t)
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise Unsupported(f"a tensor subclass {type(t).__name__} as input")
        described = source.describe()
        if t._is_view():
            try:
                t.grad_fn       # (a view whose base was written in place after it was made)
            except RuntimeError as e:
                # autograd refuses every use of it, as eager's next use of it will: the frame
                # runs eagerly and raises there (a user's error, not kiln's; no graph break can
                # isolate it: the value is read wherever the frame's state is handed on)
                first = str(e).split(". ")[0]
                raise FrameRunsEagerly(f"{described}: a tensor autograd refuses to use ({first})") from None
        dims, stride_dims = self.policy.tensor_dims(described, t, static) if self.policy is not None else (None, None)
        fake = _torch.fake_from_real(self.fake_mode, t, described, dims, stride_dims)
        if dims is not None:
            for size in fake.size():     # the symbols of its sizes come first among the inputs
                if _torch.is_symbolic(size) and size.node.expr.is_Symbol:
                    self.symbol_placeholder(size)
        node = self._placeholder(_placeholder_name(source))
        node.meta["example_value"] = fake
        # text, not the Source: a source can hold a user object (a closure cell, a globals
        # dict), and graphs outlive the call inside compiled autograd nodes. An input whose
        # grad_fn is such a node would keep itself alive through C++, out of the gc's reach.
        node.meta["kiln_source"] = described
        node.meta["kiln_static"] = static
        value = TensorValue(node, fake, source, type(t))
        guarded = t if waited_from is None else waited_from
        meta = TensorMeta.of(guarded, fake.size(), fake.stride()) if dims is not None else TensorMeta.of(guarded)
        inp = TensorInput(source, value, static, meta, t, dims)
        inp.waited_from = waited_from
        inp.waits = waited_from is not None
        if dims is not None:
            inp.marked_dynamic = marked_dynamic(t)
            # the symbols as created (a SymInt's expression later reads through replacements)
            inp.size_symbols = [s.node.expr if _torch.is_symbolic(s) else None for s in fake.size()]
        self.tensor_inputs.append(inp)
        self.guards.add(Guard(GuardKind.TENSOR_MATCH, source, meta))
        return value

    def add_int_input(self, value: int, source: Source):
        """A symbolic int input: one symbol, one graph input (its type is guarded by the caller)."""
        fake = _torch.symbolic_int(self.fake_mode, value, source.describe())
        node = self.symbol_placeholder(fake)
        self.int_inputs.append(IntInput(source, fake))
        return SymNodeValue(node, fake, source)

    def symbol_placeholder(self, sym):
        """The graph input of a symbol (a SymInt whose expression is one symbol)."""
        symbol = sym.node.expr
        node = self.symbol_nodes.get(symbol)
        if node is None:
            node = self.symbol_nodes[symbol] = self._placeholder(self._unique_name(symbol.name), unique=False,
                                                                 before_inputs=True)
            node.meta["example_value"] = sym
            node.meta["kiln_symbol"] = symbol
            self.symbol_inputs.append(SymbolInput(symbol, node))
        return node

    def _placeholder(self, name: str, unique: bool = True, before_inputs: bool = False):
        """A new graph input, after the others; symbols (``before_inputs``) go first, after the
        symbols already there."""
        name = self._unique_name(name) if unique else name
        anchor = self._first_non_placeholder()
        if before_inputs:
            anchor = next((n for n in self.graph.nodes if n.op != "placeholder"
                           or "kiln_symbol" not in n.meta), None)
        if anchor is None:
            return self.graph.placeholder(name)
        with self.graph.inserting_before(anchor):
            return self.graph.placeholder(name)

    def _location(self):
        return self.tx_stack[-1].location() if self.tx_stack else None

    def _op_node(self, kind: str, target, args: tuple, kwargs: dict) -> torch.fx.Node:
        """A graph node for an op of the user's code, tagged with the user's frame it came
        from (file, line, function): an error the op raises when the graph runs is reported
        at that line (``user_lines.py``)."""
        node = self.graph.create_node(kind, target, args, kwargs)
        if self.tx_stack:
            tx = self.tx_stack[-1]
            filename, lineno, _ = tx.location()
            node.meta[USER_FRAME] = (filename, lineno, tx.code.co_name)
        return node

    def real_tensor(self, value: TensorValue) -> torch.Tensor:
        for inp in self.tensor_inputs:
            if inp.value is value:
                return inp.real
        raise Unsupported("reading a property of a tensor that is not an input")

    def _first_non_placeholder(self):
        for n in self.graph.nodes:
            if n.op != "placeholder":
                return n
        return None

    def _unique_name(self, base: str) -> str:
        name, i = base, 1
        while name in self._names:
            name = f"{base}_{i}"
            i += 1
        self._names.add(name)
        return name

    def guard_class_attribute(self, cls: type, name: str, attr) -> None:
        """A method/property/forward found on a class through a type-guarded object: guard
        that the class still resolves the name to it (classes of torch and the standard
        library are trusted, like their modules)."""
        mod = sys.modules.get(getattr(cls, "__module__", ""))
        if mod is not None and is_trusted_module(mod):
            return
        for owner in cls.__mro__:
            if name in owner.__dict__:
                # the raw class-dict entry (a classmethod's bound method is new on each lookup)
                raw = owner.__dict__[name]
                self.guards.add(Guard(GuardKind.ID_MATCH,
                                      ItemSource(AttrSource(ConstSource(owner), "__dict__"), name), raw))
                return
            # a class before the owner that gains the name later shadows it
            self.guards.add(Guard(GuardKind.NOT_IN_INSTANCE_DICT, ConstSource(owner), name))

    def guard_module_has_no_hooks(self, module_value) -> None:
        if module_value.source is not None and self.guards_enabled_for(module_value.source):
            self.guards.add(Guard(GuardKind.NO_HOOKS, module_value.source))
        elif _torch.module_hooks_empty(module_value.value) is False:
            raise Unsupported("calling an nn.Module with hooks that cannot be guarded")
        if not _torch.module_hooks_empty(module_value.value):
            raise Unsupported(f"nn.Module {type(module_value.value).__name__} has hooks registered")
        self.guard_no_global_module_hooks()

    def guard_no_global_module_hooks(self) -> None:
        if any(_torch.global_module_hooks()):
            raise Unsupported("global nn.Module hooks are registered")
        if not self.module_hooks_guarded:
            self.module_hooks_guarded = True
            self.guards.add(Guard(GuardKind.NO_HOOKS, None))

    # -- graph nodes -------------------------------------------------------------------------------
    def call_torch_function(self, tx, fn, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if fn in STATE_READERS:
            # global state kiln guards (GLOBAL_STATE) or constant under eager execution
            return ConstantValue(fn(*[a.as_constant() for a in args]))
        if any(isinstance(a, NdarrayValue) for a in (*args, *kwargs.values())):
            return torch_function_on_numpy(tx, fn, args, kwargs)   # torch.from_numpy & co.
        if fn is torch.tensor and _traced_data(args[0] if args else kwargs.get("data")) is True:
            # torch.tensor() reads its data as Python numbers: a symbolic size would become
            # a constant (one graph per size) and a tensor in a list a data-dependent read.
            # The reference implementation builds the same tensor from graph ops.
            fn = _torch.tensor_from_traced_values
        if foreach_scalars.rewrites(fn):
            rewritten = foreach_scalars.call(tx, fn, args, kwargs)
            if rewritten is not None:
                return rewritten
        return self.call_op("call_function", fn, tuple(args), kwargs)

    def enter_autocast(self, ctx) -> None:
        import torch.amp.autocast_mode as am

        dev, dtype, enabled, cache = ctx.args
        real = torch.autocast(dev, dtype=dtype, enabled=enabled, cache_enabled=cache)
        real.__enter__()
        ctx.real = real
        self.autocast_stack.append(ctx)
        ctx.node = self.graph.call_function(am._enter_autocast, (dev, dtype, enabled, cache))

    def exit_autocast(self, ctx) -> None:
        import torch.amp.autocast_mode as am

        self.graph.call_function(am._exit_autocast, (ctx.node,))
        self.autocast_stack.remove(ctx)
        ctx.real.__exit__(None, None, None)

    def close_autocast_for_break(self) -> None:
        """At a graph break inside autocast blocks the graph exits them (innermost first);
        the entry re-enters them before handing their __exit__ to the break function."""
        import torch.amp.autocast_mode as am

        for ctx in reversed(self.autocast_stack):
            self.graph.call_function(am._exit_autocast, (ctx.node,))

    def restore_autocast(self) -> None:
        for ctx in reversed(self.autocast_stack):
            ctx.real.__exit__(None, None, None)
        self.autocast_stack.clear()

    def set_grad_enabled(self, mode: bool) -> None:
        self.graph.call_function(torch._C._set_grad_enabled, (mode,))
        torch._C._set_grad_enabled(mode)

    def call_op(self, kind: str, target, args: tuple, kwargs: dict) -> Value:
        if self.global_state.devices and kind == "call_function" and _torch.is_device_constructor(target):
            # under ``torch.device(d)`` / ``set_default_device(d)`` (guarded): a factory call
            # without a device makes its tensor on d; the graph says so, for every backend
            device = kwargs.get("device")
            if device is None or (device.is_constant() and device.as_constant() is None):
                kwargs = {**kwargs, "device": ConstantValue(torch.device(self.global_state.devices[-1]))}
        if kind == "call_function" and target is torch._C._nn.one_hot and args and isinstance(args[0], TensorValue):
            self._check_one_hot_classes(args[0], args[1] if len(args) > 1 else kwargs.get("num_classes"))
        if kind == "call_function" and target is torch.nn.functional.binary_cross_entropy:
            probabilities = args[0] if args else kwargs.get("input")
            if isinstance(probabilities, TensorValue):
                self._check_probabilities(probabilities)
        if kind == "call_function" and target in _IDENTITY_DROPOUTS and _leaves_input_as_is(args, kwargs):
            # eager's dropout returns its input itself when not training or p == 0: a write to
            # the result writes the input (the AOT stages' decomposition would return a copy)
            return args[0] if args else kwargs["input"]
        if kind == "call_function" and target in _DROPOUTS and _drops_everything(args, kwargs):
            # (eager's dropout with p=1 multiplies by a zero and draws no random numbers; the
            # AOT stages' native_dropout would draw them, moving the generator)
            return self.call_op("call_function", torch.mul, (args[0], ConstantValue(0.0)), {})
        if any(keyword.iskeyword(k) for k in kwargs):
            args, kwargs = _keywords_as_positions(kind, target, args, kwargs)
        if self.frozen_storages and (_mutates(kind, target) or "out" in kwargs):
            self._refuse_frozen_write(args, kwargs, _op_name(kind, target))
        if kind == "call_method" and target in _RESIZES and args and self._is_input_memory(args[0]):
            # an input's new size would have to be written back (functionalization copies
            # values into the old size): run it eagerly
            raise Unsupported(f"Tensor.{target}() of a graph input (or a view of one)")
        if _is_as_strided(kind, target) and args and self._is_input_memory(args[0]):
            if _explicit_storage_offset(args, kwargs):
                # where the view lands, against the input's own elements, depends on where the
                # input starts in its memory (without one, it is placed from the input's start)
                self.guard_storage_offsets(args[0].fake)
            if _reaches_outside(args, kwargs):
                # functionalization writes back an input's own elements only: a write through
                # this view would be lost (and eager's other reads of it see it)
                raise Unsupported("as_strided of a graph input reaching memory outside its elements")
        inplace = inplace_name(kind, target)
        if inplace is not None:
            _refuse_partial_overlap(inplace, args, kwargs)
            if inplace in _ARITHMETIC_INPLACE and len(args) >= 2:
                _check_inplace_result_type(inplace, args)
        fx_args = tuple(self.to_fx(a) for a in args)
        fx_kwargs = {k: self.to_fx(v) for k, v in kwargs.items()}
        fake_args = tuple(_to_fake(a) for a in args)
        fake_kwargs = {k: _to_fake(v) for k, v in kwargs.items()}
        out_layouts = _out_layouts(fake_kwargs)
        try:
            # the python dispatcher lets decompositions and meta functions keep sizes symbolic
            # (without it some ops read sizes as ints, specializing them)
            with self.fake_mode, _torch.python_dispatcher():
                if kind == "call_method":
                    result = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                else:
                    result = target(*fake_args, **fake_kwargs)
        except _torch.DATA_DEPENDENT_ERRORS as e:
            raise Unsupported(f"{_op_name(kind, target)} needs tensor data ({type(e).__name__})")
        except Unsupported:
            raise
        except NotImplementedError as e:
            raise Unsupported(f"{_op_name(kind, target)} has no fake-tensor implementation ({e})")
        except Exception as e:
            raise UserException(e)
        if out_layouts and out_layouts != _out_layouts(fake_kwargs):
            # eager resizes (or restrides) an out= tensor of the wrong size; functionalizing
            # that metadata change on an input or a view is not modelled: run it eagerly
            raise Unsupported(f"{_op_name(kind, target)} with an out= tensor it resizes")
        # An op that returns one of its tensor arguments (in-place ops, x.contiguous() on a
        # contiguous x, an out= tensor) returns the same value: identity is preserved as in eager.
        for a in (*args, *kwargs.values()):
            if isinstance(a, TensorValue) and result is a.fake:
                node = self._op_node(kind, target, fx_args, fx_kwargs)
                node.meta["example_value"] = result
                return a
        if _torch.is_symbolic(result):
            return wrap_sym(self, result, lambda: self._op_node(kind, target, fx_args, fx_kwargs))
        if not _contains_tensor(result) and _contains_symbolic(result):
            # sizes computed from symbolic ones (torch.broadcast_shapes): each symbolic item is
            # read from the op's result, as the graph runs
            node = self._op_node(kind, target, fx_args, fx_kwargs)
            node.meta["example_value"] = result
            return self._wrap_symbolic_items(node, result)
        if not _contains_tensor(result):
            # (an op that writes its out= tensors may return None: unbind_copy, split_copy)
            # (a check returns None too: torch._assert_async raises when the graph runs)
            if _mutates(kind, target) or "out" in kwargs or \
                    (kind == "call_function" and _torch.is_side_effectful(target)):
                node = self._op_node(kind, target, fx_args, fx_kwargs)
                node.meta["example_value"] = result
            return _wrap_nontensor(result, _op_name(kind, target))
        if isinstance(result, torch.Tensor) and result.requires_grad and result.grad_fn is None \
                and not result._is_view():   # (a view made under no_grad keeps requires_grad)
            # a new leaf that requires grad (``torch.zeros(..., requires_grad=True)``): the AOT
            # stage makes a graph one autograd node, and cannot hand out a leaf of its own
            raise Unsupported(f"{_op_name(kind, target)} creates a tensor that requires grad (a new leaf)")
        node = self._op_node(kind, target, fx_args, fx_kwargs)
        return self._wrap_result(node, result)

    def _check_one_hot_classes(self, classes: TensorValue, num_classes: Value | None) -> None:
        """``F.one_hot``'s checks of its classes, as graph ops (``torch._assert_async``): eager
        raises for a class below 0 or not below ``num_classes``, and a trace on fake tensors
        skips those checks (torch before 2.13 has no decomposition that keeps them)."""
        if num_classes is None or (num_classes.is_constant() and num_classes.as_constant() == -1):
            return      # (the classes' maximum sets the size: a data-dependent size, not traced)
        for compare, bound, message in ((torch.ge, ConstantValue(0), "Class values must be non-negative."),
                                        (torch.lt, num_classes, "Class values must be smaller than num_classes.")):
            holds = self.call_op("call_function", torch.all,
                                 (self.call_op("call_function", compare, (classes, bound), {}),), {})
            self.call_op("call_function", torch._assert_async, (holds, ConstantValue(message)), {})

    def _check_probabilities(self, probabilities: TensorValue) -> None:
        """``F.binary_cross_entropy``'s check of its input, as a graph op: eager raises for an
        element outside [0, 1] (or NaN); Inductor's kernel returns NaN instead."""
        inside = self.call_op("call_function", torch.logical_and, (
            self.call_op("call_function", torch.ge, (probabilities, ConstantValue(0)), {}),
            self.call_op("call_function", torch.le, (probabilities, ConstantValue(1)), {})), {})
        holds = self.call_op("call_function", torch.all, (inside,), {})
        self.call_op("call_function", torch._assert_async,
                     (holds, ConstantValue("all elements of input should be between 0 and 1")), {})

    def guard_storage_offsets(self, fake: torch.Tensor) -> None:
        """Guard where each input sharing ``fake``'s memory starts in it (TENSOR_MATCH does not
        cover storage offsets): what was read of that memory's layout holds for the entry."""
        storage = StorageWeakRef(fake.untyped_storage())
        for inp in self.tensor_inputs:
            f = inp.value.fake
            if inp.value.source is not None and StorageWeakRef(f.untyped_storage()) == storage \
                    and not isinstance(f.storage_offset(), torch.SymInt):
                self.builder.guard(GuardKind.EQUALS_MATCH, TensorPropertySource(inp.value.source, STORAGE_OFFSET),
                                   int(inp.real.storage_offset()))

    def _is_input_memory(self, v) -> bool:
        """Whether ``v`` is a tensor sharing the memory of a tensor read from outside."""
        if not isinstance(v, TensorValue):
            return False
        st = StorageWeakRef(v.fake.untyped_storage())
        return any(StorageWeakRef(t.value_fake.untyped_storage()) == st for t in self.tensor_inputs)

    def is_frozen(self, t: TensorValue) -> bool:
        return StorageWeakRef(t.fake.untyped_storage()) in self.frozen_storages

    def check_frozen_outputs(self, nodes) -> None:
        """A min()/max() select and a candidate both leaving the graph: the caller could
        tell them apart where eager hands out one object twice."""
        if not self.frozen_storages:
            return
        seen = [StorageWeakRef(n.meta["example_value"].untyped_storage()) for n in nodes
                if isinstance(n.meta.get("example_value"), torch.Tensor)]
        if sum(1 for s in seen if s in self.frozen_storages) > 1:
            raise Unsupported("returning a min()/max() of tensors together with the tensors it "
                              "chose from (eager's result is one of them)")

    def _refuse_frozen_write(self, args, kwargs, name) -> None:
        written = [args[0]] if args else []
        written += [kwargs["out"]] if "out" in kwargs else []
        written = [t for w in written for t in (getattr(w, "items", None) or [w])]
        for t in written:
            if isinstance(t, TensorValue) and StorageWeakRef(t.fake.untyped_storage()) in self.frozen_storages:
                raise Unsupported(f"{name} writes a tensor that a min()/max() of tensors may return "
                                  "(eager's result is one of them, the same object)")

    def to_fx(self, v: Value):
        """The FX argument for a value (see ``_to_fx``), with every constant FX cannot print
        exactly read from the graph module (``graph_constants``)."""
        return fx_argument(_to_fx(v), self.constant_node)

    def constant_node(self, obj) -> torch.fx.Node:
        """A ``get_attr`` node reading ``obj`` from the graph module (one per object)."""
        for name, held in self.constant_attrs.items():
            if held is obj:
                return self._constant_nodes[name]
        name = f"_kiln_constant{len(self.constant_attrs)}"
        self.constant_attrs[name] = obj
        node = self._constant_nodes[name] = self.graph.get_attr(name)
        return node

    def graph_root(self) -> torch.nn.Module:
        """The module a GraphModule of this graph is built from: it holds the constants."""
        root = torch.nn.Module()
        for name, obj in self.constant_attrs.items():
            object.__setattr__(root, name, obj)
        return root

    def _wrap_symbolic_items(self, node, result) -> Value:
        """The value of ``result`` (a number or a tuple, list or torch.Size of them, some
        symbolic) that ``node`` computes."""
        if not isinstance(result, (tuple, list)):
            return wrap_sym(self, result, lambda: node)

        def item(i, r):
            def make_node():
                child = self.graph.call_function(_getitem, (node, i))
                child.meta["example_value"] = r
                return child
            if isinstance(r, (tuple, list)):
                return self._wrap_symbolic_items(make_node(), r)
            return wrap_sym(self, r, make_node)

        items = [item(i, r) for i, r in enumerate(result)]
        if isinstance(result, torch.Size):
            return size_value(items)
        if isinstance(result, list):
            return ListValue(items)
        if type(result) is not tuple:
            return NamedTupleValue(items, None, type(result))
        return TupleValue(items)

    def _wrap_result(self, node, result) -> Value:
        node.meta["example_value"] = result
        if isinstance(result, torch.Tensor):
            return TensorValue(node, result)
        if isinstance(result, (tuple, list)):
            items = []
            for i, r in enumerate(result):
                if isinstance(r, torch.Tensor) or isinstance(r, (tuple, list)) and _contains_tensor(r):
                    child = self.graph.call_function(_getitem, (node, i))
                    items.append(self._wrap_result(child, r))
                else:
                    items.append(_wrap_nontensor(r, "result"))
            if isinstance(result, list):
                return ListValue(items)
            if type(result) is not tuple:
                return NamedTupleValue(items, None, type(result))
            return TupleValue(items)
        raise Unsupported(f"an operator returned {type(result).__name__}")

    # -- finishing -------------------------------------------------------------------------------
    def remove_unused(self) -> None:
        """Drop getitem nodes nobody reads and placeholders nobody uses (their guards stay)."""
        live = set(self.graph.nodes)
        for node in live:
            if any(a not in live for a in node.all_input_nodes):
                # a value computed in a subgraph (a custom autograd.Function's forward or a
                # torch.cond branch, moved out of this graph) was used outside it: run the
                # frame eagerly
                raise Unsupported(f"{node.name} reads a value computed inside a subgraph "
                                  "(an autograd.Function's forward or a torch.cond branch)")
        for node in reversed(list(self.graph.nodes)):
            if node.op == "call_function" and node.target is _getitem and not node.users:
                self.graph.erase_node(node)
        for inp in list(self.tensor_inputs):
            node = inp.value.node
            if node.graph is self.graph and not node.users and node.op == "placeholder":
                self.graph.erase_node(node)
                inp.value.node = None
        # a symbol the kept tensor inputs' sizes are written in stays an input, used or not
        # (as dynamo hands graphs over: backends and FX passes look it up by name)
        mentioned = set()
        for inp in self.tensor_inputs:
            if inp.value.node is not None:
                for n in (*inp.sizes, *inp.strides, inp.storage_offset):
                    if isinstance(n, torch.SymInt):
                        mentioned |= n.node.expr.free_symbols
        for sym in self.symbol_inputs:
            if sym.node is not None and not sym.node.users and not _symbols_of(sym.symbol) & mentioned:
                self.graph.erase_node(sym.node)
                sym.node = None

    def graph_inputs(self) -> list:
        """The inputs of the graph in placeholder order: TensorInputs and SymbolInputs."""
        by_node = {inp.value.node: inp for inp in self.tensor_inputs if inp.value.node is not None}
        by_node.update({s.node: s for s in self.symbol_inputs if s.node is not None})
        return [by_node[n] for n in self.graph.nodes if n.op == "placeholder"]


_AS_STRIDED_FUNCTIONS = (torch.as_strided, torch.Tensor.as_strided, torch.Tensor.as_strided_)


def _is_as_strided(kind: str, target) -> bool:
    return target in ("as_strided", "as_strided_") if kind == "call_method" else target in _AS_STRIDED_FUNCTIONS


def _explicit_storage_offset(args: tuple, kwargs: dict) -> bool:
    given = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    return given is not None and not (given.is_constant() and given.as_constant() is None)


def _reaches_outside(args: tuple, kwargs: dict) -> bool:
    """Whether ``as_strided(x, size, stride, storage_offset)`` reads or writes an element of
    ``x``'s storage that ``x`` itself does not cover (decided on known sizes only)."""
    names = ("size", "stride", "storage_offset")
    given = list(args[1:]) + [kwargs[n] for n in names[len(args) - 1:] if n in kwargs]
    try:
        consts = [v.as_constant() if v.is_constant() else None for v in given]
    except Exception:  # noqa: BLE001 - an argument that is not a constant: not decided here
        return False
    x = args[0].fake
    if len(consts) < 2 or consts[0] is None or consts[1] is None:
        return False
    offset = consts[2] if len(consts) > 2 and consts[2] is not None else x.storage_offset()

    def span(sizes, strides, start):
        if any(n == 0 for n in sizes):
            return None
        low = start + sum(min(0, (n - 1) * s) for n, s in zip(sizes, strides))
        high = start + sum(max(0, (n - 1) * s) for n, s in zip(sizes, strides))
        return low, high

    try:
        want = span(list(consts[0]), list(consts[1]), int(offset))
        have = span(list(x.shape), list(x.stride()), int(x.storage_offset()))
    except (TypeError, ValueError):     # (symbolic sizes)
        return False
    if want is None:
        return False
    return have is None or want[0] < have[0] or want[1] > have[1]


def _symbols_of(symbol) -> set:
    expr = symbol.node.expr if isinstance(symbol, torch.SymInt) else symbol
    return set(getattr(expr, "free_symbols", ()))


def _traced_data(data) -> bool | None:
    """Whether ``torch.tensor``'s data holds a symbolic number or a one-element tensor inside a
    list or tuple (True), neither (False; a tensor itself traces as a copy), or a longer tensor
    in a list (None: left to torch.tensor, which raises as eager does)."""
    if isinstance(data, SymNodeValue):
        return True
    if isinstance(data, (ListValue, TupleValue)):
        items = [_traced_data(i) if not isinstance(i, TensorValue) else
                 (None if i.fake is None or i.fake.dim() != 0 else True) for i in data.items]
        return None if None in items else any(items)
    return False


import operator as _operator  # noqa: E402

_getitem = _operator.getitem


def _placeholder_name(source: Source) -> str:
    s = re.sub(r"[^0-9a-zA-Z]+", "_", source.describe()).strip("_").lower()
    if not s or s[0].isdigit():
        s = "in_" + s
    return s[:60]


def _refuse_partial_overlap(name: str, args: tuple, kwargs: dict) -> None:
    """An in-place op whose output is expanded, or that reads a view of the memory it writes
    that partly overlaps it: eager's overlap check decides (a break), see ``values/overlap.py``.
    (Fake tensors do not check; a functionalized graph would return a value where eager raises.)"""
    if not args or not isinstance(args[0], TensorValue):
        return
    target = args[0].fake
    if has_internal_overlap(target):
        raise Unsupported(f"in-place {name}() on a tensor whose elements share memory "
                          f"(an expand: eager checks the overlap)")
    for a in (*args[1:], *kwargs.values()):
        if isinstance(a, TensorValue) and may_partially_overlap(target, a.fake):
            raise Unsupported(f"in-place {name}() reads a partly overlapping view of the "
                              f"tensor it writes (eager checks the overlap)")


def _op_name(kind, target) -> str:
    if kind == "call_method":
        return f"Tensor.{target}"
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)


def _contains_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, (tuple, list)):
        return any(_contains_tensor(i) for i in x)
    if isinstance(x, dict):
        return any(_contains_tensor(i) for i in x.values())
    return False


def _contains_symbolic(x) -> bool:
    if isinstance(x, (tuple, list)):
        return any(_contains_symbolic(i) for i in x)
    return _torch.is_symbolic(x)


def _wrap_nontensor(v, what: str) -> Value:
    try:
        return wrap_pure_result(v)
    except Unsupported:
        raise Unsupported(f"{what} returned a {type(v).__name__}, which cannot be captured")


def _node_of(t: TensorValue):
    return t.node


def _fake_of(t: TensorValue):
    return t.fake


def _to_fx(v: Value):
    """The FX argument for a value: nodes for tensors and symbolic numbers, containers
    rebuilt, constants as is."""
    return _map_leaves(v, _node_of)


_RESIZES = frozenset({"resize_", "resize_as_"})
_ARITHMETIC_INPLACE = frozenset({"add_", "sub_", "mul_", "div_", "true_divide_", "pow_", "remainder_",
                                 "fmod_", "floor_divide_"})


def _check_inplace_result_type(name: str, args: tuple) -> None:
    """Eager's error for ``int_tensor.mul_(2.5)``: the result type cannot be cast to the
    tensor's own. Fake tensors let it pass, and a functionalized graph (``mul`` then ``copy_``)
    casts silently: a result where eager raises."""
    self, other = args[0], args[1]
    if not isinstance(self, TensorValue):
        return
    if isinstance(other, TensorValue):
        o = other.fake
    else:
        try:
            c = other.as_constant()
        except Exception:
            py = other.python_type() if hasattr(other, "python_type") else None
            c = {float: 1.5, int: 1, bool: True}.get(py)
        if not isinstance(c, (bool, int, float, complex)):
            return
        o = c
    try:
        result = torch.result_type(self.fake, o)
    except Exception:
        return
    if name in ("div_", "true_divide_") and not (result.is_floating_point or result.is_complex):
        result = torch.get_default_dtype()
    if not torch.can_cast(result, self.fake.dtype):
        raise UserException(RuntimeError(f"result type {_scalar_name(result)} can't be cast to the "
                                         f"desired output type {_scalar_name(self.fake.dtype)}"))


def _scalar_name(dtype: torch.dtype) -> str:
    return torch.empty(0, dtype=dtype, device="meta").type().rsplit(".", 1)[-1].replace("Tensor", "")


# Tensor methods with a parameter named by a Python keyword, which the graph's code cannot
# write as a keyword argument: the parameters in their positions after ``self``
_KEYWORD_PARAMETERS = {"uniform_": ("from", "to"), "random_": ("from", "to")}


def _keywords_as_positions(kind: str, target, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``t.uniform_(**{"from": a, "to": b})`` as ``t.uniform_(a, b)``."""
    params = _KEYWORD_PARAMETERS.get(target) if kind == "call_method" else None
    if params is None or len(args) != 1:
        raise Unsupported(f"{_op_name(kind, target)} with a keyword argument named by a Python keyword "
                          f"({', '.join(k for k in kwargs if keyword.iskeyword(k))})")
    positional = list(args)
    rest = dict(kwargs)
    for name in params:
        if name not in rest:
            break
        positional.append(rest.pop(name))
    if any(keyword.iskeyword(k) for k in rest):     # ("to" without "from": no position for it)
        raise Unsupported(f"Tensor.{target} with {sorted(rest)} as keywords")
    return tuple(positional), rest


def _out_layouts(fake_kwargs: dict) -> list:
    """Sizes and strides of the ``out=`` tensors of a call (a tensor or a tuple of them)."""
    out = fake_kwargs.get("out")
    outs = out if isinstance(out, (tuple, list)) else [out]
    def exprs(ints):   # compared as expressions: comparing SymInts would add guards
        return tuple(i.node.expr if isinstance(i, torch.SymInt) else i for i in ints)
    return [(exprs(t.shape), exprs(t.stride())) for t in outs if isinstance(t, torch.Tensor)]


_DROPOUTS = (torch.nn.functional.dropout, torch.dropout)


# dropouts whose eager kernel returns the input itself for p == 0 or when not training
# (ATen's _dropout_impl; the functional wrappers add only the check of p)
_IDENTITY_DROPOUTS = (torch.nn.functional.dropout, torch.nn.functional.alpha_dropout,
                      torch.nn.functional.feature_alpha_dropout, torch.dropout, torch.alpha_dropout,
                      torch.feature_dropout, torch.feature_alpha_dropout)


def _dropout_arguments(args: tuple, kwargs: dict) -> dict | None:
    """The constant arguments of a dropout call but its input (``p``, ``training``,
    ``inplace``), None when one is not a constant or the input is not a tensor."""
    names = ("input", "p", "training", "inplace")
    given = dict(zip(names, args)) | {("training" if k == "train" else k): v for k, v in kwargs.items()}
    const = {k: v.as_constant() for k, v in given.items() if k != "input" and v.is_constant()}
    if len(const) != len(given) - 1 or not isinstance(given.get("input"), TensorValue):
        return None
    return const


def _drops_everything(args: tuple, kwargs: dict) -> bool:
    """``F.dropout(x, p=1.0, training=True)`` or ``torch.dropout(x, 1.0, train=True)`` (not in
    place), every argument a constant but x."""
    const = _dropout_arguments(args, kwargs)
    if const is None:
        return False
    return const.get("p", 0.5) == 1.0 and const.get("training", True) is True and not const.get("inplace", False)


def _leaves_input_as_is(args: tuple, kwargs: dict) -> bool:
    """A dropout call whose eager kernel returns its input tensor itself: p == 0 or not
    training, with p in [0, 1] (outside it eager raises, and the op runs to raise)."""
    const = _dropout_arguments(args, kwargs)
    if const is None:
        return False
    p = const.get("p", 0.5)
    return isinstance(p, (int, float)) and 0 <= p <= 1 and (p == 0 or const.get("training", True) is False)


def _to_fake(v: Value):
    """The argument for running an operator on fake tensors (symbolic numbers as SymInts)."""
    return _map_leaves(v, _fake_of)


def _map_leaves(v: Value, tensor_leaf):
    if isinstance(v, TensorValue):
        return tensor_leaf(v)
    if isinstance(v, SymNodeValue):
        return v.node if tensor_leaf is _node_of else v.fake
    if isinstance(v, SymSliceValue):
        return slice(*[_map_leaves(p, tensor_leaf) for p in v.parts])
    if isinstance(v, SymRangeValue):
        return v.as_constant()
    if isinstance(v, (TupleValue, ListValue)):
        items = [_map_leaves(i, tensor_leaf) for i in v.items]
        return items if isinstance(v, ListValue) else tuple(items)
    if isinstance(v, DictValue):
        return {k: _map_leaves(x, tensor_leaf) for k, x in v.items.items()}
    if isinstance(v, NullValue):
        raise Unsupported("NULL passed to an operator")
    if v.is_constant() and not isinstance(v, SetValue):
        return v.as_constant()
    raise Unsupported(f"{v.describe()} passed to a tensor operator")
