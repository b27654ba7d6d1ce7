"""The transformer of the lecture notes, configurable to the pretrained variants.

Post-norm block (seed 001 / 003, and torch.nn.Transformer's default):
    u = LayerNorm(x + MultiHead(x))
    z = LayerNorm(u + W_2^T ReLU(W_1^T u))
Pre-norm (Llama, many later models):
    u = x + MultiHead(Norm(x));  z = u + FFN(Norm(u))

Every intermediate passes through a named recording point. Recording is opt-in: with
`rec=None` (the default) nothing is kept and attention takes the fused kernel. Names are
the Trace contract of docs/design.md; a Recorder keeps batch item 0 (traces are unbatched).
`run_layer` runs one layer on its stored input: how a trace computes a layer's inside
when it is looked at (core/trace.py).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import attention_weights, causal_mask, combine_masks, padding_mask, scaled_dot_product_attention
from .config import ModelConfig
from .positional import apply_rope, relative_buckets, rope_angles, sinusoidal_encoding

Rec = Optional[Callable[[str, torch.Tensor], None]]
ATTENTION_KINDS = ("self_attn", "cross_attn")


class Recorder:
    """Collects named tensors during a forward pass.

    By default it keeps batch item 0, detached (a Trace is unbatched). `names` keeps only
    the names asked for (a collection of names, or a predicate name -> bool);
    `whole_batch=True, detach=False` keeps the full tensors with their gradients (used by
    training to supervise one attention head).

    `maps` says whether attention runs on the explicit path (every n_q x n_k step recorded,
    the default) or on the fused kernel (`maps=False`: only O(n d) tensors such as the
    layer outputs and the per-head outputs are recorded). A traced pass uses maps=False;
    a layer looked at is run again with maps=True (core/trace.py).
    """

    def __init__(self, names=None, whole_batch: bool = False, detach: bool = True, maps: bool = True):
        self.tensors: Dict[str, torch.Tensor] = {}
        if names is None or callable(names):
            self.keep = names
        else:
            wanted = set(names)
            self.keep = wanted.__contains__
        self.whole_batch = whole_batch
        self.detach = detach
        self.maps = maps

    def __call__(self, name: str, t: torch.Tensor, batched: bool = True) -> None:
        if self.keep is not None and not self.keep(name):
            return
        if batched and not self.whole_batch:
            t = t[0]
        self.tensors[name] = t.detach() if self.detach and t.requires_grad else t

    def scope(self, prefix: str) -> "_Scope":
        return _Scope(self, prefix)


class _Scope:
    """A recorder that prefixes names ("encoder.0.self_attn" + "." + name)."""

    __slots__ = ("rec", "prefix")

    def __init__(self, rec, prefix: str):
        self.rec, self.prefix = rec, prefix

    def __call__(self, name: str, t: torch.Tensor, batched: bool = True) -> None:
        self.rec(f"{self.prefix}.{name}", t, batched)

    @property
    def maps(self) -> bool:
        return getattr(self.rec, "maps", True)


def _sub(rec: Rec, prefix: str) -> Rec:
    if rec is None:
        return None
    if isinstance(rec, _Scope):  # one prefix, one call per record, however deep the nesting
        return _Scope(rec.rec, f"{rec.prefix}.{prefix}")
    return _Scope(rec, prefix)


def _explicit(rec: Rec) -> bool:
    """Whether attention under this recorder takes the explicit (recorded) path."""
    return rec is not None and getattr(rec, "maps", True)


class Ablation:
    """Heads switched off: their slice of Concat(head_1..head_H) is zeroed ("zero") or
    replaced by its mean over the query positions ("mean") before W_o.

    heads: (stack, layer, head) for self-attention, or (stack, layer, head, "cross_attn").
    """

    MODES = ("zero", "mean")

    def __init__(self, heads: Sequence = (), mode: str = "zero"):
        if mode not in self.MODES:
            raise ValueError(f"ablation must be one of {self.MODES}, not {mode!r}")
        by_site: Dict[Tuple[str, int, str], List[int]] = {}
        for item in heads:
            stack, layer, head = item[0], int(item[1]), int(item[2])
            kind = item[3] if len(item) > 3 else "self_attn"
            if stack not in ("encoder", "decoder") or kind not in ATTENTION_KINDS:
                raise ValueError(f"cannot ablate {item!r}: use (stack, layer, head[, kind])")
            by_site.setdefault((stack, layer, kind), []).append(head)
        self.mode = mode
        self.sites = {k: sorted(set(v)) for k, v in by_site.items()}

    def __bool__(self) -> bool:
        return bool(self.sites)

    def heads(self, stack: str, layer: int, kind: str) -> Optional[List[int]]:
        return self.sites.get((stack, layer, kind))

    def key(self) -> tuple:
        """A hashable description (for caches): sorted sites and the mode."""
        return (self.mode,) + tuple((s, l, k, tuple(h)) for (s, l, k), h in sorted(self.sites.items()))

    def layer(self, stack: str, layer: int) -> Optional[Dict[str, List[int]]]:
        """{attention kind: heads off} for one layer, or None when nothing is off there."""
        out = {k: self.sites[(stack, layer, k)] for k in ATTENTION_KINDS if (stack, layer, k) in self.sites}
        return out or None


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
        self.w_q = nn.Linear(d, h * dk, bias=cfg.qkv_bias)
        self.w_k = nn.Linear(d, hkv * dk, bias=cfg.qkv_bias)
        self.w_v = nn.Linear(d, hkv * dk, bias=cfg.qkv_bias)
        self.w_o = nn.Linear(h * dk, d, bias=cfg.bias)
        self.rope_layout = cfg.rope_layout
        self.scale = cfg.attn_scale  # None: 1/sqrt(d_k)

    def weights(self, x_q, x_kv, mask=None, angles=None, is_causal: bool = False, position_bias=None):
        """The attention weights alone (B, H, n_q, n_k), as forward's explicit path computes
        them, without values, heads or W_o: what the model view needs of each layer."""
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
                off: Optional[Sequence[int]] = None, ablation: str = "zero", cache: Optional[dict] = None,
                position_bias=None):
        """mask: additive (broadcast to B, H, n_q, n_k). is_causal: the mask is exactly the
        look-ahead mask (the fused kernel then builds it itself). off: heads switched off
        (Ablation). cache: a dict that keeps this attention's keys and values between calls
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
        explicit = _explicit(rec)
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
        if rec:
            rec("heads", heads)
        if off:
            keep = torch.ones(self.h, 1, 1, dtype=heads.dtype, device=heads.device)
            keep[list(off)] = 0
            if ablation == "mean":  # each switched-off head gives its mean over positions
                heads = heads * keep + heads.mean(dim=2, keepdim=True) * (1 - keep)
            else:
                heads = heads * keep
        concat = heads.transpose(1, 2).reshape(b, n_q, self.h * self.dk)  # (B, n_q, H*d_k)
        out = self.w_o(concat)  # (B, n_q, d)
        if rec:
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
        self.rope = cfg.positional == "rope"
        self.relative = cfg.positional == "relative"
        self.self_attn = MultiHeadAttention(cfg)
        self.cross_attn = MultiHeadAttention(cfg) if cross else None
        self.ffn = FeedForward(cfg)
        self.norms = nn.ModuleList(make_norm(cfg) for _ in range(3 if cross else 2))

    def sublayers(self) -> List[str]:
        return ["self_attn"] + (["cross_attn"] if self.cross_attn is not None else []) + ["ffn"]

    def recorded_names(self) -> List[str]:
        """What an explicit run of this layer records, in order (names under the layer)."""
        attn = ["q", "k", "v", "mask", "scores", "scaled", "masked", "weights", "heads", "out"]
        names = []
        for j, sub in enumerate(self.sublayers(), start=1):
            if sub == "ffn":
                inner = ["ffn.hidden", "ffn.out"]
            else:
                pre_rope = ["q_pre_rope", "k_pre_rope"] if self.rope and sub == "self_attn" else []
                names_ = attn if not (self.relative and sub == "self_attn") else attn[:4] + ["position_bias"] + attn[4:]
                inner = [f"{sub}.{n}" for n in pre_rope + names_]
            names += ([f"norm{j}"] + inner + [f"residual{j}"]) if self.pre else (inner + [f"residual{j}", f"norm{j}"])
        return names + ["out"]

    def self_weights(self, x, self_mask=None, angles=None, self_causal: bool = False, position_bias=None, **_):
        """This layer's self-attention weights alone, from its input x: the first sub-layer
        up to the softmax (pre-norm: of Norm(x)); the FFN and the rest are not run."""
        y = self.norms[0](x) if self.pre else x
        return self.self_attn.weights(y, y, self_mask, angles, self_causal, position_bias)

    def forward(self, x, self_mask=None, memory=None, cross_mask=None, rec: Rec = None, angles=None,
                self_causal: bool = False, off: Optional[Dict[str, List[int]]] = None, ablation: str = "zero",
                cache: Optional[dict] = None, position_bias=None):
        """off: {attention kind: heads switched off} (Ablation.layer). cache: a dict kept
        between calls for greedy decoding (keys and values of both attentions).
        position_bias: T5's relative position bias, for the self-attention."""
        off = off or {}
        caches = {} if cache is None else cache

        def attend(kind, y):
            attn, kv = (self.self_attn, y) if kind == "self_attn" else (self.cross_attn, memory)
            c = None
            if cache is not None:
                c = caches.setdefault(kind, {"static": kind == "cross_attn"})
            mask = self_mask if kind == "self_attn" else cross_mask
            return attn(y, kv, mask, _sub(rec, kind), angles if kind == "self_attn" else None,
                        is_causal=self_causal and kind == "self_attn", off=off.get(kind), ablation=ablation, cache=c,
                        position_bias=position_bias if kind == "self_attn" else None)

        for j, (sub, norm) in enumerate(zip(self.sublayers(), self.norms), start=1):
            fn = (lambda y: self.ffn(y, _sub(rec, "ffn"))) if sub == "ffn" else (lambda y, s=sub: attend(s, y))
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
        self.offset = cfg.position_offset  # RoBERTa's positions start at padding_idx + 1
        n_pos = cfg.max_len + self.offset
        self.pos = nn.Embedding(n_pos, cfg.d_model) if cfg.positional == "learned" else None
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
                p = self.pos.weight[self.offset + offset : self.offset + offset + n]
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


