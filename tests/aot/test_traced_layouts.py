"""A kernel that checks its input's layout gets the strides the trace saw
(``kiln/aot/traced_layouts.py``): the attention block of diffusers' VAE, batch 1, under
``aot_eager``, raised "Expected X.is_contiguous(memory_format)" in ``native_group_norm``."""
import copy

import pytest
import torch

import kiln
from kiln.aot.traced_layouts import as_traced_layout


class AttentionLikeBlock(torch.nn.Module):
    """Flatten the spatial dims, project, view back from the transposed result (a view whose
    size-1 batch stride eager and the fake trace compute differently), then a GroupNorm."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)
        self.norm = torch.nn.GroupNorm(8, 32)

    def forward(self, x):
        b, c, h, w = x.shape
        t = self.proj(x.view(b, c, h * w).transpose(1, 2))
        t = t.transpose(1, 2).view(b, c, h, w)
        return self.norm((t + x) / 1.0)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("batch", [1, 2])
def test_group_norm_after_a_transposed_view_matches_eager(train, batch):
    torch.manual_seed(0)
    model = AttentionLikeBlock()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="aot_eager")
    x = torch.randn(batch, 32, 16, 16, requires_grad=train)
    weights = torch.randn(batch, 32, 16, 16)
    with torch.set_grad_enabled(train):
        out, expected = compiled(x), reference(x)
    torch.testing.assert_close(out, expected)
    assert not any(e.eager_reason is not None for e in compiled._kiln_compiled.entries), \
        "the compiled graph failed and the call ran eagerly"
    if train:
        (out * weights).sum().backward()
        (expected * weights).sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            # (the compiled GroupNorm runs in the traced channels-last layout, eager's composite
            # in its own: their reductions sum in other orders)
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_as_traced_layout_restrides_size_one_dims_and_copies_otherwise():
    base = torch.arange(8192.0)
    odd = base.as_strided((1, 32, 16, 16), (32, 1, 512, 32))
    fixed = as_traced_layout(odd, (8192, 1, 512, 32))
    assert fixed.stride() == (8192, 1, 512, 32) and fixed.data_ptr() == odd.data_ptr()
    assert torch.equal(fixed, odd)
    t = torch.randn(2, 3, 4).transpose(1, 2)          # another layout: a copy into the traced one
    moved = as_traced_layout(t, (12, 3, 1))
    assert moved.stride() == (12, 3, 1) and torch.equal(moved, t)


def test_a_graph_loaded_from_the_cache_keeps_the_traced_layouts(monkeypatch):
    """A loaded graph has no fake values to read the traced strides from: its saved form
    keeps them."""
    monkeypatch.setattr(kiln.config, "cache", True)
    torch.manual_seed(0)
    model = AttentionLikeBlock()
    x = torch.randn(1, 32, 16, 16)
    with torch.no_grad():
        kiln.compile(model, backend="aot_eager")(x)
        kiln.reset()
        hits = kiln.cache.stats()["hits"]
        compiled = kiln.compile(model, backend="aot_eager")
        out = compiled(x)
        assert kiln.cache.stats()["hits"] == hits + 1
        assert not any(e.eager_reason is not None for e in compiled._kiln_compiled.entries)
        torch.testing.assert_close(out, model(x))


def test_as_strided_of_an_intermediate_whose_layouts_disagree_is_eagers():
    """torch.roll keeps a channels_last input's layout in eager (CPU); its fake tensor is
    contiguous; Inductor's decomposition keeps channels_last. as_strided reads the storage,
    so only eager's layout gives eager's elements: the graph runs eagerly rather than guess."""
    def fn(x):
        y = torch.roll(x, shifts=-1, dims=0)
        return torch.as_strided(y, (5, 10), (4, 1), 0)

    x = torch.arange(100).reshape(2, 5, 2, 5).to(memory_format=torch.channels_last)
    expected = fn(x)
    assert torch.equal(kiln.compile(fn, backend="inductor")(x), expected)
