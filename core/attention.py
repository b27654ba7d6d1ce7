"""Scaled dot-product attention and its masks: seed 003, equations (10) and (18).

    A(Q, K, V) = softmax(Q K^T / sqrt(d_k) + M) V

Tokens are rows. Masks are additive float matrices: 0 where a query may look at a key,
-inf where it may not, so softmax gives those keys a weight of exactly 0.

One function serves every model in the project. With a recorder it computes each step
explicitly and hands every intermediate to the recorder; without one it takes PyTorch's
fused kernel, which computes the same thing without keeping the n x n matrices.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F

Recorder = Callable[[str, torch.Tensor], None]

NEG_INF = float("-inf")


def causal_mask(n: int, device=None, dtype=torch.float32, n_k: Optional[int] = None) -> torch.Tensor:
    """Look-ahead mask M (seed 002) / B (seed 003): 0 on and below the diagonal, -inf above.

    With n_k > n the queries are the last n of n_k positions (a prefix is already known).
    """
    n_k = n if n_k is None else n_k
    q_pos = torch.arange(n_k - n, n_k, device=device)[:, None]  # (n, 1)
    k_pos = torch.arange(n_k, device=device)[None, :]  # (1, n_k)
    mask = torch.zeros(n, n_k, device=device, dtype=dtype)
    return mask.masked_fill(k_pos > q_pos, NEG_INF)


def padding_mask(key_is_pad: torch.Tensor, n_q: int, dtype=torch.float32) -> torch.Tensor:
    """Additive mask from a boolean key-padding vector.

    key_is_pad: (..., n_k) True at padding positions. Returns (..., n_q, n_k): -inf in the
    columns of padding keys, 0 elsewhere. Padding queries still see the real keys, so no
    row is ever all -inf.
    """
    cols = torch.zeros(key_is_pad.shape, dtype=dtype, device=key_is_pad.device)
    cols = cols.masked_fill(key_is_pad, NEG_INF)
    return cols.unsqueeze(-2).expand(*key_is_pad.shape[:-1], n_q, key_is_pad.shape[-1])


def combine_masks(*masks: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Sum of additive masks (None entries ignored); -inf anywhere stays -inf."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out + m
    return out


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    record: Optional[Recorder] = None,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """softmax(Q K^T * scale + M) V for q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v).

    scale defaults to 1/sqrt(d_k). mask is additive and broadcasts to (..., n_q, n_k).
    With `record`, the steps are recorded as scores, scaled, masked and weights
    (seed 003's Q K^T, F, F + B and S).

    A recorder with a `derive` method (core.model's Recorder, through MultiHeadAttention,
    which has already recorded q, k before any grouped-query repeat, and mask, in the same
    scope) gets only the weights as a tensor; scores, scaled and masked are recorded as
    recipes (q @ k^T, scores * scale, scaled + mask) that the Trace evaluates on access with
    the same operations as here, so they come out bit for bit the same. The forward pass
    then keeps one H x n_q x n_k buffer (scaled and masked in place) instead of three or four.
    """
    d_k = q.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    if record is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = q @ k.transpose(-2, -1)  # (..., n_q, n_k)
    derive = getattr(record, "derive", None)
    if derive is not None and (mask is None or _adds_in_place(scores, mask)):
        logits = scores.mul_(scale)  # in place: the same values as scores * scale
        if mask is not None:
            logits.add_(mask)  # the same values as scaled + mask
        weights = torch.softmax(logits, dim=-1)
        del scores, logits
        derive("scores", "qk", "q", "k")
        derive("scaled", "mul", "scores", scale)
        if mask is None:
            derive("masked", "same", "scaled")
        else:
            derive("masked", "add", "scaled", "mask")
        record("weights", weights)
        return weights @ v  # (..., n_q, d_v)
    scaled = scores * scale
    masked = scaled if mask is None else scaled + mask
    weights = torch.softmax(masked, dim=-1)
    record("scores", scores)
    record("scaled", scaled)
    record("masked", masked)
    record("weights", weights)
    return weights @ v  # (..., n_q, d_v)


def _adds_in_place(scores: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether scores.add_(mask) gives exactly scores + mask (same dtype, no broadcast growth)."""
    try:
        return mask.dtype == scores.dtype and torch.broadcast_shapes(scores.shape, mask.shape) == scores.shape
    except RuntimeError:
        return False
