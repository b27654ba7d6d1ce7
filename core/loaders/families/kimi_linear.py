"""Kimi Linear: Kimi Delta Attention layers (the gated delta rule with a decay per key channel,
core/net/kimi_delta.py: ModelConfig.mixer kind "kimi_delta") with multi-head latent attention
layers that have no positions at all (core/net/latent.py with cfg.positional "none": the rope
part of the key is still the shared single-head slice of kv_a_proj_with_mqa, never rotated;
the scale is (d_nope + d_rope)^-1/2), as transformers' KimiLinearForCausalLM computes them.

    layer_types      per layer "linear_attention" (KDA) or "full_attention" (MLA); absent, from
                     linear_attn_config's kda_layers / full_attn_layers (1-indexed), else every
                     4th layer from layer 4 is full attention (transformers' fallbacks)
    linear_attn_config  head_dim, num_heads, short_conv_kernel_size over linear_head_dim,
                     linear_num_heads, linear_conv_kernel_dim (the same precedence as transformers)
    mlp_layer_types  per layer "dense" (SwiGLU of intermediate_size) or "sparse" (the "deepseek"
                     mixture of experts of core/net/moe.py: sigmoid router, e_score_correction_bias,
                     n_group / topk_group, norm_topk_prob, routed_scaling_factor, shared experts);
                     absent, the first first_k_dense_replace (1) layers dense
    norms            pre-norm RMSNorms (input_layernorm, post_attention_layernorm), a final norm;
                     the KDA output norm o_norm (eps rms_norm_eps) gated by a sigmoid

Tensors (under model.; as the released checkpoints and transformers' save_pretrained write them, or
in transformers' own module layout: forget_gate., one conv1d, mlp., fused experts):
    layers.{i}.self_attn.q_proj / k_proj / v_proj   -> decoder.{i}.mixer.w_q / w_k / w_v   (KDA)
    layers.{i}.self_attn.{q,k,v}_conv1d (H d x 1 x K, or one conv1d of 3 H d) -> decoder.{i}.mixer.conv (3 H d x K)
    layers.{i}.self_attn.f_a_proj / f_b_proj / dt_bias / A_log (1 x 1 x H x 1; or under self_attn.forget_gate.)
                                                    -> mixer.w_fa / w_fb / dt_bias / A_log (H)
    layers.{i}.self_attn.b_proj / g_a_proj / g_b_proj / o_norm / o_proj -> mixer.w_b / w_ga / w_gb / norm_weight / w_out
    layers.{i}.self_attn.* (MLA layers)  as DeepSeek V3 (core/loaders/families/deepseek.py)
    layers.{i}.block_sparse_moe.* or layers.{i}.mlp.*: gate_proj / up_proj / down_proj (dense);
                     gate.weight, gate.e_score_correction_bias, experts.{e}.w1 / w3 / w2 (gate, up,
                     down; or transformers' fused experts.gate_up_proj / down_proj),
                     shared_experts.{gate,up,down}_proj  -> decoder.{i}.ffn.*
    layers.{i}.input_layernorm / post_attention_layernorm, norm, embed_tokens, lm_head as Llama.

Not supported (CheckpointError): fewer key/value heads than heads in the MLA layers (transformers
cannot run it either), an activation other than SiLU, attention biases, layer or MLP types other
than the ones above.
"""

from __future__ import annotations

import dataclasses

import torch

from ..checkpoint import CheckpointError, check_shape
from ..hf_config import config_llama
from .deepseek import ATTN as MLA_ROWS, Q_DIRECT, Q_LORA
from .shared import LLAMA_TOP, rows

MODEL_TYPES = ("kimi_linear",)
BASES = (("model.", ""), "embed_tokens.weight")
KIND = "decoder"
A = "layers.{i}.self_attn"
KDA = [(f"{A}.q_proj", "w_q"), (f"{A}.k_proj", "w_k"), (f"{A}.v_proj", "w_v"), (f"{A}.b_proj", "w_b"),
       (f"{A}.g_a_proj", "w_ga"), (f"{A}.g_b_proj", "w_gb"), (f"{A}.o_proj", "w_out")]
# the forget gate's tensors: under self_attn. as released, under self_attn.forget_gate. in transformers' own layout
FORGET = [("f_a_proj.weight", "w_fa.weight"), ("f_b_proj.weight", "w_fb.weight"), ("dt_bias", "dt_bias")]
FFN_PREFIXES = ("block_sparse_moe", "mlp")  # the released layout, transformers' own


def _get(hf: dict, names, default):
    """The first of `names` that config.json sets (transformers' attribute_map aliases), else default."""
    for n in names:
        if hf.get(n) is not None:
            return hf[n]
    return default


