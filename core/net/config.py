"""ModelConfig: one dataclass that describes every architecture the core runs.

Notation follows the lecture notes: d (d_model), H (n_heads), d_k (d_head), m (d_ff),
L (n_layers). The defaults are the notes' block: post-norm LayerNorm, ReLU FFN,
sinusoidal positions, encoder-decoder.

Fields added for the Hugging Face families (core/loaders/hf.py); each defaults to the behaviour the
bundled models always had, so their configs and numbers are unchanged:
    position_offset  learned positions start at this row (RoBERTa: padding_idx + 1 = 2);
                     the position table then has max_len + position_offset rows
    rope_scaling     None, or {"type": "linear", "factor": f} or {"type": "llama3", "factor",
                     "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}:
                     how the RoPE frequencies are rescaled (positional.rope_inv_freq)
    sliding_window   None, or W: decoder self-attention also masks keys W or more positions
                     back (Mistral); the mask is part of the recorded mask
    qkv_bias         biases on W_q, W_k, W_v; None: as `bias` (Qwen2: True with bias False)
    out_bias         bias on the output projection; None: bias and not tie_embeddings
Fields for checkpoint families (core/loaders/hf_seq2seq.py); their defaults change nothing:
    sinusoid_layout  "interleaved" (the notes: sin in even, cos in odd features) or "half"
                     (Marian: sin in the first half of the features, cos in the second).
    positional       "relative": no position vectors; a learned, bucketed bias per head is
                     added to the scores (T5), computed once per stack (rel_buckets buckets,
                     logarithmic beyond rel_max_distance / 2 ... rel_max_distance; both ways in
                     the encoder, backwards only in the decoder).
    attn_scale       the factor on Q K^T; None is 1/sqrt(d_k) (T5 uses 1.0).
    activation       also "silu" (Marian's swish) and "geglu_tanh" (T5's gated-gelu:
                     gelu_tanh(W_1^T u) * W_3^T u).
    out_bias         a bias on the output projection; None: bias and not tie_embeddings
                     (BART and Marian: their final_logits_bias, with tied weights).
    logit_scale      the decoder's last hidden state is multiplied by this before the output
                     projection (T5 with tied embeddings: d^-0.5).
Fields for later decoder families (core/loaders/families/); their defaults change nothing:
    qk_norm          None, "head" (an RMSNorm over each head's d_k features of q and of k:
                     Qwen3, Gemma 3) or "full" (an RMSNorm over the whole H*d_k projection
                     before it is split into heads: OLMo-2); applied before RoPE
    pre_sublayer_norm / post_sublayer_norm   (norm_placement "pre") whether a sub-layer's
                     input is normed (norms{j}) and whether its output is normed before the
                     residual add (post_norms{j}): x + post(f(pre(x))). Gemma 2/3: both;
                     OLMo-2: post only; Llama and the rest: pre only
    parallel_block   attention and FFN read the same layer input (GPT-NeoX / Pythia):
                     x + attn(norm1(x)) + ffn(norm2(x)); residual1 = x + attn, residual2 the sum
    rotary_dim       RoPE rotates the first rotary_dim features of each head, the rest pass
                     unchanged (GPT-NeoX rotary_pct, Phi-3 partial_rotary_factor); None: all d_k
Fields for Gemma 1-3 and ModernBERT:
    activation       also "geglu" (ModernBERT: exact-GELU gate, gelu(W_1^T u) * W_3^T u).
    attn_softcap     None, or c: scaled scores become c tanh(scaled / c) before the mask (Gemma 2).
    final_softcap    None, or c: logits become c tanh(logits / c) (Gemma 2).
    layer_types      None, or per layer "sliding_attention" | "full_attention" (as transformers
                     writes it): only the sliding layers get `sliding_window`. In an encoder a
                     sliding layer's window is symmetric: keys more than sliding_window // 2
                     positions away either way are masked (ModernBERT's local_attention).
                     Without layer_types a window applies to every decoder layer (Mistral).
    rope_theta_local None, or the RoPE base of the sliding layers (Gemma 3, ModernBERT); they
                     take no rope_scaling.
    norm_bias        LayerNorm with a shift (False: gain only, ModernBERT).
    first_attn_norm  False: layer 0 has no norm before its attention (ModernBERT: the
                     embedding norm serves); its norm1 is the identity.
Fields for the 2025-26 softmax attentions (gpt-oss, SmolLM3, OLMo 3, EXAONE 4, Llama 4); their
defaults change nothing:
    layer_types      also "chunked_attention": the layer's queries see the keys of their own
                     chunk of attn_chunk positions only (Llama 4), causal within it.
    attn_chunk       the chunk size of the chunked layers.
    nope_layers      None, or the layers without positions: q and k as projected (and normed),
                     never rotated (SmolLM3, Llama 4, EXAONE 4's global layers).
    attn_sinks       a learned sink logit per head in every layer (gpt-oss): the softmax runs
                     over the keys and the sink; the sink's share is recorded as `.sink`.
    qk_norm          also "l2": an RMSNorm without gain over each head's q and k (Llama 4).
    qk_norm_layers   None (every layer), or the layers that have the QK-norm (Llama 4: the
                     layers with RoPE).
    attn_temperature None, or {"scale": a, "floor": f}: on the layers without positions the
                     scale of query p is 1/sqrt(d_k) (1 + a log(1 + floor((p + 1) / f)))
                     (Llama 4's temperature tuning, recorded as `.scale`).
    rope_scaling     also {"type": "yarn", "factor", "original_max_position_embeddings",
                     "beta_fast", "beta_slow", "truncate"[, "attention_factor"]} (gpt-oss):
                     its attention factor m multiplies cos and sin in transformers, so here
                     the attention's scale is m^2 / sqrt(d_k) (positional.rope_attention_factor).
    moe              None, or a mixture-of-experts FFN (core/net/moe.py): {"kind": "gpt_oss" |
                     "llama4", "experts": E, "top_k": k, "d_expert": m_e, "layers": None (every
                     layer) or the MoE layers (the others keep the dense FFN of d_ff),
                     "alpha", "limit" (gpt_oss's clamped SwiGLU)}.
Fields for Gemma 4 (gemma4_text); their defaults change nothing:
    global_d_head    None, or d_k of the "full_attention" layers (layer_types), where it differs
                     from the sliding layers' d_head (ModelConfig.layer_d_head).
    global_kv_heads  None, or H_kv of the "full_attention" layers (ModelConfig.layer_kv_heads).
    k_eq_v           the "full_attention" layers have no W_v: their values are the key
                     projection x W_k as projected (before k's norm and RoPE).
    v_norm           an RMSNorm without gain over each head's values (before attention).
    kv_source        None, or per layer None or j < i: layer i computes no keys and values of
                     its own and attends to layer j's (after j's norm and RoPE, with j's cache);
                     it records them under its own names, equal to layer j's.
    per_layer_dim    0, or p: per-layer input embeddings. A table of per_layer_vocab x (L p)
                     and a projection of the scaled token embeddings (d -> L p, times d^-1/2,
                     RMSNorm over each layer's p) are summed and times 2^-1/2: layer i's input
                     e_i (recorded as embed.{stack}.per_layer, n x L x p). After its FFN, layer
                     i adds PostNorm(W_up (gelu_tanh(W_gate u) * e_i)) to the stream
                     (recorded as post_norm3 and residual3).
    per_layer_vocab  rows of the per-layer table (None: tgt_vocab_size).
    layer_scalar     a learned scalar multiplies each layer's output (the whole stream).
    shared_kv_d_ff   None, or m of the layers with a kv_source (Gemma 4's double-wide MLP).
    rope_scaling     also {"type": "proportional", "partial": f, "factor": s} (the global
                     layers): the first int(f d_k / 2) feature pairs (j, j + d_k / 2) turn at
                     theta^(-2j/d_k) / s, the other pairs not at all (positional.rope_inv_freq).
Fields for DeepSeek V3 / V3.2 (core/net/latent.py); their defaults change nothing:
    mla              None, or multi-head latent attention in every layer: {"kv_lora_rank": r,
                     "q_lora_rank": None (q = x W_q) or r_q (q = RMSNorm(x W_qa) W_qb),
                     "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave"
                     (DeepSeek's pairs (x0, x1), (x2, x3), ... rotated and laid out as halves),
                     "index": None, or the lightning indexer of a sparse selection (V3.2):
                     {"heads", "head_dim", "topk"}}. d_head is then v_head_dim (what W_o reads
                     per head); RoPE turns the qk_rope_head_dim features of q and of the shared key
                     (with positional "none", Kimi Linear, nothing is turned: they are a plain part
                     of q and of the key every head shares, and need not be even).
    attn_scale       with mla, the factor on Q K^T (YaRN's mscale_all_dim squared included).
    moe              also kind "deepseek": sigmoid router scores, "score_bias" (the
                     e_score_correction_bias, for the choice only), group-limited top-k
                     ("n_group", "topk_group"), "norm_topk_prob", "routed_scaling_factor" and a
                     shared SwiGLU expert of "d_shared".
Fields for token mixers that are not softmax attention (core/net/mixer.py); their defaults
change nothing:
    layer_types      also "linear_attention" (as transformers writes it for Qwen3.5 and
                     Qwen3-Next): the layer's token mixer is cfg.mixer, not softmax attention;
                     the layer has `mixer` instead of `self_attn` and its sub-layers are
                     ["mixer", "ffn"]. The mixer layers are exactly these entries
                     (ModelConfig.mixer_layers()).
    mixer            None, or the settings of the mixer layers: {"kind": a key of
                     core.net.mixer.KINDS ("gated_delta"), then the kind's own fields}.
                     "gated_delta" (core/net/gated_delta.py): "heads" (H, the value heads),
                     "k_heads" (query/key heads, H a multiple of them), "d_k", "d_v", "conv"
                     (the short convolution's width), "chunk" (the chunked form's size,
                     default 64), "norm_eps" (its gated RMSNorm's; default cfg.norm_eps).
                     "kimi_delta" (core/net/kimi_delta.py, Kimi Linear): "heads", "d_k" (= d_v),
                     "conv", "chunk" (default 16), "norm_eps"; its decay is per key channel.
                     "mamba2" (core/net/mamba2.py, Mamba2Spec.from_config): "heads",
                     "head_dim", "d_state", "groups", "conv", "chunk", "norm_eps", "bias",
                     "conv_bias", "dt_limit", "gate" (core/net/mamba2.py GATES), "beside_attention" (every layer
                     has the mixer beside its softmax attention: Falcon-H1). "short_conv" (core/net/short_conv.py, LFM2):
                     "conv" (its taps), "bias". Any kind: "ffn": False leaves the mixer layers
                     without an FFN (Mamba2's blocks: x + Mixer(Norm(x))).
                     "gated_delta" also: "beta_scale" (default 1): the write strength is
                     beta_scale * sigmoid(x W_b) (OLMo Hybrid's linear_allow_neg_eigval: 2,
                     so beta in (0, 2) and the step I - beta k k^T may flip a direction).
    mixer_sublayer_norms  None, or (pre, post): the mixer layers' own pre_sublayer_norm /
                     post_sublayer_norm (norm_placement "pre"), where the layer kinds place their
                     norms differently (OLMo Hybrid: (True, False), the mixer layers pre-norm,
                     its attention layers post_sublayer_norm only). The names follow each
                     layer's placement: norm{j} where its sub-layers are normed before,
                     post_norm{j} where after (ModelConfig.sublayer_norms(i)).
    embed_multiplier the token embeddings times this number (GraniteMoeHybrid), on top of
                     embed_scale's sqrt(d) where both are set.
    attn_gate        an output gate on every softmax attention (Qwen3.5, Qwen3-Next): W_q's
                     projection has a second part, heads * sigmoid(x W_g) before W_o,
                     recorded as `.gate` (the sigmoid's value, H x n_q x d_k).
    moe              also kind "qwen3_next": softmax router over all E experts, the top-k
                     probabilities (renormalised to sum 1 where "norm_topk": True) weigh
                     SwiGLU experts (gate and up as halves), plus a shared SwiGLU expert of
                     "d_shared" scaled by sigmoid(x w_sg), its one-output gate; "shared_gate":
                     False: the shared expert added ungated (GraniteMoeHybrid).
"""


