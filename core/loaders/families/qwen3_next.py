"""Qwen3-Next and Qwen3.5 (text): hybrids of Gated DeltaNet layers and gated softmax attention.

    layer_types  per layer "linear_attention" (a gated delta rule, core/net/gated_delta.py:
                 ModelConfig.mixer) or "full_attention"; absent: every full_attention_interval-th
                 layer (4) is full attention, the rest linear, as transformers fills it.
    attention    Qwen3's QK-norm over each head's d_k, partial rotary (partial_rotary_factor,
                 0.25 by default: ModelConfig.rotary_dim) and an output gate: q_proj holds, per
                 head, d_k rows of W_q then d_k rows of the gate W_g (split here;
                 ModelConfig.attn_gate: heads * sigmoid(x W_g) before o_proj).
    norms        every RMSNorm of the stream and of q and k scales by (1 + w): one is added
                 when loading (how "+1"), so the network's gain is the real one; the gated
                 RMSNorm inside the delta-rule layer scales by w itself.
    FFN          Qwen3.5: dense SwiGLU. Qwen3-Next: a mixture of experts (ModelConfig.moe kind
                 "qwen3_next": softmax router, top-k renormalised where norm_topk_prob, a shared
                 expert scaled by sigmoid(x w_sg)) on the layers i not in mlp_only_layers with
                 (i + 1) % decoder_sparse_step == 0, the dense SwiGLU of intermediate_size elsewhere.

Tensors (under model. or model.language_model.):
    layers.{i}.linear_attn.in_proj_qkv / in_proj_z / in_proj_b / in_proj_a  (Qwen3.5)
                                      -> decoder.{i}.mixer.w_qkv / w_z / w_b / w_a
    layers.{i}.linear_attn.in_proj_qkvz, in_proj_ba (Qwen3-Next: per key head [q, k, v, z] and
                                      [b, a], split here into the same four)
    layers.{i}.linear_attn.conv1d.weight (C x 1 x K) -> decoder.{i}.mixer.conv (C x K)
    layers.{i}.linear_attn.A_log, dt_bias, norm.weight, out_proj
                                      -> decoder.{i}.mixer.A_log, dt_bias, norm_weight, w_out
    layers.{i}.mlp.gate / experts.{e}.{gate,up,down}_proj / shared_expert.{gate,up,down}_proj /
    shared_expert_gate                -> decoder.{i}.ffn.router / gate_up, down / shared_w_1,
                                         shared_w_3, shared_w_2 / shared_gate
    the rest as Llama with Qwen3's q_norm / k_norm.

Qwen3.5's rotary embedding is multimodal (mrope_section, interleaved over time, height and
width); for text alone the three position ids are the same, which makes it the plain rotary
embedding of the first rotary_dim features, as read here. Not supported (CheckpointError):
attention biases, an activation other than SiLU, layer types other than the two above, the
multimodal checkpoints' vision tower (model_type "qwen3_5": load the text model).
"""

from __future__ import annotations

import dataclasses

import torch

from ..checkpoint import CheckpointError, check_shape
from ..hf_config import config_llama, rotary_dim

MODEL_TYPES = ("qwen3_next", "qwen3_5_text")
BASES = (("model.", "model.language_model.", ""), "embed_tokens.weight")
KIND = "decoder"
LA = "layers.{i}.linear_attn"
SA = "layers.{i}.self_attn"
MLP = "layers.{i}.mlp"


def _layer_types(hf: dict, n: int) -> list:
    types = hf.get("layer_types")
    if types is None:
        every = int(hf.get("full_attention_interval", 4))
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    types = list(types)
    if len(types) != n or any(t not in ("linear_attention", "full_attention") for t in types):
        raise CheckpointError(f"layer_types {types!r} is not a list of {n} linear_attention / full_attention")
    return types


def _moe_layers(hf: dict, n: int) -> list:
    if hf.get("model_type") != "qwen3_next" or not int(hf.get("num_experts") or 0):
        return []
    step, dense = int(hf.get("decoder_sparse_step", 1)), set(hf.get("mlp_only_layers") or [])
    return [i for i in range(n) if i not in dense and (i + 1) % step == 0]


