"""OLMo Hybrid: Gated DeltaNet layers between OLMo-3 attention layers, each kind with its own
norm placement.

    layer_types  per layer "linear_attention" (a gated delta rule, core/net/gated_delta.py:
                 ModelConfig.mixer) or "full_attention"; transformers fills an absent list with
                 every 4th layer full attention (the last layer where none would be), as here.
    attention    OLMo-3's (core/loaders/families/olmo3.py): no norm before the sub-layers, an
                 RMSNorm on each sub-layer's output before the residual add
                 (post_attention_layernorm, post_feedforward_layernorm -> post_norms.0 / .1),
                 QK-norm over the whole q and k projections, no sliding windows.
    positions    RoPE on the attention layers where rope_parameters (or the top-level
                 rope_theta) gives a rope_theta; the released checkpoints set it null: no
                 positions at all (NoPE, ModelConfig.positional "none"). An absent rope_theta is
                 transformers' default, 10000.
    linear       pre-norm, no norms after (ModelConfig.mixer_sublayer_norms (True, False)):
                 x + GDN(input_layernorm(x)), then x + MLP(post_attention_layernorm(x)).
                 The rule as Qwen3-Next's, with beta = 2 sigmoid(x W_b) where
                 linear_allow_neg_eigval (the mixer's "beta_scale"), and its gated RMSNorm's eps
                 fixed at 1e-5 (FLA's, as transformers writes it).

Tensors (under model.):
    layers.{i}.linear_attn.q_proj, k_proj, v_proj -> decoder.{i}.mixer.w_qkv (concatenated: the
                                      convolution's channels are [q | k | v])
    layers.{i}.linear_attn.g_proj / b_proj / a_proj / o_proj -> decoder.{i}.mixer.w_z / w_b / w_a / w_out
    layers.{i}.linear_attn.conv1d.weight (C x 1 x K), or OLMo-core's q_conv1d, k_conv1d, v_conv1d
                                      concatenated -> decoder.{i}.mixer.conv (C x K)
    layers.{i}.linear_attn.A_log, dt_bias, o_norm.weight -> decoder.{i}.mixer.A_log, dt_bias, norm_weight
    layers.{i}.input_layernorm / post_attention_layernorm (linear layers) -> decoder.{i}.norms.0 / .1
    the attention layers as OLMo-2 (post_norms.0 / .1, q_norm / k_norm); the MLP and the rest as Llama.
    OLMo-core's names, as stored (transformers renames them when loading, back when saving), are
    read too: attention_layer_norm for input_layernorm, feedforward_layer_norm for
    post_attention_layernorm (in either kind of layer).
Multi-token-prediction heads (mtp.*), which transformers ignores too, are left unread.

Not supported (CheckpointError): attention biases, an activation other than SiLU, layer types
other than the two above, partial rotary, a RoPE scaling this project does not read.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from ..checkpoint import CheckpointError, check_shape
from ..hf_config import config_llama
from .olmo2 import LAYER as ATTN_LAYER
from .shared import LLAMA_MLP, LLAMA_TOP, rows

MODEL_TYPES = ("olmo_hybrid",)
IGNORED = re.compile(r"^mtp\.")  # multi-token prediction heads
BASES = (("model.", ""), "embed_tokens.weight")
LA = "layers.{i}.linear_attn"
TYPES = ("linear_attention", "full_attention")
GATED_NORM_EPS = 1e-5  # OlmoHybridGatedDeltaNet's o_norm, whatever rms_norm_eps says


def _layer_types(hf: dict, n: int) -> list:
    types = hf.get("layer_types")
    if types is None:  # as transformers fills it
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
        if "full_attention" not in types:
            types[-1] = "full_attention"
    types = list(types)
    if len(types) != n or any(t not in TYPES for t in types):
        raise CheckpointError(f"layer_types {types!r} is not a list of {n} linear_attention / full_attention")
    return types


def _rope_theta(hf: dict):
    """The RoPE base as transformers reads it (rope_parameters' rope_theta, else the top-level
    rope_theta, else 10000), None where it is set null: NoPE."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if "full_attention" in params or "linear_attention" in params:
        raise CheckpointError("OLMo Hybrid with RoPE parameters per layer type is not supported")
    if "rope_theta" in params:
        return params["rope_theta"]
    return hf["rope_theta"] if "rope_theta" in hf else 10000.0


