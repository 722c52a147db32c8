"""Run in a fresh process by test_package_library_models.py:

    python _library_model_process.py save PATH    compile a tiny Hugging Face Qwen2 (its
                                                  defaults: KV cache on, 2 key/value heads),
                                                  call it, save a package
    python _library_model_process.py load PATH    load it with capture made to fail; the
                                                  logits must equal eager's
    python _library_model_process.py warm -       compile and call it with the compile cache
                                                  of $KILN_CACHE_DIR; print the cache stats
"""
import json
import sys

import torch

import kiln


def model():
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def main(mode: str, path: str) -> None:
    m = model()
    ids = torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    if mode == "warm":
        c = kiln.compile(m, backend="aot_eager")
        with torch.no_grad():
            torch.testing.assert_close(c(input_ids=ids).logits, m(input_ids=ids).logits)
        print("STATS " + json.dumps(kiln.cache.stats()))
        return
    if mode == "save":
        c = kiln.compile(m, backend="aot_eager")
        with torch.no_grad():
            c(input_ids=ids)
        saved = c.save_package(path)
        assert sum(saved.saved.values()) >= 1, saved.left_out
        print("saved", saved.saved)
        return
    import kiln.api as api

    called = []

    def no_capture(*a, **k):
        called.append("capture")
        raise AssertionError("a loaded package captured a frame")
    api.capture = no_capture
    fast = kiln.load_package(path, m, on_miss="error")
    with torch.no_grad():
        got = fast(input_ids=ids).logits
        want = m(input_ids=ids).logits
    torch.testing.assert_close(got, want)
    assert not called, called     # (kiln runs eagerly on its own failures: check it did not)
    print("loaded")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
