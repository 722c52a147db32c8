"""Hugging Face models beyond text decoders, at their defaults (tiny random configs, nothing
downloaded): Whisper (speech to text, labels, its decoder's cache on), wav2vec2 with a CTC
loss (SpecAugment masks drawn from NumPy's generator in training) and CLIP with its
contrastive loss. Two training steps and one inference call each, under ``aot_eager``, equal
eager's (loss and every gradient), with the graph counts asserted where torch.compile gets
one graph: Whisper deep-copies its config inside the forward (and the cache copies the
copy again), which is captured, not a break."""
from __future__ import annotations

import copy
import inspect
import random

import numpy as np
import pytest
import torch

import kiln
from kiln.backends.registry import lookup_backend

transformers = pytest.importorskip("transformers")


def _whisper():
    cfg = transformers.WhisperConfig(
        vocab_size=100, num_mel_bins=16, encoder_layers=2, decoder_layers=2, d_model=32,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=32, max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1)
    g = torch.Generator().manual_seed(0)
    return transformers.WhisperForConditionalGeneration(cfg), dict(
        input_features=torch.randn(2, 16, 64, generator=g), labels=torch.randint(3, 100, (2, 8), generator=g))


def _wav2vec2():
    cfg = transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, ctc_loss_reduction="mean", pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    return transformers.Wav2Vec2ForCTC(cfg), dict(
        input_values=torch.randn(2, 800, generator=g), labels=torch.randint(1, 32, (2, 5), generator=g))


def _clip():
    text = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=32)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
                  patch_size=8)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 100, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    model = transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    return model, dict(input_ids=ids, attention_mask=mask, pixel_values=torch.randn(2, 3, 32, 32, generator=g),
                       return_loss=True)


def _whisper_graphs():
    """Older transformers (5.17) draw LayerDrop's ``torch.rand([]) < layerdrop`` in training
    whatever ``layerdrop`` is: a branch on a tensor, so every layer is a graph break (in
    torch.compile too). Newer ones skip it when ``layerdrop`` is 0."""
    src = inspect.getsource(transformers.models.whisper.modeling_whisper.WhisperEncoder.forward)
    return 1 if "self.layerdrop > 0" in src else None


# name: (builder, forward graphs of a training step, as torch.compile's count where it is one)
MODELS = {"whisper": (_whisper, _whisper_graphs()), "wav2vec2": (_wav2vec2, None), "clip": (_clip, 1)}


def _run(model, inputs, train: bool):
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    model.train(train)
    out = model(**inputs)
    if not train:
        return out.loss.detach(), {}
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out.loss.detach(), grads


@pytest.mark.parametrize("name", list(MODELS))
def test_training_and_inference_match_eager(name):
    transformers.logging.set_verbosity_error()
    kiln.reset()
    torch.manual_seed(0)
    build, graphs = MODELS[name]
    model, inputs = build()
    eager = copy.deepcopy(model)
    aot_eager = lookup_backend("aot_eager")[0]
    graphs_seen = []

    def counting(gm, example_inputs):
        graphs_seen.append(gm)
        return aot_eager(gm, example_inputs)

    compiled = kiln.compile(model, backend=counting)
    for _ in range(2):
        loss, grads = _run(compiled, inputs, train=True)
        want, want_grads = _run(eager, inputs, train=True)
        torch.testing.assert_close(loss, want)
        assert grads.keys() == want_grads.keys() and grads
        for key in grads:
            torch.testing.assert_close(grads[key], want_grads[key], msg=key)
    if graphs is not None:
        assert len(graphs_seen) == graphs
    with torch.no_grad():
        torch.testing.assert_close(_run(compiled, inputs, train=False)[0], _run(eager, inputs, train=False)[0])
