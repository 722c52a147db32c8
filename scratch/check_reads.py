# compare fast and slow inputs_read on real graphs
import torch, kiln, sys
from kiln.aot import partial as P
orig = P.inputs_read_per_set
bad = []
def checked(backward, num_tangents, givens, num_saved):
    fast = orig(backward, num_tangents, givens, num_saved)
    slow = [P.inputs_read(backward, num_tangents, frozenset(t), num_saved) for t in givens]
    if fast != slow: bad.append((fast, slow))
    print("checked", len(givens), fast == slow)
    return fast
P.inputs_read_per_set = checked
import transformers
for L in (2, 3):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=L, vocab_size=256)
    m = transformers.LlamaForCausalLM(cfg); ids = torch.randint(0, 256, (2, 16))
    for rb in (True, False):
        with kiln.config.patch(repeated_blocks=rb):
            kiln.compile(m, backend="aot_eager")(input_ids=ids, labels=ids).loss.backward()
        kiln.reset()
sys.path.insert(0, "tests/capture")
from test_regions import KVStack
kiln.compile(KVStack(), backend="aot_eager")(torch.randn(5, 8))
print("BAD", len(bad))
