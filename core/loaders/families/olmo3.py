"""OLMo 3: OLMo-2's block (norms after the sub-layers, QK-norm over the whole projection) with
sliding windows on three layers of four (layer_types, sliding_window) and a RoPE setting per
layer type (rope_parameters["sliding_attention"] / ["full_attention"]: the full layers' base
and scaling, the sliding layers' base as ModelConfig.rope_theta_local).

    the weights as OLMo-2 (core/loaders/families/olmo2.py)

Not supported (CheckpointError): attention biases, a RoPE scaling on the sliding layers.
"""

from __future__ import annotations

import dataclasses

from ..checkpoint import CheckpointError
from ..hf_config import config_llama, rope_params
from .olmo2 import LAYER
from .shared import LLAMA_TOP, rows

MODEL_TYPES = ("olmo3",)
BASES = (("model.", ""), "embed_tokens.weight")


def config(hf: dict):
    per_type = hf.get("rope_parameters") or {}
    local = None
    if "full_attention" in per_type or "sliding_attention" in per_type:
        full, slide = per_type.get("full_attention") or {}, per_type.get("sliding_attention") or {}
        hf = dict(hf, rope_parameters=full)
        theta_local, scaling_local = rope_params({"rope_parameters": slide, "rope_theta": hf.get("rope_theta", 10000.0)})
        if scaling_local is not None:
            raise CheckpointError("OLMo 3 with a RoPE scaling on its sliding layers is not supported")
        local = theta_local
    cfg = config_llama(hf)
    types = hf.get("layer_types")
    window = hf.get("sliding_window") if types and "sliding_attention" in types else None
    return dataclasses.replace(cfg, qk_norm="full", pre_sublayer_norm=False, post_sublayer_norm=True,
                               layer_types=types, sliding_window=int(window) if window else None,
                               rope_theta_local=local if local is not None and window else None)


def weight_rows(cfg, base):
    return rows(cfg, base, LLAMA_TOP, LAYER)
