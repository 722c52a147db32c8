"""What the Inductor backend's partition saves on model shapes whose choice changes the kernels
Inductor generates, checked on the partitioned graphs, with gradients equal to eager's."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
import kiln.backends.inductor.backend as inductor_backend
from kiln.aot import fx_graphs


class _PatchEmbedThenBlock(nn.Module):
    """A ViT's first steps (timm's layout): patches by a strided convolution, a class token
    joined in front, positions added, then a pre-norm residual block."""

    def __init__(self, d=32):
        super().__init__()
        self.proj = nn.Conv2d(3, d, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, d) * 0.02)
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.fc = nn.Linear(d, d)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        x = self.proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = x + self.fc(self.norm1(x))
        return self.head(x[:, 0])


def test_the_class_token_cat_is_saved_not_recomputed_in_reductions(monkeypatch, tmp_path):
    """Under bf16 autocast the convolution's output has half the bytes of the float32 cat, but
    recomputing the cat leaves it unwritten in the forward too: Inductor then computes it inside
    each reduction that reads it (looped reductions over strided loads, seconds of compile each
    on a GPU). The cat is saved, as torch.compile's partitioner saves it."""
    saved_targets = []
    real = inductor_backend.min_cut_rematerialization_partition

    def spy(joint, joint_inputs, *, num_fwd_outputs):
        fw, bw = real(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)
        saved = fx_graphs.flat_outputs(fw.graph)[num_fwd_outputs:]
        saved_targets.extend(n.target for n in saved if isinstance(n, torch.fx.Node))
        return fw, bw

    monkeypatch.setattr(inductor_backend, "min_cut_rematerialization_partition", spy)
    torch.manual_seed(0)
    model = _PatchEmbedThenBlock()
    eager = copy.deepcopy(model)
    x = torch.randn(2, 3, 32, 32)
    with kiln.config.patch(cache_dir=str(tmp_path)):
        compiled = kiln.compile(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = compiled(x)
        out.float().pow(2).sum().backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = eager(x)
    ref.float().pow(2).sum().backward()
    assert torch.ops.aten.cat.default in saved_targets, saved_targets
    assert torch.ops.aten.convolution.default not in saved_targets, saved_targets
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=5e-2, rtol=5e-2, msg=name)
