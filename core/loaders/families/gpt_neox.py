"""GPT-NeoX (Pythia): a pre-norm LayerNorm decoder with biases, GELU, partial rotary positions
and, by default, the parallel block:

    x = x + MultiHead(LN_1(x)) + FFN(LN_2(x))      (use_parallel_residual; else sequential)

ModelConfig: parallel_block (recorded residual1 = x + attention, norm2 = LN_2 of the layer
input, residual2 = the sum), rotary_dim = int(d_k * rotary_pct) (RoPE on the first rotary_dim
features of each head, "half" layout among them; the rest pass unchanged).

    gpt_neox.embed_in                             -> tgt_embed.tok
    gpt_neox.layers.{i}.input_layernorm           -> decoder.{i}.norms.0
    gpt_neox.layers.{i}.attention.query_key_value -> split into decoder.{i}.self_attn.w_q / w_k / w_v
    gpt_neox.layers.{i}.attention.dense           -> decoder.{i}.self_attn.w_o
    gpt_neox.layers.{i}.post_attention_layernorm  -> decoder.{i}.norms.1
    gpt_neox.layers.{i}.mlp.dense_h_to_4h / 4h_to_h -> decoder.{i}.ffn.w_1 / w_2
    gpt_neox.final_layer_norm                     -> decoder_norm
    embed_out                                     -> out_proj

query_key_value is fused per head: its 3d rows are [head 0: q (d_k rows), k, v; head 1: q, k,
v; ...] (the output is viewed as H x 3 d_k and chunked), so W_q is rows 0:d_k of every
3 d_k-row block, W_k the next d_k, W_v the last.

Not supported (CheckpointError): attention_bias false (the FFN keeps its biases, which our
config ties to the output projection's), rope scaling other than linear / llama3.
"""

from __future__ import annotations

import re

from ..checkpoint import CheckpointError, check_shape
from ..hf_config import DECODER_MAX_LEN, _act, rope_params, rotary_dim
from ...net.config import ModelConfig
from .shared import rows

MODEL_TYPES = ("gpt_neox",)
BASES = (("gpt_neox.", ""), "embed_in.weight")
TOP = [("embed_in", "tgt_embed.tok"), ("final_layer_norm", "decoder_norm")]
LAYER = [
    ("layers.{i}.input_layernorm", "decoder.{i}.norms.0"),
    ("layers.{i}.attention.dense", "decoder.{i}.self_attn.w_o"),
    ("layers.{i}.post_attention_layernorm", "decoder.{i}.norms.1"),
    ("layers.{i}.mlp.dense_h_to_4h", "decoder.{i}.ffn.w_1"),
    ("layers.{i}.mlp.dense_4h_to_h", "decoder.{i}.ffn.w_2"),
]
# buffers older checkpoints store: the causal mask, its fill value, RoPE's frequencies
IGNORED = re.compile(r"^.*\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)$")


def config(hf: dict) -> ModelConfig:
    if hf.get("attention_bias", True) is False:
        raise CheckpointError("GPT-NeoX without attention biases (attention_bias=false) is not supported")
    d, h = hf["hidden_size"], hf["num_attention_heads"]
    d_head = d // h
    hf = dict(hf)
    if "rotary_emb_base" in hf:  # the older name of rope_theta
        hf.setdefault("rope_theta", hf["rotary_emb_base"])
    theta, scaling = rope_params(hf, partial=True)
    return ModelConfig(
        kind="decoder",
        d_model=d,
        n_heads=h,
        d_ff=hf["intermediate_size"],
        n_layers=hf["num_hidden_layers"],
        tgt_vocab_size=hf["vocab_size"],
        max_len=hf.get("max_position_embeddings", DECODER_MAX_LEN),
        positional="rope",
        rope_theta=theta,
        rope_scaling=scaling,
        rope_layout="half",
        rotary_dim=rotary_dim(hf, d_head, default=0.25),
        norm="layernorm",
        norm_eps=hf.get("layer_norm_eps", 1e-5),
        norm_placement="pre",
        activation=_act(hf.get("hidden_act", "gelu")),
        bias=True,
        out_bias=False,
        final_norm=True,
        parallel_block=bool(hf.get("use_parallel_residual", True)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        pad_id=hf.get("pad_token_id") or 0,
    )


def weight_rows(cfg, base):
    return rows(cfg, base, TOP, LAYER, lm_head="embed_out")


def split_fused(cfg, base, ckpt, state) -> None:
    """query_key_value (3d x d, per-head [q, k, v] blocks) -> W_q, W_k, W_v and their biases."""
    h, dk, d = cfg.n_heads, cfg.d_head, cfg.d_model
    for i in range(cfg.n_layers):
        for s in ("weight", "bias"):
            name = f"{base}layers.{i}.attention.query_key_value.{s}"
            if name not in ckpt:
                continue  # reported as W_q, W_k, W_v left unfilled
            t = ckpt.get(name)
            check_shape(name, t, [3 * h * dk, d] if s == "weight" else [3 * h * dk])
            blocks = t.reshape(h, 3, dk, *t.shape[1:])
            for j, part in enumerate(("w_q", "w_k", "w_v")):
                state[f"decoder.{i}.self_attn.{part}.{s}"] = blocks[:, j].reshape(h * dk, *t.shape[1:]).clone()
