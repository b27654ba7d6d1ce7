"""The transformer of the lecture notes, configurable to the pretrained variants.

Post-norm block (seed 001 / 003, and torch.nn.Transformer's default):
    u = LayerNorm(x + MultiHead(x))
    z = LayerNorm(u + W_2^T ReLU(W_1^T u))
Pre-norm (Llama, many later models):
    u = x + MultiHead(Norm(x));  z = u + FFN(Norm(u))

Every intermediate passes through a named recording point. Recording is opt-in: with
`rec=None` (the default) nothing is kept and attention takes the fused kernel. Names are
the Trace contract of DESIGN.md; a Recorder keeps batch item 0 (traces are unbatched).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import causal_mask, combine_masks, padding_mask, scaled_dot_product_attention
from .config import ModelConfig
from .positional import apply_rope, relative_buckets, rope_angles, sinusoidal_encoding
from .trace import Derived

Rec = Optional[Callable[[str, torch.Tensor], None]]


class Recorder:
    """Collects named tensors during a forward pass.

    By default it keeps batch item 0, detached (a Trace is unbatched). `names` keeps only
    the names asked for; `whole_batch=True, detach=False` keeps the full tensors with
    their gradients (used by training to supervise one attention head).

    With `lazy` (the default, when neither `names` nor `whole_batch` is given) attention
    does not hand over scores / scaled / masked (nor an all-zero mask) but says how to
    derive them from q, k and mask (`derive`; the recipes land in `derived`): the Trace
    computes them on access, bit for bit as the forward pass did (see core/trace.py).
    `entries()` gives tensors and recipes together, in recording order, for a Trace.
    `lazy=False` keeps every tensor, as before.
    """

    def __init__(self, names=None, whole_batch: bool = False, detach: bool = True, lazy: bool = True):
        self.tensors: Dict[str, torch.Tensor] = {}
        self.derived: Dict[str, Derived] = {}
        self._order: Dict[str, None] = {}
        self.names = None if names is None else set(names)
        self.whole_batch = whole_batch
        self.detach = detach
        self.lazy = bool(lazy) and names is None and not whole_batch

    def __call__(self, name: str, t: torch.Tensor, batched: bool = True) -> None:
        if self.names is not None and name not in self.names:
            return
        if batched and not self.whole_batch:
            t = t[0]
        self.tensors[name] = t.detach() if self.detach and t.requires_grad else t
        self.derived.pop(name, None)
        self._order[name] = None

    @property
    def derive(self) -> Optional[Callable[..., None]]:
        """derive(name, op, *args): record `name` as a core.trace.Derived recipe; None unless lazy."""
        return self._derive if self.lazy else None

    def _derive(self, name: str, op: str, *args) -> None:
        self.derived[name] = Derived(op, *args)
        self.tensors.pop(name, None)
        self._order[name] = None

    def entries(self) -> Dict[str, object]:
        """Every recorded name in order: a tensor, or a Derived recipe."""
        return {n: self.tensors[n] if n in self.tensors else self.derived[n] for n in self._order}

    def scope(self, prefix: str) -> "_Scope":
        return _Scope(self, prefix)


class _Scope:
    """A recorder that prefixes names ("encoder.0.self_attn" + "." + name). Its `derive` is
    the root recorder's, with the recipe's name arguments prefixed the same way."""

    __slots__ = ("rec", "prefix")

    def __init__(self, rec, prefix: str):
        self.rec, self.prefix = rec, prefix

    def __call__(self, name: str, t: torch.Tensor, batched: bool = True) -> None:
        self.rec(f"{self.prefix}.{name}", t, batched)

    @property
    def derive(self) -> Optional[Callable[..., None]]:
        parent = getattr(self.rec, "derive", None)
        if parent is None:
            return None
        p = self.prefix
        return lambda name, op, *args: parent(f"{p}.{name}", op, *(f"{p}.{a}" if isinstance(a, str) else a for a in args))


def _sub(rec: Rec, prefix: str) -> Rec:
    if rec is None:
        return None
    if isinstance(rec, _Scope):  # one prefix, one call per record, however deep the nesting
        return _Scope(rec.rec, f"{rec.prefix}.{prefix}")
    return _Scope(rec, prefix)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g (Zhang & Sennrich 2019)."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)  # seed 003 eq. (15)


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
        self.w_q = nn.Linear(d, h * dk, bias=cfg.bias)
        self.w_k = nn.Linear(d, hkv * dk, bias=cfg.bias)
        self.w_v = nn.Linear(d, hkv * dk, bias=cfg.bias)
        self.w_o = nn.Linear(h * dk, d, bias=cfg.bias)
        self.rope_layout = cfg.rope_layout
        self.scale = cfg.attn_scale  # None: 1/sqrt(d_k)

    def forward(self, x_q, x_kv, mask=None, rec: Rec = None, angles=None, position_bias=None):
        b, n_q, _ = x_q.shape
        n_k = x_kv.shape[1]
        q = self.w_q(x_q).view(b, n_q, self.h, self.dk).transpose(1, 2)  # (B, H, n_q, d_k)
        k = self.w_k(x_kv).view(b, n_k, self.hkv, self.dk).transpose(1, 2)  # (B, Hkv, n_k, d_k)
        v = self.w_v(x_kv).view(b, n_k, self.hkv, self.dk).transpose(1, 2)  # (B, Hkv, n_k, d_k)
        if angles is not None:  # RoPE: self-attention only, same positions for q and k
            if rec:
                rec("q_pre_rope", q)
                rec("k_pre_rope", k)
            q = apply_rope(q, angles[-n_q:], self.rope_layout)
            k = apply_rope(k, angles[-n_k:], self.rope_layout)
        if rec:
            rec("q", q)
            rec("k", k)
            rec("v", v)
            derive = getattr(rec, "derive", None)
            if mask is None and derive is not None:  # no mask: zeros on access, nothing kept
                derive("mask", "zeros", (n_q, n_k), q.dtype)
            else:
                m = mask if mask is not None else q.new_zeros(1, 1, n_q, n_k)
                rec("mask", m.expand(b, 1, n_q, n_k)[:, 0])
        if self.hkv != self.h:
            k = k.repeat_interleave(self.h // self.hkv, dim=1)  # (B, H, n_k, d_k)
            v = v.repeat_interleave(self.h // self.hkv, dim=1)
        attn_rec = rec
        if position_bias is not None:  # T5: scores + bias + mask; "masked" records all three
            if rec:
                rec("position_bias", position_bias)  # (1, H, n_q, n_k)
                attn_rec = lambda name, t, batched=True: rec(name, t, batched)  # noqa: E731 (no derive: explicit steps)
            mask = combine_masks(position_bias, mask)
        heads = scaled_dot_product_attention(q, k, v, mask, attn_rec, self.scale)  # (B, H, n_q, d_k)
        concat = heads.transpose(1, 2).reshape(b, n_q, self.h * self.dk)  # (B, n_q, H*d_k)
        out = self.w_o(concat)  # (B, n_q, d)
        if rec:
            rec("heads", heads)
            rec("out", out)
        return out


class FeedForward(nn.Module):
    """FFN(u) = W_2^T act(W_1^T u + b_1) + b_2; SwiGLU: W_2^T (silu(W_1^T u) * W_3^T u);
    GEGLU (T5's gated-gelu): W_2^T (gelu_tanh(W_1^T u) * W_3^T u)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = cfg.activation
        self.w_1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.w_2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        gated = self.act in ("swiglu", "geglu_tanh")
        self.w_3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias) if gated else None

    def forward(self, x, rec: Rec = None):
        a = self.w_1(x)  # (B, n, m)
        if self.act == "relu":
            hidden = F.relu(a)
        elif self.act == "gelu":
            hidden = F.gelu(a)
        elif self.act == "gelu_tanh":
            hidden = F.gelu(a, approximate="tanh")
        elif self.act == "silu":
            hidden = F.silu(a)
        elif self.act == "geglu_tanh":
            hidden = F.gelu(a, approximate="tanh") * self.w_3(x)
        else:
            hidden = F.silu(a) * self.w_3(x)
        out = self.w_2(hidden)  # (B, n, d)
        if rec:
            rec("hidden", hidden)
            rec("out", out)
        return out


