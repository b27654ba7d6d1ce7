"""Reading config.json, the pieces every family module shares (core/loaders/families):
activations, settings refused by name, RoPE's theta and scaling, the decoders' length cap, and
config_llama, the Llama-style decoder config (RMSNorm, RoPE in the "half" layout, SwiGLU,
GQA; mistral's sliding window and qwen2's qkv biases included) that llama.py and the families
built on Llama start from.

A setting the architecture here does not compute (another position scheme, an unknown
activation, attention biases on llama, ...) is a CheckpointError that names it.
"""

from __future__ import annotations

from typing import Optional, Tuple

from .checkpoint import CheckpointError
from ..net.config import ModelConfig

DECODER_MAX_LEN = 2048  # a decoder's context when its config names none

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "relu": "relu", "silu": "swiglu", "swish": "swiglu"}


def _act(name: str) -> str:
    if name not in ACTIVATIONS:
        raise CheckpointError(f"unsupported activation {name!r}")
    return ACTIVATIONS[name]


def _no(hf: dict, key: str, what: str) -> None:
    if hf.get(key):
        raise CheckpointError(f"{what} ({key}={hf[key]!r}) is not supported")


def rope_params(hf: dict, partial: bool = False) -> Tuple[float, Optional[dict]]:
    """(theta, ModelConfig.rope_scaling) from rope_theta / rope_scaling (transformers 4) or
    rope_parameters (transformers 5). partial: the family reads partial rotary itself
    (rotary_dim); otherwise a partial_rotary_factor is refused."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    merged = {**scaling, **params}
    theta = float(merged.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = merged.get("rope_type", merged.get("type", "default"))
    if not partial and merged.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("partial rotary embeddings (partial_rotary_factor) are not supported")
    if kind in (None, "default"):
        return theta, None
    if kind == "linear":
        return theta, {"type": "linear", "factor": float(merged["factor"])}
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        return theta, {"type": "llama3", **{k: float(merged[k]) for k in keys}}
    if kind == "yarn":
        if merged.get("mscale") or merged.get("mscale_all_dim"):
            raise CheckpointError("YaRN with mscale / mscale_all_dim is not supported")
        out = {"type": "yarn", "factor": float(merged["factor"]),
               "original_max_position_embeddings": float(merged["original_max_position_embeddings"]),
               "beta_fast": float(merged.get("beta_fast") or 32), "beta_slow": float(merged.get("beta_slow") or 1),
               "truncate": bool(merged.get("truncate", True))}
        if merged.get("attention_factor") is not None:
            out["attention_factor"] = float(merged["attention_factor"])
        return theta, out
    raise CheckpointError(f"rope scaling type {kind!r} is not supported (only linear, llama3 and yarn)")


def rotary_dim(hf: dict, d_head: int, default: float = 1.0) -> Optional[int]:
    """ModelConfig.rotary_dim from partial_rotary_factor (rope_parameters, rope_scaling or the
    top level) or GPT-NeoX's rotary_pct: None when every feature of a head is rotated."""
    merged = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    factor = merged.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct", default)))
    r = int(d_head * float(factor))
    if r >= d_head:
        return None
    if r < 2 or r % 2:
        raise CheckpointError(f"partial rotary over {r} of {d_head} features is not supported (it must be even and >= 2)")
    return r


def config_llama(hf: dict, partial: bool = False) -> ModelConfig:
    """partial: the caller reads partial rotary (rotary_dim) itself (Phi-3)."""
    family = hf.get("model_type")
    _no(hf, "attention_bias", "attention biases")
    _no(hf, "mlp_bias", "FFN biases")
    if family == "qwen2" and hf.get("use_sliding_window"):
        raise CheckpointError("Qwen2 with use_sliding_window is not supported")
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise CheckpointError(f"hidden_act {act!r} is not supported for {family}")
    h = hf["num_attention_heads"]
    theta, scaling = rope_params(hf, partial)
    window = hf.get("sliding_window") if family == "mistral" else None
    return ModelConfig(
        kind="decoder",
        d_model=hf["hidden_size"],
        n_heads=h,
        n_kv_heads=hf.get("num_key_value_heads") or h,
        d_head=hf.get("head_dim") or hf["hidden_size"] // h,
        d_ff=hf["intermediate_size"],
        n_layers=hf["num_hidden_layers"],
        tgt_vocab_size=hf["vocab_size"],
        max_len=hf.get("max_position_embeddings", DECODER_MAX_LEN),
        positional="rope",
        rope_theta=theta,
        rope_scaling=scaling,
        rope_layout="half",
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        norm_placement="pre",
        activation="swiglu",
        bias=False,
        qkv_bias=family == "qwen2",
        final_norm=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window else None,
        pad_id=hf.get("pad_token_id") or 0,
    )
