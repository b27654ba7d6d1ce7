"""Qwen3: Llama's block with QK-norm, an RMSNorm over each head's d_k features of q and k,
applied before RoPE (ModelConfig.qk_norm = "head"; recorded as q_pre_norm / k_pre_norm).

    layers.{i}.self_attn.q_norm / k_norm  -> decoder.{i}.self_attn.q_norm / k_norm   (d_k gains)
    the rest as Llama (core/loaders/families/shared.py)

Not supported (CheckpointError): attention biases, the sliding window (use_sliding_window).
"""

from __future__ import annotations

import dataclasses

from ..checkpoint import CheckpointError
from ..hf_config import config_llama
from .shared import LLAMA_ATTN, LLAMA_MLP, LLAMA_TOP, QK_NORM, rows

MODEL_TYPES = ("qwen3",)
BASES = (("model.", ""), "embed_tokens.weight")
LAYER = [("layers.{i}.input_layernorm", "decoder.{i}.norms.0"), *LLAMA_ATTN, *QK_NORM,
         ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1"), *LLAMA_MLP]


def config(hf: dict):
    if hf.get("use_sliding_window"):
        raise CheckpointError("Qwen3 with use_sliding_window is not supported")
    return dataclasses.replace(config_llama(hf), qk_norm="head")


def weight_rows(cfg, base):
    return rows(cfg, base, LLAMA_TOP, LAYER)
