"""Positional information: sinusoidal encoding (seed 003 eq. 2-3) and rotary embeddings.

Sinusoidal, in radians as in Vaswani et al. (2017):
    PE[i, 2j]   = sin(i / 10000^(2j/d))
    PE[i, 2j+1] = cos(i / 10000^(2j/d))

Rotary (RoPE, Su et al. 2021): each pair of query/key features is rotated by the angle
position * theta^(-2j/d_k). Pairs are either the two halves of the head ("half", the
layout of Hugging Face's Llama) or neighbours (2j, 2j+1) ("interleaved", the layout of
the original paper and of llama.cpp's files).
"""

from __future__ import annotations

import torch


def sinusoidal_encoding(n: int, d: int, base: float = 10000.0, dtype=torch.float32) -> torch.Tensor:
    """P, n x d: the sinusoidal positional encoding of positions 0..n-1."""
    i = torch.arange(n, dtype=torch.float64)[:, None]  # (n, 1) positions
    two_j = torch.arange(0, d, 2, dtype=torch.float64)[None, :]  # (1, ceil(d/2)) = 2j
    angle = i / base ** (two_j / d)  # (n, ceil(d/2)) radians
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d // 2])
    return pe.to(dtype)


def rope_angles(n: int, d_k: int, theta: float = 10000.0, offset: int = 0) -> torch.Tensor:
    """Rotation angle (radians) of each position and feature pair: n x d_k/2."""
    pos = torch.arange(offset, offset + n, dtype=torch.float64)[:, None]
    inv_freq = theta ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    return pos * inv_freq[None, :]


def apply_rope(x: torch.Tensor, angles: torch.Tensor, layout: str = "half") -> torch.Tensor:
    """Rotate feature pairs of x (..., n, d_k) by angles (n, d_k/2)."""
    cos = torch.cos(angles).to(x.dtype)
    sin = torch.sin(angles).to(x.dtype)
    if layout == "half":
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.flatten(-2)
    raise ValueError(f"unknown RoPE layout {layout!r}")
