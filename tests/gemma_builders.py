"""Tiny random Gemma 1-4 and ModernBERT checkpoints written by transformers at test time
(as tests/hf_builders.py does for the other families): odd sizes, every parameter redrawn
(norm gains included), the settings that exercise each family's peculiarities."""

from __future__ import annotations

from pathlib import Path

import torch

from hf_builders import byte_bpe_tokenizer, randomize, wordpiece_tokenizer

GEMMA = dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=12, intermediate_size=72,
             num_hidden_layers=3, max_position_embeddings=128)
GEMMA4_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                "sliding_attention", "full_attention"]
DEFAULTS = {
    "gemma": dict(GEMMA),
    # windows shorter than the test sentences; caps low enough to bend the scores
    "gemma2": dict(GEMMA, sliding_window=4, attn_logit_softcapping=4.0, final_logit_softcapping=3.0,
                   query_pre_attn_scalar=20),
    "gemma3_text": dict(GEMMA, num_hidden_layers=4, sliding_window=3, query_pre_attn_scalar=20,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
    # Gemma 4: windows of 6 on ~30 tokens; layer 1 global with K = V, head_dim 16 and one kv head
    # (the sliding layers: 12 and two); the last two layers reuse layer 3's (sliding) and layer 1's
    # (global) keys and values, with FFNs twice as wide; proportional RoPE over half the global heads'
    # pairs; per-layer inputs
    "gemma4_text": dict(GEMMA, num_hidden_layers=6, sliding_window=6, final_logit_softcapping=5.0,
                        layer_types=GEMMA4_TYPES, attention_k_eq_v=True, num_kv_shared_layers=2,
                        per_layer_config={i: {"head_dim": 16, "num_key_value_heads": 1} for i in (1, 5)},
                        hidden_size_per_layer_input=6, use_double_wide_mlp=True,
                        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                                            "rope_theta": 100.0}}),
    "modernbert": dict(hidden_size=40, num_attention_heads=4, intermediate_size=36, num_hidden_layers=4,
                       max_position_embeddings=128, local_attention=4, global_attn_every_n_layers=2,
                       global_rope_theta=5000.0, local_rope_theta=50.0, pad_token_id=0, bos_token_id=2,
                       eos_token_id=3, cls_token_id=2, sep_token_id=3),
}


def build(family: str, folder: Path, **over):
    """(transformers model in eval mode, folder holding tokenizer.json; the caller saves it)."""
    import transformers as tf

    folder.mkdir(parents=True, exist_ok=True)
    tok = folder / "tokenizer.json"
    v = wordpiece_tokenizer(tok) if family == "modernbert" else byte_bpe_tokenizer(tok)
    args = dict(DEFAULTS[family], vocab_size=v)
    args.update(over)
    torch.manual_seed(0)
    cls = {"gemma": (tf.GemmaConfig, tf.GemmaForCausalLM), "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM),
           "gemma3_text": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
           "gemma4_text": (tf.Gemma4TextConfig, tf.Gemma4ForCausalLM),
           "modernbert": (tf.ModernBertConfig, tf.ModernBertForMaskedLM)}[family]
    model = cls[1](cls[0](**args))
    randomize(model)
    if family in ("gemma", "gemma2", "gemma3_text"):  # their norms scale by 1 + w: stored w around 0
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim == 1 and "norm" in name:
                    p.sub_(1.0)
    if family == "gemma4_text":  # Gemma 4 scales by w itself; its layer scalars are buffers: redrawn too
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g))
                # its scale is 1 on QK-normed q and k: gains around 0.5 keep scores within a few units, so
                # the random model is not so sharp that float32 rounding grows past 1e-4 through the layers
                for norm in (layer.self_attn.q_norm, getattr(layer.self_attn, "k_norm", None)):
                    if norm is not None:
                        norm.weight.mul_(0.5)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.eval(), folder
