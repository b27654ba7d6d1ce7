"""config.json -> ModelConfig for the families core/loaders/hf.py reads (model_type):

    bert        encoder, post-norm LayerNorm, learned positions + token types, GELU
    roberta     as bert, positions start at padding_idx + 1 (ModelConfig.position_offset)
    distilbert  as bert without token types (q_lin/k_lin/... names)
    gpt2        decoder, pre-norm LayerNorm, learned positions, gelu_new; Conv1D weights are
                stored (in, out) and transposed (core/loaders/hf_weights.py); c_attn is split into
                W_q, W_k, W_v
    llama       decoder, RMSNorm, RoPE ("half" layout; rope_scaling linear / llama3), SwiGLU, GQA
    mistral     as llama, plus sliding-window attention (ModelConfig.sliding_window): keys
                W or more positions back are masked with -inf, visible in the recorded mask
    qwen2       as llama, with biases on W_q, W_k, W_v (ModelConfig.qkv_bias)

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


def config_bert(hf: dict) -> ModelConfig:
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported")
    roberta = hf.get("model_type") == "roberta"
    offset = int(hf.get("pad_token_id", 1)) + 1 if roberta else 0
    return _bert_family(
        hf, ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers"),
        max_len=hf.get("max_position_embeddings", 512) - offset,
        position_offset=offset,
        type_vocab_size=hf.get("type_vocab_size", 2),
        activation=_act(hf.get("hidden_act", "gelu")),
        norm_eps=hf.get("layer_norm_eps", 1e-12),
    )


def _bert_family(hf: dict, sizes: Tuple[str, str, str, str], **fields) -> ModelConfig:
    """What BERT, RoBERTa and DistilBERT share: a post-norm encoder with learned positions, an
    embedding LayerNorm and biases. sizes: the config.json keys of d, H, m and L, which each
    family names its own way; `fields` the rest."""
    d, h, m, n_layers = (hf[k] for k in sizes)
    return ModelConfig(kind="encoder", d_model=d, n_heads=h, d_ff=m, n_layers=n_layers,
                       src_vocab_size=hf["vocab_size"], positional="learned", embed_norm=True, norm="layernorm",
                       norm_placement="post", bias=True, final_norm=False, pad_id=hf.get("pad_token_id") or 0,
                       **fields)


def config_distilbert(hf: dict) -> ModelConfig:
    return _bert_family(
        hf, ("dim", "n_heads", "hidden_dim", "n_layers"),
        max_len=hf.get("max_position_embeddings", 512),
        # positional="learned" for sinusoidal_pos_embds too: the table is stored in the checkpoint
        activation=_act(hf.get("activation", "gelu")),
        norm_eps=1e-12,
    )


def config_gpt2(hf: dict) -> ModelConfig:
    _no(hf, "scale_attn_by_inverse_layer_idx", "scaling attention by the layer index")
    _no(hf, "reorder_and_upcast_attn", "reordered attention")
    if hf.get("scale_attn_weights", True) is False:
        raise CheckpointError("GPT-2 without 1/sqrt(d_k) scaling (scale_attn_weights=false) is not supported")
    d = hf["n_embd"]
    return ModelConfig(
        kind="decoder",
        d_model=d,
        n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d,
        n_layers=hf["n_layer"],
        tgt_vocab_size=hf["vocab_size"],
        max_len=hf.get("n_positions", 1024),
        positional="learned",
        activation=_act(hf.get("activation_function", "gelu_new")),
        norm="layernorm",
        norm_placement="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        bias=True,
        final_norm=True,
        tie_embeddings=hf.get("tie_word_embeddings", True),
        out_bias=False,
        pad_id=hf.get("pad_token_id") or 0,
    )


def rope_params(hf: dict) -> Tuple[float, Optional[dict]]:
    """(theta, ModelConfig.rope_scaling) from rope_theta / rope_scaling (transformers 4) or
    rope_parameters (transformers 5)."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    merged = {**scaling, **params}
    theta = float(merged.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = merged.get("rope_type", merged.get("type", "default"))
    if merged.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("partial rotary embeddings (partial_rotary_factor) are not supported")
    if kind in (None, "default"):
        return theta, None
    if kind == "linear":
        return theta, {"type": "linear", "factor": float(merged["factor"])}
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        return theta, {"type": "llama3", **{k: float(merged[k]) for k in keys}}
    raise CheckpointError(f"rope scaling type {kind!r} is not supported (only linear and llama3)")


def config_llama(hf: dict) -> ModelConfig:
    family = hf.get("model_type")
    _no(hf, "attention_bias", "attention biases")
    _no(hf, "mlp_bias", "FFN biases")
    if family == "qwen2" and hf.get("use_sliding_window"):
        raise CheckpointError("Qwen2 with use_sliding_window is not supported")
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise CheckpointError(f"hidden_act {act!r} is not supported for {family}")
    h = hf["num_attention_heads"]
    theta, scaling = rope_params(hf)
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


CONFIGS = {"bert": config_bert, "roberta": config_bert, "distilbert": config_distilbert, "gpt2": config_gpt2,
           "llama": config_llama, "mistral": config_llama, "qwen2": config_llama}
