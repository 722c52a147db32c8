"""diffusers models at small sizes (random weights, nothing downloaded): each captures as one
graph with no break, matches eager in inference and in a training step under ``aot_eager``,
and its package saves every entry and loads with nothing captured.

diffusers is not a test dependency (``pip install diffusers`` to run these)."""
from __future__ import annotations

import copy

import pytest
import torch

import kiln
from kiln.runtime import function as call_path

diffusers = pytest.importorskip("diffusers")


def unet_conditional():
    m = diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8)
    return m, dict(sample=torch.randn(2, 4, 16, 16), timestep=torch.tensor([10, 20]),
                   encoder_hidden_states=torch.randn(2, 7, 32))


def vae():
    m = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), latent_channels=4,
        norm_num_groups=8, sample_size=32)
    return m, dict(sample=torch.randn(1, 3, 32, 32))


def sd3_transformer():
    m = diffusers.SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=16, out_channels=4)
    return m, dict(hidden_states=torch.randn(1, 4, 16, 16), encoder_hidden_states=torch.randn(1, 7, 32),
                   pooled_projections=torch.randn(1, 16), timestep=torch.tensor([5]))


def unet_plain():
    m = diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8)
    return m, dict(sample=torch.randn(1, 3, 16, 16), timestep=torch.tensor([3]))


MODELS = {"unet_conditional": unet_conditional, "vae": vae, "sd3_transformer": sd3_transformer,
          "unet_plain": unet_plain}


def _sample(out):
    return out.sample if hasattr(out, "sample") else out[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_one_graph_matching_eager_in_inference_and_training(name):
    torch.manual_seed(0)
    model, kwargs = MODELS[name]()
    reference = copy.deepcopy(model)
    with torch.no_grad():
        report = kiln.explain(model.eval())(**kwargs)
    assert (report.graph_count, report.graph_break_count) == (1, 0), [str(b) for b in report.break_reasons]
    compiled = kiln.compile(model.train(), backend="aot_eager")
    reference.train()
    out, expected = _sample(compiled(**kwargs)), _sample(reference(**kwargs))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    weights = torch.randn_like(expected)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    for (pname, p), q in zip(model.named_parameters(), reference.parameters()):
        if q.grad is not None:
            # in norm: a key projection's bias has an exact gradient of zero (softmax does not
            # see it), which both sides only approximate by rounding noise
            err = (p.grad - q.grad).norm().item()
            assert err <= 1e-3 * q.grad.norm().item() + 1e-5, (pname, err, q.grad.norm().item())
    assert not any(e.eager_reason is not None for e in compiled._kiln_compiled.entries)


@pytest.mark.parametrize("name", list(MODELS))
def test_package_saves_every_entry_and_loads_with_nothing_captured(name, tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, kwargs = MODELS[name]()
    model.eval()
    compiled = kiln.compile(model, backend="aot_eager")
    with torch.no_grad():
        expected = _sample(compiled(**kwargs))
        report = compiled.save_package(tmp_path / "model.kiln")
        assert not report.left_out, report
        kiln.reset()
        monkeypatch.setattr(call_path, "capture", lambda *a, **k: pytest.fail("capture ran"))
        loaded = kiln.load_package(tmp_path / "model.kiln", model, on_miss="error")
        torch.testing.assert_close(_sample(loaded(**kwargs)), expected)
