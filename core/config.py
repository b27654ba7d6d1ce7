"""ModelConfig: one dataclass that describes every architecture the core runs.

Notation follows the lecture notes: d (d_model), H (n_heads), d_k (d_head), m (d_ff),
L (n_layers). The defaults are the notes' block: post-norm LayerNorm, ReLU FFN,
sinusoidal positions, encoder-decoder.

Fields added for the Hugging Face families (core/hf.py); each defaults to the behaviour the
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
"""


from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional


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
    positional: str = "sinusoidal"  # sinusoidal | learned | rope | none
    rope_theta: float = 10000.0
    rope_layout: str = "half"  # half | interleaved (see positional.apply_rope)
    norm: str = "layernorm"  # layernorm | rmsnorm
    norm_eps: float = 1e-5
    norm_placement: str = "post"  # post | pre
    activation: str = "relu"  # relu | gelu | gelu_tanh | swiglu
    kind: str = "encoder-decoder"  # encoder | decoder | encoder-decoder
    bias: bool = True  # biases in the attention and FFN projections
    embed_scale: bool = False  # multiply token embeddings by sqrt(d) (Vaswani et al.)
    embed_norm: bool = False  # LayerNorm after summing embeddings (BERT)
    type_vocab_size: int = 0  # token-type (segment) embeddings (BERT)
    final_norm: Optional[bool] = None  # norm after the last layer; default: pre-norm only
    tie_embeddings: bool = False  # output projection shares the target embedding
    pad_id: int = 0
    position_offset: int = 0  # first learned position row (RoBERTa: 2)
    rope_scaling: Optional[dict] = None  # see the module docstring
    sliding_window: Optional[int] = None  # decoder self-attention window (Mistral)
    qkv_bias: Optional[bool] = None  # default: bias
    out_bias: Optional[bool] = None  # default: bias and not tie_embeddings
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
        if self.rope_scaling is not None and self.rope_scaling.get("type") not in ("linear", "llama3"):
            raise ValueError(f"rope_scaling type must be 'linear' or 'llama3', not {self.rope_scaling.get('type')!r}")
        if self.final_norm is None:
            self.final_norm = self.norm_placement == "pre"
        for name, value, allowed in [
            ("positional", self.positional, ("sinusoidal", "learned", "rope", "none")),
            ("norm", self.norm, ("layernorm", "rmsnorm")),
            ("norm_placement", self.norm_placement, ("post", "pre")),
            ("activation", self.activation, ("relu", "gelu", "gelu_tanh", "swiglu")),
            ("kind", self.kind, ("encoder", "decoder", "encoder-decoder")),
            ("rope_layout", self.rope_layout, ("half", "interleaved")),
        ]:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, not {value!r}")
        for name in ("d_model", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")

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
