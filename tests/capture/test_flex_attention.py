"""``flex_attention`` in compiled code: one graph with a ``higher_order.flex_attention`` node
whose score_mod and mask_mod are subgraphs; the same outputs and gradients as eager
flex_attention (which compiles the op itself with torch.compile's eager backend)."""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

import kiln
from kiln.errors import Unsupported
from kiln.testing import CompileCounter, assert_same

FLEX = torch.ops.higher_order.flex_attention
S = 128        # the Inductor CPU template works on blocks of 128 positions
TOL = dict(rtol=1e-4, atol=1e-5)

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _qkv(hq=2, hkv=2, s=S, e=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, hq, s, e, generator=g), torch.randn(1, hkv, s, e, generator=g),
            torch.randn(1, hkv, s, e, generator=g))


def _flex_nodes(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is FLEX]


def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def causal_score(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def plain(q, k, v):
    return flex_attention(q, k, v)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_no_score_mod_one_graph(backend):
    counter = CompileCounter()
    compiled = kiln.compile(plain, backend=counter if backend == "eager" else backend, fullgraph=True)
    q, k, v = _qkv()
    assert_same(compiled(q, k, v), plain(q, k, v), **TOL)
    if backend == "eager":
        assert counter.frame_count == 1
        (node,) = _flex_nodes(counter.graphs[0])
        score_gm = getattr(counter.graphs[0], node.args[3].target)
        mask_gm = getattr(counter.graphs[0], node.args[4][-1].target)
        assert isinstance(score_gm, torch.fx.GraphModule) and isinstance(mask_gm, torch.fx.GraphModule)
        assert node.args[5] == 0.25          # the default scale, 1/sqrt(16)
        assert node.args[7] == () and node.args[8] == ()


def test_causal_score_mod_fullgraph():
    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=causal_score) * 2

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True)
    q, k, v = _qkv()
    assert_same(compiled(q, k, v), f(q, k, v), **TOL)
    assert counter.frame_count == 1 and len(_flex_nodes(counter.graphs[0])) == 1
    assert kiln.explain(f)(q, k, v).graph_break_count == 0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_block_mask_argument(backend):
    def f(q, k, v, block_mask):
        return flex_attention(q, k, v, block_mask=block_mask)

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter if backend == "eager" else backend, fullgraph=True)
    q, k, v = _qkv(s=2 * S)
    causal = create_block_mask(causal_mask, None, None, 2 * S, 2 * S, device="cpu")
    assert_same(compiled(q, k, v, causal), f(q, k, v, causal), **TOL)

    # another mask_mod, same sizes: its tensors are new inputs, the function a new guard
    def window(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < 64

    windowed = create_block_mask(window, None, None, 2 * S, 2 * S, device="cpu")
    assert_same(compiled(q, k, v, windowed), f(q, k, v, windowed), **TOL)
    assert not torch.allclose(f(q, k, v, windowed), f(q, k, v, causal))
    if backend == "eager":
        assert counter.frame_count == 2
        (node,) = _flex_nodes(counter.graphs[0])
        mask_tensors = [a for a in node.args[4] if isinstance(a, torch.fx.Node) and a.op == "placeholder"]
        assert len(mask_tensors) >= 4      # the BlockMask's tensors are graph inputs


def test_block_mask_of_other_lengths_runs_eagerly_and_raises_as_eager():
    def f(q, k, v, block_mask):
        return flex_attention(q, k, v, block_mask=block_mask)

    q, k, v = _qkv()
    wrong = create_block_mask(causal_mask, None, None, 2 * S, 2 * S, device="cpu")
    with pytest.raises(ValueError, match="block_mask was created for"):
        f(q, k, v, wrong)
    with pytest.raises(ValueError, match="block_mask was created for"):
        kiln.compile(f)(q, k, v, wrong)
    with pytest.raises(Unsupported, match="block mask made for lengths"):
        kiln.compile(f, fullgraph=True)(q, k, v, wrong)


def _relative_bias(table):
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + S]
    return score_mod


def test_score_mod_closure_tensor_is_an_other_buffer():
    table = torch.randn(2, 2 * S)
    score_mod = _relative_bias(table)

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod)

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True)
    q, k, v = _qkv()
    assert_same(compiled(q, k, v), f(q, k, v), **TOL)
    (node,) = _flex_nodes(counter.graphs[0])
    assert len(node.args[7]) == 1 and node.args[7][0].op == "placeholder"
    table.mul_(3)     # the buffer is an input: the change is seen without a recompile
    assert_same(compiled(q, k, v), f(q, k, v), **TOL)
    assert counter.frame_count == 1


