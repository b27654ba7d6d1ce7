"""Tiny random checkpoints of the families whose token mixers are not softmax attention and
that this project reads (Mamba2, LFM2, GraniteMoeHybrid, Falcon-H1, Kimi Linear), built by transformers at test time and saved with a
byte-level BPE tokenizer: build(family, folder) -> (transformers model, folder).
Shared by tests/parity/test_mamba_families.py and the conformance matrix."""

from __future__ import annotations

from pathlib import Path

import torch

from hf_builders import byte_bpe_tokenizer, randomize

MIXER_FAMILIES = ["mamba2", "lfm2", "granitemoehybrid", "granitemoehybrid_moe", "falcon_h1", "kimi_linear"]

# Kimi Linear: Kimi Delta Attention (4 heads of 8, a convolution of 4) in layers 0-2, latent attention
# without positions in layer 3 (4 heads, latent 6, d_nope 6 + d_rope 4, d_v 5, q as one projection);
# a dense first layer, then experts in 2 groups of 2 (1 group kept, 2 chosen, a correction bias,
# scaled weights, a shared expert); norms with eps 1e-4 (as the Qwen3-Next hybrids: a head's gated
# norm of an output near zero would blow up float32's rounding)
KIMI = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
            intermediate_size=48, moe_intermediate_size=12, num_local_experts=4, num_experts_per_tok=2,
            n_group=2, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
            kv_lora_rank=6, q_lora_rank=None, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            linear_head_dim=8, linear_num_heads=4, linear_conv_kernel_dim=4, rms_norm_eps=1e-4)


def _kimi_params(model):
    """Decays per channel from a few steps to the whole text (exp(A_log) 0.3 to 3 per head,
    softplus(dt_bias) 0.01 to 0.7 over each head's channels), write strengths spread over (0, 1),
    routers with preferences, a correction bias that changes the choice, latent maps far from uniform."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.linspace(-1.2, 1.1, p.numel())[torch.randperm(p.numel(), generator=g)].view(p.shape))
            elif name.endswith("dt_bias"):
                p.copy_(torch.linspace(-4.5, -0.5, p.numel())[torch.randperm(p.numel(), generator=g)])
            elif name.endswith("b_proj.weight"):
                p.mul_(2.0)
            elif name.endswith("f_b_proj.weight"):
                p.mul_(0.5)
            elif name.endswith("mlp.gate.weight"):
                p.mul_(5.0)
            elif name.endswith(("kv_b_proj.weight", "kv_a_proj_with_mqa.weight")):
                p.mul_(3.0)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)


def _mamba_params(model, heads: int):
    """Every Mamba2 mixer's rates and steps spread over heads, so that some heads forget fast."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.linspace(-1.0, 1.0, heads))
            elif name.endswith("dt_bias"):
                p.copy_(torch.linspace(-2.0, 0.5, heads))


def build(family: str, folder: Path):
    """(transformers model in eval mode, folder holding its checkpoint and tokenizer)."""
    import transformers as tf

    folder.mkdir(parents=True, exist_ok=True)
    v = byte_bpe_tokenizer(folder / "tokenizer.json")
    torch.manual_seed(0)
    if family == "mamba2":
        cfg = tf.Mamba2Config(vocab_size=v, hidden_size=16, num_heads=4, head_dim=8, expand=2, state_size=6,
                              n_groups=2, conv_kernel=4, chunk_size=8, num_hidden_layers=3,
                              tie_word_embeddings=False, pad_token_id=0, bos_token_id=None, eos_token_id=None)
        model = tf.Mamba2ForCausalLM(cfg)
        randomize(model)
        _mamba_params(model, 4)
    elif family == "lfm2":
        cfg = tf.Lfm2Config(vocab_size=v, hidden_size=24, intermediate_size=80, block_multiple_of=16,
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3,
                            layer_types=["conv", "full_attention", "conv", "conv"], max_position_embeddings=128,
                            tie_word_embeddings=True, pad_token_id=0, bos_token_id=None, eos_token_id=None)
        model = tf.Lfm2ForCausalLM(cfg)
        randomize(model)
        model.tie_weights()
    elif family in ("granitemoehybrid", "granitemoehybrid_moe"):  # RoPE, every multiplier away from 1
        moe = family.endswith("_moe")  # 4 experts (top 2) of 16 beside the shared MLP; else dense
        cfg = tf.GraniteMoeHybridConfig(
            vocab_size=v, hidden_size=24, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            num_local_experts=4 if moe else 0, num_experts_per_tok=2, intermediate_size=16,
            shared_intermediate_size=40, position_embedding_type="rope",
            layer_types=["linear_attention", "full_attention", "linear_attention"], mamba_n_heads=4,
            mamba_d_head=12, mamba_d_state=6, mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=8,
            embedding_multiplier=2.5, attention_multiplier=0.3, residual_multiplier=0.6, logits_scaling=3.0,
            max_position_embeddings=128, tie_word_embeddings=True, pad_token_id=0, bos_token_id=None,
            eos_token_id=None)
        model = tf.GraniteMoeHybridForCausalLM(cfg)
        randomize(model)
        _mamba_params(model, 4)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("router.weight"):  # routers that prefer different experts per token
                    p.mul_(5.0)
        model.tie_weights()
    elif family == "falcon_h1":  # attention and Mamba2 side by side, every multiplier away from 1
        cfg = tf.FalconH1Config(
            vocab_size=v, hidden_size=24, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=6, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=6,
            mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=8, embedding_multiplier=1.7, lm_head_multiplier=0.4,
            mlp_multipliers=[1.3, 0.7], key_multiplier=0.8, attention_in_multiplier=1.2,
            attention_out_multiplier=0.9, ssm_in_multiplier=1.1, ssm_out_multiplier=0.6,
            ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 2.0], mamba_rms_norm=True, mamba_norm_before_gate=True,
            max_position_embeddings=128, tie_word_embeddings=False,
            pad_token_id=0, bos_token_id=None, eos_token_id=None)
        model = tf.FalconH1ForCausalLM(cfg)
        randomize(model)
        _mamba_params(model, 4)
    elif family == "kimi_linear":
        cfg = tf.KimiLinearConfig(vocab_size=v, max_position_embeddings=128, tie_word_embeddings=False,
                                  pad_token_id=None, bos_token_id=None, eos_token_id=0, **KIMI)
        model = tf.KimiLinearForCausalLM(cfg)
        randomize(model)
        _kimi_params(model)
    else:
        raise ValueError(family)
    model.eval().save_pretrained(str(folder))
    return model, folder
