"""Models for the engine benchmark and tests that the model zoo does not provide.

``TinyEncoder``: a small pre-norm transformer encoder on token sequences, written with plain
``nn.Linear``/``nn.LayerNorm``/``nn.Embedding`` (attention computed functionally), so that both
dpfy's layer rules and Opacus' hooks support every parameter. ``nn.MultiheadAttention`` is not
used because it reads ``out_proj.weight`` without calling ``out_proj`` (dpfy handles it with its
vmap fallback; Opacus needs DPMultiheadAttention).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TinyEncoder", "EncoderBlock"]


class EncoderBlock(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)  # 3 × (B, T, d)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v)  # (B, h, T, d/h)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class TinyEncoder(nn.Module):
    """Token ids (B, T) -> class logits (B, classes); learned positions, mean pooling."""

    def __init__(
        self,
        vocab: int = 1000,
        seq_len: int = 32,
        d: int = 64,
        heads: int = 4,
        layers: int = 2,
        ffn: int = 128,
        classes: int = 10,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)
        self.blocks = nn.Sequential(*[EncoderBlock(d, heads, ffn, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device).repeat(ids.shape[0], 1)  # (B, T)
        h = self.blocks(self.tok(ids) + self.pos(pos))  # (B, T, d)
        return self.head(self.ln(h).mean(1))
