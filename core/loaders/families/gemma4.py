"""Gemma 4 (text, gemma4_text): config.json -> ModelConfig and the weight table.

Gemma 3's block (pre and post sub-layer RMSNorms, GeGLU with gelu_tanh, QK-norm over each
head, token embeddings times sqrt(d), sliding and global layers with their own RoPE bases,
final logit soft-capping) with:

    scale 1           q . k is not divided by sqrt(d_k) (the QK-norm sets the scale)
    v-norm            an RMSNorm without gain over each head's values (ModelConfig.v_norm)
    norm gains        as stored: Gemma 4's RMSNorm multiplies by w, not 1 + w
    per-layer heads   the global (full_attention) layers' head_dim and key/value heads
                      (per_layer_config, or global_head_dim / num_global_key_value_heads)
                      may differ from the sliding layers' (global_d_head, global_kv_heads)
    K = V             attention_k_eq_v: the global layers have no v_proj; their values are
                      k_proj's output, before k_norm and RoPE (k_eq_v)
    shared KV         num_kv_shared_layers: the last layers have no k_proj / v_proj; each
                      reuses the keys and values of the last earlier layer of its own kind
                      (kv_source), as transformers' kv_sharing_modes says
    proportional RoPE the global layers' rope_type "proportional": the first
                      int(partial_rotary_factor d_k / 2) frequency pairs of the whole head,
                      the others not rotated (rope_scaling {"type": "proportional"})
    per-layer inputs  hidden_size_per_layer_input p: embed_tokens_per_layer,
                      per_layer_model_projection and per_layer_projection_norm make each
                      layer's input; per_layer_input_gate, per_layer_projection and
                      post_per_layer_input_norm add it after the FFN (per_layer_dim)
    layer scalar      layer_scalar multiplies each layer's output (layer_scalar)
    double-wide MLP   use_double_wide_mlp: the shared-KV layers' FFN is 2 x intermediate_size
                      wide (shared_kv_d_ff)

Refused, by name: attention biases, bidirectional attention over all tokens, the
mixture-of-experts block, other activations than
gelu_pytorch_tanh, other RoPE types (the sliding layers' must be default), per-layer overrides
other than a global layer's head_dim and key/value heads.
"""

from __future__ import annotations

from ..checkpoint import CheckpointError
from ..hf_config import DECODER_MAX_LEN
from ...net.config import ModelConfig

MODEL_TYPES = ("gemma4_text",)
KIND = "decoder"
BASES = (("model.", "model.language_model.", ""), "embed_tokens.weight")
GELU_TANH = ("gelu_pytorch_tanh", "gelu_new")
KINDS = ("sliding_attention", "full_attention")
# what Gemma4TextConfig takes for a key config.json leaves out (files transformers writes hold them all)
DEFAULTS = {"head_dim": 256, "num_key_value_heads": 4, "sliding_window": 512, "hidden_size_per_layer_input": 256,
            "vocab_size_per_layer_input": 262_144}


def _no(hf: dict, key: str, what: str) -> None:
    if hf.get(key):
        raise CheckpointError(f"{what} ({key}={hf[key]!r}) is not supported")


def _layer_types(hf: dict, n: int) -> list:
    """Per layer 'sliding_attention' / 'full_attention' (five sliding to one global by
    default); the last layer is global, as transformers forces it."""
    types = hf.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    types = list(types)
    if len(types) != n or any(t not in KINDS for t in types):
        raise CheckpointError(f"layer_types {types!r} is not a list of {n} sliding_attention / full_attention")
    types[-1] = "full_attention"
    return types


