"""Llama 4 (text): chunked attention on the RoPE layers (a query sees the keys of its own chunk
of attention_chunk_size positions), no positions on the others (no_rope_layers[i] = 0), the QK
L2 norm on the RoPE layers (use_qk_norm: an RMSNorm without gain), temperature tuning on the
NoPE layers (a scale per query position: attn_scale, floor_scale), RoPE in the interleaved
(complex) layout, and a mixture-of-experts FFN with a shared expert on moe_layers (the other
layers a SwiGLU FFN of intermediate_size_mlp).

    layers.{i}.feed_forward.{gate,up,down}_proj          -> decoder.{i}.ffn.w_1 / w_3 / w_2   (dense layers)
    layers.{i}.feed_forward.router                       -> decoder.{i}.ffn.router            (E x d)
    layers.{i}.feed_forward.experts.gate_up_proj         -> decoder.{i}.ffn.gate_up           (E x d x 2m)
    layers.{i}.feed_forward.experts.down_proj            -> decoder.{i}.ffn.down              (E x m x d)
    layers.{i}.feed_forward.shared_expert.{gate,up,down}_proj -> decoder.{i}.ffn.shared_w_1 / w_3 / w_2
    the rest as Llama (core/loaders/families/shared.py)
"""

from __future__ import annotations

import dataclasses

from ..hf_config import config_llama
from .shared import LLAMA_ATTN, LLAMA_TOP, rows
from .smollm3 import nope

MODEL_TYPES = ("llama4_text",)
BASES = (("model.", "language_model.model.", ""), "embed_tokens.weight")
FF = "layers.{i}.feed_forward"
LAYER = [("layers.{i}.input_layernorm", "decoder.{i}.norms.0"), *LLAMA_ATTN,
         ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1"),
         (f"{FF}.gate_proj", "decoder.{i}.ffn.w_1"), (f"{FF}.up_proj", "decoder.{i}.ffn.w_3"),
         (f"{FF}.down_proj", "decoder.{i}.ffn.w_2"), (f"{FF}.router", "decoder.{i}.ffn.router"),
         (f"{FF}.shared_expert.gate_proj", "decoder.{i}.ffn.shared_w_1"),
         (f"{FF}.shared_expert.up_proj", "decoder.{i}.ffn.shared_w_3"),
         (f"{FF}.shared_expert.down_proj", "decoder.{i}.ffn.shared_w_2")]


def config(hf: dict):
    n = hf["num_hidden_layers"]
    cfg = config_llama(dict(hf, intermediate_size=hf.get("intermediate_size_mlp", hf["intermediate_size"])))
    flags = hf.get("no_rope_layers") or [1] * n
    no_pos = nope(flags)
    rope_layers = [i for i in range(n) if flags[i]]
    chunk = hf.get("attention_chunk_size")
    types = hf.get("layer_types") or (["chunked_attention" if flags[i] else "full_attention" for i in range(n)]
                                      if chunk else None)
    if types is not None and "chunked_attention" not in types:
        types = None
    moe_layers = hf.get("moe_layers")
    if moe_layers is None:
        step = hf.get("interleave_moe_layer_step", 1)
        moe_layers = list(range(step - 1, n, step)) if step else []
    moe = {"kind": "llama4", "experts": int(hf["num_local_experts"]), "top_k": int(hf["num_experts_per_tok"]),
           "d_expert": int(hf["intermediate_size"]), "layers": list(moe_layers)} if moe_layers else None
    temp = ({"scale": float(hf.get("attn_scale", 0.1)), "floor": float(hf.get("floor_scale", 8192))}
            if hf.get("attn_temperature_tuning") and no_pos else None)
    return dataclasses.replace(cfg, rope_layout="interleaved", nope_layers=no_pos or None, layer_types=types,
                               attn_chunk=int(chunk) if types else None,
                               qk_norm="l2" if hf.get("use_qk_norm") and rope_layers else None,
                               qk_norm_layers=rope_layers if hf.get("use_qk_norm") else None,
                               attn_temperature=temp, moe=moe)


def weight_rows(cfg, base):
    out = rows(cfg, base, LLAMA_TOP, LAYER)
    for i in (cfg.moe or {}).get("layers") or []:
        out += [(f"{base}{FF.format(i=i)}.experts.gate_up_proj", f"decoder.{i}.ffn.gate_up", ""),
                (f"{base}{FF.format(i=i)}.experts.down_proj", f"decoder.{i}.ffn.down", "")]
    return out
