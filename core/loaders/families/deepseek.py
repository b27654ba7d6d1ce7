"""DeepSeek V3 and V3.2: multi-head latent attention in every layer (ModelConfig.mla,
core/net/latent.py), DeepSeek's interleaved RoPE on the rope part of q and the shared key,
YaRN with mscale (cos and sin times mscale(f, mscale) / mscale(f, mscale_all_dim), the
softmax scale times mscale(f, mscale_all_dim)^2), and a mixture of experts after the first
first_k_dense_replace layers (core/net/moe.py's "deepseek": sigmoid scores with a correction
bias for the choice, group-limited top-k, norm_topk_prob, routed_scaling_factor, shared
experts). V3.2 adds the lightning indexer of a sparse selection (index_topk keys per query).

    layers.{i}.self_attn.q_proj                    -> decoder.{i}.self_attn.w_q       (q_lora_rank None)
    layers.{i}.self_attn.q_a_proj / q_a_layernorm / q_b_proj -> decoder.{i}.self_attn.w_qa / q_a_norm / w_qb
    layers.{i}.self_attn.kv_a_proj_with_mqa        -> decoder.{i}.self_attn.w_kva     ((r + d_rope) x d)
    layers.{i}.self_attn.kv_a_layernorm            -> decoder.{i}.self_attn.kv_a_norm (r)
    layers.{i}.self_attn.kv_b_proj                 -> decoder.{i}.self_attn.w_kvb     (H (d_nope + d_v) x r)
    layers.{i}.self_attn.o_proj                    -> decoder.{i}.self_attn.w_o
    layers.{i}.self_attn.indexer.wq_b / wk / k_norm / weights_proj -> decoder.{i}.self_attn.idx_wq / idx_wk / idx_k_norm / idx_w (V3.2)
    layers.{i}.mlp.{gate,up,down}_proj             -> decoder.{i}.ffn.w_1 / w_3 / w_2 (dense layers)
    layers.{i}.mlp.gate.weight / e_score_correction_bias -> decoder.{i}.ffn.router.weight / score_bias
    layers.{i}.mlp.experts.{e}.{gate,up,down}_proj -> decoder.{i}.ffn.gate_up / down (stacked: E x 2m x d
                                                      with gate then up, E x d x m; or fused as
                                                      experts.gate_up_proj / down_proj already)
    layers.{i}.mlp.shared_experts.{gate,up,down}_proj -> decoder.{i}.ffn.shared_w_1 / w_3 / w_2
    the rest as Llama (core/loaders/families/shared.py)

Not supported (CheckpointError): a RoPE scaling other than YaRN, fewer key/value heads than
heads (MLA rebuilds one per head).
"""

from __future__ import annotations

import dataclasses
import math
import re

import torch

from ..checkpoint import CheckpointError
from ..hf_config import config_llama
from .shared import LLAMA_TOP, rows

