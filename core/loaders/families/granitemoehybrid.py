"""GraniteMoeHybrid (IBM Granite 4.0-H): Mamba2 layers (core/net/mamba2.py) and softmax
attention layers, as layer_types says ("mamba" / "linear_attention" -> ModelConfig's
"linear_attention" with mixer kind "mamba2"; "attention" -> "full_attention"), each followed
by the FFN; RoPE where position_embedding_type is "rope", else no positions. Its multipliers:

    embedding_multiplier  -> ModelConfig.embed_multiplier (the token embeddings times it)
    attention_multiplier  -> ModelConfig.attn_scale (the factor on Q K^T, in place of 1/sqrt(d_k))
    logits_scaling        -> ModelConfig.logit_scale = 1 / logits_scaling (logits / s)
    residual_multiplier   r: every sub-layer adds r f(x) to the stream; r is folded into the
                          sub-layer's last projection here (W_o, the mixer's out_proj, the FFN's
                          W_2, and their biases), so that `.out` and `ffn.out` are what the
                          stream receives

The weights:

    model.embed_tokens                                  -> tgt_embed.tok
    model.layers.{i}.input_layernorm / post_attention_layernorm -> decoder.{i}.norms.0 / norms.1
    model.layers.{i}.self_attn.q_proj / k_proj / v_proj / o_proj -> decoder.{i}.self_attn.w_q / w_k / w_v / w_o
    model.layers.{i}.mamba.*                            -> decoder.{i}.mixer.* (transformers' names)
    model.layers.{i}.shared_mlp.input_linear            -> decoder.{i}.ffn.w_1 (first half: the gate)
                                                           and w_3 (second half: the up projection)
    model.layers.{i}.shared_mlp.output_linear           -> decoder.{i}.ffn.w_2
    model.norm                                          -> decoder_norm
    lm_head                                             -> out_proj (absent when tied)

A mixture of experts (num_local_experts > 0: Granite 4.0-H Tiny and Small; Micro is dense) is
ModelConfig.moe kind "qwen3_next" with an ungated shared expert: the router's softmax over its
top-k logits is the softmax over all E renormalised over the top k (norm_topk), and the shared
MLP is added to the experts' sum:

    model.layers.{i}.block_sparse_moe.router.layer      -> decoder.{i}.ffn.router
    model.layers.{i}.block_sparse_moe.input_linear (E x 2m x d) / output_linear (E x d x m)
                                                        -> decoder.{i}.ffn.gate_up / down, transposed
    (transformers' in-memory names, router and experts.gate_up_proj / down_proj, are read too)
    model.layers.{i}.shared_mlp.input_linear / output_linear -> decoder.{i}.ffn.shared_w_1 and
                                                           shared_w_3 (halves) / shared_w_2

Not supported (CheckpointError): attention biases, an activation other than SiLU.
"""

from __future__ import annotations

import dataclasses

from ..checkpoint import CheckpointError, check_shape
from ..hf_config import config_llama
from .mamba2 import mixer_rows, mixer_settings
from .shared import rows

MODEL_TYPES = ("granitemoehybrid",)
BASES = (("model.", ""), "embed_tokens.weight")

TOP = [("embed_tokens", "tgt_embed.tok"), ("norm", "decoder_norm")]
LAYER = [
    ("layers.{i}.input_layernorm", "decoder.{i}.norms.0"),
    ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1"),
    ("layers.{i}.self_attn.q_proj", "decoder.{i}.self_attn.w_q"),
    ("layers.{i}.self_attn.k_proj", "decoder.{i}.self_attn.w_k"),
    ("layers.{i}.self_attn.v_proj", "decoder.{i}.self_attn.w_v"),
    ("layers.{i}.self_attn.o_proj", "decoder.{i}.self_attn.w_o"),
    ("layers.{i}.shared_mlp.output_linear", "decoder.{i}.ffn.w_2"),
]
MOE_LAYER = LAYER[:-1] + [
    ("layers.{i}.shared_mlp.output_linear", "decoder.{i}.ffn.shared_w_2"),  # the shared MLP beside the experts
]
MIXER_TYPES = ("mamba", "linear_attention")
ATTN_TYPES = ("attention", "full_attention")


