"""Tiny random Hugging Face checkpoints built at test time (nothing is downloaded).

Each builder trains a small tokenizer with `tokenizers` on CORPUS, builds a transformers
model of the family with random weights (every parameter redrawn, so LayerNorm gains and
biases are not the trivial 1 / 0 and a wrongly mapped tensor shows), and saves both into a
folder with save_pretrained (safetensors) and tokenizer.json.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

CORPUS = [
    "the small dog sees the cat near the old river bank",
    "a cat sat on the mat because it was tired",
    "the trophy does not fit in the suitcase because it is too big",
    "alice gave bob the book because he asked for it",
    "attention is all you need, said the old man to the young woman",
    "one two three four five six seven eight nine ten",
] * 4
SENTENCES = ["the small dog sees the old cat near the river", "alice gave the tired cat a book because it asked"]


def wordpiece_tokenizer(path: Path, vocab_size: int = 150) -> int:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tk.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tk.save(str(path))
    return tk.get_vocab_size()


def byte_bpe_tokenizer(path: Path, specials=("<|endoftext|>",), roberta: bool = False, vocab_size: int = 300) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(CORPUS, trainer)
    if roberta:
        tk.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tk.save(str(path))
    return tk.get_vocab_size()


def randomize(model, std: float = 0.2, seed: int = 0):
    """Redraw every parameter: norm gains around 1, query/key projections larger (so the
    attention maps are far from uniform), the rest N(0, std^2)."""
    g = torch.Generator().manual_seed(seed)
    qk = ("query", "key", "q_proj", "k_proj", "q_lin", "k_lin", "c_attn", "qkv_proj")
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            low = name.lower()
            if p.ndim == 1 and ("norm" in low or ".ln_" in low or "layer_norm" in low) and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * r)
            elif any(k in name for k in qk) and name.endswith("weight"):
                p.copy_(r * 3.0 / math.sqrt(p.shape[-1] if "c_attn" not in name else p.shape[0]))
            else:
                p.copy_(r * std)
    return model.eval()


def save(model, folder: Path, dtype=None, **kw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(str(folder), safe_serialization=True, **kw)
    return folder


# the later decoder families (core/loaders/families): (config class, model class, sizes), odd
# sizes and their peculiarity switched on: QK-norm with d_k != d / H (qwen3), GQA, partial rotary
LATER = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(hidden_size=40, num_attention_heads=6, num_key_value_heads=2, head_dim=10, intermediate_size=72)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM",
              dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, intermediate_size=72)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(hidden_size=40, num_attention_heads=4, intermediate_size=72, rotary_pct=0.4)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, intermediate_size=72,
                  partial_rotary_factor=0.6)),
}


# the 2025-26 attentions (issue 59): four layers, windows and chunks of 6 tokens, so that each
# peculiarity bites on the test sentences (20-40 tokens)
SHARED = dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, intermediate_size=72, num_hidden_layers=4)
NEW = {
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(SHARED, head_dim=10, intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                     sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2,
                     max_position_embeddings=512,
                     rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "truncate": False, "original_max_position_embeddings": 64,
                                      "rope_theta": 10000.0})),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(SHARED, no_rope_layers=[1, 0, 1, 0])),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM",
              dict(SHARED, sliding_window=6,
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "default", "rope_theta": 500000.0}})),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", dict(SHARED, sliding_window=6)),
    "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM",
                    dict(SHARED, head_dim=10, intermediate_size=24, intermediate_size_mlp=56, num_local_experts=4,
                         num_experts_per_tok=2, interleave_moe_layer_step=2, attention_chunk_size=6,
                         no_rope_layers=[1, 1, 0, 1], use_qk_norm=True, attn_temperature_tuning=True,
                         floor_scale=4, attn_scale=0.5)),
}
# DeepSeek V3 / V3.2: multi-head latent attention with a small latent (kv_lora_rank 6) and a
# compressed query, YaRN with both mscales, a dense first layer then experts in 4 groups of 2
# (2 groups kept, 2 experts chosen, a correction bias, scaled weights, a shared expert); V3.2's
# indexer keeps 6 keys per query, so most rows of ~30 tokens are sparse; 16 indexer heads, so that
# an index score is rarely exactly 0 (every head's relu 0): ties would make the choice depend on the row's length
MLA = dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=3, intermediate_size=48,
           q_lora_rank=12, kv_lora_rank=6, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5,
           moe_intermediate_size=8, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
           n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
           rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8,
                            "rope_theta": 10000.0})
NEW.update({"deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(MLA)),
            "deepseek_v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM",
                             dict(MLA, index_topk=6, index_head_dim=8, index_n_heads=16))})


# the hybrids of Gated DeltaNet and gated attention (issue 52): four layers, linear, linear, full,
# linear; two key heads for six value heads (d_k 8, d_v 6; the softmax layer has 4 heads), a
# convolution of 4; decays from
# a few steps to the whole text, strong writes; partial rotary over 4 of 8 features; norms with
# eps 1e-4, so that the gated norm of a head whose output is near zero at some position (rms ~1e-4
# here) does not blow float32's rounding up 10^4-fold (both sides round differently); Qwen3-Next
# with a mixture of 4 experts (top 2) and a shared expert on layers 0, 1 and 3 (layer 2 dense)
MIXED = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
             num_hidden_layers=4, layer_types=["linear_attention", "linear_attention", "full_attention",
                                               "linear_attention"],
             linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=8, linear_value_head_dim=6,
             linear_conv_kernel_dim=4, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                        "partial_rotary_factor": 0.5},
             rms_norm_eps=1e-4)
HYBRID = {
    "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(MIXED)),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(MIXED, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        shared_expert_intermediate_size=20, mlp_only_layers=[2])),
}


# OLMo Hybrid (issue 52): three Gated DeltaNet layers and one OLMo-3 attention layer, two key heads
# for six value heads (d_k 8, d_v 6), beta up to 2 (linear_allow_neg_eigval), decays from a few steps
# to the whole text; NoPE as the released checkpoints (rope_theta null) unless rope_theta is given
OLMO_HYBRID = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                   num_hidden_layers=4, layer_types=["linear_attention", "linear_attention", "full_attention",
                                                     "linear_attention"],
                   linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=8, linear_value_head_dim=6,
                   linear_conv_kernel_dim=4, linear_allow_neg_eigval=True, rms_norm_eps=1e-4,
                   rope_parameters={"rope_type": "default", "rope_theta": None})


def build_olmo_hybrid(folder: Path, v: int, **over):
    """A random OlmoHybridForCausalLM (see OLMO_HYBRID); rope_theta=T turns RoPE on."""
    import transformers as tf

    theta = over.pop("rope_theta", None)
    args = dict(dict(vocab_size=v, max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=None,
                     bos_token_id=None, eos_token_id=0), **OLMO_HYBRID)
    if theta is not None:
        args["rope_parameters"] = {"rope_type": "default", "rope_theta": float(theta)}
    args.update(over)
    model = tf.OlmoHybridForCausalLM(tf.OlmoHybridConfig(**args))
    randomize(model)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):  # exp(A_log) from 0.05 to 3: some heads forget within a few tokens
                p.copy_(torch.linspace(-3.0, 1.0, p.numel())[torch.randperm(p.numel(), generator=g)])
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("b_proj.weight"):  # write strengths spread over (0, 2)
                p.mul_(2.0)
            elif name.endswith("linear_attn.v_proj.weight"):
                # values halved: the gated norm's eps is fixed at 1e-5, so a head near zero is amplified
                # up to 300-fold, float32 rounding with it; here both float32 passes stay within ~3e-5
                # of float64 (measured), where full-size values put each near 1e-4
                p.mul_(0.5)
    return model.eval(), folder


def build(family: str, folder: Path, **over):
    """(transformers model in eval mode, folder) for a family; `over` overrides config fields."""
    import transformers as tf

    folder.mkdir(parents=True, exist_ok=True)
    tok = folder / "tokenizer.json"
    if family in ("bert", "distilbert"):
        v = wordpiece_tokenizer(tok)
    elif family == "roberta":
        v = byte_bpe_tokenizer(tok, specials=("<s>", "<pad>", "</s>", "<unk>", "<mask>"), roberta=True)
    else:
        v = byte_bpe_tokenizer(tok)
    torch.manual_seed(0)
    if family == "bert":
        cfg = tf.BertConfig(vocab_size=v, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=64, **over)
        model = tf.BertForMaskedLM(cfg)
    elif family == "roberta":
        cfg = tf.RobertaConfig(vocab_size=v, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=66, pad_token_id=1, bos_token_id=0,
                               eos_token_id=2, type_vocab_size=1, **over)
        model = tf.RobertaForMaskedLM(cfg)
    elif family == "distilbert":
        cfg = tf.DistilBertConfig(vocab_size=v, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                  max_position_embeddings=64, **over)
        model = tf.DistilBertForMaskedLM(cfg)
    elif family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=v, n_embd=32, n_layer=2, n_head=4, n_positions=64, **over)
        model = tf.GPT2LMHeadModel(cfg)
    elif family in NEW:
        conf, cls, args = NEW[family]
        args = dict(dict(vocab_size=v, max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=None,
                         bos_token_id=None, eos_token_id=0), **args)
        args.update(over)
        model = getattr(tf, cls)(getattr(tf, conf)(**args))
        randomize(model)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".sinks"):  # sink logits of the scores' size, so that they take a real share
                    p.copy_(torch.randn(p.shape, generator=g) * 1.5 + 1.0)
                elif name.endswith("router.weight"):  # routers that prefer different experts per token
                    p.mul_(5.0)
                elif family == "gpt_oss" and ("q_proj" in name or "k_proj" in name):
                    p.mul_(0.6)  # YaRN's attention factor already scales the scores by 1.46
                elif name.endswith(("q_b_proj.weight", "kv_b_proj.weight", "kv_a_proj_with_mqa.weight")):
                    p.mul_(3.0)  # latent attention's projections: maps far from uniform
                elif name.endswith("mlp.gate.weight"):  # deepseek's router: preferences per token
                    p.mul_(5.0)
            for name, b in model.named_buffers():
                if name.endswith("e_score_correction_bias"):  # a correction that changes the choice
                    b.copy_(torch.randn(b.shape, generator=g) * 0.3)
        return model.eval(), folder
    elif family == "olmo_hybrid":
        return build_olmo_hybrid(folder, v, **over)
    elif family in HYBRID or family == "qwen3_5":
        conf, cls, args = HYBRID.get(family, HYBRID["qwen3_5_text"])
        args = dict(dict(vocab_size=v, max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=None,
                         bos_token_id=None, eos_token_id=0), **args)
        args.update(over)
        if family == "qwen3_5":  # the multimodal checkpoint: this text model beside a one-block vision tower
            vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4,
                          num_position_embeddings=16)
            model = tf.Qwen3_5ForConditionalGeneration(tf.Qwen3_5Config(text_config=args, vision_config=vision,
                                                                        tie_word_embeddings=False))
        else:
            model = getattr(tf, cls)(getattr(tf, conf)(**args))
        randomize(model)
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("A_log"):  # exp(A_log) from 0.05 to 3: some heads forget within a few tokens
                    p.copy_(torch.linspace(-3.0, 1.0, p.numel())[torch.randperm(p.numel(), generator=g)])
                elif name.endswith("dt_bias"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
                elif "in_proj_b" in name or "in_proj_ba" in name:  # write strengths spread over (0, 1)
                    p.mul_(2.0)
                elif name.endswith("mlp.gate.weight"):  # routers that prefer different experts per token
                    p.mul_(5.0)
                elif name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight", "norm.weight",
                                    "q_norm.weight", "k_norm.weight")) and "linear_attn" not in name:
                    p.sub_(1.0)  # these norms scale by (1 + w): gains around 1 again
        return model.eval(), folder
    elif family in LATER:
        conf, cls, args = LATER[family]
        args = dict(vocab_size=v, num_hidden_layers=2, max_position_embeddings=128, tie_word_embeddings=False,
                    pad_token_id=None, **args)
        args.update(over)
        model = getattr(tf, cls)(getattr(tf, conf)(**args))
    else:
        cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM), "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
               "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM)}[family]
        args = dict(vocab_size=v, hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                    intermediate_size=96, max_position_embeddings=128, tie_word_embeddings=False)
        args.update(over)
        model = cls[1](cls[0](**args))
    randomize(model)
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.eval(), folder


def hf_eager(model, ids):
    """transformers' eager forward with every attention map: (attentions, last hidden, logits)."""
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    return [a[0] for a in out.attentions], out.hidden_states[-1][0], out.logits[0]


@functools.lru_cache(maxsize=1)
def smollm2_llama():
    """transformers' LlamaForCausalLM (eager attention, float32, tied output) holding smollm2's
    GGUF weights as transformers' own GGUF reader reads them: the independent reference of the
    smollm2 parity tests, loaded once per test process. Callers must not change its weights."""
    import importlib.util
    import os

    import pytest

    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local file; never reach for the Hub
    from transformers import AutoConfig, LlamaForCausalLM

    from core.loaders.smollm2_files import gguf_path

    path = gguf_path()
    folder, name = str(path.parent), path.name
    if importlib.util.find_spec("accelerate") is not None:
        ref = LlamaForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32,
                                               attn_implementation="eager")
    else:
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        cfg = AutoConfig.from_pretrained(folder, gguf_file=name)
        cfg._attn_implementation = "eager"
        ref = LlamaForCausalLM(cfg)
        parsed = load_gguf_checkpoint(os.path.join(folder, name), return_tensors=True, model_to_load=ref)
        ref.load_state_dict(parsed["tensors"], strict=False)
        ref.tie_weights()
    return ref.float().eval()
