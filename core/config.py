"""ModelConfig: one dataclass that describes every architecture the core runs.

Notation follows the lecture notes: d (d_model), H (n_heads), d_k (d_head), m (d_ff),
L (n_layers). The defaults are the notes' block: post-norm LayerNorm, ReLU FFN,
sinusoidal positions, encoder-decoder.
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
