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
from .shared import LLAMA_ATTN, LLAMA_MLP, LLAMA_TOP, rows
from ...net.config import ModelConfig

MODEL_TYPES = ("llama", "mistral", "qwen2")
BASES = (("model.", ""), "embed_tokens.weight")

# the Llama table, shared with the families built on it (core/loaders/families/shared.py)
LAYER = [("layers.{i}.input_layernorm", "decoder.{i}.norms.0"), *LLAMA_ATTN,
         ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1"), *LLAMA_MLP]


def config(hf: dict) -> ModelConfig:
    return config_llama(hf)


def weight_rows(cfg: ModelConfig, base: str) -> List[Tuple[str, str, str]]:
    return rows(cfg, base, LLAMA_TOP, LAYER)
