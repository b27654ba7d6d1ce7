"""Marian, BART and T5 for core/loaders/hf_seq2seq.py: config.json -> ModelConfig, and each
family's weight-name table (rows of (our name, checkpoint names, transform)).

Families (our Transformer, core/net/model.py, configured by ModelConfig):

    marian  post-norm, sinusoidal positions laid out sin | cos by halves (not interleaved),
            token embeddings times sqrt(d) (scale_embedding), swish (silu) FFN, output
            projection tied to the shared embedding plus final_logits_bias; the decoder
            starts from <pad>. Tokens: source.spm (source) and target.spm (target) with
            sentencepiece, pieces mapped to ids through vocab.json, </s> appended.
    bart    post-norm, learned positions stored with an offset of 2 (rows 2.. are positions
            0..), LayerNorm after the embedding sum (layernorm_embedding), gelu, tied output
            projection plus final_logits_bias. Tokens: tokenizer.json (<s> ... </s>).
    t5      pre-norm with RMS norms (no mean, no bias), no position vectors: a bucketed
            relative position bias, learned in layer 0 of each stack and shared by its layers,
            is added to the scores (bidirectional buckets in the encoder, backwards only in the
            decoder; trace name {stack}.{i}.self_attn.position_bias), no 1/sqrt(d_k) on the
            scores, relu or gated-gelu FFN, no biases, final norms; with tied embeddings the
            last hidden state is scaled by d^-0.5 before the output projection. The decoder
            starts from <pad>. Tokens: tokenizer.json, else spiece.model (sentencepiece);
            </s> appended.

Weight names (checkpoint -> ours; a leading "model." is dropped; i = layer; "|" lists
alternatives, the first one present is used; Linear and LayerNorm rows stand for .weight
and .bias):

    bart / marian
        encoder.embed_tokens | shared               -> src_embed.tok
        decoder.embed_tokens | shared               -> tgt_embed.tok
        lm_head | decoder.embed_tokens | shared     -> out_proj.weight;  final_logits_bias -> out_proj.bias
        {encoder,decoder}.embed_positions           -> {src,tgt}_embed.pos   (bart: rows 2..)
        {encoder,decoder}.layernorm_embedding       -> {src,tgt}_embed.norm  (bart)
        {stack}.layers.{i}.self_attn.{q,k,v,out}_proj -> {stack}.{i}.self_attn.w_{q,k,v,o}
        {stack}.layers.{i}.self_attn_layer_norm     -> {stack}.{i}.norms.0
        decoder.layers.{i}.encoder_attn.*_proj      -> decoder.{i}.cross_attn.w_*
        decoder.layers.{i}.encoder_attn_layer_norm  -> decoder.{i}.norms.1
        {stack}.layers.{i}.fc1 / fc2                -> {stack}.{i}.ffn.w_1 / w_2
        {stack}.layers.{i}.final_layer_norm         -> {stack}.{i}.norms.1 (encoder) / .2 (decoder)
    t5
        shared | encoder.embed_tokens / decoder.embed_tokens -> src_embed.tok / tgt_embed.tok
        lm_head | shared                            -> out_proj.weight
        {stack}.block.0.layer.0.SelfAttention.relative_attention_bias -> {stack}_bias.emb
        {stack}.block.{i}.layer.0.SelfAttention.{q,k,v,o} -> {stack}.{i}.self_attn.w_{q,k,v,o}
        {stack}.block.{i}.layer.0.layer_norm        -> {stack}.{i}.norms.0
        decoder.block.{i}.layer.1.EncDecAttention.* -> decoder.{i}.cross_attn.*;  layer.1.layer_norm -> norms.1
        {stack}.block.{i}.layer.{f}.DenseReluDense.wi | wi_0 / wi_1 / wo -> ffn.w_1 / w_3 / w_2
        {stack}.block.{i}.layer.{f}.layer_norm      -> {stack}.{i}.norms.{f}   (f = 1 encoder, 2 decoder)
        {stack}.final_layer_norm                    -> {stack}_norm
"""

from __future__ import annotations

import re
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .checkpoint import CheckpointError
from ..net.config import ModelConfig