def config(hf: dict):
    experts = int(hf.get("num_local_experts") or 0)
    n, d = int(hf["num_hidden_layers"]), int(hf["hidden_size"])
    types = hf.get("layer_types") or hf.get("layers_block_type") or ["mamba"] * n
    bad = sorted({t for t in types if t not in MIXER_TYPES + ATTN_TYPES})
    if bad:
        raise CheckpointError(f"GraniteMoeHybrid layer types {bad} are not supported (only mamba and attention)")
    layer_types = ["linear_attention" if t in MIXER_TYPES else "full_attention" for t in types]
    eps = float(hf.get("rms_norm_eps", 1e-6))
    d_inner = int(hf.get("mamba_expand", 2)) * d
    heads = int(hf.get("mamba_n_heads", 128))
    head_dim = hf.get("mamba_d_head", "auto")
    mamba = dict(hf, mamba_n_heads=heads, mamba_d_head=d_inner // heads if head_dim in (None, "auto") else head_dim)
    mixer = mixer_settings(mamba, "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv",
                           "mamba_chunk_size", "mamba_proj_bias", "mamba_conv_bias", d_inner, eps)
    cfg = config_llama(dict(hf, intermediate_size=hf.get("shared_intermediate_size", 1024)))
    rope = hf.get("position_embedding_type") == "rope"
    return dataclasses.replace(
        cfg, positional="rope" if rope else "none", layer_types=layer_types, mixer=mixer,
        attn_scale=float(hf.get("attention_multiplier", 1.0)),
        embed_multiplier=float(hf.get("embedding_multiplier", 1.0)),
        logit_scale=1.0 / float(hf.get("logits_scaling", 1.0)),
        moe=None if experts == 0 else {
            "kind": "qwen3_next", "experts": experts, "top_k": int(hf.get("num_experts_per_tok", 2)),
            "d_expert": int(hf["intermediate_size"]), "d_shared": int(hf.get("shared_intermediate_size", 1024)),
            "norm_topk": True, "shared_gate": False},
        extra={"residual_multiplier": float(hf.get("residual_multiplier", 1.0))})


def weight_rows(cfg, base):
    out = rows(cfg, base, TOP, MOE_LAYER if cfg.moe else LAYER)
    for i in cfg.mixer_layers():
        out += mixer_rows(base, f"layers.{i}.mamba", f"decoder.{i}.mixer")
    return out


def split_fused(cfg, base, ckpt, state):
    """The shared MLP's fused gate and up projection, split; then the residual multiplier
    folded into each sub-layer's last projection."""
    gate, up = ("shared_w_1", "shared_w_3") if cfg.moe else ("w_1", "w_3")
    for i in range(cfg.n_layers):
        fused = ckpt.get(f"{base}layers.{i}.shared_mlp.input_linear.weight")  # (2 m, d): gate rows, then up
        m = fused.shape[0] // 2
        state[f"decoder.{i}.ffn.{gate}.weight"], state[f"decoder.{i}.ffn.{up}.weight"] = fused[:m].clone(), fused[m:].clone()
        if cfg.moe:
            moe = f"{base}layers.{i}.block_sparse_moe"
            saved = f"{moe}.input_linear.weight" in ckpt  # the checkpoints' names, else transformers' own
            router = f"{moe}.router.layer.weight" if saved else f"{moe}.router.weight"
            names = ((f"{moe}.input_linear.weight", f"{moe}.output_linear.weight") if saved
                     else (f"{moe}.experts.gate_up_proj", f"{moe}.experts.down_proj"))
            E, m_e, d = cfg.moe["experts"], cfg.moe["d_expert"], cfg.d_model
            state[f"decoder.{i}.ffn.router.weight"] = ckpt.get(router)
            check_shape(router, state[f"decoder.{i}.ffn.router.weight"], [E, d])
            gu, down = ckpt.get(names[0]), ckpt.get(names[1])
            check_shape(names[0], gu, [E, 2 * m_e, d])
            check_shape(names[1], down, [E, d, m_e])
            state[f"decoder.{i}.ffn.gate_up"] = gu.transpose(1, 2).contiguous()  # E x d x 2m: gate, then up
            state[f"decoder.{i}.ffn.down"] = down.transpose(1, 2).contiguous()  # E x m x d
    r = float(cfg.extra.get("residual_multiplier", 1.0))
    if r != 1.0:
        last = ("self_attn.w_o", "mixer.out_proj", "ffn.w_2", "ffn.shared_w_2", "ffn.down")
        for name in list(state):
            rest = name.split(".", 2)[-1] if name.startswith("decoder.") else ""  # e.g. ffn.w_2.weight, ffn.down
            if any(rest == p or rest.startswith(p + ".") for p in last):
                state[name] = state[name] * r
