"""LFM2 (Liquid AI): short gated convolutions (core/net/short_conv.py) and softmax attention
layers, as layer_types says ("conv" -> ModelConfig's "linear_attention" with mixer kind
"short_conv"; "full_attention"), each followed by a SwiGLU FFN. Attention as Llama's with
QK-norm over each head's d_k (as Qwen3); the final norm is called embedding_norm.

    model.embed_tokens                        -> tgt_embed.tok
    model.layers.{i}.operator_norm / ffn_norm -> decoder.{i}.norms.0 / norms.1
    model.layers.{i}.self_attn.q_proj / k_proj / v_proj / out_proj -> decoder.{i}.self_attn.w_q / w_k / w_v / w_o
    model.layers.{i}.self_attn.q_layernorm / k_layernorm           -> decoder.{i}.self_attn.q_norm / k_norm
    model.layers.{i}.conv.in_proj / conv / out_proj                -> decoder.{i}.mixer.in_proj / conv / out_proj
    model.layers.{i}.feed_forward.w1 / w3 / w2                     -> decoder.{i}.ffn.w_1 / w_3 / w_2
    model.embedding_norm                      -> decoder_norm
    lm_head                                   -> out_proj (absent when tied, LFM2's default)

The FFN's width (intermediate_size, or LFM2's own block_ff_dim) is transformers' own rule: with block_auto_adjust_ff_dim, int(2 m / 3), then
times block_ffn_dim_multiplier rounded up to block_multiple_of where a multiplier is set.
"""

from __future__ import annotations

import dataclasses

from ..checkpoint import CheckpointError
from ..hf_config import config_llama
from .shared import rows

MODEL_TYPES = ("lfm2",)
BASES = (("model.", ""), "embed_tokens.weight")

TOP = [("embed_tokens", "tgt_embed.tok"), ("embedding_norm", "decoder_norm")]
LAYER = [
    ("layers.{i}.operator_norm", "decoder.{i}.norms.0"),
    ("layers.{i}.ffn_norm", "decoder.{i}.norms.1"),
    ("layers.{i}.self_attn.q_proj", "decoder.{i}.self_attn.w_q"),
    ("layers.{i}.self_attn.k_proj", "decoder.{i}.self_attn.w_k"),
    ("layers.{i}.self_attn.v_proj", "decoder.{i}.self_attn.w_v"),
    ("layers.{i}.self_attn.out_proj", "decoder.{i}.self_attn.w_o"),
    ("layers.{i}.self_attn.q_layernorm", "decoder.{i}.self_attn.q_norm"),
    ("layers.{i}.self_attn.k_layernorm", "decoder.{i}.self_attn.k_norm"),
    ("layers.{i}.conv.in_proj", "decoder.{i}.mixer.in_proj"),
    ("layers.{i}.conv.conv", "decoder.{i}.mixer.conv"),
    ("layers.{i}.conv.out_proj", "decoder.{i}.mixer.out_proj"),
    ("layers.{i}.feed_forward.w1", "decoder.{i}.ffn.w_1"),
    ("layers.{i}.feed_forward.w3", "decoder.{i}.ffn.w_3"),
    ("layers.{i}.feed_forward.w2", "decoder.{i}.ffn.w_2"),
]
TYPES = {"conv": "linear_attention", "full_attention": "full_attention"}


def ffn_width(hf: dict) -> int:
    m = int(hf["intermediate_size"] if "intermediate_size" in hf else hf["block_ff_dim"])  # LFM2's own name
    if hf.get("block_auto_adjust_ff_dim", True):
        m = int(2 * m / 3)
        mult = hf.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            step = int(hf.get("block_multiple_of", 256))
            m = step * ((int(mult * m) + step - 1) // step)
    return m


def config(hf: dict):
    n = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if types is None:
        full = hf.get("full_attn_idxs")
        types = ["full_attention" if full is None or i in full else "conv" for i in range(n)]
    bad = sorted({t for t in types if t not in TYPES})
    if bad:
        raise CheckpointError(f"LFM2 layer types {bad} are not supported (only 'conv' and 'full_attention')")
    cfg = config_llama(dict(hf, rms_norm_eps=hf.get("norm_eps", 1e-5), intermediate_size=ffn_width(hf)))
    layer_types = [TYPES[t] for t in types]
    mixes = "linear_attention" in layer_types
    return dataclasses.replace(
        cfg, d_ff=ffn_width(hf), qk_norm="head", layer_types=layer_types if mixes else None,
        tie_embeddings=bool(hf.get("tie_word_embeddings", hf.get("tie_embedding", True))),
        mixer={"kind": "short_conv", "conv": int(hf.get("conv_L_cache", 3)), "bias": bool(hf.get("conv_bias", False))}
        if mixes else None)


def weight_rows(cfg, base):
    return rows(cfg, base, TOP, LAYER)