def _layer_types(hf: dict, n: int) -> list:
    lac = hf.get("linear_attn_config") or {}
    types = hf.get("layer_types")
    if types is None and "full_attn_layers" in lac and "kda_layers" in lac:
        types = [None] * n
        for j in lac["full_attn_layers"]:
            types[j - 1] = "full_attention"  # 1-indexed in the checkpoint
        for j in lac["kda_layers"]:
            types[j - 1] = "linear_attention"
    elif types is None:
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    types = list(types)
    if len(types) != n or any(t not in ("linear_attention", "full_attention") for t in types):
        raise CheckpointError(f"layer_types {types!r} is not a list of {n} linear_attention / full_attention")
    return types


def _mlp_types(hf: dict, n: int) -> list:
    types = hf.get("mlp_layer_types")
    if types is None:
        first = _get(hf, ("first_k_dense_replace",), 1)
        types = ["dense" if i < first else "sparse" for i in range(n)]
    types = list(types)
    if len(types) != n or any(t not in ("dense", "sparse") for t in types):
        raise CheckpointError(f"mlp_layer_types {types!r} is not a list of {n} dense / sparse")
    return types


def config(hf: dict):
    n, h = hf["num_hidden_layers"], hf["num_attention_heads"]
    if (hf.get("num_key_value_heads") or h) != h:
        raise CheckpointError("Kimi Linear with num_key_value_heads != num_attention_heads is not supported "
                              "(its latent attention rebuilds one key and value per head)")
    lac = hf.get("linear_attn_config") or {}
    dk = int(lac.get("head_dim", hf.get("linear_head_dim", 128)))
    heads = int(lac.get("num_heads", hf.get("linear_num_heads", 32)))
    conv = int(lac.get("short_conv_kernel_size", hf.get("linear_conv_kernel_dim", 4)))
    eps = float(hf.get("rms_norm_eps", 1e-5))
    types, mlp = _layer_types(hf, n), _mlp_types(hf, n)
    dqk = int(hf["qk_nope_head_dim"]) + int(hf["qk_rope_head_dim"])
    plain = {k: v for k, v in hf.items() if k not in ("rope_parameters", "rope_scaling")}
    max_len = _get(hf, ("max_position_embeddings", "model_max_length"), 1048576)
    cfg = config_llama(dict(plain, head_dim=hf["v_head_dim"], num_key_value_heads=h, max_position_embeddings=max_len,
                            rms_norm_eps=eps))
    de = int(hf.get("moe_intermediate_size", 1024))
    sparse = [i for i, t in enumerate(mlp) if t == "sparse"]
    moe = {"kind": "deepseek", "experts": int(_get(hf, ("num_local_experts", "num_experts"), 256)),
           "top_k": int(_get(hf, ("num_experts_per_tok", "num_experts_per_token"), 8)), "d_expert": de,
           "layers": sparse, "n_group": int(_get(hf, ("n_group", "num_expert_group"), 1)),
           "topk_group": int(_get(hf, ("topk_group",), 1)),
           "norm_topk_prob": bool(_get(hf, ("norm_topk_prob", "moe_renormalize"), True)),
           "routed_scaling_factor": float(_get(hf, ("routed_scaling_factor",), 2.446)),
           "d_shared": de * int(_get(hf, ("n_shared_experts", "num_shared_experts"), 1))} if sparse else None
    mla = {"kv_lora_rank": int(hf.get("kv_lora_rank", 512)), "q_lora_rank": hf.get("q_lora_rank"),
           "qk_nope_head_dim": int(hf["qk_nope_head_dim"]), "qk_rope_head_dim": int(hf["qk_rope_head_dim"]),
           "v_head_dim": int(hf["v_head_dim"]), "rope_interleave": False, "index": None}
    mixer = {"kind": "kimi_delta", "heads": heads, "d_k": dk, "conv": conv, "norm_eps": eps}
    return dataclasses.replace(cfg, positional="none", attn_scale=dqk ** -0.5, layer_types=types, mixer=mixer,
                               moe=moe, mla=mla)


def weight_rows(cfg, base):
    """(theirs, ours, how) of every tensor read as stored; the rest (convolutions, A_log, the
    FFNs under either prefix) is split_fused's."""
    mixers = set(cfg.mixer_layers())
    out = rows(cfg, base, LLAMA_TOP, [])
    for i in range(cfg.n_layers):
        out += [(f"{base}layers.{i}.input_layernorm.weight", f"decoder.{i}.norms.0.weight", ""),
                (f"{base}layers.{i}.post_attention_layernorm.weight", f"decoder.{i}.norms.1.weight", "")]
        if i in mixers:
            m = f"decoder.{i}.mixer"
            out += [(f"{base}{t.format(i=i)}.weight", f"{m}.{o}.weight", "") for t, o in KDA]
            out.append((f"{base}{A.format(i=i)}.o_norm.weight", f"{m}.norm_weight", ""))
        else:
            layer = [r for r in MLA_ROWS if "layernorm" not in r[0] or "kv_a" in r[0]]
            layer += Q_DIRECT if cfg.mla["q_lora_rank"] is None else Q_LORA
            out += [(base + t.format(i=i) + s, o.format(i=i) + s, "") for t, o in layer for s in (".weight", ".bias")]
    return out