# (our name, checkpoint names -- the first present is used, optional transform)
Row = Tuple[str, Sequence[str], Optional[Callable[[torch.Tensor], torch.Tensor]]]


def _same(hf: dict, *keys):
    vals = {k: hf.get(k) for k in keys}
    if len({v for v in vals.values() if v is not None}) > 1:
        raise CheckpointError(f"encoder and decoder differ in {vals}; only equal sizes are supported")
    return next((v for v in vals.values() if v is not None), None)


# ------------------------------------------------------------------------------ bart / marian
_BART_ACT = {"gelu": "gelu", "relu": "relu", "swish": "silu", "silu": "silu", "gelu_new": "gelu_tanh"}


def bart_config(hf: dict, family: str) -> ModelConfig:
    act = hf.get("activation_function", "gelu")
    if act not in _BART_ACT:
        raise CheckpointError(f"unsupported activation_function {act!r} (supported: {', '.join(_BART_ACT)})")
    if hf.get("normalize_before") or hf.get("add_final_layer_norm"):
        raise CheckpointError("pre-norm BART variants (normalize_before) are not supported")
    if family == "marian" and hf.get("share_encoder_decoder_embeddings") is False:
        raise CheckpointError("Marian checkpoints with separate source and target vocabularies are not supported")
    d = hf["d_model"]
    vocab = hf["vocab_size"]
    return ModelConfig(
        kind="encoder-decoder",
        d_model=d,
        n_heads=_same(hf, "encoder_attention_heads", "decoder_attention_heads"),
        d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim"),
        n_layers=hf["encoder_layers"],
        n_decoder_layers=hf["decoder_layers"],
        src_vocab_size=vocab,
        tgt_vocab_size=hf.get("decoder_vocab_size") or vocab,
        max_len=hf.get("max_position_embeddings", 1024),
        positional="sinusoidal" if family == "marian" else "learned",
        sinusoid_layout="half",
        norm="layernorm",
        norm_eps=1e-5,
        norm_placement="post",
        final_norm=False,
        activation=_BART_ACT[act],
        bias=True,
        out_bias=True,
        embed_scale=bool(hf.get("scale_embedding", False)),
        embed_norm=family == "bart",
        pad_id=hf.get("pad_token_id", 1),
        extra={"family": family},
    )


def bart_table(cfg: ModelConfig, family: str) -> List[Row]:
    rows: List[Row] = [
        ("src_embed.tok.weight", ["encoder.embed_tokens.weight", "shared.weight"], None),
        ("tgt_embed.tok.weight", ["decoder.embed_tokens.weight", "shared.weight"], None),
        ("out_proj.weight", ["lm_head.weight", "decoder.embed_tokens.weight", "shared.weight"], None),
        ("out_proj.bias", ["final_logits_bias"], lambda t: t.reshape(-1)),
    ]
    if family == "bart":
        for ours, theirs in (("src_embed", "encoder"), ("tgt_embed", "decoder")):
            rows.append((f"{ours}.pos.weight", [f"{theirs}.embed_positions.weight"], lambda t: t[2:]))
            rows += [(f"{ours}.norm.{p}", [f"{theirs}.layernorm_embedding.{p}"], None) for p in ("weight", "bias")]
    proj = [("q_proj", "w_q"), ("k_proj", "w_k"), ("v_proj", "w_v"), ("out_proj", "w_o")]
    for stack, n in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            a, b = f"{stack}.layers.{i}", f"{stack}.{i}"
            pairs = [(f"{a}.self_attn.{t}", f"{b}.self_attn.{o}") for t, o in proj]
            pairs += [(f"{a}.self_attn_layer_norm", f"{b}.norms.0"),
                      (f"{a}.fc1", f"{b}.ffn.w_1"), (f"{a}.fc2", f"{b}.ffn.w_2")]
            if stack == "decoder":
                pairs += [(f"{a}.encoder_attn.{t}", f"{b}.cross_attn.{o}") for t, o in proj]
                pairs += [(f"{a}.encoder_attn_layer_norm", f"{b}.norms.1"), (f"{a}.final_layer_norm", f"{b}.norms.2")]
            else:
                pairs += [(f"{a}.final_layer_norm", f"{b}.norms.1")]
            rows += [(f"{o}.{p}", [f"{t}.{p}"], None) for t, o in pairs for p in ("weight", "bias")]
    return rows


