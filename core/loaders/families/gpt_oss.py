"""gpt-oss: a learned sink logit per head inside the softmax (ModelConfig.attn_sinks), sliding
windows on alternate layers (layer_types), YaRN RoPE (its attention factor squared in the
scale), biases on q, k, v and o, and a mixture-of-experts FFN in every layer (core/net/moe.py:
top-k softmax router with a bias, experts with the clamped SwiGLU (up + 1) * g sigmoid(alpha g)
and biases).

    layers.{i}.self_attn.sinks                  -> decoder.{i}.self_attn.sinks       (H)
    layers.{i}.mlp.router                       -> decoder.{i}.ffn.router            (E x d, E)
    layers.{i}.mlp.experts.gate_up_proj[_bias]  -> decoder.{i}.ffn.gate_up[_bias]    (E x d x 2m, E x 2m)
    layers.{i}.mlp.experts.down_proj[_bias]     -> decoder.{i}.ffn.down[_bias]       (E x m x d, E x d)
    the rest as Llama (core/loaders/families/shared.py), with biases
"""

from __future__ import annotations

import dataclasses

from ..checkpoint import CheckpointError
from ..hf_config import config_llama
from .shared import LLAMA_ATTN, LLAMA_TOP, rows

MODEL_TYPES = ("gpt_oss",)
BASES = (("model.", ""), "embed_tokens.weight")
LAYER = [("layers.{i}.input_layernorm", "decoder.{i}.norms.0"), *LLAMA_ATTN,
         ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1"),
         ("layers.{i}.mlp.router", "decoder.{i}.ffn.router")]
EXPERTS = [("self_attn.sinks", "self_attn.sinks")] + [
    (f"mlp.experts.{t}", f"ffn.{o}") for t, o in (("gate_up_proj", "gate_up"), ("gate_up_proj_bias", "gate_up_bias"),
                                                  ("down_proj", "down"), ("down_proj_bias", "down_bias"))]


def config(hf: dict):
    bias = bool(hf.get("attention_bias", True))
    cfg = config_llama(dict(hf, attention_bias=False))
    if hf.get("num_local_experts", 0) < 1:
        raise CheckpointError("gpt-oss without experts (num_local_experts) is not supported")
    types = hf.get("layer_types")
    window = hf.get("sliding_window") if types and "sliding_attention" in types else None
    moe = {"kind": "gpt_oss", "experts": int(hf["num_local_experts"]), "top_k": int(hf["num_experts_per_tok"]),
           "d_expert": int(hf["intermediate_size"]), "alpha": float(hf.get("swiglu_alpha", 1.702)),
           "limit": float(hf.get("swiglu_limit", 7.0))}
    return dataclasses.replace(cfg, bias=bias, qkv_bias=bias, out_bias=False, attn_sinks=True, moe=moe,
                               layer_types=types if window else None, sliding_window=int(window) if window else None)


def weight_rows(cfg, base):
    out = rows(cfg, base, LLAMA_TOP, LAYER)
    for i in range(cfg.n_layers):
        out += [(f"{base}layers.{i}.{t}", f"decoder.{i}.{o}", "") for t, o in EXPERTS]
    return out
