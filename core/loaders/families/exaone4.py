"""EXAONE 4: norms after the sub-layers only (as OLMo-2: x + PostNorm(f(x))), QK-norm over each
head's d_k (as Qwen3), sliding windows on three layers of four (layer_types), and where a
window is set, no positions on the global layers (transformers: "global NoPE").

    layers.{i}.post_attention_layernorm   -> decoder.{i}.post_norms.0
    layers.{i}.post_feedforward_layernorm -> decoder.{i}.post_norms.1
    layers.{i}.self_attn.q_norm / k_norm  -> decoder.{i}.self_attn.q_norm / k_norm  (d_k gains)
    the rest as Llama (core/loaders/families/shared.py)
"""

from __future__ import annotations

import dataclasses

from ..hf_config import config_llama
from .olmo2 import LAYER
from .shared import LLAMA_TOP, rows

MODEL_TYPES = ("exaone4",)
BASES = (("model.", ""), "embed_tokens.weight")


def config(hf: dict):
    cfg = config_llama(hf)
    window = hf.get("sliding_window")
    types = hf.get("layer_types") if window else None
    nope = [i for i, t in enumerate(types or [])
            if t != "sliding_attention"] if window else []  # transformers rotates only where no window or a sliding layer
    if types and "sliding_attention" not in types:
        types = None
    return dataclasses.replace(cfg, qk_norm="head", pre_sublayer_norm=False, post_sublayer_norm=True,
                               layer_types=types, sliding_window=int(window) if types else None,
                               nope_layers=nope or None)


def weight_rows(cfg, base):
    return rows(cfg, base, LLAMA_TOP, LAYER)