def sliding_window_mask(n: int, window: int, device=None, dtype=torch.float32, n_k: Optional[int] = None) -> torch.Tensor:
    """(1, 1, n, n_k) additive mask: -inf where key j is `window` or more positions before
    query i (the queries are the last n of n_k positions)."""
    n_k = n if n_k is None else n_k
    i = torch.arange(n_k - n, n_k, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    m = torch.zeros(n, n_k, device=device, dtype=dtype).masked_fill(i - j >= window, float("-inf"))
    return m[None, None]


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
        a = rope_angles(n, self.cfg.d_head, self.cfg.rope_theta, offset, self.cfg.rope_scaling)
        return a.to(device=device, dtype=torch.float32)

    def layers(self, stack: str) -> nn.ModuleList:
        return self.encoder if stack == "encoder" else self.decoder

    def final_norm(self, stack: str) -> Optional[nn.Module]:
        return self.encoder_norm if stack == "encoder" else self.decoder_norm

    def position_bias(self, stack: str, n: int):
        """T5's relative position bias of a stack for n positions (1, H, n, n), else None."""
        if self.cfg.positional != "relative":
            return None
        return (self.encoder_bias if stack == "encoder" else self.decoder_bias)(n, n)

    def encoder_masks(self, src_pad, n: int, dtype=torch.float32) -> dict:
        """The encoder's attention masks: padding columns -inf (B, 1, n, n), or none."""
        return {"self_mask": None if src_pad is None else padding_mask(src_pad, n, dtype)[:, None]}

    def decoder_masks(self, t: int, src_pad=None, tgt_pad=None, device=None, dtype=torch.float32,
                      n_past: int = 0) -> dict:
        """The decoder's masks for t new positions after n_past known ones: the look-ahead
        mask (seed 002's M; left to the fused kernel as is_causal when it is all there is),
        padding, and the cross-attention's padding mask."""
        n_k = n_past + t
        self_mask, causal = None, False
        window = self.cfg.sliding_window
        if tgt_pad is not None or n_past or window is not None:
            self_mask = causal_mask(t, device=device, dtype=dtype, n_k=n_k)[None, None]  # (1, 1, t, n_k)
            if window is not None:  # Mistral: keys `window` or more positions back are masked too
                self_mask = combine_masks(self_mask, sliding_window_mask(t, window, device, dtype, n_k=n_k))
            if tgt_pad is not None:
                self_mask = combine_masks(self_mask, padding_mask(tgt_pad, t, dtype)[:, None])
        else:
            causal = True
        cross_mask = None if src_pad is None else padding_mask(src_pad, t, dtype)[:, None]  # (B, 1, t, n)
        return {"self_mask": self_mask, "cross_mask": cross_mask, "self_causal": causal}

    def encode(self, src, src_pad=None, rec: Rec = None, token_types=None, ablate: Optional[Ablation] = None):
        """src (B, n) ids, src_pad (B, n) bool (True = padding). Returns memory (B, n, d)."""
        n = src.shape[1]
        x = self.src_embed(src, _sub(rec, "embed.encoder"), token_types=token_types)
        masks = self.encoder_masks(src_pad, n, x.dtype)
        angles = self._angles(n, device=src.device)
        bias = self.position_bias("encoder", n)
        for i, layer in enumerate(self.encoder):
            x = layer(x, **masks, rec=_sub(rec, f"encoder.{i}"), angles=angles, position_bias=bias,
                      **_off(ablate, "encoder", i))
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
            if rec:
                rec("encoder.final_norm", x)
        return x

    def decode(self, tgt, memory=None, src_pad=None, tgt_pad=None, rec: Rec = None,
               ablate: Optional[Ablation] = None, cache: Optional[dict] = None):
        """tgt (B, t) decoder input ids (<start> y_1 ...). Returns hidden states (B, t, d).

        cache: a dict kept between calls for greedy decoding: the keys and values of the
        positions already decoded (tgt then holds only the new ids)."""
        t = tgt.shape[1]
        n_past = 0 if cache is None else cache.get("n", 0)
        x = self.tgt_embed(tgt, _sub(rec, "embed.decoder"), offset=n_past)
        masks = self.decoder_masks(t, src_pad, tgt_pad, tgt.device, x.dtype, n_past)
        angles = self._angles(n_past + t, device=tgt.device)
        bias = self.position_bias("decoder", n_past + t)
        for i, layer in enumerate(self.decoder):
            c = None if cache is None else cache.setdefault(i, {})
            x = layer(x, memory=memory, **masks, rec=_sub(rec, f"decoder.{i}"), angles=angles,
                      cache=c, position_bias=bias, **_off(ablate, "decoder", i))
        if cache is not None:
            cache["n"] = n_past + t
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
            if rec:
                rec("decoder.final_norm", x)
        return x

    def run_layer(self, stack: str, i: int, x, rec: Rec, memory=None, src_pad=None,
                  ablate: Optional[Ablation] = None):
        """Layer i of `stack` run alone on its input x (B, n, d): how a trace computes the
        inside of a layer it stored only the input and output of. Same masks, positions and
        ablation as encode/decode, so the same layer code gives the same numbers."""
        n = x.shape[1]
        if stack == "encoder":
            masks = self.encoder_masks(src_pad, n, x.dtype)
        else:
            masks = self.decoder_masks(n, src_pad if memory is not None else None, None, x.device, x.dtype)
            masks["memory"] = memory
        return self.layers(stack)[i](x, **masks, rec=rec, angles=self._angles(n, device=x.device),
                                     position_bias=self.position_bias(stack, n),
                                     **_off(ablate, stack, i))

    def layer_weights(self, stack: str, i: int, x, src_pad=None):
        """Layer i's self-attention weights alone (B, H, n, n) from its input x, with
        run_layer's masks and positions (ablation acts after the weights: nothing to do)."""
        n = x.shape[1]
        masks = (self.encoder_masks(src_pad, n, x.dtype) if stack == "encoder"
                 else self.decoder_masks(n, None, None, x.device, x.dtype))
        return self.layers(stack)[i].self_weights(x, **masks, angles=self._angles(n, device=x.device),
                                                  position_bias=self.position_bias(stack, n))

    def project(self, hidden, rec: Rec = None):
        if self.cfg.logit_scale != 1.0:  # T5 with tied embeddings
            hidden = hidden * self.cfg.logit_scale
        logits = self.out_proj(hidden)  # (B, t, V)
        if rec:
            rec("logits", logits)
            rec("probs", torch.softmax(logits, dim=-1))
        return logits

    def forward(self, src=None, tgt=None, src_pad=None, tgt_pad=None, rec: Rec = None, token_types=None,
                ablate: Optional[Ablation] = None):
        """Encoder-decoder: logits for tgt given src. Encoder-only: final hidden states.
        Decoder-only: logits for tgt."""
        memory = self.encode(src, src_pad, rec, token_types, ablate) if self.cfg.has_encoder else None
        if not self.cfg.has_decoder:
            return memory
        hidden = self.decode(tgt, memory, src_pad, tgt_pad, rec, ablate)
        return self.project(hidden, rec)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _off(ablate: Optional[Ablation], stack: str, i: int) -> dict:
    """Keyword arguments that switch a layer's ablated heads off (none without ablation)."""
    off = ablate.layer(stack, i) if ablate else None
    return {"off": off, "ablation": ablate.mode} if off else {}