def config(hf: dict):
    if hf.get("model_type") not in MODEL_TYPES:
        raise CheckpointError(f"model_type {hf.get('model_type')!r} is not read by the Qwen3-Next family")
    cfg = config_llama(hf, partial=True)
    n = cfg.n_layers
    mixer = {"kind": "gated_delta", "heads": int(hf["linear_num_value_heads"]),
             "k_heads": int(hf["linear_num_key_heads"]), "d_k": int(hf["linear_key_head_dim"]),
             "d_v": int(hf["linear_value_head_dim"]), "conv": int(hf["linear_conv_kernel_dim"]),
             "norm_eps": float(hf.get("rms_norm_eps", 1e-6))}
    if mixer["heads"] % mixer["k_heads"]:
        raise CheckpointError("linear_num_value_heads must be a multiple of linear_num_key_heads")
    layers = _moe_layers(hf, n)
    moe = {"kind": "qwen3_next", "experts": int(hf["num_experts"]), "top_k": int(hf["num_experts_per_tok"]),
           "d_expert": int(hf["moe_intermediate_size"]), "d_shared": int(hf["shared_expert_intermediate_size"]),
           "norm_topk": bool(hf.get("norm_topk_prob", True)), "layers": layers} if layers else None
    return dataclasses.replace(cfg, qk_norm="head", attn_gate=True, layer_types=_layer_types(hf, n), mixer=mixer,
                               moe=moe, rotary_dim=rotary_dim(hf, cfg.d_head, default=0.25))


def weight_rows(cfg, base):
    """(theirs, ours, how): the (1 + w) norms get "+1"; what is fused or reshaped is split_fused's."""
    out = [(f"{base}embed_tokens.weight", "tgt_embed.tok.weight", ""), (f"{base}norm.weight", "decoder_norm.weight", "+1")]
    moe = set((cfg.moe or {}).get("layers") or [])
    for i in range(cfg.n_layers):
        at = lambda s: s.format(i=i)  # noqa: E731
        out += [(base + at("layers.{i}.input_layernorm.weight"), f"decoder.{i}.norms.0.weight", "+1"),
                (base + at("layers.{i}.post_attention_layernorm.weight"), f"decoder.{i}.norms.1.weight", "+1")]
        if i in cfg.mixer_layers():
            la, m = base + at(LA), f"decoder.{i}.mixer"
            out += [(f"{la}.{t}", f"{m}.{o}", "") for t, o in (
                ("in_proj_qkv.weight", "w_qkv.weight"), ("in_proj_z.weight", "w_z.weight"),
                ("in_proj_b.weight", "w_b.weight"), ("in_proj_a.weight", "w_a.weight"), ("A_log", "A_log"),
                ("dt_bias", "dt_bias"), ("norm.weight", "norm_weight"), ("out_proj.weight", "w_out.weight"))]
        else:
            sa, a = base + at(SA), f"decoder.{i}.self_attn"
            out += [(f"{sa}.k_proj.weight", f"{a}.w_k.weight", ""), (f"{sa}.v_proj.weight", f"{a}.w_v.weight", ""),
                    (f"{sa}.o_proj.weight", f"{a}.w_o.weight", ""),
                    (f"{sa}.q_norm.weight", f"{a}.q_norm.weight", "+1"),
                    (f"{sa}.k_norm.weight", f"{a}.k_norm.weight", "+1")]
        mlp, f = base + at(MLP), f"decoder.{i}.ffn"
        if i in moe:
            out += [(f"{mlp}.gate.weight", f"{f}.router.weight", ""),
                    (f"{mlp}.shared_expert.gate_proj.weight", f"{f}.shared_w_1.weight", ""),
                    (f"{mlp}.shared_expert.up_proj.weight", f"{f}.shared_w_3.weight", ""),
                    (f"{mlp}.shared_expert.down_proj.weight", f"{f}.shared_w_2.weight", ""),
                    (f"{mlp}.shared_expert_gate.weight", f"{f}.shared_gate.weight", "")]
        else:
            out += [(f"{mlp}.gate_proj.weight", f"{f}.w_1.weight", ""), (f"{mlp}.up_proj.weight", f"{f}.w_3.weight", ""),
                    (f"{mlp}.down_proj.weight", f"{f}.w_2.weight", "")]
    if not cfg.tie_embeddings:
        out.append(("lm_head.weight", "out_proj.weight", ""))
    return out


