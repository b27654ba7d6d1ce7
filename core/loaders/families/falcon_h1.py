"""Falcon-H1 (TII): in every layer a Mamba2 mixer (core/net/mamba2.py) and softmax attention
side by side on the same normed input (ModelConfig.mixer with "beside_attention"):
x + ssm_out * Mamba2(Norm(x)) + attn_out * Attention(attn_in * Norm(x)), then a SwiGLU FFN.

Its multipliers (muP) are folded into the weights at load time, so that each recorded value is
what the next step reads (the numbers differ from transformers' by float rounding only):

    attention_in_multiplier  -> W_q, W_k, W_v (weights; the biases are added after)
    key_multiplier           -> W_k (weight and bias)
    attention_out_multiplier -> W_o
    ssm_in_multiplier        -> the mixer's in_proj weight
    ssm_multipliers          -> the mixer's in_proj rows, by part (z, x, B, C, dt): transformers'
                                mup_vector, computed from the config as there
    ssm_out_multiplier       -> the mixer's out_proj
    mlp_multipliers (g, d)   -> the FFN's W_1 (silu(g x W_1)) and W_2
    embedding_multiplier     -> ModelConfig.embed_multiplier
    lm_head_multiplier       -> ModelConfig.logit_scale

The mixer's gate (core/net/mamba2.py GATES): mamba_rms_norm False: y * silu(z), no norm;
else RMSNorm(y) * silu(z) (mamba_norm_before_gate) or RMSNorm(y * silu(z)).

    model.embed_tokens                               -> tgt_embed.tok
    model.layers.{i}.input_layernorm / pre_ff_layernorm -> decoder.{i}.norms.0 / norms.1
    model.layers.{i}.self_attn.q_proj / k_proj / v_proj / o_proj -> decoder.{i}.self_attn.w_q / w_k / w_v / w_o
    model.layers.{i}.mamba.*                         -> decoder.{i}.mixer.* (transformers' names)
    model.layers.{i}.feed_forward.gate_proj / up_proj / down_proj -> decoder.{i}.ffn.w_1 / w_3 / w_2
    model.final_layernorm                            -> decoder_norm
    lm_head                                          -> out_proj (absent when tied)

Not supported (CheckpointError): in_proj and out_proj biases that differ (mamba_proj_bias vs
projectors_bias), attention or FFN biases, an activation other than SiLU.
"""

from __future__ import annotations

import dataclasses

import torch

from ..checkpoint import CheckpointError
from ..hf_config import config_llama
from .mamba2 import mixer_rows, mixer_settings
from .shared import LLAMA_ATTN, LLAMA_MLP, rows

MODEL_TYPES = ("falcon_h1",)
BASES = (("model.", ""), "embed_tokens.weight")

TOP = [("embed_tokens", "tgt_embed.tok"), ("final_layernorm", "decoder_norm")]
LAYER = [
    ("layers.{i}.input_layernorm", "decoder.{i}.norms.0"),
    ("layers.{i}.pre_ff_layernorm", "decoder.{i}.norms.1"),
] + LLAMA_ATTN + [(t.replace(".mlp.", ".feed_forward."), o) for t, o in LLAMA_MLP]


def _d_inner(hf: dict) -> int:
    return int(hf["mamba_d_ssm"]) if hf.get("mamba_d_ssm") else int(hf.get("mamba_expand", 2) * hf["hidden_size"])


def config(hf: dict):
    if bool(hf.get("mamba_proj_bias", False)) != bool(hf.get("projectors_bias", False)):
        raise CheckpointError("Falcon-H1 with a bias on the mixer's in_proj but not on its out_proj (or the reverse) "
                              "is not supported")
    d_inner = _d_inner(hf)
    heads = int(hf.get("mamba_n_heads", 128))
    head_dim = hf.get("mamba_d_head", "auto")
    eps = float(hf.get("rms_norm_eps", 1e-5))
    mamba = dict(hf, mamba_n_heads=heads, mamba_d_head=d_inner // heads if head_dim in (None, "auto") else head_dim,
                 bias=hf.get("mamba_proj_bias", False))
    mixer = mixer_settings(mamba, "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv",
                           "mamba_chunk_size", "bias", "mamba_conv_bias", d_inner, eps)
    gate = ("gate_only" if not hf.get("mamba_rms_norm", False)
            else "norm_then_gate" if hf.get("mamba_norm_before_gate", True) else "gate_then_norm")
    cfg = config_llama(hf)
    multipliers = {k: hf.get(k) for k in ("attention_in_multiplier", "key_multiplier", "attention_out_multiplier",
                                          "ssm_in_multiplier", "ssm_multipliers", "ssm_out_multiplier",
                                          "mlp_multipliers")}
    return dataclasses.replace(
        cfg, mixer=dict(mixer, gate=gate, beside_attention=True),
        embed_multiplier=float(hf.get("embedding_multiplier", 1.0)),
        logit_scale=float(hf.get("lm_head_multiplier", 1.0)), extra={"multipliers": multipliers})


def weight_rows(cfg, base):
    out = rows(cfg, base, TOP, LAYER)
    for i in range(cfg.n_layers):
        out += mixer_rows(base, f"layers.{i}.mamba", f"decoder.{i}.mixer")
    return out


def _scale(state, name: str, by, bias: bool = True) -> None:
    """state[name.weight] (and its bias, where `bias` and there is one) times `by`: a number, or
    a vector over the output rows."""
    for part in ("weight", "bias") if bias else ("weight",):
        key = f"{name}.{part}"
        if key in state:
            f = by if not torch.is_tensor(by) else (by[:, None] if part == "weight" else by)
            state[key] = state[key] * f


def mup_rows(cfg) -> torch.Tensor:
    """transformers' mup_vector: the in_proj's rows z, x, B, C, dt times ssm_multipliers[0..4]."""
    m = cfg.mixer
    d_inner, gn = m["heads"] * m["head_dim"], m["groups"] * m["d_state"]
    k = [float(v) for v in (cfg.extra["multipliers"].get("ssm_multipliers") or [1.0] * 5)]
    sizes = [d_inner, d_inner, gn, gn, m["heads"]]
    return torch.cat([torch.full((n,), v) for n, v in zip(sizes, k)])


def split_fused(cfg, base, ckpt, state):
    """No fused tensors: the multipliers folded into the weights (the module docstring)."""
    mult = {k: v for k, v in cfg.extra["multipliers"].items() if v is not None}
    g, dn = (float(v) for v in (mult.get("mlp_multipliers") or [1.0, 1.0]))
    mup = mup_rows(cfg)
    for i in range(cfg.n_layers):
        at, mx, ffn = f"decoder.{i}.self_attn", f"decoder.{i}.mixer", f"decoder.{i}.ffn"
        a_in = float(mult.get("attention_in_multiplier", 1.0))
        for w in ("w_q", "w_k", "w_v"):
            _scale(state, f"{at}.{w}", a_in, bias=False)
        _scale(state, f"{at}.w_k", float(mult.get("key_multiplier", 1.0)))
        _scale(state, f"{at}.w_o", float(mult.get("attention_out_multiplier", 1.0)))
        _scale(state, f"{mx}.in_proj", float(mult.get("ssm_in_multiplier", 1.0)), bias=False)
        _scale(state, f"{mx}.in_proj", mup)
        _scale(state, f"{mx}.out_proj", float(mult.get("ssm_out_multiplier", 1.0)))
        _scale(state, f"{ffn}.w_1", g)
        _scale(state, f"{ffn}.w_2", dn)
