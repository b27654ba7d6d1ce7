"""OLMo-2: Llama's sizes with the norms moved after the sub-layers and QK-norm over the whole
projection.

    x = x + PostNorm_1(MultiHead(x));  x = x + PostNorm_2(FFN(x))     (no norm before either)

ModelConfig: pre_sublayer_norm False, post_sublayer_norm True (recorded post_norm1/2),
qk_norm "full" (an RMSNorm over all H*d_k features of q, H_kv*d_k of k, before the split into
heads and RoPE; recorded q_pre_norm / k_pre_norm).

    layers.{i}.post_attention_layernorm   -> decoder.{i}.post_norms.0
    layers.{i}.post_feedforward_layernorm -> decoder.{i}.post_norms.1
    layers.{i}.self_attn.q_norm / k_norm  -> decoder.{i}.self_attn.q_norm / k_norm  (H*d_k, H_kv*d_k gains)
    the rest as Llama (core/loaders/families/shared.py)

Not supported (CheckpointError): attention biases.
"""

from __future__ import annotations

import dataclasses

from ..hf_config import config_llama
from .shared import LLAMA_ATTN, LLAMA_MLP, LLAMA_TOP, QK_NORM, rows

MODEL_TYPES = ("olmo2",)
BASES = (("model.", ""), "embed_tokens.weight")
LAYER = [*LLAMA_ATTN, *QK_NORM, ("layers.{i}.post_attention_layernorm", "decoder.{i}.post_norms.0"),
         *LLAMA_MLP, ("layers.{i}.post_feedforward_layernorm", "decoder.{i}.post_norms.1")]


def config(hf: dict):
    return dataclasses.replace(config_llama(hf), qk_norm="full", pre_sublayer_norm=False, post_sublayer_norm=True)


def weight_rows(cfg, base):
    return rows(cfg, base, LLAMA_TOP, LAYER)
