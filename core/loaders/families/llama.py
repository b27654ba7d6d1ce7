"""Llama, Mistral and Qwen2: the Llama block (RMSNorm, RoPE in the "half" layout, SwiGLU,
grouped-query attention); config.json -> ModelConfig and the weight table.

    llama       rope_scaling linear / llama3
    mistral     as llama, plus sliding-window attention (ModelConfig.sliding_window): keys W or
                more positions back are masked with -inf, visible in the recorded mask
    qwen2       as llama, with biases on W_q, W_k, W_v (ModelConfig.qkv_bias)

The config is core/loaders/hf_config.config_llama, the Llama-style config other families
start from too.
"""

from __future__ import annotations

from typing import List, Tuple

from ..hf_config import config_llama
from ...net.config import ModelConfig

MODEL_TYPES = ("llama", "mistral", "qwen2")
BASES = (("model.", ""), "embed_tokens.weight")

TOP = [("embed_tokens", "tgt_embed.tok"), ("norm", "decoder_norm")]
LAYER = [
    ("layers.{i}.input_layernorm", "decoder.{i}.norms.0"),
    ("layers.{i}.self_attn.q_proj", "decoder.{i}.self_attn.w_q"),
    ("layers.{i}.self_attn.k_proj", "decoder.{i}.self_attn.w_k"),
    ("layers.{i}.self_attn.v_proj", "decoder.{i}.self_attn.w_v"),
    ("layers.{i}.self_attn.o_proj", "decoder.{i}.self_attn.w_o"),
    ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1"),
    ("layers.{i}.mlp.gate_proj", "decoder.{i}.ffn.w_1"),
    ("layers.{i}.mlp.up_proj", "decoder.{i}.ffn.w_3"),
    ("layers.{i}.mlp.down_proj", "decoder.{i}.ffn.w_2"),
]


def config(hf: dict) -> ModelConfig:
    return config_llama(hf)


def weight_rows(cfg: ModelConfig, base: str) -> List[Tuple[str, str, str]]:
    rows = [(base + theirs + s, ours + s, "") for theirs, ours in TOP for s in (".weight", ".bias")]
    for i in range(cfg.n_layers):
        rows += [(base + theirs.format(i=i) + s, ours.format(i=i) + s, "") for theirs, ours in LAYER
                 for s in (".weight", ".bias")]
    if not cfg.tie_embeddings:
        rows.append(("lm_head.weight", "out_proj.weight", ""))
    return rows
