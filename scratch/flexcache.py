import torch, kiln
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx
slopes = torch.rand(4)
def alibi(score, b, h, q_idx, kv_idx):
    return score - slopes[h] * (q_idx - kv_idx)
bm = create_block_mask(causal, None, None, 128, 128, device="cpu")
def attend(q, k, v, block_mask):
    return flex_attention(q, k, v, score_mod=alibi, block_mask=block_mask)
c = kiln.compile(attend, backend="inductor", fullgraph=True)
q, k, v = (torch.randn(1, 4, 128, 16) for _ in range(3))
torch.testing.assert_close(c(q, k, v, bm), attend(q, k, v, bm))
print(kiln.cache.stats())
