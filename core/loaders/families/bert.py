"""BERT, RoBERTa and DistilBERT: a post-norm encoder with learned positions, an embedding
LayerNorm and biases; config.json -> ModelConfig and the weight table.

    bert        post-norm LayerNorm, learned positions + token types, GELU
    roberta     as bert, positions start at padding_idx + 1 (ModelConfig.position_offset)
    distilbert  as bert without token types (q_lin/k_lin/... names)

The masked-LM head, where the checkpoint has one, is read by core/loaders/masked_lm.py.
"""

from __future__ import annotations

from typing import List, Tuple

from ..checkpoint import CheckpointError
from ..hf_config import _act
from ..minilm import EMBED_MAP as BERT_EMBED  # the tables core/loaders/minilm.py uses for all-MiniLM-L6-v2
from ..minilm import LAYER_MAP as BERT_LAYER
from ...net.config import ModelConfig

MODEL_TYPES = ("bert", "roberta", "distilbert")
BASES = (("bert.", ""), "embeddings.word_embeddings.weight")
BASES_BY_TYPE = {t: ((f"{t}.", ""), "embeddings.word_embeddings.weight") for t in MODEL_TYPES}

DISTIL_EMBED = [("embeddings.word_embeddings", "src_embed.tok"), ("embeddings.position_embeddings", "src_embed.pos"),
                ("embeddings.LayerNorm", "src_embed.norm")]
DISTIL_LAYER = [
    ("transformer.layer.{i}.attention.q_lin", "encoder.{i}.self_attn.w_q"),
    ("transformer.layer.{i}.attention.k_lin", "encoder.{i}.self_attn.w_k"),
    ("transformer.layer.{i}.attention.v_lin", "encoder.{i}.self_attn.w_v"),
    ("transformer.layer.{i}.attention.out_lin", "encoder.{i}.self_attn.w_o"),
    ("transformer.layer.{i}.sa_layer_norm", "encoder.{i}.norms.0"),
    ("transformer.layer.{i}.ffn.lin1", "encoder.{i}.ffn.w_1"),
    ("transformer.layer.{i}.ffn.lin2", "encoder.{i}.ffn.w_2"),
    ("transformer.layer.{i}.output_layer_norm", "encoder.{i}.norms.1"),
]


def config(hf: dict) -> ModelConfig:
    if hf.get("model_type") == "distilbert":
        cfg = _bert_family(
            hf, ("dim", "n_heads", "hidden_dim", "n_layers"),
            max_len=hf.get("max_position_embeddings", 512),
            # positional="learned" for sinusoidal_pos_embds too: the table is stored in the checkpoint
            activation=_act(hf.get("activation", "gelu")),
            norm_eps=1e-12,
        )
    else:
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported")
        roberta = hf.get("model_type") == "roberta"
        offset = int(hf.get("pad_token_id", 1)) + 1 if roberta else 0
        cfg = _bert_family(
            hf, ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers"),
            max_len=hf.get("max_position_embeddings", 512) - offset,
            position_offset=offset,
            type_vocab_size=hf.get("type_vocab_size", 2),
            activation=_act(hf.get("hidden_act", "gelu")),
            norm_eps=hf.get("layer_norm_eps", 1e-12),
        )
    cfg.extra = {"family": hf.get("model_type")}  # which table weight_rows gives (build_net rewrites extra)
    return cfg


def _bert_family(hf: dict, sizes: Tuple[str, str, str, str], **fields) -> ModelConfig:
    """What BERT, RoBERTa and DistilBERT share: a post-norm encoder with learned positions, an
    embedding LayerNorm and biases. sizes: the config.json keys of d, H, m and L, which each
    family names its own way; `fields` the rest."""
    d, h, m, n_layers = (hf[k] for k in sizes)
    return ModelConfig(kind="encoder", d_model=d, n_heads=h, d_ff=m, n_layers=n_layers,
                       src_vocab_size=hf["vocab_size"], positional="learned", embed_norm=True, norm="layernorm",
                       norm_placement="post", bias=True, final_norm=False, pad_id=hf.get("pad_token_id") or 0,
                       **fields)


def weight_rows(cfg: ModelConfig, base: str) -> List[Tuple[str, str, str]]:
    distil = (cfg.extra or {}).get("family") == "distilbert"
    top, layer = (DISTIL_EMBED, DISTIL_LAYER) if distil else (BERT_EMBED, BERT_LAYER)
    rows = [(base + theirs + s, ours + s, "") for theirs, ours in top for s in (".weight", ".bias")]
    for i in range(cfg.n_layers):
        rows += [(base + theirs.format(i=i) + s, ours.format(i=i) + s, "") for theirs, ours in layer
                 for s in (".weight", ".bias")]
    return rows