class Layer(nn.Module):
    """One encoder or decoder layer: self-attention, [cross-attention], FFN, each wrapped
    in residual + norm. Trace names residual{j}/norm{j} number the sub-layers in order."""

    def __init__(self, cfg: ModelConfig, cross: bool):
        super().__init__()
        self.pre = cfg.norm_placement == "pre"
        self.self_attn = MultiHeadAttention(cfg)
        self.cross_attn = MultiHeadAttention(cfg) if cross else None
        self.ffn = FeedForward(cfg)
        self.norms = nn.ModuleList(make_norm(cfg) for _ in range(3 if cross else 2))

    def forward(self, x, self_mask=None, memory=None, cross_mask=None, rec: Rec = None, angles=None,
                position_bias=None):
        subs = [("self_attn", lambda y: self.self_attn(y, y, self_mask, _sub(rec, "self_attn"), angles, position_bias))]
        if self.cross_attn is not None:
            subs.append(("cross_attn", lambda y: self.cross_attn(y, memory, cross_mask, _sub(rec, "cross_attn"))))
        subs.append(("ffn", lambda y: self.ffn(y, _sub(rec, "ffn"))))
        for j, ((_, fn), norm) in enumerate(zip(subs, self.norms), start=1):
            if self.pre:  # u = x + f(Norm(x))
                normed = norm(x)
                if rec:
                    rec(f"norm{j}", normed)
                x = x + fn(normed)
                if rec:
                    rec(f"residual{j}", x)
            else:  # u = Norm(x + f(x))
                res = x + fn(x)
                x = norm(res)
                if rec:
                    rec(f"residual{j}", res)
                    rec(f"norm{j}", x)
        if rec:
            rec("out", x)
        return x


