"""Phi-3: Llama's block with fused projections, optional partial rotary and a sliding window.

    layers.{i}.self_attn.qkv_proj  -> split: rows [0, H d_k) W_q, the next H_kv d_k W_k, the last W_v
    layers.{i}.mlp.gate_up_proj    -> split: rows [0, m) the gate W_1, [m, 2m) the up W_3
    the rest as Llama (core/loaders/families/shared.py)

partial_rotary_factor < 1 sets ModelConfig.rotary_dim (RoPE on the first features of each
head); sliding_window masks keys that many positions back in every layer, as Mistral's.

Not supported (CheckpointError): longrope ("su", "yarn") RoPE scaling, the rescaled
frequencies and attention factor of the 128k-context checkpoints.
"""

from __future__ import annotations

import dataclasses

from ..checkpoint import CheckpointError, check_shape
from ..hf_config import config_llama, rotary_dim
from .shared import LLAMA_TOP, rows

MODEL_TYPES = ("phi3",)
BASES = (("model.", ""), "embed_tokens.weight")
LAYER = [
    ("layers.{i}.input_layernorm", "decoder.{i}.norms.0"),
    ("layers.{i}.self_attn.o_proj", "decoder.{i}.self_attn.w_o"),
    ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1"),
    ("layers.{i}.mlp.down_proj", "decoder.{i}.ffn.w_2"),
]


def config(hf: dict):
    merged = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    kind = merged.get("rope_type", merged.get("type", "default"))
    if kind in ("longrope", "su", "yarn"):
        raise CheckpointError(f"Phi-3 with {kind!r} RoPE scaling (the long-context checkpoints) is not supported; "
                              "the checkpoints without rope scaling (4k context) are")
    cfg = config_llama(hf, partial=True)
    window = hf.get("sliding_window")
    return dataclasses.replace(cfg, rotary_dim=rotary_dim(hf, cfg.d_head),
                               sliding_window=int(window) if window else None)


def weight_rows(cfg, base):
    return rows(cfg, base, LLAMA_TOP, LAYER)


def split_fused(cfg, base, ckpt, state) -> None:
    """qkv_proj -> W_q, W_k, W_v; gate_up_proj -> W_1 (gate), W_3 (up)."""
    d, q, kv, m = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head, cfg.d_ff
    for i in range(cfg.n_layers):
        name = f"{base}layers.{i}.self_attn.qkv_proj.weight"
        if name in ckpt:
            t = ckpt.get(name)
            check_shape(name, t, [q + 2 * kv, d])
            for part, rows_ in (("w_q", t[:q]), ("w_k", t[q:q + kv]), ("w_v", t[q + kv:])):
                state[f"decoder.{i}.self_attn.{part}.weight"] = rows_.clone()
        name = f"{base}layers.{i}.mlp.gate_up_proj.weight"
        if name in ckpt:
            t = ckpt.get(name)
            check_shape(name, t, [2 * m, d])
            state[f"decoder.{i}.ffn.w_1.weight"], state[f"decoder.{i}.ffn.w_3.weight"] = t[:m].clone(), t[m:].clone()