def test_mask_mod_closure_tensor_and_document_mask():
    doc = torch.arange(S) // 40          # three documents and a bit

    def same_doc(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    block_mask = create_block_mask(same_doc, None, None, S, S, device="cpu", BLOCK_SIZE=32)

    def f(q, k, v, bm):
        return flex_attention(q, k, v, block_mask=bm)

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True)
    q, k, v = _qkv()
    assert_same(compiled(q, k, v, block_mask), f(q, k, v, block_mask), **TOL)
    (node,) = _flex_nodes(counter.graphs[0])
    assert len(node.args[8]) == 1         # doc: the mask_mod's other buffer


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_gqa(backend):
    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=causal_score, enable_gqa=True)

    compiled = kiln.compile(f, backend=backend, fullgraph=True)
    q, k, v = _qkv(hq=4, hkv=2)
    assert_same(compiled(q, k, v), f(q, k, v), **TOL)


def test_gqa_without_enable_gqa_raises_as_eager():
    q, k, v = _qkv(hq=4, hkv=2)
    with pytest.raises(ValueError, match="same number of heads"):
        kiln.compile(plain)(q, k, v)


@pytest.mark.filterwarnings("ignore:return_lse is deprecated")
def test_scale_and_return_lse():
    def f(q, k, v):
        out, lse = flex_attention(q, k, v, score_mod=causal_score, scale=0.5, return_lse=True)
        return out, lse

    counter = CompileCounter()
    compiled = kiln.compile(f, backend=counter, fullgraph=True)
    q, k, v = _qkv()
    assert_same(compiled(q, k, v), f(q, k, v), **TOL)
    assert _flex_nodes(counter.graphs[0])[0].args[5] == 0.5


def test_return_aux_lse():
    def f(q, k, v):
        out, aux = flex_attention(q, k, v, score_mod=causal_score, return_aux=AuxRequest(lse=True))
        return out, aux.lse, aux.max_scores

    q, k, v = _qkv()
    out, lse, max_scores = kiln.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    assert max_scores is None
    assert_same((out, lse), f(q, k, v)[:2], **TOL)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_training_closure_parameter_gradient(backend):
    """On CPU eager flex_attention differentiates only its score_mod's buffers (query, key and
    value that require grad raise): the bias table's gradient, through flex_attention_backward."""
    table = torch.randn(2, 2 * S, requires_grad=True)
    score_mod = _relative_bias(table)

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod).sin().sum()

    q, k, v = _qkv()
    compiled = kiln.compile(f, backend=backend, fullgraph=True)
    loss = compiled(q, k, v)
    loss.backward()
    got = table.grad.clone()
    table.grad = None
    ref = f(q, k, v)
    ref.backward()
    assert_same(loss, ref, **TOL)
    assert_same(got, table.grad, **TOL)
    assert got.abs().sum() > 0


def test_inputs_requiring_grad_on_cpu_raise_as_eager():
    q, k, v = _qkv()
    q.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        plain(q, k, v)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        kiln.compile(plain)(q, k, v)
    with pytest.raises(Unsupported, match="require grad"):
        kiln.compile(plain, fullgraph=True)(q, k, v)


def test_create_block_mask_inside_breaks_with_a_reason():
    def f(q, k, v):
        block_mask = create_block_mask(causal_mask, None, None, S, S, device="cpu")
        return flex_attention(q, k, v, block_mask=block_mask) + 1

    q, k, v = _qkv()
    assert_same(kiln.compile(f)(q, k, v), f(q, k, v), **TOL)
    explained = kiln.explain(f)(q, k, v)
    assert explained.graph_break_count == 1
    assert "create_block_mask" in explained.break_reasons[0].reason
    with pytest.raises(Unsupported, match="create_block_mask"):
        kiln.compile(f, fullgraph=True)(q, k, v)


def test_score_mod_kiln_cannot_capture_runs_eagerly():
    def score_mod(score, b, h, q_idx, kv_idx):
        print("side effect")      # a subgraph has no Python effects
        return score

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod)

    q, k, v = _qkv()
    with pytest.raises(Unsupported, match="score_mod"):
        kiln.compile(f, fullgraph=True)(q, k, v)


def test_same_output_as_torch_compile():
    table = torch.randn(2, 2 * S)
    score_mod = _relative_bias(table)
    block_mask = create_block_mask(causal_mask, None, None, S, S, device="cpu")

    def f(q, k, v, bm):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)

    q, k, v = _qkv()
    ours = kiln.compile(f, backend="inductor", fullgraph=True)(q, k, v, block_mask)
    torch._dynamo.reset()
    theirs = torch.compile(f, backend="inductor", fullgraph=True)(q, k, v, block_mask)
    torch._dynamo.reset()
    assert_same(ours, theirs, **TOL)
    assert_same(ours, f(q, k, v, block_mask), **TOL)