def _global_heads(hf: dict, types: list, d_head: int, kv: int):
    """(global d_k, global H_kv) or None each where they equal the sliding layers': from
    per_layer_config (transformers 5's files) or global_head_dim / num_global_key_value_heads."""
    per = hf.get("per_layer_config")
    if per is None:  # as Gemma4TextConfig builds it: global_head_dim 512 unless given
        d_g = int(hf.get("global_head_dim", 512))
        kv_g = hf.get("num_global_key_value_heads") if hf.get("attention_k_eq_v") else None
        return (d_g if d_g != d_head else None), (int(kv_g) if kv_g and int(kv_g) != kv else None)
    seen = set()
    for key, over in dict(per).items():
        i = int(key)
        if not 0 <= i < len(types):
            raise CheckpointError(f"per_layer_config names layer {key}, which the model does not have")
        bad = sorted(set(over) - {"head_dim", "num_key_value_heads"})
        if bad:
            raise CheckpointError(f"per_layer_config of layer {i} overrides {bad}, which is not supported")
        if types[i] != "full_attention":
            raise CheckpointError(f"per_layer_config overrides sliding layer {i}; only the global layers' may differ")
        seen.add((int(over.get("head_dim", d_head)), int(over.get("num_key_value_heads", kv))))
    globals_ = [i for i, t in enumerate(types) if t == "full_attention"]
    overridden = {int(k) for k in per}
    if len(seen) > 1 or (seen and overridden != set(globals_)):
        raise CheckpointError("per_layer_config gives the global layers different head sizes; one size is supported")
    if not seen:
        return None, None
    d_g, kv_g = seen.pop()
    return (d_g if d_g != d_head else None), (kv_g if kv_g != kv else None)


def _rope(hf: dict):
    """(global theta, global rope_scaling, sliding theta) from rope_parameters per layer kind."""
    params = hf.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
    if not all(k in params for k in KINDS):
        raise CheckpointError(f"rope_parameters must give sliding_attention and full_attention, not {sorted(params)}")
    local, full = dict(params["sliding_attention"] or {}), dict(params["full_attention"] or {})
    if local.get("rope_type", "default") != "default":
        raise CheckpointError(f"rope_type {local.get('rope_type')!r} on the sliding layers is not supported (default only)")
    kind = full.get("rope_type", "default")
    if kind == "default":  # transformers' default RoPE rotates every feature (partial_rotary_factor unread)
        scaling = None
    elif kind == "proportional":
        scaling = {"type": "proportional", "partial": float(full.get("partial_rotary_factor", 1.0)),
                   "factor": float(full.get("factor", 1.0))}
    else:
        raise CheckpointError(f"rope_type {kind!r} on the global layers is not supported (default or proportional)")
    return float(full.get("rope_theta", 1_000_000.0)), scaling, float(local.get("rope_theta", 10_000.0))


def kv_sources(types: list, n_shared: int) -> list:
    """Per layer None or the layer whose keys and values it reuses: the last n_shared layers
    reuse the last earlier layer of their own kind (transformers' kv_sharing_modes)."""
    n = len(types)
    if not 0 <= n_shared <= n:
        raise CheckpointError(f"num_kv_shared_layers {n_shared} is not in 0..{n}")
    if n_shared == n and n:
        raise CheckpointError("num_kv_shared_layers equal to num_hidden_layers (no layer makes keys) is not supported")
    first = n - n_shared
    out = [None] * n
    for i in range(first, n):
        own = [j for j in range(first) if types[j] == types[i]]
        if not own:
            raise CheckpointError(f"layer {i} ({types[i]}) reuses keys and values, but no earlier layer of its kind "
                                  "makes them")
        out[i] = own[-1]
    return out


def config(hf: dict) -> ModelConfig:
    _no(hf, "attention_bias", "attention biases")
    _no(hf, "enable_moe_block", "the mixture-of-experts block")
    if hf.get("use_bidirectional_attention") == "all":
        raise CheckpointError("bidirectional attention (use_bidirectional_attention='all') is not supported")
    act = hf.get("hidden_activation") or "gelu_pytorch_tanh"
    if act not in GELU_TANH:
        raise CheckpointError(f"hidden_activation {act!r} is not supported for gemma4_text (gelu_pytorch_tanh only)")
    d, h, n = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    d_head = hf.get("head_dim", DEFAULTS["head_dim"]) or d // h
    kv = hf.get("num_key_value_heads", DEFAULTS["num_key_value_heads"]) or h
    types = _layer_types(hf, n)
    n_shared = int(hf.get("num_kv_shared_layers") or 0)
    wide = 2 * hf["intermediate_size"] if hf.get("use_double_wide_mlp") and n_shared else None
    d_g, kv_g = _global_heads(hf, types, d_head, kv)
    sources = kv_sources(types, n_shared) if n_shared else None
    theta, scaling, local_theta = _rope(hf)
    window = hf.get("sliding_window", DEFAULTS["sliding_window"])
    if "sliding_attention" in types and not window:
        raise CheckpointError("sliding layers without a sliding_window")
    p = int(hf.get("hidden_size_per_layer_input", DEFAULTS["hidden_size_per_layer_input"]) or 0)
    cap = hf.get("final_logit_softcapping")
    return ModelConfig(
        kind="decoder", d_model=d, n_heads=h, n_kv_heads=kv, d_head=d_head, d_ff=hf["intermediate_size"],
        n_layers=n, tgt_vocab_size=hf["vocab_size"], max_len=hf.get("max_position_embeddings") or DECODER_MAX_LEN,
        positional="rope", rope_theta=theta, rope_scaling=scaling, rope_layout="half", rope_theta_local=local_theta,
        norm="rmsnorm", norm_eps=hf.get("rms_norm_eps", 1e-6), norm_placement="pre", post_sublayer_norm=True,
        qk_norm="head", activation="geglu_tanh", bias=False, embed_scale=True, final_norm=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), attn_scale=1.0,
        final_softcap=float(cap) if cap else None, layer_types=types,
        sliding_window=int(window) if "sliding_attention" in types else None, pad_id=hf.get("pad_token_id") or 0,
        global_d_head=d_g, global_kv_heads=kv_g, k_eq_v=bool(hf.get("attention_k_eq_v")), v_norm=True,
        kv_source=sources, per_layer_dim=p,
        per_layer_vocab=int(hf.get("vocab_size_per_layer_input", DEFAULTS["vocab_size_per_layer_input"])
                            or hf["vocab_size"]) if p else None,
        layer_scalar=True, shared_kv_d_ff=wide,
    )


