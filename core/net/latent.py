"""Multi-head latent attention (DeepSeek V2/V3) and its sparse selection (DeepSeek V3.2), as
transformers' eager code computes them, around the one attention function of
core/net/attention.py (ModelConfig.mla).

    queries   q = x W_q, or q = RMSNorm(x W_qa) W_qb (q_lora_rank): per head [q_nope | q_rope]
    latent    [c | k_rope] = x W_kva; c = RMSNorm(c) (n x r, kv_lora_rank): with k_rope (one
              for every head) all that the KV cache holds, (r + d_rope) numbers a position
    keys      [k_nope | v] = c W_kvb per head; k = [k_nope | k_rope], v per head (d_v)
    RoPE      on q_rope and k_rope only: DeepSeek's pairs (x0, x1), (x2, x3), ... each turned
              by one frequency, the result laid out as halves (transformers' interleaved
              rotation); YaRN's attention factor m multiplies the rotated features (cos and
              sin times m there), and mscale_all_dim's square is in the scale (attn_scale)
    attention softmax(q k^T scale + M) v, then Concat(heads) W_o
A layer without positions (cfg.positional "none": Kimi Linear's latent layers) turns nothing:
q_rope and k_rope enter q and k as projected (the angles are None), the scale (d_nope + d_rope)^-1/2.

The sparse selection (V3.2's lightning indexer) picks, for each query, the top-k keys by
    I[s, t] = sum_h w[s, h] H_I^-1/2 relu(q_I[s, h] . k_I[t] d_I^-1/2)
with q_I = c_q W_I (c_q = RMSNorm(x W_qa), the compressed query), k_I = LayerNorm(x W_Ik),
w = x W_Iw, RoPE (halves layout, no interleave) on the first d_rope features of q_I and k_I;
the causal mask added before the choice. Attention then runs over the selected keys alone:
the others are masked (-inf), so `.weights` are exactly 0 off the selection. transformers'
torch code skips the reference's Hadamard rotation (orthogonal: q . k unchanged) and FP8
scoring; so does this.

Recorded (under "{stack}.{i}.self_attn"): latent (n x r, RMSNorm applied: what the cache
keeps), index_scores (n_q x n_k, the indexer's scores with the causal mask) and selected
(n_q x n_k bool: the keys kept) where there is a selection, then the usual q, k (after RoPE,
d_nope + d_rope per head), v (H x n x d_v), mask (the selection folded in), scores, scaled,
masked, weights, value_norms, heads, out. The cache keeps `latent`, `k_rope` (and the
indexer's keys `index_k`) per position, never per-head keys and values.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import additive, attention_weights, causal_mask, combine_masks, forbidden, scaled_dot_product_attention
from .config import ModelConfig
from .hooks import point
from .linear import Linear
from .multihead import MultiHeadAttention
from .norms import RMSNorm
from .positional import apply_rope, rope_attention_factor
from .recorder import Rec, records_maps

LATENT_EPS = 1e-6  # transformers' q_a_layernorm and kv_a_layernorm keep the norm's default eps


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...): DeepSeek's pairs laid out as halves,
    so that the halves rotation turns each pair (x_2i, x_2i+1) by frequency i."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


class LatentAttention(MultiHeadAttention):
    """MLA: keys and values rebuilt per head from a small latent per position (module docstring).
    d_k (self.dk) is v's per-head size, what W_o reads; q and k have d_nope + d_rope (self.dqk)."""

    def __init__(self, cfg: ModelConfig, index: int = 0, self_attn: bool = True):
        nn.Module.__init__(self)
        m = cfg.mla
        d, h = cfg.d_model, cfg.n_heads
        self.h = self.hkv = h
        self.r, self.rq = int(m["kv_lora_rank"]), m.get("q_lora_rank")
        self.d_nope, self.d_rope, self.dk = int(m["qk_nope_head_dim"]), int(m["qk_rope_head_dim"]), int(m["v_head_dim"])
        self.dqk = self.d_nope + self.d_rope
        self.interleave = bool(m.get("rope_interleave", True))
        bias = cfg.qkv_bias
        if self.rq is None:
            self.w_q = Linear(d, h * self.dqk, bias=False)
        else:
            self.w_qa = Linear(d, int(self.rq), bias=bias)
            self.q_a_norm = RMSNorm(int(self.rq), LATENT_EPS)
            self.w_qb = Linear(int(self.rq), h * self.dqk, bias=False)
        self.w_kva = Linear(d, self.r + self.d_rope, bias=bias)
        self.kv_a_norm = RMSNorm(self.r, LATENT_EPS)
        self.w_kvb = Linear(self.r, h * (self.d_nope + self.dk), bias=False)
        self.w_o = Linear(h * self.dk, d, bias=bias)  # attention_bias: q_a, kv_a and o carry biases
        self.scale = cfg.attn_scale if cfg.attn_scale is not None else self.dqk ** -0.5
        self.factor = rope_attention_factor(cfg.rope_scaling)  # YaRN's m on cos and sin
        self.softcap, self.sinks, self.temperature, self.qk_norm = None, None, None, None
        self.q_norm = self.k_norm = None
        self.index, self.kv_source, self.v_norm = index, None, None  # no keys of another layer, no v-norm
        self.w_gate = None  # no output gate
        self.rope_layout = "half"
        sel = m.get("index")
        self.topk = None
        if sel is not None:  # V3.2's lightning indexer
            self.topk, self.ih, self.idk = int(sel["topk"]), int(sel["heads"]), int(sel["head_dim"])
            self.idx_wq = Linear(int(self.rq), self.ih * self.idk, bias=False)
            self.idx_wk = Linear(d, self.idk, bias=False)
            self.idx_k_norm = nn.LayerNorm(self.idk, eps=1e-6)
            self.idx_w = Linear(d, self.ih, bias=False)

    @property
    def k_is_v(self) -> bool:
        """Keys and values both come from the latent, through their own columns of W_kvb."""
        return False

    @property
    def needs_input(self) -> bool:
        """A sparse selection is read from the layer's input (the indexer), not from q and k."""
        return self.topk is not None

    # ------------------------------------------------------------------ the pieces
    def _rotate(self, t: torch.Tensor, angles, interleave: bool) -> torch.Tensor:
        if interleave:
            t = deinterleave(t)
        t = apply_rope(t, angles, "half")
        return t * self.factor if self.factor != 1.0 else t

    def _q_latent(self, x):
        """The compressed query RMSNorm(x W_qa) (B, n, r_q), or None without q_lora_rank."""
        return None if self.rq is None else self.q_a_norm(self.w_qa(x))

    def _queries(self, x, cq, angles):
        """Every head's q (B, H, n, d_nope + d_rope), its rope part rotated by `angles` (n rows)."""
        b, n, _ = x.shape
        q = (self.w_q(x) if cq is None else self.w_qb(cq)).view(b, n, self.h, self.dqk).transpose(1, 2)
        if angles is None:
            return q
        return torch.cat([q[..., :self.d_nope], self._rotate(q[..., self.d_nope:], angles, self.interleave)], dim=-1)

    def _latent(self, x, angles):
        """(latent (B, n, r), k_rope (B, 1, n, d_rope) rotated by `angles`)."""
        b, n, _ = x.shape
        c, k_rope = torch.split(self.w_kva(x), [self.r, self.d_rope], dim=-1)
        k_rope = k_rope.view(b, 1, n, self.d_rope)
        if angles is not None:
            k_rope = self._rotate(k_rope, angles, self.interleave)
        return self.kv_a_norm(c), k_rope

    def expand(self, latent, k_rope):
        """Per-head k (B, H, n, d_nope + d_rope) and v (B, H, n, d_v) from the latent (B, n, r)
        and the shared rotated key (B, 1, n, d_rope)."""
        b, n, _ = latent.shape
        kv = self.w_kvb(latent).view(b, n, self.h, self.d_nope + self.dk).transpose(1, 2)
        k = torch.cat([kv[..., :self.d_nope], k_rope.expand(b, self.h, n, self.d_rope)], dim=-1)
        return k, kv[..., self.d_nope:]

    def _index_keys(self, x, angles):
        """The indexer's keys (B, n, d_I): LayerNorm(x W_Ik), the first d_rope features rotated (halves)."""
        k = self.idx_k_norm(self.idx_wk(x))
        if angles is None:
            return k
        return torch.cat([self._rotate(k[..., :self.d_rope], angles, False), k[..., self.d_rope:]], dim=-1)

    def index_scores(self, x, cq, angles, keys, off=None):
        """The indexer's scores (B, n_q, n_k) of queries x (B, n_q, d) (cq: their compressed
        query) against its keys (B, n_k, d_I); off (…, n_q, n_k) True: forbidden (-inf)."""
        b, n, _ = x.shape
        q = self.idx_wq(cq).view(b, n, self.ih, self.idk).transpose(1, 2)  # (B, H_I, n_q, d_I)
        if angles is not None:
            q = torch.cat([self._rotate(q[..., :self.d_rope], angles, False), q[..., self.d_rope:]], dim=-1)
        s = F.relu(torch.einsum("bhsd,btd->bsht", q, keys) * self.idk ** -0.5)  # (B, n_q, H_I, n_k)
        w = self.idx_w(x) * self.ih ** -0.5  # (B, n_q, H_I)
        scores = torch.einsum("bsh,bsht->bst", w, s)
        return scores if off is None else scores.masked_fill(off, float("-inf"))

    def select(self, scores):
        """(B, n_q, n_k) bool: the top-k keys of each query's row of index scores, minus the
        cells the mask already forbids (-inf: fewer than k keys visible)."""
        k = min(self.topk, scores.shape[-1])
        top = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, scores.topk(k, dim=-1).indices, True)
        return top & torch.isfinite(scores)

    def _qk(self, y, angles, p0: int = 0):
        """q and k (B, H, n, d_qk) of y (B, n, d) at positions p0.. with no cache."""
        n = y.shape[1]
        a = None if angles is None else angles[p0:p0 + n]
        latent, k_rope = self._latent(y, a)
        k, _ = self.expand(latent, k_rope)
        return self._queries(y, self._q_latent(y), a), k

    def _selection_mask(self, y, angles, mask, is_causal: bool):
        """The additive mask with the sparse selection folded in, for y (B, n, d) alone (no cache)."""
        n = y.shape[1]
        pos = torch.arange(n, device=y.device)
        a = None if angles is None else angles[:n]
        off = forbidden(pos, pos, causal=True)
        scores = self.index_scores(y, self._q_latent(y), a, self._index_keys(y, a), off)
        if mask is not None:
            scores = scores + mask[:, 0]
        sel = self.select(scores)
        own = mask if mask is not None else causal_mask(n, device=y.device, dtype=y.dtype)[None, None]
        return combine_masks(own, additive(~sel, y.dtype)[:, None])

    # ------------------------------------------------------------------ what the other paths read
    def head_proj(self, x, which: str, h: int, angles=None):
        """One head's q or k (n, d_qk) of x (n, d), as forward computes that head's slice: the
        compressed query or the latent (small: r_q or r numbers a position) and this head's rows
        of W_qb (W_q) or of W_kvb's key part; the rotated key is every head's."""
        a = None if angles is None else angles[:x.shape[-2]]
        if which == "q":
            cq = self._q_latent(x)
            lin, src = (self.w_q, x) if cq is None else (self.w_qb, cq)
            t = lin.rows(src, h * self.dqk, (h + 1) * self.dqk)
            if a is None:
                return t
            return torch.cat([t[..., :self.d_nope], self._rotate(t[..., self.d_nope:], a, self.interleave)], dim=-1)
        latent, k_rope = self._latent(x[None], a)
        r0 = h * (self.d_nope + self.dk)
        return torch.cat([self.w_kvb.rows(latent[0], r0, r0 + self.d_nope), k_rope[0, 0]], dim=-1)

    def qkv(self, x, angles=None, v_rows: Optional[int] = None):
        """Every head's q, k (B, H, n, d_qk) and v (B, H, n, d_v) of x with no cache."""
        n = x.shape[1]
        a = None if angles is None else angles[:n]
        latent, k_rope = self._latent(x, a)
        k, v = self.expand(latent, k_rope)
        m = n if v_rows is None else min(n, v_rows)
        return self._queries(x, self._q_latent(x), a), k, (v[:, :, :m] if m else None)

    def weights(self, x_q, x_kv, mask=None, angles=None, is_causal: bool = False, position_bias=None, qk=None):
        """The attention weights alone (B, H, n_q, n_k), as forward's explicit path computes them
        (a self-attention with no cache; the selection from x_q where there is one)."""
        if qk is not None:
            q, k = qk
        else:
            q, k = self._qk(x_q, angles)
        n_q, n_k = q.shape[2], k.shape[2]
        if self.topk is not None:
            mask = self._selection_mask(x_q, angles, mask, is_causal)
        elif mask is None and is_causal:
            mask = causal_mask(n_q, device=q.device, dtype=q.dtype, n_k=n_k)[None, None]
        return attention_weights(q, k, mask, self.scale)

    def value_norms(self, x_q, x_kv, mask=None, angles=None, is_causal: bool = False, position_bias=None,
                    qkv=None):
        if qkv is not None:
            w = self.weights(x_q, None, mask, angles, is_causal, qk=qkv[:2])
            v = qkv[2]
        else:
            w = self.weights(x_q, x_kv, mask, angles, is_causal)
            v = self.qkv(x_kv, angles)[2]
        return w.mul_(self.value_sizes(v)[:, :, None, :])

    def cache_prefix(self, cache: dict, s: int, batch: int) -> dict:
        """The cache (latent, shared rotated key, indexer keys) cut to its first s positions and
        repeated over `batch` runs."""
        out = {"static": False, "latent": cache["latent"][:, :s].expand(batch, -1, -1),
               "k_rope": cache["k_rope"][:, :, :s].expand(batch, -1, -1, -1)}
        if "index_k" in cache:
            out["index_k"] = cache["index_k"][:, :s].expand(batch, -1, -1)
        return out

    # ------------------------------------------------------------------ the pass
    def forward(self, x_q, x_kv, mask=None, rec: Rec = None, angles=None, is_causal: bool = False,
                cache: Optional[dict] = None, position_bias=None):
        """Self-attention of x_q (B, n_q, d) (x_kv is x_q). cache: a dict that keeps the latent,
        the shared rotated key (and the indexer's keys) of earlier positions between calls."""
        if position_bias is not None:
            raise ValueError("multi-head latent attention takes no relative position bias")
        b, n_q, _ = x_q.shape
        explicit = records_maps(rec)
        n_past = 0 if cache is None or "latent" not in cache else cache["latent"].shape[1]
        n_k = n_past + n_q
        n_pos = n_k + (cache.get("dropped", 0) if cache is not None else 0)
        a = None if angles is None else angles[n_pos - n_q:n_pos]
        cq = self._q_latent(x_q)
        latent, k_rope = self._latent(x_q, a)
        index_k = self._index_keys(x_q, a) if self.topk is not None else None
        if cache is not None:
            if "latent" in cache:
                latent = torch.cat([cache["latent"], latent], dim=1)
                k_rope = torch.cat([cache["k_rope"], k_rope], dim=2)
                if index_k is not None:
                    index_k = torch.cat([cache["index_k"], index_k], dim=1)
            cache["latent"], cache["k_rope"] = latent, k_rope
            if index_k is not None:
                cache["index_k"] = index_k
        if rec:
            rec("latent", latent)
        q = self._queries(x_q, cq, a)
        k, v = self.expand(latent, k_rope)
        if self.topk is not None:  # the selection: the indexer's top-k keys under the layer's own mask
            q_pos = torch.arange(n_k - n_q, n_k, device=x_q.device)
            off = forbidden(q_pos, torch.arange(n_k, device=x_q.device), causal=True)
            scores = self.index_scores(x_q, cq, a, index_k, off)
            if mask is not None:
                scores = scores + mask[:, 0]
            sel = self.select(scores)
            if rec:
                rec("index_scores", scores)
                rec("selected", sel)
            if mask is None:
                mask = causal_mask(n_q, device=q.device, dtype=q.dtype, n_k=n_k)[None, None]
            mask, is_causal = combine_masks(mask, additive(~sel, q.dtype)[:, None]), False
        q = point(rec, "q", q)
        k = point(rec, "k", k)
        v = point(rec, "v", v)
        if explicit:
            if mask is None and is_causal:
                mask = causal_mask(n_q, device=q.device, dtype=q.dtype, n_k=n_k)[None, None]
            m = mask if mask is not None else q.new_zeros(1, 1, n_q, n_k)
            rec("mask", m.expand(b, 1, n_q, n_k)[:, 0])
        seen = {}
        record = None
        if explicit:
            def record(name, t, batched=True):
                if name == "weights":
                    seen["weights"] = t
                rec(name, t, batched)
        heads = scaled_dot_product_attention(q, k, v, mask, record, self.scale, is_causal=is_causal)  # (B, H, n_q, d_v)
        if explicit:
            rec("value_norms", seen["weights"] * self.value_sizes(v)[:, :, None, :])
        heads = point(rec, "heads", heads)
        out = self.w_o(heads.transpose(1, 2).reshape(b, n_q, self.h * self.dk))
        return point(rec, "out", out)
