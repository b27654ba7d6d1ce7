"""The trained toy model's loader: toy-translate from assets/toy-translate/ (its config, its
vocabularies and its final or a saved step's weights; safetensors, never pickle). The registry
names it `core.toy.toy_model:load_toy` (core/loaders/catalog.py); `load_model("toy-translate")`
calls it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..api import AttentionModel
from ..device import pick_device
from ..loaders.catalog import MODELS, TOY_DIR, ModelUnavailable
from ..net.config import ModelConfig
from ..net.model import Transformer
from ..tokens.tokenizer import WordTokenizer


def toy_files(folder: Path = TOY_DIR):
    return folder / "config.json", folder / "vocab.json", folder / "model.safetensors"


def load_toy(device=None, folder: Path = TOY_DIR, step: Optional[int] = None) -> AttentionModel:
    """The trained toy model; `step`: the weights after that many training updates (one of
    core.toy.toy_steps.available_steps(); None: the final ones). An unknown step is a ValueError."""
    from safetensors.torch import load_file

    from . import toy_steps, toy_task

    cfg_path, vocab_path, weights_path = toy_files(folder)
    if step is not None:
        weights_path = toy_steps.weights_file(folder, step)
    if not weights_path.exists():
        raise ModelUnavailable(
            f"the toy-translate checkpoint is missing ({weights_path}); rebuild it with: python -m core.cli.train_toy"
        )
    cfg = ModelConfig.from_dict(json.loads(cfg_path.read_text()))
    vocab = json.loads(vocab_path.read_text())
    net = Transformer(cfg)
    net.load_state_dict(load_file(str(weights_path)), strict=True)  # float16 steps are copied into float32
    src_tok = WordTokenizer(vocab["source"], max_len=cfg.max_len)
    tgt_tok = WordTokenizer(vocab["target"], max_len=cfg.max_len)
    return AttentionModel(
        "toy-translate",
        net,
        src_tok,
        target_tokenizer=tgt_tok,
        device=pick_device(device),
        description=MODELS["toy-translate"].description,
        start_id=tgt_tok.index["<start>"],
        end_id=tgt_tok.index["<end>"],
        max_new_tokens=cfg.max_len - 1,
        examples=toy_task.EXAMPLES,
        info={"checkpoint": str(weights_path), **cfg.extra,
              "step": toy_steps.final_step(folder) if step is None else int(step),
              "steps": toy_steps.available_steps(folder)},
    )
