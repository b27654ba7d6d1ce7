"""Multi-head attention, the module: projections, RoPE, grouped-query attention, the KV
cache of greedy decoding and T5's position bias, around the one attention
function of core/net/attention.py.

Recorded names (under "{stack}.{i}.{attn}"): q_pre_norm and k_pre_norm (QK-norm),
q_pre_rope and k_pre_rope (RoPE), q, k, v, mask, position_bias (T5), scores, scaled, capped
(soft-capping), masked, weights (core/net/attention.py), value_norms, heads, out.
value_norms[h, i, j] = ||a_ij v_j W_o^h|| = a_ij ||v_j W_o^h|| (Kobayashi et al. 2020): the
size of what key j adds to query i's output through head h (v_j of the kv head h reads under
grouped-query attention; W_o^h the d_k rows of W_o that take head h's output).
Under a recorder made with maps=False the fused kernel runs and q_pre_norm, k_pre_norm,
mask, position_bias and the n_q x n_k steps are not recorded; q, k (after RoPE) and v are handed
to it, and a traced pass keeps them when they are small (core/api.py), so that reading a
layer's weights later costs only Q K^T and the softmax (value_norms: and v's sizes).

QK-norm (cfg.qk_norm): "head" normalises each head's q and k over d_k (Gemma 3), "full" the
whole projection (before it is split into heads); both before RoPE. "l2" (Llama 4) is "head"
without a gain, on cfg.qk_norm_layers only; transformers applies it after RoPE, which is the
same map (a rotation keeps each head's norm).
Learned sinks (cfg.attn_sinks, gpt-oss): `sinks` (H), one logit per head in the softmax beside
the keys; recorded `sink` (H x n_q) is its probability, 1 - the row sum of `weights`.
Temperature tuning (cfg.attn_temperature on cfg.nope_layers, Llama 4): the scale varies by
query position (q_scale); recorded `scale` (n_q), and q stays as projected.
An output gate (cfg.attn_gate, Qwen3.5 and Qwen3-Next): `w_gate`, the second part of their q
projection; the heads are multiplied by sigmoid(x_q W_g) (recorded `gate`, H x n_q x d_k)
after the hook point `heads` and before Concat and W_o.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .attention import attention_map, attention_weights, causal_mask, combine_masks, scaled_dot_product_attention
from .config import ModelConfig
from .linear import Linear
from .norms import RMSNorm
from .positional import apply_rope, rope_attention_factor
from .hooks import point
from .recorder import Rec, records_maps


class MultiHeadAttention(nn.Module):
    """MultiHead(X_q, X_kv) = Concat(head_1..head_H) W_o, head_h = A(X_q W_q^h, X_kv W_k^h, X_kv W_v^h).

    W_q holds the H per-head d x d_k matrices side by side (head h is rows
    h*d_k:(h+1)*d_k of w_q.weight). With n_kv_heads < H, groups of H/n_kv query heads share
    one key/value head (grouped-query attention).
    """

    def __init__(self, cfg: ModelConfig, index: int = 0, self_attn: bool = True):
        super().__init__()
        d, h, hkv, dk = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        self.h, self.hkv, self.dk = h, hkv, dk
        self.w_q = Linear(d, h * dk, bias=cfg.qkv_bias)
        self.w_k = Linear(d, hkv * dk, bias=cfg.qkv_bias)
        self.w_v = Linear(d, hkv * dk, bias=cfg.qkv_bias)
        self.w_o = Linear(h * dk, d, bias=cfg.bias)
        # an output gate (Qwen3.5, Qwen3-Next): heads * sigmoid(x_q W_g) before W_o
        self.w_gate = Linear(d, h * dk, bias=cfg.qkv_bias) if cfg.attn_gate and self_attn else None
        self.rope_layout = cfg.rope_layout
        self.scale = cfg.attn_scale  # None: 1/sqrt(d_k)
        factor = rope_attention_factor(cfg.rope_scaling) if cfg.positional == "rope" else 1.0
        if factor != 1.0:  # YaRN scales cos and sin by the factor: q . k by its square
            self.scale = (dk ** -0.5 if self.scale is None else self.scale) * factor * factor
        self.softcap = cfg.attn_softcap
        layers = cfg.qk_norm_layers
        self.qk_norm = cfg.qk_norm if layers is None or index in layers else None
        self.q_norm = self.k_norm = None  # QK-norm's RMSNorms, where the model has them
        if self.qk_norm is not None:
            full = self.qk_norm == "full"
            gain = self.qk_norm != "l2"
            self.q_norm = RMSNorm(h * dk if full else dk, cfg.norm_eps, gain)
            self.k_norm = RMSNorm(hkv * dk if full else dk, cfg.norm_eps, gain)
        # learned sinks (gpt-oss): one logit per head beside the keys in the softmax
        self.sinks = nn.Parameter(torch.zeros(h)) if cfg.attn_sinks and self_attn else None
        nope = cfg.nope_layers is not None and index in cfg.nope_layers
        # Llama 4's temperature tuning: a scale per query position on the layers without positions
        self.temperature = dict(cfg.attn_temperature) if cfg.attn_temperature and nope and self_attn else None

    def sink(self, head: Optional[int] = None):
        """The sink logits as the formula broadcasts them: (1, H, 1, 1), or head `head`'s (1, 1); None without sinks."""
        if self.sinks is None:
            return None
        return self.sinks.view(1, self.h, 1, 1) if head is None else self.sinks[head].view(1, 1)

    def q_scale(self, p0: int, n: int, device=None):
        """The scale on the scores of queries at positions p0..p0+n-1: the attention's scale
        (None: 1/sqrt(d_k)), or with temperature tuning a tensor (n, 1) of
        scale * (1 + a log(1 + floor((p + 1) / f)))."""
        if self.temperature is None:
            return self.scale
        base = self.dk ** -0.5 if self.scale is None else self.scale
        p = torch.arange(p0, p0 + n, device=device, dtype=torch.float32)
        t = torch.log1p(torch.floor((p + 1.0) / float(self.temperature["floor"]))) * float(self.temperature["scale"]) + 1.0
        return (t * base)[:, None]

    def _split(self, lin, norm, x, n_heads: int, rec: Rec = None, name: str = ""):
        """x W (+ b) as (B, heads, n, d_k), QK-norm applied (`norm` None: none); the value
        before the norm is recorded as `name` when rec is given."""
        b, n, _ = x.shape
        y = lin(x)
        heads = y.view(b, n, n_heads, self.dk).transpose(1, 2)
        if norm is None or self.qk_norm is None:
            return heads
        if rec:
            rec(name, heads)
        if self.qk_norm == "full":
            return norm(y).view(b, n, n_heads, self.dk).transpose(1, 2)
        return norm(heads)

    def kv_head(self, h: int) -> int:
        """The key/value head query head h reads (grouped-query: h // (H / H_kv))."""
        return h // (self.h // self.hkv)

    def head_proj(self, x, which: str, h: int, angles=None):
        """One head's q (which="q", query head h) or k (which="k", kv head h) of x (..., n, d):
        (..., n, d_k), as forward computes that head's slice: the projection's d_k columns,
        QK-norm (per head over d_k; "full": over the whole projection, so that one is made),
        RoPE with `angles` (this layer's, positions 0..n-1; None: none). Only this head's
        columns are computed where the norm allows."""
        lin, norm = (self.w_q, getattr(self, "q_norm", None)) if which == "q" else (self.w_k, getattr(self, "k_norm", None))
        dk = self.dk
        if norm is not None and self.qk_norm == "full":
            t = norm(lin(x))[..., h * dk:(h + 1) * dk]
        else:
            t = lin.rows(x, h * dk, (h + 1) * dk)  # these columns of the full projection, bit for bit
            if norm is not None:
                t = norm(t)
        return t if angles is None else apply_rope(t, angles, self.rope_layout)

    def qkv(self, x, angles=None, v_rows: Optional[int] = None):
        """Every head's q (B, H, n, d_k) and k, v (B, Hkv, n, d_k) of x (B, n, d), as forward
        computes them for a self-attention with no cache: projections, QK-norm, RoPE with
        `angles` (positions 0..n-1; None: none); k after RoPE, as a decoder's cache keeps it.
        v_rows: v of the first v_rows positions only (0: no v)."""
        b, n, _ = x.shape
        q = self._split(self.w_q, getattr(self, "q_norm", None), x, self.h)
        k = self._split(self.w_k, getattr(self, "k_norm", None), x, self.hkv)
        if angles is not None:
            q = apply_rope(q, angles[:n], self.rope_layout)
            k = apply_rope(k, angles[:n], self.rope_layout)
        m = n if v_rows is None else min(n, v_rows)
        v = self.w_v(x[:, :m]).view(b, m, self.hkv, self.dk).transpose(1, 2) if m else None
        return q, k, v

    def head_map(self, q, k, mask=None, what: str = "weights", head: Optional[int] = None, row0: int = 0):
        """One head's map `what` (core/net/attention.py's STEPS) for its q rows (n_q, d_k) and k
        (n_k, d_k): this attention's scale and soft-cap, mask additive or boolean (True:
        forbidden); the formula of every other path (attention_map). head: which query head
        (its learned sink, where the model has them); row0: the position of the first q row
        (a scale that varies by position)."""
        return attention_map(q, k, mask, self.q_scale(row0, q.shape[-2], q.device), self.softcap, what,
                             sink=self.sink(head) if head is not None else None)

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
            q = self._split(self.w_q, getattr(self, "q_norm", None), x_q, self.h)  # (B, H, n_q, d_k)
            k = self._split(self.w_k, getattr(self, "k_norm", None), x_kv, self.hkv)  # (B, Hkv, n_k, d_k)
        if angles is not None:
            q = apply_rope(q, angles[n_k - n_q : n_k], self.rope_layout)
            k = apply_rope(k, angles[:n_k], self.rope_layout)
        if mask is None and is_causal:
            mask = causal_mask(n_q, device=q.device, dtype=q.dtype, n_k=n_k)[None, None]
        if position_bias is not None:
            mask = combine_masks(position_bias[:, :, -n_q:], mask)
        if self.hkv != self.h:
            k = k.repeat_interleave(self.h // self.hkv, dim=1)  # (B, H, n_k, d_k)
        return attention_weights(q, k, mask, self.q_scale(n_k - n_q, n_q, q.device), self.softcap, self.sink())

    def _gram(self) -> torch.Tensor:
        """G_h = W_o^h W_o^h^T (H, d_k, d_k) in float64, so that ||v W_o^h||^2 = v G_h v^T costs
        d_k^2 a key instead of d_k d; kept until W_o changes (its storage or version)."""
        w = self.w_o.weight
        key = (w.data_ptr(), w._version, w.device, w.dtype)
        kept = self.__dict__.get("_gram_kept")
        if kept is None or kept[0] != key:
            w_o = w.detach().double().view(w.shape[0], self.h, self.dk)  # (d, H, d_k): W_o^h^T side by side
            self.__dict__["_gram_kept"] = kept = (key, torch.einsum("dhk,dhl->hkl", w_o, w_o))
        return kept[1]

    def value_sizes(self, v: torch.Tensor) -> torch.Tensor:
        """||v_j W_o^h|| for v (B, H or Hkv, n_k, d_k): (B, H, n_k), in v's dtype. A grouped-query
        v (one per kv head) is read by each of its H/Hkv query heads' W_o^h."""
        vd = v.double()
        if v.shape[1] != self.h:
            vd = vd.repeat_interleave(self.h // v.shape[1], dim=1)
        sq = (torch.matmul(vd, self._gram()) * vd).sum(-1)  # v G_h v^T, exact to float64 rounding
        return sq.clamp_min_(0).sqrt_().to(v.dtype)

    def value_norms(self, x_q, x_kv, mask=None, angles=None, is_causal: bool = False, position_bias=None,
                    qkv=None):
        """||a_ij v_j W_o^h|| alone (B, H, n_q, n_k): the weights (as `weights` computes them)
        times the size of each key's transformed value; no heads, no W_o on the heads.
        qkv: the (q, k, v) a traced pass kept, instead of projecting x again."""
        if qkv is not None:
            w = self.weights(None, None, mask, angles, is_causal, position_bias, qk=qkv[:2])
            v = qkv[2]
        else:
            w = self.weights(x_q, x_kv, mask, angles, is_causal, position_bias)
            b, n_k = x_kv.shape[0], x_kv.shape[1]
            v = self.w_v(x_kv).view(b, n_k, self.hkv, self.dk).transpose(1, 2)
        return w.mul_(self.value_sizes(v)[:, :, None, :])

    def forward(self, x_q, x_kv, mask=None, rec: Rec = None, angles=None, is_causal: bool = False,
                cache: Optional[dict] = None, position_bias=None):
        """mask: additive (broadcast to B, H, n_q, n_k). is_causal: the mask is exactly the
        look-ahead mask (the fused kernel then builds it itself). cache: a dict that keeps this attention's keys and values between calls
        (greedy decoding): new keys/values are appended to the kept ones (self-attention),
        or computed once (cross-attention, flagged by cache["static"]). position_bias: T5's
        relative position bias (1, H, n_q, n_k), added to the scores with the mask."""
        b, n_q, _ = x_q.shape
        explicit = records_maps(rec)
        q = self._split(self.w_q, getattr(self, "q_norm", None), x_q, self.h,
                        rec if explicit else None, "q_pre_norm")  # (B, H, n_q, d_k)
        if cache is not None and cache.get("static") and "k" in cache:
            k, v = cache["k"], cache["v"]
        else:
            n_new = x_kv.shape[1]
            k = self._split(self.w_k, getattr(self, "k_norm", None), x_kv, self.hkv,
                            rec if explicit else None, "k_pre_norm")  # (B, Hkv, n_new, d_k)
            v = self.w_v(x_kv).view(b, n_new, self.hkv, self.dk).transpose(1, 2)  # (B, Hkv, n_new, d_k)
        n_k = k.shape[2] + (cache["k"].shape[2] if cache is not None and "k" in cache and not cache.get("static") else 0)
        if angles is not None:  # RoPE: self-attention only; angles cover positions 0..n_pos-1
            if rec:
                rec("q_pre_rope", q)
                rec("k_pre_rope", k)
            # cache["dropped"]: earlier keys a caller removed from the cache (a KV-cache policy,
            # core/analysis/evict.py): the new positions run that far past the kept keys
            n_pos = n_k + (cache.get("dropped", 0) if cache is not None else 0)
            q = apply_rope(q, angles[n_pos - n_q : n_pos], self.rope_layout)
            if not (cache is not None and cache.get("static") and "k" in cache):
                k = apply_rope(k, angles[n_pos - k.shape[2] : n_pos], self.rope_layout)
        if cache is not None:
            if cache.get("static"):
                cache["k"], cache["v"] = k, v
            else:
                if "k" in cache:
                    k = torch.cat([cache["k"], k], dim=2)  # (B, Hkv, n_k, d_k)
                    v = torch.cat([cache["v"], v], dim=2)
                cache["k"], cache["v"] = k, v
        explicit = records_maps(rec)
        # q, k, v (after RoPE; k and v with any cached positions): recorded (the fused path too, for a
        # trace that keeps them, core/api.py) and hook points (path patching replaces one head's)
        q = point(rec, "q", q)
        k = point(rec, "k", k)
        v = point(rec, "v", v)
        if explicit:
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
        scale = self.scale
        if self.temperature is not None:  # a scale per query position (Llama 4's temperature tuning)
            n_pos = n_k + (cache.get("dropped", 0) if cache is not None else 0)
            scale = self.q_scale(n_pos - n_q, n_q, q.device)
            if explicit:
                rec("scale", scale[:, 0], False)
        opts = {} if self.softcap is None else {"softcap": self.softcap}  # only where a cap is set
        if self.sinks is not None:
            opts["sink"] = self.sink()
        seen = {}
        record = None
        if explicit:
            def record(name, t, batched=True):
                if name == "weights":
                    seen["weights"] = t
                rec(name, t, batched)
        heads = scaled_dot_product_attention(q, k, v, mask, record, scale,
                                             is_causal=is_causal, **opts)  # (B, H, n_q, d_k)
        if explicit:  # what each key adds, ||a_ij v_j W_o^h|| (computed from the same weights)
            rec("value_norms", seen["weights"] * self.value_sizes(v)[:, :, None, :])
        heads = point(rec, "heads", heads)  # hook point: head ablation and patching act here
        if self.w_gate is not None:  # the output gate, per head and feature
            gate = torch.sigmoid(self.w_gate(x_q)).view(b, n_q, self.h, self.dk).transpose(1, 2)
            if rec:
                rec("gate", gate)
            heads = heads * gate
        concat = heads.transpose(1, 2).reshape(b, n_q, self.h * self.dk)  # (B, n_q, H*d_k)
        out = self.w_o(concat)  # (B, n_q, d)
        return point(rec, "out", out)