MODEL_TYPES = ("deepseek_v3", "deepseek_v32")
BASES = (("model.", ""), "embed_tokens.weight")
LAYER_OF = re.compile(r"^(?:model\.)?layers\.(\d+)\.")
A = "layers.{i}.self_attn"
ATTN = [(f"{A}.kv_a_proj_with_mqa", "decoder.{i}.self_attn.w_kva"), (f"{A}.kv_a_layernorm", "decoder.{i}.self_attn.kv_a_norm"),
        (f"{A}.kv_b_proj", "decoder.{i}.self_attn.w_kvb"), (f"{A}.o_proj", "decoder.{i}.self_attn.w_o"),
        ("layers.{i}.input_layernorm", "decoder.{i}.norms.0"),
        ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1")]
Q_DIRECT = [(f"{A}.q_proj", "decoder.{i}.self_attn.w_q")]
Q_LORA = [(f"{A}.q_a_proj", "decoder.{i}.self_attn.w_qa"), (f"{A}.q_a_layernorm", "decoder.{i}.self_attn.q_a_norm"),
          (f"{A}.q_b_proj", "decoder.{i}.self_attn.w_qb")]
INDEXER = [(f"{A}.indexer.wq_b", "decoder.{i}.self_attn.idx_wq"), (f"{A}.indexer.wk", "decoder.{i}.self_attn.idx_wk"),
           (f"{A}.indexer.k_norm", "decoder.{i}.self_attn.idx_k_norm"),
           (f"{A}.indexer.weights_proj", "decoder.{i}.self_attn.idx_w")]
DENSE = [("layers.{i}.mlp.gate_proj", "decoder.{i}.ffn.w_1"), ("layers.{i}.mlp.up_proj", "decoder.{i}.ffn.w_3"),
         ("layers.{i}.mlp.down_proj", "decoder.{i}.ffn.w_2")]
MOE = [("mlp.gate.weight", "ffn.router.weight"), ("mlp.gate.e_score_correction_bias", "ffn.score_bias"),
       ("mlp.shared_experts.gate_proj.weight", "ffn.shared_w_1.weight"),
       ("mlp.shared_experts.up_proj.weight", "ffn.shared_w_3.weight"),
       ("mlp.shared_experts.down_proj.weight", "ffn.shared_w_2.weight")]


def mscale(factor: float, m: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 m ln(factor) + 1 (1 where factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def rope(hf: dict, qk_head_dim: int):
    """(theta, ModelConfig.rope_scaling, the softmax scale) from rope_parameters / rope_scaling."""
    p = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    theta = float(p.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = p.get("rope_type", p.get("type", "default"))
    scale = qk_head_dim ** -0.5
    if kind in (None, "default"):
        return theta, None, scale
    if kind != "yarn":
        raise CheckpointError(f"DeepSeek with rope scaling {kind!r} is not supported (only YaRN)")
    orig = float(p["original_max_position_embeddings"])
    factor = p.get("factor")
    factor = float(factor) if factor is not None else hf["max_position_embeddings"] / orig
    m, m_all = p.get("mscale"), p.get("mscale_all_dim")
    att = p.get("attention_factor")
    if att is None:
        att = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    if m_all:
        scale *= mscale(factor, m_all) ** 2
    scaling = {"type": "yarn", "factor": factor, "original_max_position_embeddings": orig,
               "beta_fast": float(p.get("beta_fast") or 32), "beta_slow": float(p.get("beta_slow") or 1),
               "truncate": bool(p.get("truncate", True)), "attention_factor": float(att)}
    return theta, scaling, scale


def config(hf: dict):
    n, h = hf["num_hidden_layers"], hf["num_attention_heads"]
    if (hf.get("num_key_value_heads") or h) != h:
        raise CheckpointError("DeepSeek with num_key_value_heads != num_attention_heads is not supported")
    v2 = hf.get("model_type") == "deepseek_v32"
    dqk = hf["qk_nope_head_dim"] + hf["qk_rope_head_dim"]
    theta, scaling, scale = rope(hf, dqk)
    bias = bool(hf.get("attention_bias", False))
    plain = {k: v for k, v in hf.items() if k not in ("rope_parameters", "rope_scaling")}
    cfg = config_llama(dict(plain, attention_bias=False, head_dim=hf["v_head_dim"], num_key_value_heads=h))
    types = hf.get("mlp_layer_types")
    if types is None:
        first = hf.get("first_k_dense_replace") or 0
        types = ["dense" if i < first else "sparse" for i in range(n)]
    moe_layers = [i for i, t in enumerate(types) if t == "sparse"]
    experts = hf.get("n_routed_experts") or hf.get("num_local_experts")
    moe = None
    if moe_layers:
        de = int(hf["moe_intermediate_size"])
        moe = {"kind": "deepseek", "experts": int(experts), "top_k": int(hf["num_experts_per_tok"]), "d_expert": de,
               "layers": moe_layers, "n_group": int(hf.get("n_group") or 1), "topk_group": int(hf.get("topk_group") or 1),
               "norm_topk_prob": bool(hf.get("norm_topk_prob", True)),
               "routed_scaling_factor": float(hf.get("routed_scaling_factor", 1.0)),
               "d_shared": de * int(hf.get("n_shared_experts") or 1)}
    index = ({"heads": int(hf["index_n_heads"]), "head_dim": int(hf["index_head_dim"]), "topk": int(hf["index_topk"])}
             if v2 else None)
    if v2 and hf.get("q_lora_rank") is None:
        raise CheckpointError("DeepSeek V3.2 without q_lora_rank is not supported (its indexer reads the compressed query)")
    mla = {"kv_lora_rank": int(hf["kv_lora_rank"]), "q_lora_rank": hf.get("q_lora_rank"),
           "qk_nope_head_dim": int(hf["qk_nope_head_dim"]), "qk_rope_head_dim": int(hf["qk_rope_head_dim"]),
           "v_head_dim": int(hf["v_head_dim"]), "rope_interleave": True if v2 else bool(hf.get("rope_interleave", True)),
           "index": index}
    return dataclasses.replace(cfg, rope_theta=theta, rope_scaling=scaling, attn_scale=scale, qkv_bias=bias,
                               moe=moe, mla=mla)


def weight_rows(cfg, base):
    dense = [i for i in range(cfg.n_layers) if not (cfg.moe and i in cfg.moe["layers"])]
    layer = ATTN + (Q_DIRECT if cfg.mla["q_lora_rank"] is None else Q_LORA) + (INDEXER if cfg.mla["index"] else [])
    out = rows(cfg, base, LLAMA_TOP, layer)
    for i in dense:
        out += [(f"{base}{t.format(i=i)}{s}", f"{o.format(i=i)}{s}", "") for t, o in DENSE for s in (".weight", ".bias")]
    for i in (cfg.moe or {}).get("layers") or []:
        out += [(f"{base}layers.{i}.{t}", f"decoder.{i}.{o}", "") for t, o in MOE]
    return out


def split_fused(cfg, base, ckpt, state):
    """The routed experts, one tensor per expert and projection in the checkpoint (as DeepSeek
    and transformers' save_pretrained write them), stacked into ffn.gate_up and ffn.down. The
    layers past num_hidden_layers (DeepSeek's multi-token prediction modules, which transformers
    does not load either) are passed over unread."""
    for name in ckpt.names():
        m = LAYER_OF.match(name)
        if m and int(m.group(1)) >= cfg.n_layers:
            ckpt.used.add(name)
    for i in (cfg.moe or {}).get("layers") or []:
        ex = f"{base}layers.{i}.mlp.experts"
        if f"{ex}.gate_up_proj" in ckpt:
            state[f"decoder.{i}.ffn.gate_up"] = ckpt.get(f"{ex}.gate_up_proj")
            state[f"decoder.{i}.ffn.down"] = ckpt.get(f"{ex}.down_proj")
            continue
        n = cfg.moe["experts"]
        if any(f"{ex}.{e}.gate_proj.weight" not in ckpt for e in range(n)):
            raise CheckpointError(f"the checkpoint lacks some of layer {i}'s {n} experts ({ex}.{{e}}.gate_proj.weight)")
        state[f"decoder.{i}.ffn.gate_up"] = torch.stack([torch.cat([ckpt.get(f"{ex}.{e}.gate_proj.weight"),
                                                                    ckpt.get(f"{ex}.{e}.up_proj.weight")]) for e in range(n)])
        state[f"decoder.{i}.ffn.down"] = torch.stack([ckpt.get(f"{ex}.{e}.down_proj.weight") for e in range(n)])
