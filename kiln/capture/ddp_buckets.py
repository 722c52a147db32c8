"""A graph finished while DistributedDataParallel runs its wrapped module, cut at DDP's gradient
buckets before the backend: each piece is compiled by the backend on its own (any backend, a
user's callable too, receives the pieces), so each piece's backward is its own autograd node.

Why: DDP all-reduces gradients bucket by bucket, and a bucket's all-reduce starts when the
last of its parameters' gradients is accumulated. One graph is one autograd node in the
backward: every parameter's gradient would be ready only at its end, and no all-reduce could
overlap the backward. Cut at the buckets, the backward of the last piece (the first to run)
makes the first bucket's gradients, whose all-reduce then runs while the earlier pieces'
backward does.

**The buckets** are DDP's: its reducer fills them with the parameters in reverse order of
registration (about the order the backward makes their gradients), up to ``bucket_cap_mb``,
the first one smaller (1 MiB unless ``bucket_cap_mb`` was given; ``_torch.ddp_bucket_caps``).
The graph's nodes are walked backwards and each parameter is counted where it is read last;
once a bucket is full a new one starts, at a node whose value a later piece or the output
reads (a piece that hands nothing on would be cut off). Nodes before the first parameter join
the first piece.

**The pieces** join consecutive buckets until each holds ``1/config.ddp_pieces`` of the
bucketed bytes (4 pieces at most by default; 0: a piece per bucket). A cut is not free: each
piece is a graph call and an autograd node of its own, host time on every step, and no fusion
crosses it. On a step the host bounds (as a GPT-2-size model on two H100 over NVLink is) a cut
costs more than the overlap it buys; with a slower link (PCIe, several hosts) the overlap is
worth more. The buckets' all-reduces are DDP's own either way: a piece's end makes every bucket
in it ready. Where a value other than a tensor (a size, a tuple) would cross a cut, the two
pieces stay one.

**Not cut**: a graph that changes grad mode or autocast (a piece's backend runs in the state
its piece starts in), one that returns a graph attribute, a graph finished without grad mode.

**Compiling**: the first piece is compiled with the graph's own example inputs. A later piece
reads values the pieces before it make: it is compiled for the values they really hand it,
at its first call (``aot.PerShapeCompiled``: their sizes, strides and aliasing, which a
compiler may choose differently from the capture's), under ``COMPILE_LOCK``; a new shape
compiles it again. Where kiln's own compile of a piece fails, the piece runs as captured; a
user's backend's error is the user's.

Ranks agree: the cuts depend on the graph and the parameters' sizes only (the bucket caps are
the DDP module's settings, the same on every rank), never on the rank; nothing here adds a
guard.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.amp.autocast_mode as _autocast
import torch.fx

from .. import _torch, logs
from ..aot.dynamic import PerShapeCompiled
from ..compile_lock import compile_scope
from ..config import config
from ..internal_errors import is_users

# grad mode and autocast switched inside a graph (see the module's docstring)
_MODE_CHANGES = (torch._C._set_grad_enabled, _autocast._enter_autocast, _autocast._exit_autocast)


def plan_pieces(gm: torch.fx.GraphModule, inputs: list, ddp) -> list[list[torch.fx.Node]] | None:
    """The graph's nodes (placeholders and attributes aside) in pieces, in graph order, one
    per group of buckets; None when the graph is not cut (one piece, or see the module's docstring)."""
    if not torch.is_grad_enabled():
        return None
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    bucketed = _torch.ddp_bucketed_parameters(ddp)
    param_bytes = {}
    for node, inp in zip(placeholders, inputs):
        t = getattr(inp, "real", None)
        if isinstance(t, torch.Tensor) and id(t) in bucketed:
            param_bytes[node] = t.numel() * t.element_size()
    if not param_bytes:
        return None
    work = [n for n in graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    output = next(n for n in graph.nodes if n.op == "output")
    returned = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    if any(not isinstance(a, torch.fx.Node) or a.op == "get_attr" for a in returned):
        return None
    if any(n.op == "call_function" and n.target in _MODE_CHANGES for n in work):
        return None

    first_cap, cap = _torch.ddp_bucket_caps(ddp)
    buckets: list[list[torch.fx.Node]] = [[]]      # backwards: the last piece first
    sizes = [0]
    members: set = set()
    counted: set = set()
    for node in reversed(work):
        limit = first_cap if len(buckets) == 1 else cap
        if sizes[-1] >= limit and _hands_on(buckets[-1], members):
            buckets.append([])
            sizes.append(0)
            members = set()
        for a in node.all_input_nodes:
            if a in param_bytes and a not in counted:
                counted.add(a)
                sizes[-1] += param_bytes[a]
        buckets[-1].append(node)
        members.add(node)
    if len(buckets) > 1 and sizes[-1] == 0:
        # nodes before the first parameter: no bucket of their own
        buckets[-2].extend(buckets.pop())
        sizes.pop()
    if config.ddp_pieces > 0:
        buckets = _joined(buckets, sizes, -(-sum(sizes) // config.ddp_pieces))
    pieces = [list(reversed(b)) for b in reversed(buckets)]
    pieces = _merge_non_tensor_cuts(pieces)
    return pieces if len(pieces) > 1 else None


def _joined(buckets: list[list], sizes: list[int], least: int) -> list[list]:
    """Consecutive buckets (in the order their gradients are made) joined until each group holds
    ``least`` bytes of parameters (the last group may hold less); a group ends only where it hands
    a value on, as a bucket does."""
    groups: list[list] = [[]]
    size = 0
    for bucket, nbytes in zip(buckets, sizes):
        if size >= least and _hands_on(groups[-1], set(groups[-1])):
            groups.append([])
            size = 0
        groups[-1].extend(bucket)
        size += nbytes
    return groups


def _hands_on(bucket: list, members: set) -> bool:
    """Whether a node of the bucket is read outside it (by a later piece or the output)."""
    return any(u not in members for n in bucket for u in n.users)


def _merge_non_tensor_cuts(pieces: list[list]) -> list[list]:
    """Pieces joined across every cut that a value other than a tensor would cross."""
    while True:
        index = {n: k for k, piece in enumerate(pieces) for n in piece}
        joined = None
        for k, piece in enumerate(pieces):
            for n in piece:
                last = max((index.get(u, len(pieces)) for u in n.users), default=k)
                if last > k and not isinstance(n.meta.get("example_value"), torch.Tensor):
                    joined = k
                    break
            if joined is not None:
                break
        if joined is None:
            return pieces
        pieces = pieces[:joined] + [pieces[joined] + pieces[joined + 1]] + pieces[joined + 2:]


class Piece:
    """One piece as a graph of its own: which values of the call it reads (slots: the graph's
    arguments first, then the values pieces hand on) and which slots its outputs fill."""

    def __init__(self, gm: torch.fx.GraphModule, reads: list[int], writes: list[int]):
        self.gm = gm
        self.reads = reads
        self.writes = writes


def split(gm: torch.fx.GraphModule, pieces: list[list[torch.fx.Node]]) -> tuple[list[Piece], list[int]]:
    """The pieces as graphs, and the slots of the graph's outputs."""
    graph = gm.graph
    slot = {n: i for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    output = next(n for n in graph.nodes if n.op == "output")
    result = []
    for k, nodes in enumerate(pieces):
        members = set(nodes)
        g = torch.fx.Graph()
        env: dict = {}
        reads = []
        for n in nodes:
            for a in n.all_input_nodes:
                if a in members or a in env or a.op == "get_attr":
                    continue
                p = g.placeholder(a.name)
                p.meta.update(a.meta)
                if a.op != "placeholder":
                    p.meta["kiln_source"] = f"value {a.name} of an earlier DDP bucket piece"
                    p.meta["kiln_static"] = False
                if k > 0:
                    p.meta.pop("example_value", None)     # (the real values' layouts decide)
                env[a] = p
                reads.append(slot[a])
        for n in nodes:
            for a in n.all_input_nodes:
                if a.op == "get_attr" and a not in env:
                    env[a] = g.node_copy(a, lambda x: env[x])
            env[n] = g.node_copy(n, lambda x: env[x])
        handed = [n for n in nodes if any(u not in members for u in n.users)]
        writes = []
        for n in handed:
            slot[n] = len(slot)
            writes.append(slot[n])
        g.output(tuple(env[n] for n in handed))
        piece_gm = torch.fx.GraphModule(gm, g, class_name=f"{type(gm).__name__}_bucket{k}")
        piece_gm.meta.update(gm.meta)
        piece_gm.meta["kiln_static_inputs"] = [i for i, p in enumerate(n for n in g.nodes if n.op == "placeholder")
                                               if p.meta.get("kiln_static")]
        result.append(Piece(piece_gm, reads, writes))
    returned = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    return result, [slot[n] for n in returned]


def compile_pieces(gm: torch.fx.GraphModule, pieces: list[list[torch.fx.Node]], example_inputs: list,
                   compile_one: Callable[[torch.fx.GraphModule, list], Callable]) -> Callable:
    """The graph as its pieces, each compiled by ``compile_one(piece, example_inputs)`` (see
    the module's docstring), run one after the other."""
    parts, out_slots = split(gm, pieces)
    first = parts[0]
    steps = [compile_one(first.gm, [example_inputs[i] for i in first.reads])]
    for part in parts[1:]:
        steps.append(_compiled_at_first_call(part.gm, compile_one))
    n_args = len(example_inputs)
    n_slots = n_args + sum(len(p.writes) for p in parts)
    # a handed value is dropped once the last piece that reads it has run (unless returned)
    last_read: dict[int, int] = {}
    for k, p in enumerate(parts):
        for s in p.reads:
            last_read[s] = k
    kept = set(out_slots)
    drops = [[s for s, k2 in last_read.items() if k2 == k and s >= n_args and s not in kept]
             for k in range(len(parts))]
    plan = [(step, p.reads, p.writes, d) for step, p, d in zip(steps, parts, drops)]

    def run_pieces(*args):
        values = [*args, *([None] * (n_slots - n_args))]
        for step, reads, writes, drop in plan:
            outs = step(*[values[s] for s in reads])
            for s, v in zip(writes, outs):
                values[s] = v
            for s in drop:
                values[s] = None
        return tuple(values[s] for s in out_slots)

    run_pieces.kiln_ddp_pieces = [p.gm for p in parts]
    run_pieces.kiln_unsaved_reason = ("a graph cut at DDP's gradient buckets has no saved form (its pieces "
                                      "are in the compile cache, for kiln's backends)")
    if logs.enabled.graph:
        logs.log("graph", f"graph {type(gm).__name__} cut at DDP's gradient buckets into {len(parts)} pieces")
    return run_pieces


def _compiled_at_first_call(piece: torch.fx.GraphModule, compile_one: Callable) -> Callable:
    def compile_static(args: list) -> Callable:
        with compile_scope(config.pause_gc_while_compiling):
            return compile_one(piece, args)

    def on_failure(e: BaseException) -> Callable:
        if is_users(e) or piece.meta.get("kiln_fullgraph"):
            raise e
        if logs.enabled.graph_breaks:
            logs.log("graph_breaks", f"compiling DDP bucket piece {type(piece).__name__} failed; it runs "
                     f"as captured: {type(e).__name__}: {e}")
        return piece.forward
    return PerShapeCompiled(compile_static, "a DDP bucket piece, compiled for the values handed to it",
                            on_failure)
