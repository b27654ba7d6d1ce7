"""GPT-2: a pre-norm decoder with learned positions and gelu_new; config.json -> ModelConfig,
the weight table and the fused c_attn.

Its Conv1D weights are stored (in, out) and transposed ("T" rows); c_attn holds W_q, W_k and
W_v side by side (d x 3d, and a 3d bias) and is split in three (split_fused).
"""

from __future__ import annotations

from typing import List, Tuple

from ..checkpoint import CheckpointError, check_shape
from ..hf_config import _act, _no
from ...net.config import ModelConfig

MODEL_TYPES = ("gpt2",)
BASES = (("transformer.", ""), "wte.weight")

TOP = [("wte", "tgt_embed.tok"), ("wpe", "tgt_embed.pos"), ("ln_f", "decoder_norm")]
LAYER = [("h.{i}.ln_1", "decoder.{i}.norms.0"), ("h.{i}.ln_2", "decoder.{i}.norms.1")]
LAYER_T = [("h.{i}.attn.c_proj", "decoder.{i}.self_attn.w_o"), ("h.{i}.mlp.c_fc", "decoder.{i}.ffn.w_1"),
           ("h.{i}.mlp.c_proj", "decoder.{i}.ffn.w_2")]


def config(hf: dict) -> ModelConfig:
    _no(hf, "scale_attn_by_inverse_layer_idx", "scaling attention by the layer index")
    _no(hf, "reorder_and_upcast_attn", "reordered attention")
    if hf.get("scale_attn_weights", True) is False:
        raise CheckpointError("GPT-2 without 1/sqrt(d_k) scaling (scale_attn_weights=false) is not supported")
    d = hf["n_embd"]
    return ModelConfig(
        kind="decoder",
        d_model=d,
        n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * d,
        n_layers=hf["n_layer"],
        tgt_vocab_size=hf["vocab_size"],
        max_len=hf.get("n_positions", 1024),
        positional="learned",
        activation=_act(hf.get("activation_function", "gelu_new")),
        norm="layernorm",
        norm_placement="pre",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        bias=True,
        final_norm=True,
        tie_embeddings=hf.get("tie_word_embeddings", True),
        out_bias=False,
        pad_id=hf.get("pad_token_id") or 0,
    )


def weight_rows(cfg: ModelConfig, base: str) -> List[Tuple[str, str, str]]:
    rows = [(base + theirs + s, ours + s, "") for theirs, ours in TOP for s in (".weight", ".bias")]
    for i in range(cfg.n_layers):
        for table, how in ((LAYER, ""), (LAYER_T, "T")):
            rows += [(base + theirs.format(i=i) + s, ours.format(i=i) + s, how) for theirs, ours in table
                     for s in (".weight", ".bias")]
    if not cfg.tie_embeddings:
        rows.append(("lm_head.weight", "out_proj.weight", ""))
    return rows


def split_fused(cfg: ModelConfig, base: str, ckpt, state) -> None:
    """c_attn: x @ W (d x 3d) + b -> W_q, W_k, W_v (each d x d, transposed to ours) and their biases."""
    d = cfg.d_model
    for i in range(cfg.n_layers):
        w_name, b_name = f"{base}h.{i}.attn.c_attn.weight", f"{base}h.{i}.attn.c_attn.bias"
        if w_name not in ckpt:
            continue
        w = ckpt.get(w_name)
        check_shape(w_name, w, [d, 3 * d])
        b = ckpt.get(b_name) if b_name in ckpt else None
        for j, part in enumerate(("w_q", "w_k", "w_v")):
            state[f"decoder.{i}.self_attn.{part}.weight"] = w[:, j * d:(j + 1) * d].t().contiguous()
            if b is not None:
                state[f"decoder.{i}.self_attn.{part}.bias"] = b[j * d:(j + 1) * d].clone()