class Embedding(nn.Module):
    """Token embedding (times sqrt(d) if configured) + positions [+ token types] [-> LayerNorm]."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.scale = math.sqrt(cfg.d_model) if cfg.embed_scale else 1.0
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model) if cfg.positional == "learned" else None
        if cfg.positional == "sinusoidal":
            pe = sinusoidal_encoding(cfg.max_len, cfg.d_model, layout=cfg.sinusoid_layout)
            self.register_buffer("pe", pe, persistent=False)
        self.types = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.embed_norm else None

    def forward(self, ids, rec: Rec = None, offset: int = 0, token_types=None):
        n = ids.shape[1]
        x = self.tok(ids) * self.scale  # (B, n, d)
        if rec:
            rec("tokens", x)
        if self.cfg.positional in ("sinusoidal", "learned"):
            if self.pos is not None:
                p = self.pos.weight[offset : offset + n]
            else:
                p = self.pe[offset : offset + n].to(x.dtype)
            x = x + p  # X = X' + P (seed 003 eq. 6)
            if rec:
                rec("positions", p, batched=False)
        if self.types is not None:
            tt = token_types if token_types is not None else torch.zeros_like(ids)
            t = self.types(tt)
            x = x + t
            if rec:
                rec("types", t)
        if self.norm is not None:
            if rec:
                rec("presum_norm", x)
            x = self.norm(x)
        if rec:
            rec("sum", x)
        return x


class RelativePositionBias(nn.Module):
    """T5's position bias: one learned scalar per head and distance bucket, H x n_q x n_k."""

    def __init__(self, cfg: ModelConfig, bidirectional: bool):
        super().__init__()
        self.bidirectional = bidirectional
        self.num_buckets, self.max_distance = cfg.rel_buckets, cfg.rel_max_distance
        self.emb = nn.Embedding(cfg.rel_buckets, cfg.n_heads)

    def forward(self, n_q: int, n_k: int):
        b = relative_buckets(n_q, n_k, self.bidirectional, self.num_buckets, self.max_distance, self.emb.weight.device)
        return self.emb(b).permute(2, 0, 1)[None]  # (1, H, n_q, n_k)