def config(hf: dict):
    if hf.get("model_type") not in MODEL_TYPES:
        raise CheckpointError(f"model_type {hf.get('model_type')!r} is not read by the OLMo Hybrid family")
    theta = _rope_theta(hf)
    h = int(hf["num_attention_heads"])
    if theta is None:  # NoPE: config_llama reads a base all the same; no layer uses it
        hf = dict(hf, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rope_scaling=None)
    cfg = config_llama(hf)
    n = cfg.n_layers
    hk = int(hf.get("linear_num_key_heads") or h)
    hv = int(hf.get("linear_num_value_heads") or h)
    dk = int(hf.get("linear_key_head_dim") or int(0.75 * cfg.d_model / hk))
    dv = int(hf.get("linear_value_head_dim") or 2 * dk)
    if hv % hk:
        raise CheckpointError(f"linear_num_value_heads ({hv}) must be a multiple of linear_num_key_heads ({hk})")
    mixer = {"kind": "gated_delta", "heads": hv, "k_heads": hk, "d_k": dk, "d_v": dv,
             "conv": int(hf.get("linear_conv_kernel_dim", 4)), "norm_eps": GATED_NORM_EPS,
             "beta_scale": 2.0 if hf.get("linear_allow_neg_eigval", True) else 1.0}
    return dataclasses.replace(cfg, qk_norm="full", pre_sublayer_norm=False, post_sublayer_norm=True,
                               positional="rope" if theta is not None else "none",
                               layer_types=_layer_types(hf, n), mixer=mixer, mixer_sublayer_norms=(True, False))


# the stored names (OLMo-core's, which transformers renames when loading and writes back when
# saving: attention_layer_norm -> input_layernorm, feedforward_layer_norm -> post_attention_layernorm,
# in every layer) and transformers' own names are both read
LINEAR_LAYER = [("layers.{i}.attention_layer_norm", "decoder.{i}.norms.0"),
                ("layers.{i}.input_layernorm", "decoder.{i}.norms.0"),
                ("layers.{i}.feedforward_layer_norm", "decoder.{i}.norms.1"),
                ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1"), *LLAMA_MLP]
ATTN_LAYER = [("layers.{i}.feedforward_layer_norm", "decoder.{i}.post_norms.0"), *ATTN_LAYER]
LINEAR_PARAMS = [("g_proj.weight", "w_z.weight"), ("b_proj.weight", "w_b.weight"), ("a_proj.weight", "w_a.weight"),
                 ("o_proj.weight", "w_out.weight"), ("A_log", "A_log"), ("dt_bias", "dt_bias"),
                 ("o_norm.weight", "norm_weight")]


def weight_rows(cfg, base):
    """The attention layers as OLMo-2's; the linear layers' norms, MLP and mixer tensors (q, k, v
    and the convolution are split_fused's)."""
    linear = set(cfg.mixer_layers())
    out = rows(cfg, base, LLAMA_TOP, [])  # embeddings, final norm, lm_head
    for i in range(cfg.n_layers):
        table = LINEAR_LAYER if i in linear else ATTN_LAYER
        for theirs, ours in table:
            out += [(base + theirs.format(i=i) + s, ours.format(i=i) + s, "") for s in (".weight", ".bias")]
        if i in linear:
            la = base + LA.format(i=i)
            out += [(f"{la}.{t}", f"decoder.{i}.mixer.{o}", "") for t, o in LINEAR_PARAMS]
    return out


def split_fused(cfg, base, ckpt, state) -> None:
    """q_proj, k_proj, v_proj -> W_qkv (rows [q | k | v], the convolution's channel order);
    conv1d (C x 1 x K), or q_conv1d, k_conv1d and v_conv1d concatenated -> C x K."""
    d, mx = cfg.d_model, cfg.mixer
    key_dim, value_dim = mx["k_heads"] * mx["d_k"], mx["heads"] * mx["d_v"]
    for i in cfg.mixer_layers():
        la, m = f"{base}{LA.format(i=i)}", f"decoder.{i}.mixer"
        names = [f"{la}.{p}_proj.weight" for p in "qkv"]
        missing = [n for n in names if n not in ckpt]
        if missing:
            raise CheckpointError(f"the checkpoint lacks {missing[0]!r}")
        parts = []
        for name, rows_ in zip(names, (key_dim, key_dim, value_dim)):
            t = ckpt.get(name)
            check_shape(name, t, [rows_, d])
            parts.append(t)
        state[f"{m}.w_qkv.weight"] = torch.cat(parts).contiguous()
        name = f"{la}.conv1d.weight"
        split = [f"{la}.{p}_conv1d.weight" for p in "qkv"]
        if name in ckpt:
            t = ckpt.get(name)
        elif all(n in ckpt for n in split):  # OLMo-core's three filters (transformers writes them back so,
            t = torch.cat([ckpt.get(n) for n in split])  # cut into three near-equal parts): concatenated
            name = f"{la}.{{q,k,v}}_conv1d.weight"
        else:
            raise CheckpointError(f"the checkpoint lacks {name!r} (or q_conv1d, k_conv1d and v_conv1d)")
        check_shape(name, t, [2 * key_dim + value_dim, 1, mx["conv"]])
        state[f"{m}.conv"] = t[:, 0].clone()
