"""Gemma 1, 2 and 3 (text): config.json -> ModelConfig and the weight table.

    gemma        Llama's block with GeGLU (gelu_tanh gate), token embeddings times sqrt(d)
                 (ModelConfig.embed_scale; float32 here) and RMSNorm scaling by (1 + w);
                 tied output matrix by default.
    gemma2       + attention logit soft-capping c tanh(scaled / c) (attn_softcap) and final
                 logit soft-capping (final_softcap); sliding-window and global layers
                 alternating (layer_types); a norm after each sub-layer as well as before it
                 (post_sublayer_norm: post_attention_layernorm, post_feedforward_layernorm);
                 the scale query_pre_attn_scalar^-1/2 (attn_scale).
    gemma3_text  + QK-norm over each head's d_k (qk_norm "head"), before RoPE; local layers
                 with their own RoPE base (rope_local_base_freq / rope_parameters
                 ["sliding_attention"], ModelConfig.rope_theta_local), five local to one
                 global by default (sliding_window_pattern). Attention soft-capping is gone
                 (QK-norm replaced it): attn_logit_softcapping in its config.json is ignored,
                 as transformers' Gemma 3 ignores it; final_logit_softcapping is applied.

Gemma's (1 + w) is applied when loading: the row's how "+1" adds one to every stored norm
gain (layer norms, the final norm, q_norm / k_norm), so the network's RMSNorm is the usual
x / rms(x) * g with g = 1 + w, and the Inside page shows the gain the model multiplies by.
"""

from __future__ import annotations

from ..checkpoint import CheckpointError
from ..hf_config import DECODER_MAX_LEN, rope_params
from ...net.config import ModelConfig

MODEL_TYPES = ("gemma", "gemma2", "gemma3_text")
KIND = "decoder"  # what the app's picker says before loading
BASES = (("model.", ""), "embed_tokens.weight")

GEGLU = {"gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh", "gelu_fast": "geglu_tanh", "gelu": "geglu"}
SOFTCAP_DEFAULTS = {"gemma2": (50.0, 30.0)}  # (attention, final) when config.json leaves them out
PATTERN = {"gemma2": 2, "gemma3_text": 6}  # every n-th layer global when layer_types is absent


def _no(hf: dict, key: str, what: str) -> None:
    if hf.get(key):
        raise CheckpointError(f"{what} ({key}={hf[key]!r}) is not supported")


def _layer_types(hf: dict, family: str, n_layers: int):
    """Per layer 'sliding_attention' / 'full_attention', from config.json or Gemma's default pattern."""
    if family == "gemma":
        return None
    types = hf.get("layer_types")
    if types is None:
        every = int(hf.get("sliding_window_pattern") or PATTERN[family])
        types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n_layers)]
    types = list(types)
    if len(types) != n_layers or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise CheckpointError(f"layer_types {types!r} is not a list of {n_layers} sliding_attention / full_attention")
    if not hf.get("sliding_window"):  # no window: every layer attends to all
        types = ["full_attention"] * n_layers
    return types


def _rope_gemma3(hf: dict):
    """(global theta, global scaling, local theta): rope_parameters per layer kind
    (transformers 5) or rope_theta / rope_scaling / rope_local_base_freq (earlier files)."""
    params = hf.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:
        full = {**(hf.get("rope_scaling") or {}), **params}
        full.setdefault("rope_theta", hf.get("rope_theta", 1_000_000.0))
        local = {"rope_theta": hf.get("rope_local_base_freq", 10_000.0)}
    full.setdefault("rope_theta", 1_000_000.0)
    theta, scaling = rope_params({"rope_parameters": full})
    kind = local.get("rope_type", local.get("type", "default"))
    if kind not in (None, "default"):
        raise CheckpointError(f"rope scaling {kind!r} on the local (sliding) layers is not supported")
    return theta, scaling, float(local.get("rope_theta", 10_000.0))


