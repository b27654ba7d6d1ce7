"""ModernBERT (model_type "modernbert"): an encoder with RoPE and pre-norm LayerNorm (no shifts
by default, norm_bias), GeGLU from one fused input matrix Wi, a fused Wqkv, no biases by
default, a norm after the embedding (and none before layer 0's attention: first_attn_norm),
a final norm, and alternating attention: every `global_attn_every_n_layers`-th layer (0, n,
2n, ...) global, the others local, seeing keys at most local_attention // 2 positions away
either way (ModelConfig.sliding_window = local_attention, layer_types), each kind with its
own RoPE base (global_rope_theta / local_rope_theta, or rope_parameters per layer kind).

Its masked-LM head (head.dense, the activation, head.norm, decoder tied to the token
embedding) is read by core/loaders/masked_lm.py; fill-ins work as for BERT.
"""

from __future__ import annotations

from ..checkpoint import CheckpointError, check_shape
from ..hf_config import rope_params
from ...net.config import ModelConfig

MODEL_TYPES = ("modernbert",)
KIND = "encoder"  # what the app's picker says before loading
BASES = (("model.", ""), "embeddings.tok_embeddings.weight")
GEGLU = {"gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh", "gelu_fast": "geglu_tanh"}


def _rope(hf: dict):
    """(global theta, global scaling, local theta)."""
    params = hf.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or {"rope_theta": hf.get("global_rope_theta", 160_000.0)})
    local = dict(params.get("sliding_attention") or {"rope_theta": hf.get("local_rope_theta", 10_000.0)})
    for name, p in (("global", full), ("local", local)):
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in (None, "default"):
            raise CheckpointError(f"rope scaling {kind!r} on the {name} layers is not supported for ModernBERT")
    theta, _ = rope_params({"rope_parameters": full})
    return theta, float(local.get("rope_theta", 10_000.0))


def config(hf: dict) -> ModelConfig:
    act = hf.get("hidden_activation", "gelu")
    if act not in GEGLU:
        raise CheckpointError(f"hidden_activation {act!r} is not supported for modernbert")
    attn_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    if attn_bias != mlp_bias:
        raise CheckpointError(f"attention_bias={attn_bias} with mlp_bias={mlp_bias} is not supported (both or neither)")
    n_layers = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        every = int(hf.get("global_attn_every_n_layers", 3))
        types = ["sliding_attention" if i % every else "full_attention" for i in range(n_layers)]
    if len(types) != n_layers or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise CheckpointError(f"layer_types {types!r} is not a list of {n_layers} sliding_attention / full_attention")
    theta, local_theta = _rope(hf)
    window = int(hf.get("local_attention", 128))
    return ModelConfig(
        kind="encoder",
        d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        n_layers=n_layers,
        src_vocab_size=hf["vocab_size"],
        max_len=hf.get("max_position_embeddings", 8192),
        positional="rope",
        rope_theta=theta,
        rope_theta_local=local_theta,
        rope_layout="half",
        norm="layernorm",
        norm_eps=hf.get("norm_eps", 1e-5),
        norm_bias=bool(hf.get("norm_bias", False)),
        norm_placement="pre",
        first_attn_norm=False,
        embed_norm=True,
        final_norm=True,
        activation=GEGLU[act],
        bias=attn_bias,
        layer_types=list(types),
        sliding_window=window if "sliding_attention" in types else None,
        pad_id=hf.get("pad_token_id") or 0,
    )


def weight_rows(cfg: ModelConfig, base: str):
    rows = []

    def both(theirs, ours):
        rows.extend((base + theirs + s, ours + s, "") for s in (".weight", ".bias"))

    both("embeddings.tok_embeddings", "src_embed.tok")
    both("embeddings.norm", "src_embed.norm")
    both("final_norm", "encoder_norm")
    for i in range(cfg.n_layers):
        t, o = f"layers.{i}.", f"encoder.{i}."
        if i > 0:  # layer 0 has no attention norm
            both(t + "attn_norm", o + "norms.0")
        both(t + "attn.Wo", o + "self_attn.w_o")
        both(t + "mlp_norm", o + "norms.1")
        both(t + "mlp.Wo", o + "ffn.w_2")
    return rows


def split_fused(cfg: ModelConfig, base: str, ckpt, state) -> None:
    """Wqkv (3 d x d: Q, K, V stacked) and Wi (2 m x d: the GELU input, then the gate)."""
    d, m = cfg.d_model, cfg.d_ff
    for i in range(cfg.n_layers):
        t, o = f"{base}layers.{i}.", f"encoder.{i}."
        for fused, rows, parts in ((t + "attn.Wqkv", d, ("self_attn.w_q", "self_attn.w_k", "self_attn.w_v")),
                                   (t + "mlp.Wi", m, ("ffn.w_1", "ffn.w_3"))):
            w = ckpt.get(fused + ".weight")
            check_shape(fused + ".weight", w, [rows * len(parts), d])
            b = ckpt.get(fused + ".bias") if fused + ".bias" in ckpt else None
            for j, part in enumerate(parts):
                state[f"{o}{part}.weight"] = w[j * rows:(j + 1) * rows].clone()
                if b is not None:
                    state[f"{o}{part}.bias"] = b[j * rows:(j + 1) * rows].clone()
