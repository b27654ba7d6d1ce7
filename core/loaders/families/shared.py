"""Pieces the family modules share: the Llama-style weight table (embed_tokens, q/k/v/o_proj,
gate/up/down_proj, input/post_attention_layernorm, norm) and the table builder.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from ...net.config import ModelConfig

Row = Tuple[str, str, str]

LLAMA_TOP = [("embed_tokens", "tgt_embed.tok"), ("norm", "decoder_norm")]
LLAMA_ATTN = [
    ("layers.{i}.self_attn.q_proj", "decoder.{i}.self_attn.w_q"),
    ("layers.{i}.self_attn.k_proj", "decoder.{i}.self_attn.w_k"),
    ("layers.{i}.self_attn.v_proj", "decoder.{i}.self_attn.w_v"),
    ("layers.{i}.self_attn.o_proj", "decoder.{i}.self_attn.w_o"),
]
LLAMA_MLP = [
    ("layers.{i}.mlp.gate_proj", "decoder.{i}.ffn.w_1"),
    ("layers.{i}.mlp.up_proj", "decoder.{i}.ffn.w_3"),
    ("layers.{i}.mlp.down_proj", "decoder.{i}.ffn.w_2"),
]
QK_NORM = [
    ("layers.{i}.self_attn.q_norm", "decoder.{i}.self_attn.q_norm"),
    ("layers.{i}.self_attn.k_norm", "decoder.{i}.self_attn.k_norm"),
]


def rows(cfg: ModelConfig, base: str, top: Sequence[Tuple[str, str]], layer: Sequence[Tuple[str, str]],
         lm_head: str = "lm_head") -> List[Row]:
    """(full checkpoint name, our name, "") for every top-level and per-layer pair, .weight and
    .bias each (a bias our config lacks is skipped when the checkpoint lacks it too), and the
    output projection when it is not tied."""
    out: List[Row] = []
    for theirs, ours in top:
        out += [(base + theirs + s, ours + s, "") for s in (".weight", ".bias")]
    for i in range(cfg.n_layers):
        for theirs, ours in layer:
            out += [(base + theirs.format(i=i) + s, ours.format(i=i) + s, "") for s in (".weight", ".bias")]
    if not cfg.tie_embeddings:
        out += [(f"{lm_head}.weight", "out_proj.weight", ""), (f"{lm_head}.bias", "out_proj.bias", "")]
    return out