def config(hf: dict) -> ModelConfig:
    family = hf.get("model_type")
    _no(hf, "attention_bias", "attention biases")
    _no(hf, "use_bidirectional_attention", "bidirectional attention")
    key = "hidden_act" if family == "gemma" else "hidden_activation"
    act = hf.get(key) or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in GEGLU:
        raise CheckpointError(f"{key} {act!r} is not supported for {family} (GeGLU with gelu or gelu_pytorch_tanh)")
    d, h, n_layers = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    d_head = hf.get("head_dim") or d // h
    local_theta = None
    if family == "gemma3_text":
        theta, scaling, local_theta = _rope_gemma3(hf)
    else:
        theta, scaling = rope_params(hf)
    cap_attn, cap_final = SOFTCAP_DEFAULTS.get(family, (None, None))
    cap_attn = hf["attn_logit_softcapping"] if "attn_logit_softcapping" in hf else cap_attn
    if family == "gemma3_text":
        cap_attn = None  # kept in Gemma 3's config, used by no layer
    cap_final = hf["final_logit_softcapping"] if "final_logit_softcapping" in hf else cap_final
    types = _layer_types(hf, family, n_layers)
    window = hf.get("sliding_window") if types and "sliding_attention" in types else None
    scalar = hf.get("query_pre_attn_scalar", 256) if family != "gemma" else None
    return ModelConfig(
        kind="decoder",
        d_model=d,
        n_heads=h,
        n_kv_heads=hf.get("num_key_value_heads") or h,
        d_head=d_head,
        d_ff=hf["intermediate_size"],
        n_layers=n_layers,
        tgt_vocab_size=hf["vocab_size"],
        max_len=hf.get("max_position_embeddings", DECODER_MAX_LEN),
        positional="rope",
        rope_theta=theta,
        rope_scaling=scaling,
        rope_layout="half",
        rope_theta_local=local_theta,
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        norm_placement="pre",
        post_sublayer_norm=family != "gemma",
        qk_norm="head" if family == "gemma3_text" else None,
        activation=GEGLU[act],
        bias=False,
        embed_scale=True,
        final_norm=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        attn_scale=float(scalar) ** -0.5 if scalar else None,
        attn_softcap=float(cap_attn) if cap_attn else None,
        final_softcap=float(cap_final) if cap_final else None,
        layer_types=types,
        sliding_window=int(window) if window else None,
        pad_id=hf.get("pad_token_id") or 0,
    )


def weight_rows(cfg: ModelConfig, base: str):
    """(checkpoint name, our name, how) for every tensor; norms get how "+1"."""
    rows = [(base + "embed_tokens.weight", "tgt_embed.tok.weight", ""), (base + "norm.weight", "decoder_norm.weight", "+1")]
    gemma1 = not cfg.post_sublayer_norm
    for i in range(cfg.n_layers):
        t, o = f"{base}layers.{i}.", f"decoder.{i}."
        rows += [
            (t + "input_layernorm.weight", o + "norms.0.weight", "+1"),
            (t + "self_attn.q_proj.weight", o + "self_attn.w_q.weight", ""),
            (t + "self_attn.k_proj.weight", o + "self_attn.w_k.weight", ""),
            (t + "self_attn.v_proj.weight", o + "self_attn.w_v.weight", ""),
            (t + "self_attn.o_proj.weight", o + "self_attn.w_o.weight", ""),
            (t + "mlp.gate_proj.weight", o + "ffn.w_1.weight", ""),
            (t + "mlp.up_proj.weight", o + "ffn.w_3.weight", ""),
            (t + "mlp.down_proj.weight", o + "ffn.w_2.weight", ""),
        ]
        if gemma1:
            rows.append((t + "post_attention_layernorm.weight", o + "norms.1.weight", "+1"))
        else:  # Gemma 2/3: post_attention_layernorm is the norm AFTER the attention
            rows += [(t + "post_attention_layernorm.weight", o + "post_norms.0.weight", "+1"),
                     (t + "pre_feedforward_layernorm.weight", o + "norms.1.weight", "+1"),
                     (t + "post_feedforward_layernorm.weight", o + "post_norms.1.weight", "+1")]
        if cfg.qk_norm:
            rows += [(t + "self_attn.q_norm.weight", o + "self_attn.q_norm.weight", "+1"),
                     (t + "self_attn.k_norm.weight", o + "self_attn.k_norm.weight", "+1")]
    if not cfg.tie_embeddings:
        rows.append(("lm_head.weight", "out_proj.weight", ""))
    return rows