def weight_rows(cfg: ModelConfig, base: str):
    """(checkpoint name, our name, how) for every tensor; Gemma 4's norm gains as stored."""
    rows = [(base + "embed_tokens.weight", "tgt_embed.tok.weight", ""), (base + "norm.weight", "decoder_norm.weight", "")]
    if cfg.per_layer_dim:
        rows += [(base + "embed_tokens_per_layer.weight", "per_layer_embed.weight", ""),
                 (base + "per_layer_model_projection.weight", "per_layer_proj.weight", ""),
                 (base + "per_layer_projection_norm.weight", "per_layer_norm.weight", "")]
    for i in range(cfg.n_layers):
        t, o = f"{base}layers.{i}.", f"decoder.{i}."
        rows += [
            (t + "input_layernorm.weight", o + "norms.0.weight", ""),
            (t + "post_attention_layernorm.weight", o + "post_norms.0.weight", ""),
            (t + "pre_feedforward_layernorm.weight", o + "norms.1.weight", ""),
            (t + "post_feedforward_layernorm.weight", o + "post_norms.1.weight", ""),
            (t + "self_attn.q_proj.weight", o + "self_attn.w_q.weight", ""),
            (t + "self_attn.q_norm.weight", o + "self_attn.q_norm.weight", ""),
            (t + "self_attn.o_proj.weight", o + "self_attn.w_o.weight", ""),
            (t + "mlp.gate_proj.weight", o + "ffn.w_1.weight", ""),
            (t + "mlp.up_proj.weight", o + "ffn.w_3.weight", ""),
            (t + "mlp.down_proj.weight", o + "ffn.w_2.weight", ""),
            (t + "layer_scalar", o + "layer_scalar", ""),
        ]
        if cfg.kv_source is None or cfg.kv_source[i] is None:
            rows += [(t + "self_attn.k_proj.weight", o + "self_attn.w_k.weight", ""),
                     (t + "self_attn.k_norm.weight", o + "self_attn.k_norm.weight", "")]
            if not cfg.k_is_v(i):
                rows.append((t + "self_attn.v_proj.weight", o + "self_attn.w_v.weight", ""))
        if cfg.per_layer_dim:
            rows += [(t + "per_layer_input_gate.weight", o + "ple_gate.weight", ""),
                     (t + "per_layer_projection.weight", o + "ple_proj.weight", ""),
                     (t + "post_per_layer_input_norm.weight", o + "ple_norm.weight", "")]
    if not cfg.tie_embeddings:
        rows.append(("lm_head.weight", "out_proj.weight", ""))
    return rows


def split_fused(cfg: ModelConfig, base: str, ckpt, state) -> None:
    """No fused tensors: this reads (and drops) the key/value projections some files keep for
    the layers that reuse an earlier layer's keys and values, which transformers drops too."""
    for i, j in enumerate(cfg.kv_source or []):
        if j is None:
            continue
        for name in ("k_proj", "v_proj", "k_norm", "v_norm"):
            key = f"{base}layers.{i}.self_attn.{name}.weight"
            if key in ckpt:
                ckpt.get(key)