def split_fused(cfg, base, ckpt, state) -> None:
    """The KDA convolutions ({q,k,v}_conv1d, each H d x 1 x K, concatenated; or one conv1d),
    the forget gate (f_a_proj, f_b_proj, dt_bias, A_log: 1 x 1 x H x 1 -> H; under self_attn. or
    self_attn.forget_gate.); every FFN under block_sparse_moe. (the released layout) or
    mlp. (transformers' own), the routed experts stacked (E x 2m x d gate then up, E x d x m)."""
    mx = cfg.mixer
    dim, K = mx["heads"] * mx["d_k"], mx["conv"]
    for i in range(cfg.n_layers):
        a, m = f"{base}{A.format(i=i)}", f"decoder.{i}.mixer"
        if i in cfg.mixer_layers():
            parts = [f"{a}.{p}_conv1d.weight" for p in "qkv"]
            if all(p in ckpt for p in parts):
                ts = [ckpt.get(p) for p in parts]
                for p, t in zip(parts, ts):
                    check_shape(p, t, [dim, 1, K])
                state[f"{m}.conv"] = torch.cat(ts)[:, 0].contiguous()
            elif f"{a}.conv1d.weight" in ckpt:
                t = ckpt.get(f"{a}.conv1d.weight")
                check_shape(f"{a}.conv1d.weight", t, [3 * dim, 1, K])
                state[f"{m}.conv"] = t[:, 0].clone()
            gate = f"{a}.forget_gate" if f"{a}.forget_gate.A_log" in ckpt else a
            for t, o in FORGET:
                if f"{gate}.{t}" in ckpt:
                    state[f"{m}.{o}"] = ckpt.get(f"{gate}.{t}")
            if f"{gate}.A_log" in ckpt:
                t = ckpt.get(f"{gate}.A_log")
                if t.numel() != mx["heads"]:
                    raise CheckpointError(f"the tensor {gate}.A_log has shape {list(t.shape)}: expected {mx['heads']} "
                                          "numbers, one a head")
                state[f"{m}.A_log"] = t.reshape(-1).clone()
        _ffn(cfg, base, i, ckpt, state)


def _ffn(cfg, base, i, ckpt, state) -> None:
    ours = f"decoder.{i}.ffn"
    sparse = i in ((cfg.moe or {}).get("layers") or [])
    probe = "gate.weight" if sparse else "gate_proj.weight"
    pre = next((f"{base}layers.{i}.{p}" for p in FFN_PREFIXES if f"{base}layers.{i}.{p}.{probe}" in ckpt), None)
    if pre is None:
        raise CheckpointError(f"the checkpoint lacks layer {i}'s {'experts' if sparse else 'MLP'} "
                              f"({base}layers.{i}.block_sparse_moe.{probe})")
    if not sparse:
        for t, o in (("gate_proj", "w_1"), ("up_proj", "w_3"), ("down_proj", "w_2")):
            state[f"{ours}.{o}.weight"] = ckpt.get(f"{pre}.{t}.weight")
        return
    state[f"{ours}.router.weight"] = ckpt.get(f"{pre}.gate.weight")
    state[f"{ours}.score_bias"] = ckpt.get(f"{pre}.gate.e_score_correction_bias")
    for t, o in (("gate_proj", "shared_w_1"), ("up_proj", "shared_w_3"), ("down_proj", "shared_w_2")):
        state[f"{ours}.{o}.weight"] = ckpt.get(f"{pre}.shared_experts.{t}.weight")
    ex, E = f"{pre}.experts", cfg.moe["experts"]
    if f"{ex}.gate_up_proj" in ckpt:
        state[f"{ours}.gate_up"] = ckpt.get(f"{ex}.gate_up_proj")
        state[f"{ours}.down"] = ckpt.get(f"{ex}.down_proj")
        return
    missing = [f"{ex}.{e}.w1.weight" for e in range(E) if f"{ex}.{e}.w1.weight" not in ckpt]
    if missing:
        raise CheckpointError(f"the checkpoint lacks some of layer {i}'s {E} experts ({missing[0]})")
    state[f"{ours}.gate_up"] = torch.stack([torch.cat([ckpt.get(f"{ex}.{e}.w1.weight"), ckpt.get(f"{ex}.{e}.w3.weight")])
                                            for e in range(E)])
    state[f"{ours}.down"] = torch.stack([ckpt.get(f"{ex}.{e}.w2.weight") for e in range(E)])
