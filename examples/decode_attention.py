"""One decoding step's attention: each head's single new query against the cached keys and
values (grouped-query: 8 query heads share 2 key/value heads), no mask.

One query a head is still attention to emmy: one flash kernel. The 4 query heads that share a
key/value head become 4 query rows of one block, so each key and value is read once for all 4.
Alone, such a kernel has only batch x key/value heads blocks (4 here, 8 for a Llama-3-8B
step), each walking the whole cache while most SMs idle; `REDUCE=split:S:combine` deals each
head's key blocks out to S blocks (split-KV, as FlashDecoding) and a second kernel merges
their partial outputs by their log-sum-exp. The default row splits where the cost model says
that is faster: here, at 300 cached tokens, one kernel is (the combine's launch costs more
than the split saves); with `--set cache_len=4096` the default splits 32 ways. `emmy space
examples/decode_attention.py` lists the choices.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2
n_heads = 8
n_kv_heads = 2
cache_len = 300       # not a multiple of any key block: the last one is masked
head_dim = 64
dtype = "float16"     # or "bfloat16", "float32"


class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def get_inputs():
    t = getattr(torch, dtype)
    return [torch.randn(batch_size, n_heads, 1, head_dim).to(t),
            torch.randn(batch_size, n_kv_heads, cache_len, head_dim).to(t),
            torch.randn(batch_size, n_kv_heads, cache_len, head_dim).to(t)]


def get_init_inputs():
    return []