class Transformer(nn.Module):
    """Encoder-decoder, encoder-only or decoder-only stack, per ModelConfig.kind."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.has_encoder:
            self.src_embed = Embedding(cfg, cfg.src_vocab_size)
            self.encoder = nn.ModuleList(Layer(cfg, cross=False) for _ in range(cfg.n_layers))
            self.encoder_norm = make_norm(cfg) if cfg.final_norm else None
            if cfg.positional == "relative":
                self.encoder_bias = RelativePositionBias(cfg, bidirectional=True)
        if cfg.has_decoder:
            cross = cfg.kind == "encoder-decoder"
            n_dec = cfg.n_decoder_layers if cross else cfg.n_layers
            self.tgt_embed = Embedding(cfg, cfg.tgt_vocab_size)
            self.decoder = nn.ModuleList(Layer(cfg, cross=cross) for _ in range(n_dec))
            self.decoder_norm = make_norm(cfg) if cfg.final_norm else None
            if cfg.positional == "relative":
                self.decoder_bias = RelativePositionBias(cfg, bidirectional=False)
            out_bias = cfg.bias and not cfg.tie_embeddings if cfg.out_bias is None else cfg.out_bias
            self.out_proj = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=out_bias)
            if cfg.tie_embeddings:
                self.out_proj.weight = self.tgt_embed.tok.weight

    def _angles(self, n: int, offset: int = 0, device=None):
        if self.cfg.positional != "rope":
            return None
        a = rope_angles(n, self.cfg.d_head, self.cfg.rope_theta, offset)
        return a.to(device=device, dtype=torch.float32)

    def encode(self, src, src_pad=None, rec: Rec = None, token_types=None):
        """src (B, n) ids, src_pad (B, n) bool (True = padding). Returns memory (B, n, d)."""
        n = src.shape[1]
        x = self.src_embed(src, _sub(rec, "embed.encoder"), token_types=token_types)
        mask = None if src_pad is None else padding_mask(src_pad, n, x.dtype)[:, None]  # (B, 1, n, n)
        angles = self._angles(n, device=src.device)
        bias = self.encoder_bias(n, n) if self.cfg.positional == "relative" else None
        for i, layer in enumerate(self.encoder):
            x = layer(x, self_mask=mask, rec=_sub(rec, f"encoder.{i}"), angles=angles, position_bias=bias)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
            if rec:
                rec("encoder.final_norm", x)
        return x

    def decode(self, tgt, memory=None, src_pad=None, tgt_pad=None, rec: Rec = None):
        """tgt (B, t) decoder input ids (<start> y_1 ...). Returns hidden states (B, t, d)."""
        t = tgt.shape[1]
        x = self.tgt_embed(tgt, _sub(rec, "embed.decoder"))
        self_mask = causal_mask(t, device=tgt.device, dtype=x.dtype)[None, None]  # (1, 1, t, t)
        if tgt_pad is not None:
            self_mask = combine_masks(self_mask, padding_mask(tgt_pad, t, x.dtype)[:, None])
        cross_mask = None
        if memory is not None and src_pad is not None:
            cross_mask = padding_mask(src_pad, t, x.dtype)[:, None]  # (B, 1, t, n)
        angles = self._angles(t, device=tgt.device)
        bias = self.decoder_bias(t, t) if self.cfg.positional == "relative" else None
        for i, layer in enumerate(self.decoder):
            x = layer(x, self_mask, memory, cross_mask, rec=_sub(rec, f"decoder.{i}"), angles=angles,
                      position_bias=bias)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
            if rec:
                rec("decoder.final_norm", x)
        return x

    def project(self, hidden, rec: Rec = None):
        if self.cfg.logit_scale != 1.0:  # T5 with tied embeddings
            hidden = hidden * self.cfg.logit_scale
        logits = self.out_proj(hidden)  # (B, t, V)
        if rec:
            rec("logits", logits)
            derive = getattr(rec, "derive", None)
            if derive is not None:  # n x V twice would be the largest part of a decoder trace
                derive("probs", "softmax", "logits")
            else:
                rec("probs", torch.softmax(logits, dim=-1))
        return logits

    def forward(self, src=None, tgt=None, src_pad=None, tgt_pad=None, rec: Rec = None, token_types=None):
        """Encoder-decoder: logits for tgt given src. Encoder-only: final hidden states.
        Decoder-only: logits for tgt."""
        memory = self.encode(src, src_pad, rec, token_types) if self.cfg.has_encoder else None
        if not self.cfg.has_decoder:
            return memory
        hidden = self.decode(tgt, memory, src_pad, tgt_pad, rec)
        return self.project(hidden, rec)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
