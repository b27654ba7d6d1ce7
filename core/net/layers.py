"""The pieces of a transformer layer, written as the notes' formulas: norms, the FFN, one
encoder or decoder layer (Layer), the embedding, and T5's relative position bias.

Post-norm block (seed 001 / 003, and torch.nn.Transformer's default):
    u = LayerNorm(x + MultiHead(x))
    z = LayerNorm(u + W_2^T ReLU(W_1^T u))
Pre-norm (Llama, many later models):
    u = x + MultiHead(Norm(x));  z = u + FFN(Norm(u))
Norms after the sub-layers (ModelConfig.post_sublayer_norm; Gemma 2/3 with the pre norms,
OLMo-2 without them):
    u = x + PostNorm(MultiHead(Norm(x)));  z = u + PostNorm(FFN(Norm(u)))
Norms placed by layer kind (ModelConfig.mixer_sublayer_norms; OLMo Hybrid): the mixer layers
pre-norm, u = x + Mixer(Norm(x)), the attention layers with norms after the sub-layers only,
u = x + PostNorm(MultiHead(x)); each layer records the names of its own placement.
Parallel block (ModelConfig.parallel_block; GPT-NeoX / Pythia): both sub-layers read x,
    z = x + MultiHead(Norm_1(x)) + FFN(Norm_2(x))
    recorded: residual1 = x + MultiHead(...), norm2 = Norm_2(x) (of x, not of residual1),
    residual2 = z.

Gemma 4 (cfg.per_layer_dim, cfg.layer_scalar): after the FFN a third residual add of the
layer's per-layer input e_i, then the whole stream times a learned scalar:
    r3 = r2 + Norm(W_proj (gelu_tanh(W_gate r2) * e_i));  out = r3 * s
    recorded: post_norm3 (the normed write), residual3 (r3), out.
The FFN of a layer with a kv_source may be wider (cfg.layer_d_ff: the double-wide MLP).
A layer listed by cfg.mixer_layers() (layer_types "linear_attention") mixes tokens with
cfg.mixer (core/net/mixer.py) instead of softmax attention: it has `mixer` where the others
have `self_attn` (the other is None), and its sub-layers are ["mixer", "ffn"], wrapped in the
same residuals and norms; ["mixer"] alone where cfg.mixer["ffn"] is False (Mamba2's blocks:
x + Mixer(Norm(x)), `ffn` None). With cfg.mixer["beside_attention"] (Falcon-H1) every layer has
both, side by side on the same input: its first sub-layer is x + Mixer(Norm(x)) +
SelfAttention(Norm(x)), recording the mixer's names, then the attention's.

Every intermediate passes through a named recording point (core/net/recorder.py); the
attention itself is core/net/multihead.py.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
import torch.nn as nn

from .config import ModelConfig
from .latent import LatentAttention
from .mixer import make_mixer
from .moe import MoE
from .multihead import MultiHeadAttention
from .norms import RMSNorm
from .positional import relative_buckets, sinusoidal_encoding
from .hooks import point
from .linear import Linear
from .recorder import Rec, scoped


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.norm_bias)  # seed 003 eq. (15)


class FeedForward(nn.Module):
    """FFN(u) = W_2^T act(W_1^T u + b_1) + b_2; SwiGLU: W_2^T (silu(W_1^T u) * W_3^T u);
    GEGLU (T5's gated-gelu): W_2^T (gelu_tanh(W_1^T u) * W_3^T u); "geglu" (ModernBERT) the
    same with exact GELU."""

    def __init__(self, cfg: ModelConfig, d_ff: Optional[int] = None):
        """d_ff: m of this FFN where it is not cfg.d_ff (Gemma 4's double-wide MLP)."""
        super().__init__()
        self.act = cfg.activation
        m = cfg.d_ff if d_ff is None else d_ff
        self.w_1 = Linear(cfg.d_model, m, bias=cfg.bias)
        self.w_2 = Linear(m, cfg.d_model, bias=cfg.bias)
        gated = self.act in ("swiglu", "geglu_tanh", "geglu")
        self.w_3 = Linear(cfg.d_model, m, bias=cfg.bias) if gated else None

    def forward(self, x, rec: Rec = None):
        act = {"geglu_tanh": "gelu_tanh", "geglu": "gelu", "swiglu": "silu"}.get(self.act, self.act)
        hidden = self.w_1.act(x, act)  # (B, n, m): act(W_1^T u + b_1), fused into the GEMM on a CPU
        if self.w_3 is not None:
            hidden = hidden * self.w_3(x)
        out = self.w_2(hidden)  # (B, n, d)
        if rec:
            rec("hidden", hidden)
        return point(rec, "out", out)


class Layer(nn.Module):
    """One encoder or decoder layer: self-attention, [cross-attention], FFN, each wrapped
    in residual + norm. Trace names residual{j}/norm{j} number the sub-layers in order.

    Pre-norm with cfg.post_sublayer_norm (Gemma 2/3): x + PostNorm(f(Norm(x))), the post
    norm recorded as post_norm{j}; without cfg.pre_sublayer_norm there is no norm{j}. A mixer
    layer may place its norms otherwise (cfg.mixer_sublayer_norms; cfg.sublayer_norms(index)).
    `index` is the layer's place in its stack (ModernBERT's layer 0 has no attention norm)."""

    def __init__(self, cfg: ModelConfig, cross: bool, index: int = 0):
        super().__init__()
        self.pre = cfg.norm_placement == "pre"
        self.rope = cfg.positional == "rope" and not (cfg.nope_layers and index in cfg.nope_layers)
        self.relative = cfg.positional == "relative"
        self.softcap = cfg.attn_softcap is not None
        mixes = index in cfg.mixer_layers()
        self.beside = bool(cfg.mixer and cfg.mixer.get("beside_attention"))  # Falcon-H1: mixer + attention
        self.mixer = make_mixer(cfg, index) if mixes or self.beside else None
        self.latent = cfg.mla is not None and not mixes
        self.self_attn = None if mixes else (LatentAttention(cfg, index) if self.latent else MultiHeadAttention(cfg, index))
        self.cross_attn = MultiHeadAttention(cfg, index, self_attn=False) if cross else None
        self.qk_norm = self.self_attn is not None and self.self_attn.qk_norm is not None
        self.rope = self.rope and not mixes
        moe = cfg.moe is not None and (cfg.moe.get("layers") is None or index in cfg.moe["layers"])
        bare = mixes and not cfg.mixer.get("ffn", True)  # a Mamba2 block: the mixer is the whole layer
        self.ffn = None if bare else MoE(cfg) if moe else FeedForward(cfg, cfg.layer_d_ff(index))
        n_sub = (3 if cross else 2) - (self.ffn is None)
        # norms{j}: before sub-layer j (pre-norm) or after its residual add (post-norm); absent
        # when a pre-norm block has only norms after the sub-layers (OLMo-2)
        # the placement may differ by layer kind (cfg.sublayer_norms: OLMo Hybrid's mixer layers)
        pre_sub, post_sub = cfg.sublayer_norms(index)
        self.pre_norm = not self.pre or pre_sub
        self.norms = nn.ModuleList(make_norm(cfg) for _ in range(n_sub if self.pre_norm else 0))
        if self.pre_norm and not cfg.first_attn_norm and index == 0:
            self.norms[0] = nn.Identity()  # ModernBERT: the embedding norm stands for layer 0's
        self.post_norms = (nn.ModuleList(make_norm(cfg) for _ in range(n_sub))
                           if self.pre and post_sub else None)
        self.parallel = cfg.parallel_block
        self._init_gemma4(cfg, index)

    def _init_gemma4(self, cfg: ModelConfig, index: int) -> None:
        """Gemma 4's parts of a layer: the per-layer input's gate, projection and norm (a third
        residual add, after the FFN) and the scalar on the layer's output."""
        self.index = index
        p = cfg.per_layer_dim
        self.ple_gate = Linear(cfg.d_model, p, bias=False) if p else None
        self.ple_proj = Linear(p, cfg.d_model, bias=False) if p else None
        self.ple_norm = make_norm(cfg) if p else None
        if cfg.layer_scalar:
            self.register_buffer("layer_scalar", torch.ones(1))
        else:
            self.layer_scalar = None

    def per_layer_add(self, x, e, rec: Rec = None):
        """Gemma 4's per-layer input e (B, n, p) added to the stream x after the FFN:
        x + Norm(W_proj (gelu_tanh(W_gate x) * e)), recorded as post_norm3 and residual3."""
        f = self.ple_norm(self.ple_proj(self.ple_gate.act(x, "gelu_tanh") * e))
        if rec:
            rec("post_norm3", f)
        x = x + f
        if rec:
            rec("residual3", x)
        return x

    @property
    def reads_norm(self) -> bool:
        """Whether the self-attention reads Norm(x) (a pre-norm layer with norms before its
        sub-layers) rather than the layer's input x itself."""
        return self.pre and self.pre_norm

    def attn_input(self, x):
        """What this layer's self-attention reads of its input x: Norm(x) or x (reads_norm)."""
        return self.norms[0](x) if self.reads_norm else x

    def sublayers(self) -> List[str]:
        if self.self_attn is None:
            return ["mixer"] + (["ffn"] if self.ffn is not None else [])
        return ["self_attn"] + (["cross_attn"] if self.cross_attn is not None else []) + ["ffn"]

    def recorded_names(self) -> List[str]:
        """What an explicit run of this layer records, in order (names under the layer)."""
        def attn_names(mod):
            tempered, sinks = mod.temperature is not None, mod.sinks is not None
            gated = getattr(mod, "w_gate", None) is not None
            names = ["q", "k", "v", "mask"] + (["scale"] if tempered else []) + ["scores", "scaled"] + (
                ["capped"] if self.softcap else []) + ["masked", "weights"] + (["sink"] if sinks else []) + (
                [] if gated else ["value_norms"]) + ["heads"] + (["gate"] if gated else []) + ["out"]
            if isinstance(mod, LatentAttention):  # multi-head latent attention: no pre-RoPE q and k
                names = ["latent"] + (["index_scores", "selected"] if mod.topk is not None else []) + names
            return names

        names = []
        for j, sub in enumerate(self.sublayers(), start=1):
            if sub == "ffn":
                inner = ["ffn.router", "ffn.out"] if isinstance(self.ffn, MoE) else ["ffn.hidden", "ffn.out"]
            elif sub == "mixer":
                inner = [f"mixer.{n}" for n in self.mixer.recorded_names()]
            else:
                own = sub == "self_attn"
                pre_rope = (["q_pre_norm", "k_pre_norm"] if self.qk_norm and own else []) + (
                    ["q_pre_rope", "k_pre_rope"] if self.rope and own and not self.latent else [])
                if own and self.self_attn.kv_source is not None:  # keys and values of an earlier layer
                    pre_rope = [n for n in pre_rope if not n.startswith("k_")]
                attn = attn_names(getattr(self, sub))
                names_ = attn if not (self.relative and own) else attn[:4] + ["position_bias"] + attn[4:]
                inner = [f"{sub}.{n}" for n in pre_rope + names_]
                if own and self.beside:
                    inner = [f"mixer.{n}" for n in self.mixer.recorded_names()] + inner
            if self.pre:
                post = [f"post_norm{j}"] if self.post_norms is not None else []
                names += ([f"norm{j}"] if self.pre_norm else []) + inner + post + [f"residual{j}"]
            else:
                names += inner + [f"residual{j}", f"norm{j}"]
        if self.ple_gate is not None:
            names += ["post_norm3", "residual3"]
        return names + ["out"]

    def self_weights(self, x, self_mask=None, angles=None, self_causal: bool = False, position_bias=None, qk=None, **_):
        """This layer's self-attention weights alone, from its input x: the first sub-layer
        up to the softmax (pre-norm: of Norm(x)); the FFN and the rest are not run. qk: the
        q and k a traced pass kept (then x is not read). A mixer layer: its exact implicit
        attention (Mixer.weights) of Norm(x); a layer with both (Falcon-H1): the attention's."""
        if self.self_attn is None:
            return self.mixer.weights(self.attn_input(x))
        y = None if qk is not None and not getattr(self.self_attn, "needs_input", False) else self.attn_input(x)
        return self.self_attn.weights(y, y, self_mask, angles, self_causal, position_bias, qk=qk)

    def self_value_norms(self, x, self_mask=None, angles=None, self_causal: bool = False, position_bias=None,
                         qk=None, **_):
        """This layer's self-attention value norms alone (core/net/multihead.py), like self_weights;
        qk: the (q, k, v) a traced pass kept."""
        if self.self_attn is None:
            raise ValueError("value norms are ||a_ij v_j W_o^h|| of a softmax attention; this layer mixes tokens "
                             f"with {self.mixer.kind!r}, whose out-projection follows a gated norm of the heads")
        y = None if qk is not None and not getattr(self.self_attn, "needs_input", False) else self.attn_input(x)
        return self.self_attn.value_norms(y, y, self_mask, angles, self_causal, position_bias, qkv=qk)

    def forward(self, x, self_mask=None, memory=None, cross_mask=None, rec: Rec = None, angles=None,
                self_causal: bool = False, cache: Optional[dict] = None, position_bias=None,
                shared: Optional[dict] = None, per_layer=None):
        """cache: a dict kept between calls for greedy decoding (keys and values of both
        attentions). position_bias: T5's relative position bias, for the self-attention.
        rec may carry hooks (core/net/hooks.py): the layer's input is hook point `in`.
        Gemma 4: shared, the dict of keys and values layers leave for later ones
        (MultiHeadAttention.forward); per_layer, every layer's per-layer input (B, n, L, p)."""
        x = point(rec, "in", x, record=False)  # the residual stream entering the layer
        caches = {} if cache is None else cache

        def attend(kind, y):
            if kind == "mixer":
                c = caches.setdefault("mixer", {}) if cache is not None else None
                return self.mixer(y, scoped(rec, "mixer"), cache=c)
            attn, kv = (self.self_attn, y) if kind == "self_attn" else (self.cross_attn, memory)
            c = None
            if cache is not None:
                c = caches.setdefault(kind, {"static": kind == "cross_attn"})
            mask = self_mask if kind == "self_attn" else cross_mask
            extra = {"shared": shared} if shared is not None and kind == "self_attn" else {}
            return attn(y, kv, mask, scoped(rec, kind), angles if kind == "self_attn" else None,
                        is_causal=self_causal and kind == "self_attn", cache=c,
                        position_bias=position_bias if kind == "self_attn" else None, **extra)

        x_in = x  # the parallel block's sub-layers all read the layer's input
        for j, sub in enumerate(self.sublayers(), start=1):
            fn = (lambda y: self.ffn(y, scoped(rec, "ffn"))) if sub == "ffn" else (lambda y, s=sub: attend(s, y))
            if sub == "self_attn" and self.beside:  # Falcon-H1: the mixer and the attention read the same y
                fn = lambda y: attend("mixer", y) + attend("self_attn", y)  # noqa: E731
            if self.pre:  # u = x + [PostNorm](f([Norm](x)))
                y = x_in if self.parallel else x
                if len(self.norms):
                    y = self.norms[j - 1](y)
                    if rec:
                        rec(f"norm{j}", y)
                f = fn(y)
                if self.post_norms is not None:
                    f = self.post_norms[j - 1](f)
                    if rec:
                        rec(f"post_norm{j}", f)
                x = x + f
                if rec:
                    rec(f"residual{j}", x)
            else:  # u = Norm(x + f(x))
                res = x + fn(x)
                x = self.norms[j - 1](res)
                if rec:
                    rec(f"residual{j}", res)
                    rec(f"norm{j}", x)
        if self.ple_gate is not None:
            if per_layer is None:
                raise ValueError(f"layer {self.index} adds a per-layer input: run it with per_layer (B, n, L, p)")
            x = self.per_layer_add(x, per_layer[:, -x.shape[1]:, self.index], rec)
        if self.layer_scalar is not None:
            x = x * self.layer_scalar
        if rec:
            rec("out", x)
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


class Embedding(nn.Module):
    """Token embedding (times sqrt(d) and embed_multiplier if configured) + positions [+ token types] [-> LayerNorm]."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.scale = (math.sqrt(cfg.d_model) if cfg.embed_scale else 1.0) * cfg.embed_multiplier
        self.offset = cfg.position_offset  # RoBERTa's positions start at padding_idx + 1
        n_pos = cfg.max_len + self.offset
        self.pos = nn.Embedding(n_pos, cfg.d_model) if cfg.positional == "learned" else None
        if cfg.positional == "sinusoidal":
            pe = sinusoidal_encoding(cfg.max_len, cfg.d_model, layout=cfg.sinusoid_layout)
            self.register_buffer("pe", pe, persistent=False)
        self.types = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.norm_bias) if cfg.embed_norm else None

    def forward(self, ids, rec: Rec = None, offset: int = 0, token_types=None):
        n = ids.shape[1]
        x = point(rec, "tokens", self.tok(ids) * self.scale)  # (B, n, d); attribution replaces it
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