# Marian's sinusoids are computed, never read (older files may still carry them); "shared"
# is the tied table, also saved under the encoder's and decoder's names in some files.
BART_IGNORE = re.compile(r"^((encoder|decoder)\.(version|embed_positions\.weight)|shared\.weight)$")
BART_IGNORE_LEARNED = re.compile(r"^((encoder|decoder)\.version|shared\.weight)$")


# ------------------------------------------------------------------------------ t5
def t5_config(hf: dict) -> ModelConfig:
    proj = hf.get("feed_forward_proj", "relu")
    acts = {"relu": "relu", "gated-gelu": "geglu_tanh", "gelu": "gelu", "gated-silu": None}
    if acts.get(proj) is None:
        raise CheckpointError(f"unsupported feed_forward_proj {proj!r} (supported: relu, gelu, gated-gelu)")
    d = hf["d_model"]
    scale_out = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True) is not False)
    return ModelConfig(
        kind="encoder-decoder",
        d_model=d,
        n_heads=hf["num_heads"],
        d_head=hf["d_kv"],
        d_ff=hf["d_ff"],
        n_layers=hf["num_layers"],
        n_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        src_vocab_size=hf["vocab_size"],
        tgt_vocab_size=hf["vocab_size"],
        max_len=hf.get("n_positions", 512),
        positional="relative",
        rel_buckets=hf.get("relative_attention_num_buckets", 32),
        rel_max_distance=hf.get("relative_attention_max_distance", 128),
        attn_scale=1.0,
        norm="rmsnorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        norm_placement="pre",
        final_norm=True,
        activation=acts[proj],
        bias=False,
        out_bias=False,
        logit_scale=d**-0.5 if scale_out else 1.0,
        pad_id=hf.get("pad_token_id", 0),
        extra={"family": "t5"},
    )


def t5_table(cfg: ModelConfig) -> List[Row]:
    rows: List[Row] = [
        ("src_embed.tok.weight", ["shared.weight", "encoder.embed_tokens.weight"], None),
        ("tgt_embed.tok.weight", ["shared.weight", "decoder.embed_tokens.weight"], None),
        ("out_proj.weight", ["lm_head.weight", "shared.weight"], None),
        ("encoder_norm.weight", ["encoder.final_layer_norm.weight"], None),
        ("decoder_norm.weight", ["decoder.final_layer_norm.weight"], None),
        ("encoder_bias.emb.weight", ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], None),
        ("decoder_bias.emb.weight", ["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"], None),
    ]
    proj = [("q", "w_q"), ("k", "w_k"), ("v", "w_v"), ("o", "w_o")]
    ffn = [("wo", "w_2")] + ([("wi_0", "w_1"), ("wi_1", "w_3")] if cfg.activation == "geglu_tanh" else [("wi", "w_1")])
    for stack, n in (("encoder", cfg.n_layers), ("decoder", cfg.n_decoder_layers)):
        f = 2 if stack == "decoder" else 1
        for i in range(n):
            a, b = f"{stack}.block.{i}.layer", f"{stack}.{i}"
            pairs = [(f"{a}.0.SelfAttention.{t}", f"{b}.self_attn.{o}") for t, o in proj]
            pairs += [(f"{a}.0.layer_norm", f"{b}.norms.0"), (f"{a}.{f}.layer_norm", f"{b}.norms.{f}")]
            pairs += [(f"{a}.{f}.DenseReluDense.{t}", f"{b}.ffn.{o}") for t, o in ffn]
            if stack == "decoder":
                pairs += [(f"{a}.1.EncDecAttention.{t}", f"{b}.cross_attn.{o}") for t, o in proj]
                pairs += [(f"{a}.1.layer_norm", f"{b}.norms.1")]
            rows += [(f"{o}.weight", [f"{t}.weight"], None) for t, o in pairs]
    return rows


# (T5 ties both stacks' token tables to "shared"; some files also save them under their own names.)
T5_IGNORE = re.compile(
    r"^(decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"
    r"|(encoder|decoder)\.embed_tokens\.weight)$"
)
