"""One module per model family: how its config.json becomes a ModelConfig and which
checkpoint tensor fills which parameter of ours. A new family is a module here plus one
line in MODULES.

A family module defines:

    MODEL_TYPES = ("gemma",)                       # config.json model_type values it reads
    BASES = (("model.", ""), "embed_tokens.weight")  # base prefixes to try; the tensor that finds them
    def config(hf: dict) -> ModelConfig            # CheckpointError for a setting not supported
    def weight_rows(cfg, base) -> [(theirs, ours, how)]
        # full tensor names (".weight" / ".bias" included); how: "" as stored, "T" transposed,
        # "+1" one added (Gemma's RMSNorm gains are stored as w for a scale of 1 + w).
        # Rows whose parameter our config lacks are skipped if the checkpoint lacks them too.
    def split_fused(cfg, base, ckpt, state) -> None   # optional: fused tensors (qkv, gate_up)
        # read with ckpt.get(name) (marks them used) and written into state[our name]
    IGNORED = re.compile(...)                      # optional: tensors that carry no parameter
    KIND = "encoder"                               # optional: the picker's kind before loading (default decoder)

core/loaders/hf_weights.build_net fills the network from these and checks that every
tensor is used and every parameter filled, as for the families read there directly.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Dict, Optional

# model_type -> module name under core.loaders.families
MODULES: Dict[str, str] = {
    "qwen3": "qwen3",
    "olmo2": "olmo2",
    "gpt_neox": "gpt_neox",
    "phi3": "phi3",
}
MODULES.update({"bert": "bert", "roberta": "bert", "distilbert": "bert", "gpt2": "gpt2",
                "llama": "llama", "mistral": "llama", "qwen2": "llama"})
MODULES.update({"gemma": "gemma", "gemma2": "gemma", "gemma3_text": "gemma"})
MODULES.update({"modernbert": "modernbert"})
MODULES.update({"gpt_oss": "gpt_oss", "smollm3": "smollm3", "olmo3": "olmo3", "exaone4": "exaone4",
                "llama4_text": "llama4", "gemma4_text": "gemma4"})
MODULES.update({"deepseek_v3": "deepseek", "deepseek_v32": "deepseek"})
MODULES.update({"qwen3_next": "qwen3_next", "qwen3_5_text": "qwen3_next", "qwen3_5": "qwen3_next",
                "olmo_hybrid": "olmo_hybrid"})
MODULES.update({"mamba2": "mamba2", "lfm2": "lfm2", "granitemoehybrid": "granitemoehybrid",
                "falcon_h1": "falcon_h1", "kimi_linear": "kimi_linear"})


def module(model_type: str) -> Optional[ModuleType]:
    """The family module that reads `model_type`, or None."""
    name = MODULES.get(model_type)
    return importlib.import_module(f"{__name__}.{name}") if name else None


def model_types() -> tuple:
    return tuple(MODULES)
