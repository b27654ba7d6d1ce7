"""Multi-head attention, the module: projections, RoPE, grouped-query attention, the KV
cache of greedy decoding and T5's position bias, around the one attention
function of core/net/attention.py.

Recorded names (under "{stack}.{i}.{attn}"): q_pre_rope and k_pre_rope (RoPE), q, k, v,
mask, position_bias (T5), scores, scaled, masked, weights (core/net/attention.py), heads, out.
Under a recorder made with maps=False the fused kernel runs and v, mask, position_bias and
the n_q x n_k steps are not recorded; q and k (after RoPE) are handed to it, and a traced pass
keeps them when they are small (core/api.py), so that reading a layer's weights later costs
only Q K^T and the softmax.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .attention import attention_weights, causal_mask, combine_masks, scaled_dot_product_attention
from .config import ModelConfig
from .positional import apply_rope
from .hooks import point
from .recorder import Rec, records_maps


class MultiHeadAttention(nn.Module):
    """MultiHead(X_q, X_kv) = Concat(head_1..head_H) W_o, head_h = A(X_q W_q^h, X_kv W_k^h, X_kv W_v^h).

    W_q holds the H per-head d x d_k matrices side by side (head h is rows
    h*d_k:(h+1)*d_k of w_q.weight). With n_kv_heads < H, groups of H/n_kv query heads share
    one key/value head (grouped-query attention).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, h, hkv, dk = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        self.h, self.hkv, self.dk = h, hkv, dk
        self.w_q = nn.Linear(d, h * dk, bias=cfg.qkv_bias)
        self.w_k = nn.Linear(d, hkv * dk, bias=cfg.qkv_bias)
        self.w_v = nn.Linear(d, hkv * dk, bias=cfg.qkv_bias)
        self.w_o = nn.Linear(h * dk, d, bias=cfg.bias)
        self.rope_layout = cfg.rope_layout
        self.scale = cfg.attn_scale  # None: 1/sqrt(d_k)

    def weights(self, x_q, x_kv, mask=None, angles=None, is_causal: bool = False, position_bias=None, qk=None):
        """The attention weights alone (B, H, n_q, n_k), as forward's explicit path computes
        them, without values, heads or W_o: what the model view needs of each layer.
        qk: the (q, k) a traced pass kept (after RoPE), instead of projecting x again."""
        if qk is not None:
            q, k = qk
            n_q, n_k = q.shape[2], k.shape[2]
            angles = None
        else:
            b, n_q, _ = x_q.shape
            n_k = x_kv.shape[1]
            q = self.w_q(x_q).view(b, n_q, self.h, self.dk).transpose(1, 2)  # (B, H, n_q, d_k)
            k = self.w_k(x_kv).view(b, n_k, self.hkv, self.dk).transpose(1, 2)  # (B, Hkv, n_k, d_k)
        if angles is not None:
            q = apply_rope(q, angles[n_k - n_q : n_k], self.rope_layout)
            k = apply_rope(k, angles[:n_k], self.rope_layout)
        if mask is None and is_causal:
            mask = causal_mask(n_q, device=q.device, dtype=q.dtype, n_k=n_k)[None, None]
        if position_bias is not None:
            mask = combine_masks(position_bias[:, :, -n_q:], mask)
        if self.hkv != self.h:
            k = k.repeat_interleave(self.h // self.hkv, dim=1)  # (B, H, n_k, d_k)
        return attention_weights(q, k, mask, self.scale)

    def forward(self, x_q, x_kv, mask=None, rec: Rec = None, angles=None, is_causal: bool = False,
                cache: Optional[dict] = None, position_bias=None):
        """mask: additive (broadcast to B, H, n_q, n_k). is_causal: the mask is exactly the
        look-ahead mask (the fused kernel then builds it itself). cache: a dict that keeps this attention's keys and values between calls
        (greedy decoding): new keys/values are appended to the kept ones (self-attention),
        or computed once (cross-attention, flagged by cache["static"]). position_bias: T5's
        relative position bias (1, H, n_q, n_k), added to the scores with the mask."""
        b, n_q, _ = x_q.shape
        q = self.w_q(x_q).view(b, n_q, self.h, self.dk).transpose(1, 2)  # (B, H, n_q, d_k)
        if cache is not None and cache.get("static") and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            n_new = x_kv.shape[1]
            k = self.w_k(x_kv).view(b, n_new, self.hkv, self.dk).transpose(1, 2)  # (B, Hkv, n_new, d_k)
            v = self.w_v(x_kv).view(b, n_new, self.hkv, self.dk).transpose(1, 2)  # (B, Hkv, n_new, d_k)
        n_k = k.shape[2] + (cache["k"].shape[2] if cache is not None and "k" in cache and not cache.get("static") else 0)
        if angles is not None:  # RoPE: self-attention only; angles cover positions 0..n_k-1
            if rec:
                rec("q_pre_rope", q)
                rec("k_pre_rope", k)
            q = apply_rope(q, angles[n_k - n_q : n_k], self.rope_layout)
            if not (cache is not None and cache.get("static") and "k" in cache):
                k = apply_rope(k, angles[n_k - k.shape[2] : n_k], self.rope_layout)
        if cache is not None:
            if cache.get("static"):
                cache["k"], cache["v"] = k, v
            else:
                if "k" in cache:
                    k = torch.cat([cache["k"], k], dim=2)  # (B, Hkv, n_k, d_k)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        explicit = records_maps(rec)
        if rec and not explicit:  # the fused path: q and k for a trace that keeps them (core/api.py)
            rec("q", q)
            rec("k", k)
        if explicit:
            rec("q", q)
            rec("k", k)
            rec("v", v)
            if mask is None and is_causal:
                mask = causal_mask(n_q, device=q.device, dtype=q.dtype, n_k=n_k)[None, None]
            m = mask if mask is not None else q.new_zeros(1, 1, n_q, n_k)
            rec("mask", m.expand(b, 1, n_q, n_k)[:, 0])
        if self.hkv != self.h:
            k = k.repeat_interleave(self.h // self.hkv, dim=1)  # (B, H, n_k, d_k)
            v = v.repeat_interleave(self.h // self.hkv, dim=1)
        if position_bias is not None:  # T5: scores + bias + mask; "masked" records all three
            if explicit:
                rec("position_bias", position_bias[:, :, -n_q:])  # (1, H, n_q, n_k)
            if is_causal and mask is None:
                mask = causal_mask(n_q, device=q.device, dtype=q.dtype, n_k=n_k)[None, None]
            mask, is_causal = combine_masks(position_bias[:, :, -n_q:], mask), False
        heads = scaled_dot_product_attention(q, k, v, mask, rec if explicit else None, self.scale,
                                             is_causal=is_causal)  # (B, H, n_q, d_k)
        heads = point(rec, "heads", heads)  # hook point: head ablation and patching act here
        concat = heads.transpose(1, 2).reshape(b, n_q, self.h * self.dk)  # (B, n_q, H*d_k)
        out = self.w_o(concat)  # (B, n_q, d)
        return point(rec, "out", out)
