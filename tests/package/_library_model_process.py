"""Run in a fresh process by test_package_library_models.py:

    python _library_model_process.py save PATH    compile a tiny Hugging Face Qwen2 (its
                                                  defaults: KV cache on, 2 key/value heads),
                                                  call it (the logits must equal eager's),
                                                  print the cache stats, save a package
    python _library_model_process.py load PATH    load it with capture made to fail; the
                                                  logits must equal eager's
    python _library_model_process.py warm -       compile and call it with the compile cache
                                                  of $KILN_CACHE_DIR; print the cache stats
    python _library_model_process.py MODE-train PATH   the same (save, load, warm) for a
                                                  training step with the default backend:
                                                  loss and gradients must equal eager's
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


def _batch():
    ids = torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


def _train_step(fn, m) -> tuple:
    """A training step's loss and gradients (the model's outputs include its KV cache, computed
    from the same layers as the loss: the graph runs in segments, its backward as one graph
    made at run time)."""
    for p in m.parameters():
        p.grad = None
    loss = fn(**_batch()).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in m.parameters()]


def _heavy_imports() -> list:
    return [name for name in ("torch._inductor.compile_fx", "torch._functorch.aot_autograd") if name in sys.modules]


def main(mode: str, path: str) -> None:
    m = model()
    ids = torch.randint(1, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    if mode.endswith("-train"):       # (the default backend, Inductor, in a training step)
        mode = mode[:-len("-train")]
        m.train()
        if mode == "load":
            import kiln.runtime.function as call_path

            def no_capture(*a, **k):
                raise AssertionError("a loaded package captured a frame")
            call_path.capture = no_capture
            fn = kiln.load_package(path, m, on_miss="error")
        else:
            fn = kiln.compile(m)
        got = _train_step(fn, m)
        want = _train_step(m, m)
        torch.testing.assert_close(got[0], want[0])
        for a, b in zip(got[1], want[1]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
        if mode == "save":
            saved = fn.save_package(path)
            assert sum(saved.saved.values()) >= 1, saved.left_out
        print("STATS " + json.dumps({**kiln.cache.stats(), "imported": _heavy_imports()}))
        return
    if mode == "warm":
        c = kiln.compile(m, backend="aot_eager")
        with torch.no_grad():
            torch.testing.assert_close(c(input_ids=ids).logits, m(input_ids=ids).logits)
        print("STATS " + json.dumps(kiln.cache.stats()))
        return
    if mode == "save":                # (the stats as "warm" prints them: a cold run, with a package)
        c = kiln.compile(m, backend="aot_eager")
        with torch.no_grad():
            torch.testing.assert_close(c(input_ids=ids).logits, m(input_ids=ids).logits)
        print("STATS " + json.dumps(kiln.cache.stats()))
        saved = c.save_package(path)
        assert sum(saved.saved.values()) >= 1, saved.left_out
        print("saved", saved.saved)
        return
    import kiln.runtime.function as call_path

    called = []

    def no_capture(*a, **k):
        called.append("capture")
        raise AssertionError("a loaded package captured a frame")
    call_path.capture = no_capture
    fast = kiln.load_package(path, m, on_miss="error")
    with torch.no_grad():
        got = fast(input_ids=ids).logits
        want = m(input_ids=ids).logits
    torch.testing.assert_close(got, want)
    assert not called, called     # (kiln runs eagerly on its own failures: check it did not)
    print("loaded")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
