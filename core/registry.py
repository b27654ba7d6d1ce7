"""Models by name. Each entry knows its kind, a one-line description, where its weights come
from, and how to load it. Weight packages are found without importing them."""

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


def load_random(device=None, config: Optional[ModelConfig] = None, seed: int = 0, **overrides) -> AttentionModel:
    """A randomly initialised model of any configuration; words are toy-translate's source
    vocabulary (both sides for encoder-decoders)."""
    from .toy import toy_task

    vocab = toy_task.source_vocab()
    cfg = config or ModelConfig(kind="encoder", n_layers=2, d_model=64, n_heads=4, d_ff=128, max_len=256)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg = ModelConfig.from_dict({**cfg.to_dict(), "src_vocab_size": len(vocab), "tgt_vocab_size": len(vocab)})
    torch.manual_seed(seed)
    net = Transformer(cfg)
    tok = WordTokenizer(vocab, max_len=cfg.max_len)
    return AttentionModel(
        "random",
        net,
        tok,
        device=pick_device(device),
        description=MODELS["random"].description,
        start_id=tok.index["<start>"],
        end_id=tok.index["<end>"],
        max_new_tokens=16,
        examples=toy_task.EXAMPLES,
        info={"seed": seed},
    )