def split_fused(cfg, base, ckpt, state) -> None:
    """q_proj -> W_q and the gate W_g (per head: d_k rows each); Qwen3-Next's in_proj_qkvz and
    in_proj_ba (per key head) -> W_qkv, W_z, W_b, W_a; conv1d (C x 1 x K) -> C x K; the experts
    (one tensor per expert and projection, or transformers' fused E x 2m x d and E x d x m)."""
    d, h, dk = cfg.d_model, cfg.n_heads, cfg.d_head
    mx = cfg.mixer
    hk, hv, mk, mv = mx["k_heads"], mx["heads"], mx["d_k"], mx["d_v"]
    r = hv // hk
    moe = cfg.moe or {}
    for i in range(cfg.n_layers):
        if i in cfg.mixer_layers():
            la, m = f"{base}{LA.format(i=i)}", f"decoder.{i}.mixer"
            name = f"{la}.in_proj_qkvz.weight"
            if name in ckpt:
                t = ckpt.get(name)
                check_shape(name, t, [hk * (2 * mk + 2 * r * mv), d])
                g = t.view(hk, 2 * mk + 2 * r * mv, d)
                q, k = g[:, :mk].reshape(-1, d), g[:, mk:2 * mk].reshape(-1, d)
                v, z = g[:, 2 * mk:2 * mk + r * mv].reshape(-1, d), g[:, 2 * mk + r * mv:].reshape(-1, d)
                state[f"{m}.w_qkv.weight"] = torch.cat([q, k, v]).contiguous()
                state[f"{m}.w_z.weight"] = z.clone()
            name = f"{la}.in_proj_ba.weight"
            if name in ckpt:
                t = ckpt.get(name)
                check_shape(name, t, [2 * hv, d])
                g = t.view(hk, 2 * r, d)
                state[f"{m}.w_b.weight"], state[f"{m}.w_a.weight"] = g[:, :r].reshape(-1, d).clone(), g[:, r:].reshape(-1, d).clone()
            name = f"{la}.conv1d.weight"
            if name in ckpt:
                t = ckpt.get(name)
                check_shape(name, t, [2 * hk * mk + hv * mv, 1, mx["conv"]])
                state[f"{m}.conv"] = t[:, 0].clone()
        else:
            name = f"{base}{SA.format(i=i)}.q_proj.weight"
            if name in ckpt:
                t = ckpt.get(name)
                check_shape(name, t, [2 * h * dk, d])
                g = t.view(h, 2 * dk, d)
                a = f"decoder.{i}.self_attn"
                state[f"{a}.w_q.weight"], state[f"{a}.w_gate.weight"] = (g[:, :dk].reshape(-1, d).clone(),
                                                                          g[:, dk:].reshape(-1, d).clone())
        if i in (moe.get("layers") or []):
            _experts(cfg, f"{base}{MLP.format(i=i)}.experts", f"decoder.{i}.ffn", ckpt, state)


def _experts(cfg, theirs: str, ours: str, ckpt, state) -> None:
    E, m, d = cfg.moe["experts"], cfg.moe["d_expert"], cfg.d_model
    if f"{theirs}.gate_up_proj" in ckpt:  # transformers' fused layout: E x 2m x d, E x d x m
        gu, down = ckpt.get(f"{theirs}.gate_up_proj"), ckpt.get(f"{theirs}.down_proj")
        check_shape(f"{theirs}.gate_up_proj", gu, [E, 2 * m, d])
        check_shape(f"{theirs}.down_proj", down, [E, d, m])
        state[f"{ours}.gate_up"] = gu.transpose(1, 2).contiguous()
        state[f"{ours}.down"] = down.transpose(1, 2).contiguous()
        return
    gate_up, downs = [], []
    for e in range(E):
        names = [f"{theirs}.{e}.{p}_proj.weight" for p in ("gate", "up", "down")]
        missing = [n for n in names if n not in ckpt]
        if missing:
            raise CheckpointError(f"the checkpoint lacks {missing[0]!r}")
        g, u, dn = (ckpt.get(n) for n in names)
        for n, t, shape in zip(names, (g, u, dn), ([m, d], [m, d], [d, m])):
            check_shape(n, t, shape)
        gate_up.append(torch.cat([g, u]).t())  # d x 2m: gate then up
        downs.append(dn.t())  # m x d
    state[f"{ours}.gate_up"] = torch.stack(gate_up).contiguous()
    state[f"{ours}.down"] = torch.stack(downs).contiguous()