from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional


# the per-layer kinds layer_types may name; the last is a layer whose token mixer is cfg.mixer
LAYER_TYPES = ("sliding_attention", "full_attention", "chunked_attention", "linear_attention")
MIXER_LAYER_TYPES = ("linear_attention",)


@dataclass
class ModelConfig:
    d_model: int = 128  # d
    n_heads: int = 4  # H
    d_head: Optional[int] = None  # d_k; default d / H
    d_ff: int = 512  # m
    n_layers: int = 3  # L, encoder layers (and decoder layers unless n_decoder_layers)
    n_decoder_layers: Optional[int] = None
    n_kv_heads: Optional[int] = None  # grouped-query attention; default H
    src_vocab_size: int = 0
    tgt_vocab_size: int = 0  # decoders; for decoder-only models the one vocabulary
    max_len: int = 512
    positional: str = "sinusoidal"  # sinusoidal | learned | rope | relative | none
    rope_theta: float = 10000.0
    rope_layout: str = "half"  # half | interleaved (see positional.apply_rope)
    norm: str = "layernorm"  # layernorm | rmsnorm
    norm_eps: float = 1e-5
    norm_placement: str = "post"  # post | pre
    activation: str = "relu"  # relu | gelu | gelu_tanh | silu | swiglu | geglu_tanh | geglu
    kind: str = "encoder-decoder"  # encoder | decoder | encoder-decoder
    bias: bool = True  # biases in the attention and FFN projections
    embed_scale: bool = False  # multiply token embeddings by sqrt(d) (Vaswani et al.)
    embed_multiplier: float = 1.0  # token embeddings times this (GraniteMoeHybrid's embedding_multiplier)
    embed_norm: bool = False  # LayerNorm after summing embeddings (BERT)
    type_vocab_size: int = 0  # token-type (segment) embeddings (BERT)
    final_norm: Optional[bool] = None  # norm after the last layer; default: pre-norm only
    tie_embeddings: bool = False  # output projection shares the target embedding
    sinusoid_layout: str = "interleaved"  # interleaved | half (Marian)
    rel_buckets: int = 32  # positional="relative" (T5): number of buckets
    rel_max_distance: int = 128  # positional="relative": distance of the last bucket
    attn_scale: Optional[float] = None  # factor on Q K^T; None: 1/sqrt(d_k)
    out_bias: Optional[bool] = None  # output projection bias; None: bias and not tie_embeddings
    logit_scale: float = 1.0  # hidden state times this before the output projection (T5)
    pad_id: int = 0
    position_offset: int = 0  # first learned position row (RoBERTa: 2)
    rope_scaling: Optional[dict] = None  # see the module docstring
    sliding_window: Optional[int] = None  # decoder self-attention window (Mistral)
    qkv_bias: Optional[bool] = None  # default: bias
    out_bias: Optional[bool] = None  # default: bias and not tie_embeddings
    qk_norm: Optional[str] = None  # None | head | full (see the module docstring)
    pre_sublayer_norm: bool = True  # norm_placement "pre": a norm before each sub-layer
    post_sublayer_norm: bool = False  # a norm on each sub-layer's output, before the residual add
    parallel_block: bool = False  # x + attn(norm1(x)) + ffn(norm2(x)) (GPT-NeoX)
    rotary_dim: Optional[int] = None  # RoPE on the first rotary_dim features of a head; None: all
    attn_softcap: Optional[float] = None
    final_softcap: Optional[float] = None
    layer_types: Optional[list] = None  # per layer "sliding_attention" | "full_attention"
    rope_theta_local: Optional[float] = None  # RoPE base of the sliding layers
    norm_bias: bool = True
    first_attn_norm: bool = True
    attn_chunk: Optional[int] = None
    nope_layers: Optional[list] = None
    attn_sinks: bool = False
    qk_norm_layers: Optional[list] = None
    attn_temperature: Optional[dict] = None
    moe: Optional[dict] = None
    global_d_head: Optional[int] = None
    global_kv_heads: Optional[int] = None
    k_eq_v: bool = False
    v_norm: bool = False
    kv_source: Optional[list] = None
    per_layer_dim: int = 0
    per_layer_vocab: Optional[int] = None
    layer_scalar: bool = False
    shared_kv_d_ff: Optional[int] = None
    mla: Optional[dict] = None
    mixer: Optional[dict] = None
    attn_gate: bool = False
    mixer_sublayer_norms: Optional[tuple] = None  # (pre, post) of the mixer layers; None: as the others
    extra: dict = field(default_factory=dict)  # free-form metadata (e.g. source of weights)

    def __post_init__(self):
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError("d_model must be divisible by n_heads when d_head is not given")
            self.d_head = self.d_model // self.n_heads
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        if self.n_decoder_layers is None:
            self.n_decoder_layers = self.n_layers
        if self.qkv_bias is None:
            self.qkv_bias = self.bias
        if self.out_bias is None:
            self.out_bias = self.bias and not self.tie_embeddings
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError("sliding_window must be positive")
        if self.rope_scaling is not None and self.rope_scaling.get("type") not in ("linear", "llama3", "yarn", "proportional"):
            raise ValueError(f"rope_scaling type must be 'linear', 'llama3', 'yarn' or 'proportional', not {self.rope_scaling.get('type')!r}")
        if self.qk_norm not in (None, "head", "full", "l2"):
            raise ValueError(f"qk_norm must be None, 'head', 'full' or 'l2', not {self.qk_norm!r}")
        if self.rotary_dim is not None and not (0 < self.rotary_dim <= self.d_head and self.rotary_dim % 2 == 0):
            raise ValueError(f"rotary_dim must be even and in 1..d_head ({self.d_head}), not {self.rotary_dim}")
        if self.norm_placement == "post" and (self.post_sublayer_norm or not self.pre_sublayer_norm
                                              or self.parallel_block):
            raise ValueError("pre_sublayer_norm / post_sublayer_norm / parallel_block need norm_placement 'pre'")
        if self.parallel_block and not self.pre_sublayer_norm:
            raise ValueError("parallel_block needs pre_sublayer_norm")
        if self.layer_types is not None:
            self.layer_types = list(self.layer_types)
            bad = [t for t in self.layer_types if t not in LAYER_TYPES]
            if bad or len(self.layer_types) != self.n_layers:
                raise ValueError("layer_types must list n_layers entries of 'sliding_attention' / 'full_attention'"
                                 " / 'chunked_attention' / 'linear_attention'")
            if "linear_attention" in self.layer_types and not self.mixer:
                raise ValueError("linear_attention layers need a mixer (ModelConfig.mixer: its kind and sizes)")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("sliding layers need sliding_window")
            if "chunked_attention" in self.layer_types and not (self.attn_chunk or 0) > 0:
                raise ValueError("chunked layers need a positive attn_chunk")
        if self.mixer_sublayer_norms is not None:
            pair = tuple(self.mixer_sublayer_norms)
            if len(pair) != 2 or any(not isinstance(b, bool) for b in pair):
                raise ValueError(f"mixer_sublayer_norms must be a pair (pre, post) of booleans, not {pair!r}")
            if self.norm_placement != "pre" or not self.mixer:
                raise ValueError("mixer_sublayer_norms needs norm_placement 'pre' and a mixer")
            if self.parallel_block and not pair[0]:
                raise ValueError("parallel_block needs the mixer layers' pre_sublayer_norm")
            self.mixer_sublayer_norms = pair
        for name in ("nope_layers", "qk_norm_layers"):
            v = getattr(self, name)
            if v is not None:
                v = sorted({int(i) for i in v})
                if any(not 0 <= i < self.n_layers for i in v):
                    raise ValueError(f"{name} must hold layer indices 0..{self.n_layers - 1}")
                setattr(self, name, v)
        if self.moe is not None:
            self.moe = dict(self.moe)
            if self.moe.get("kind") not in ("gpt_oss", "llama4", "deepseek", "qwen3_next"):
                raise ValueError(f"moe kind must be 'gpt_oss', 'llama4', 'deepseek' or 'qwen3_next', not {self.moe.get('kind')!r}")
            if not 1 <= int(self.moe.get("top_k", 0)) <= int(self.moe.get("experts", 0)):
                raise ValueError("moe needs 1 <= top_k <= experts")
            if self.moe["kind"] == "deepseek":
                e, g = int(self.moe["experts"]), int(self.moe.get("n_group") or 1)
                if e % g or not 1 <= int(self.moe.get("topk_group") or 1) <= g:
                    raise ValueError(f"moe needs experts ({e}) divisible by n_group ({g}) and 1 <= topk_group <= n_group")
        if self.mla is not None:
            self.mla = dict(self.mla)
            for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if not int(self.mla.get(key) or 0) > 0 and not (key == "qk_nope_head_dim" and self.mla.get(key) == 0):
                    raise ValueError(f"mla needs a positive {key}, not {self.mla.get(key)!r}")
            if self.mla["qk_rope_head_dim"] % 2 and self.positional == "rope":
                raise ValueError(f"mla's qk_rope_head_dim must be even (RoPE turns pairs), not {self.mla['qk_rope_head_dim']}")
            index = self.mla.get("index")
            if index is not None:
                if self.mla.get("q_lora_rank") is None:
                    raise ValueError("a sparse selection's indexer reads the compressed query: mla needs q_lora_rank")
                if not int(index.get("topk", 0)) >= 1:
                    raise ValueError(f"the indexer's topk must be a positive number of keys, not {index.get('topk')!r}")
                if int(index["head_dim"]) < self.mla["qk_rope_head_dim"]:
                    raise ValueError("the indexer's head_dim must hold its qk_rope_head_dim rotated features")
        for name in ("attn_softcap", "final_softcap"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.final_norm is None:
            self.final_norm = self.norm_placement == "pre"
        self._check_gemma4()
        for name, value, allowed in [
            ("positional", self.positional, ("sinusoidal", "learned", "rope", "relative", "none")),
            ("norm", self.norm, ("layernorm", "rmsnorm")),
            ("norm_placement", self.norm_placement, ("post", "pre")),
            ("activation", self.activation, ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu_tanh", "geglu")),
            ("sinusoid_layout", self.sinusoid_layout, ("interleaved", "half")),
            ("kind", self.kind, ("encoder", "decoder", "encoder-decoder")),
            ("rope_layout", self.rope_layout, ("half", "interleaved")),
        ]:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, not {value!r}")
        for name in ("d_model", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")

    def _check_gemma4(self) -> None:
        """The Gemma 4 fields (global_d_head ... layer_scalar) are consistent."""
        for name in ("global_d_head", "global_kv_heads"):
            v = getattr(self, name)
            if v is not None and (v < 1 or not self.layer_types):
                raise ValueError(f"{name} must be positive and needs layer_types (it sets the full_attention layers')")
        if self.global_kv_heads is not None and self.n_heads % self.global_kv_heads:
            raise ValueError("n_heads must be a multiple of global_kv_heads")
        if self.k_eq_v and not self.layer_types:
            raise ValueError("k_eq_v needs layer_types (it applies to the full_attention layers)")
        if self.kv_source is not None:
            self.kv_source = [None if j is None else int(j) for j in self.kv_source]
            if len(self.kv_source) != self.n_layers:
                raise ValueError(f"kv_source must list {self.n_layers} entries (None or an earlier layer)")
            for i, j in enumerate(self.kv_source):
                if j is None:
                    continue
                if not 0 <= j < i or self.kv_source[j] is not None:
                    raise ValueError(f"kv_source[{i}] = {j}: a layer reuses the keys and values of an earlier layer "
                                     "that computes its own")
                if (self.layer_d_head(i), self.layer_kv_heads(i)) != (self.layer_d_head(j), self.layer_kv_heads(j)):
                    raise ValueError(f"kv_source[{i}] = {j}: the two layers' head sizes or key/value heads differ")
        if self.per_layer_dim < 0 or (self.per_layer_vocab is not None and self.per_layer_vocab < 1):
            raise ValueError("per_layer_dim must be >= 0 and per_layer_vocab positive")
        if self.rope_scaling is not None and self.rope_scaling.get("type") == "proportional":
            if not 0 <= float(self.rope_scaling.get("partial", 1.0)) <= 1:
                raise ValueError("proportional RoPE's partial must be in 0..1")

    def is_global(self, i: int) -> bool:
        """Whether layer i is a "full_attention" layer of layer_types (False without layer_types)."""
        return bool(self.layer_types) and self.layer_types[i] == "full_attention"

    def layer_d_head(self, i: int) -> int:
        """d_k of layer i: global_d_head on the full_attention layers where set, else d_head."""
        return self.global_d_head if self.global_d_head is not None and self.is_global(i) else self.d_head

    def layer_kv_heads(self, i: int) -> int:
        """H_kv of layer i: global_kv_heads on the full_attention layers where set, else n_kv_heads."""
        return self.global_kv_heads if self.global_kv_heads is not None and self.is_global(i) else self.n_kv_heads

    def layer_d_ff(self, i: int) -> int:
        """m of layer i's FFN: shared_kv_d_ff on the layers that reuse keys and values where set, else d_ff."""
        shared = self.kv_source is not None and self.kv_source[i] is not None
        return self.shared_kv_d_ff if shared and self.shared_kv_d_ff is not None else self.d_ff

    def k_is_v(self, i: int) -> bool:
        """Whether layer i's values are its key projection (k_eq_v on a full_attention layer)."""
        return self.k_eq_v and self.is_global(i)

    def sublayer_norms(self, i: int) -> tuple:
        """(pre, post) of layer i under norm_placement "pre": whether its sub-layers' inputs are
        normed (norm{j}) and whether their outputs are before the residual add (post_norm{j}):
        mixer_sublayer_norms on the mixer layers where set, else pre_sublayer_norm /
        post_sublayer_norm."""
        if self.mixer_sublayer_norms is not None and i in self.mixer_layers():
            return self.mixer_sublayer_norms
        return self.pre_sublayer_norm, self.post_sublayer_norm

    def mixer_layers(self) -> list:
        """The layers whose token mixer is cfg.mixer (layer_types "linear_attention"), in order."""
        return [i for i, t in enumerate(self.layer_types or []) if t in MIXER_LAYER_TYPES]

    @property
    def has_encoder(self) -> bool:
        return self.kind in ("encoder", "encoder-decoder")

    @property
    def has_decoder(self) -> bool:
        return self.kind in ("decoder", "encoder-decoder")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)
