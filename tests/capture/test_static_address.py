"""A tensor marked at a static address (``torch._dynamo.mark_static_address``, as Hugging Face's
static KV cache marks its tensors) enters the graph as a static input, as a parameter does:
CUDA graphs then read and write it in place (tests/cudagraphs/test_cuda.py checks the replay)."""
import torch

import kiln


def test_a_marked_tensor_is_a_static_input_and_its_writes_match_eager():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    def step(x, cache, length):
        cache.index_copy_(0, length, x)
        length.add_(1)
        return cache.sum(0) * 2 + x

    cache, length = torch.zeros(16, 8), torch.zeros(1, dtype=torch.long)
    ref_cache, ref_length = cache.clone(), length.clone()
    torch._dynamo.mark_static_address(cache)
    compiled = kiln.compile(step, backend=backend)
    for _ in range(3):
        x = torch.randn(1, 8)
        torch.testing.assert_close(compiled(x, cache, length), step(x, ref_cache, ref_length))
        torch.testing.assert_close(cache, ref_cache)
        assert int(length) == int(ref_length)
    (gm,) = graphs
    static = {p.meta["kiln_source"]: p.meta["kiln_static"] for p in gm.graph.nodes if p.op == "placeholder"}
    assert static == {"L['x']": False, "L['cache']": True, "L['length']": False}, static
