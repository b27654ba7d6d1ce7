"""SmolLM3: Llama's block with no positions on some layers (NoPE): no_rope_layers[i] = 0
leaves layer i's q and k unrotated (ModelConfig.nope_layers; every fourth layer by default),
and an optional sliding window on the NoPE layers (use_sliding_window, layer_types).

    the weights as Llama (core/loaders/families/shared.py)

Not supported (CheckpointError): attention or FFN biases.
"""

from __future__ import annotations

import dataclasses

from ..hf_config import config_llama
from .llama import LAYER
from .shared import LLAMA_TOP, rows

MODEL_TYPES = ("smollm3",)
BASES = (("model.", ""), "embed_tokens.weight")


def nope(flags) -> list:
    """The layers whose flag in transformers' no_rope_layers is 0 (no RoPE)."""
    return [i for i, f in enumerate(flags or []) if not f]


def config(hf: dict):
    cfg = config_llama(hf)
    n = hf["num_hidden_layers"]
    flags = hf.get("no_rope_layers") or [int((i + 1) % hf.get("no_rope_layer_interval", 4) != 0) for i in range(n)]
    types = hf.get("layer_types") if hf.get("use_sliding_window") and hf.get("sliding_window") else None
    return dataclasses.replace(cfg, nope_layers=nope(flags) or None, layer_types=types,
                               sliding_window=int(hf["sliding_window"]) if types else None)


def weight_rows(cfg, base):
    return rows(cfg, base, LLAMA_TOP, LAYER)
