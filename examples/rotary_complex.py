"""Rotary position embeddings as the Llama reference code computes them, on complex numbers:
each pair of a head's features is a complex number, rotated by multiplying it with
`freqs_cis` (cos θ + i sin θ, a complex64 input, as the reference's `Attention.forward` takes
it).

emmy computes complex values as pairs of real ones: `view_as_complex` reads the pairs where
they lie, the complex product is four real products and two sums, and `view_as_real` writes
the pairs back, so the whole rotation of q and k is one elementwise kernel over real f32
values. A complex input is passed as torch holds it; the kernels read it as its (real,
imaginary) pairs (`torch.view_as_real`, the same memory). `emmy compile
examples/rotary_complex.py --ir tensor` shows the arithmetic.
"""

import torch
import torch.nn as nn

batch_size = 2
seq_len = 24
n_heads = 4
n_kv_heads = 2
head_dim = 64
dtype = "bfloat16"    # or "float16", "float32"


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ndim = x.ndim
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Model(nn.Module):
    def forward(self, xq, xk, freqs_cis):
        return apply_rotary_emb(xq, xk, freqs_cis)


def get_inputs():
    t = getattr(torch, dtype)
    return [torch.randn(batch_size, seq_len, n_heads, head_dim).to(t),
            torch.randn(batch_size, seq_len, n_kv_heads, head_dim).to(t),
            precompute_freqs_cis(head_dim, seq_len)]


def get_init_inputs():
    return []
