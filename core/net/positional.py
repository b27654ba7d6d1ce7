"""Positional information: sinusoidal encoding (seed 003 eq. 2-3) and rotary embeddings.

Sinusoidal, in radians as in Vaswani et al. (2017):
    PE[i, 2j]   = sin(i / 10000^(2j/d))
    PE[i, 2j+1] = cos(i / 10000^(2j/d))

Rotary (RoPE, Su et al. 2021): each pair of query/key features is rotated by the angle
position * theta^(-2j/d_k). Pairs are either the two halves of the head ("half", the
layout of Hugging Face's Llama) or neighbours (2j, 2j+1) ("interleaved", the layout of
the original paper and of llama.cpp's files).

Relative position bias (T5, Raffel et al. 2020): no position vectors at all; each head
learns one scalar per bucket of the distance key - query, added to the scores. Distances
below half the buckets get a bucket each; longer ones share logarithmically wider buckets up
to max_distance. The encoder's buckets tell "before" from "after" (bidirectional); the
decoder's only look back.
"""

from __future__ import annotations

import math
from typing import Optional

import torch


def sinusoidal_encoding(
    n: int, d: int, base: float = 10000.0, dtype=torch.float32, layout: str = "interleaved"
) -> torch.Tensor:
    """P, n x d: the sinusoidal positional encoding of positions 0..n-1.

    layout "interleaved": sin in the even features, cos in the odd ones (the notes);
    "half": the same sines in the first ceil(d/2) features, the cosines after them (Marian).
    """
    i = torch.arange(n, dtype=torch.float64)[:, None]  # (n, 1) positions
    two_j = torch.arange(0, d, 2, dtype=torch.float64)[None, :]  # (1, ceil(d/2)) = 2j
    angle = i / base ** (two_j / d)  # (n, ceil(d/2)) radians
    pe = torch.zeros(n, d, dtype=torch.float64)
    if layout == "half":
        half = angle.shape[1]
        pe[:, :half] = torch.sin(angle)
        pe[:, half:] = torch.cos(angle[:, : d // 2])
        return pe.to(dtype)
    if layout != "interleaved":
        raise ValueError(f"unknown sinusoid layout {layout!r}")
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d // 2])
    return pe.to(dtype)


def relative_buckets(
    n_q: int, n_k: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128, device=None
) -> torch.Tensor:
    """Bucket of each (query i, key j) pair, n_q x n_k long, from the distance j - i (T5).

    Bidirectional: half the buckets for keys after the query, half for the others. Within a
    half, distances 0 .. b/2 - 1 have a bucket each; longer ones fall into b/2 more buckets,
    spaced logarithmically up to max_distance (anything further shares the last one).
    Unidirectional (decoder): keys after the query get bucket 0, like distance 0.
    """
    rel = torch.arange(n_k, device=device)[None, :] - torch.arange(n_q, device=device)[:, None]  # j - i
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        dist = rel.abs()
    else:
        dist = (-rel).clamp(min=0)  # how far back the key is
    exact = num_buckets // 2
    far = exact + (
        torch.log(dist.float() / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    ).long()
    far = far.clamp(max=num_buckets - 1)
    return buckets + torch.where(dist < exact, dist, far)


def rope_inv_freq(d_k: int, theta: float = 10000.0, scaling: Optional[dict] = None) -> torch.Tensor:
    """Frequency of each feature pair, theta^(-2j/d_k) (float64), optionally rescaled:

    linear: every frequency / factor (positions interpolated, Chen et al. 2023).
    llama3: wavelengths 2 pi / f longer than original_max_position_embeddings / low_freq_factor
        are divided by factor, those shorter than original / high_freq_factor kept, those
        between interpolated smoothly (Meta's Llama 3.1; as transformers computes it).
    """
    inv_freq = theta ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    if not scaling:
        return inv_freq
    if scaling.get("type") == "proportional":
        return _proportional_inv_freq(inv_freq, d_k, scaling)
    kind, factor = scaling.get("type"), float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, smoothed, scaled)
    if kind == "yarn":
        return _yarn_inv_freq(d_k, theta, scaling)
    raise ValueError(f"unknown RoPE scaling type {kind!r}")


def _proportional_inv_freq(inv_freq: torch.Tensor, d_k: int, scaling: dict) -> torch.Tensor:
    """Proportional partial RoPE (Gemma 4's global layers), as transformers computes it: the
    first int(partial * d_k / 2) pairs keep theta^(-2j/d_k) (over the whole head's d_k, not
    the rotated part's), the others get frequency 0 (angle 0: not rotated), all / factor. In
    the "half" layout pair j is features (j, j + d_k / 2), so the unrotated features lie in
    both halves of the head (unlike rotary_dim's partial RoPE, which rotates a prefix)."""
    rotated = int(float(scaling.get("partial", 1.0)) * d_k // 2)
    out = inv_freq.clone()
    out[rotated:] = 0.0
    return out / float(scaling.get("factor", 1.0))


def _yarn_inv_freq(d_k: int, theta: float, scaling: dict) -> torch.Tensor:
    """YaRN (Peng et al. 2023), as transformers computes it: each pair's frequency blends the
    original (extrapolation) and the one divided by factor (interpolation) by a linear ramp
    between the pairs that turn beta_fast and beta_slow times over the original context."""
    factor = float(scaling["factor"])
    old = float(scaling["original_max_position_embeddings"])
    fast, slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def dim_of(rotations):
        return (d_k * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dim_of(fast), dim_of(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d_k - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d_k // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    base = theta ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    extra = 1 - ramp  # the share of the original frequency
    return (1.0 / (factor * base)) * (1 - extra) + (1.0 / base) * extra


def rope_attention_factor(scaling: Optional[dict]) -> float:
    """The factor YaRN multiplies cos and sin by (1 for every other scaling): attention_factor
    where given, else 0.1 ln(factor) + 1 (1 for factor <= 1)."""
    if not scaling or scaling.get("type") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def rope_angles(n: int, d_k: int, theta: float = 10000.0, offset: int = 0, scaling: Optional[dict] = None) -> torch.Tensor:
    """Rotation angle (radians) of each position and feature pair: n x d_k/2."""
    pos = torch.arange(offset, offset + n, dtype=torch.float64)[:, None]
    inv_freq = rope_inv_freq(d_k, theta, scaling)
    return pos * inv_freq[None, :]


def apply_rope(x: torch.Tensor, angles: torch.Tensor, layout: str = "half") -> torch.Tensor:
    """Rotate feature pairs of x (..., n, d_k) by angles (n, r/2). Partial rotary (r < d_k,
    GPT-NeoX, Phi-3): only the first r features are rotated (their pairs in `layout` among
    those r), the other d_k - r pass unchanged."""
    r = 2 * angles.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], angles, layout), x[..., r:]], dim=-1)
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
