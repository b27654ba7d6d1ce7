"""The recall models' loader: one two-layer decoder per token mixer, trained on multi-query
associative recall (core/toy/recall_task.py) by core/cli/train_recall.py and shipped in
assets/recall/<mixer>/ (config.json, model.safetensors, metrics.json; safetensors, never pickle).

The shipped ones are registry models named "recall-<mixer>" (core/loaders/catalog.py), loaded
by load_softmax / load_gated_delta / load_mamba2."""

from __future__ import annotations

import json
import random
from pathlib import Path

from .. import trace_names as tn
from ..api import AttentionModel
from ..device import pick_device
from ..loaders.catalog import ModelUnavailable
from ..net.config import ModelConfig
from ..net.model import Transformer
from ..tokens.tokenizer import WordTokenizer
from . import recall_task


def available(folder: Path = recall_task.RECALL_DIR) -> list:
    """The mixers whose recall model is shipped, in the task's order."""
    order = ("softmax", "gated_delta", "mamba2")
    have = {p.parent.name for p in Path(folder).glob("*/model.safetensors")}
    return [m for m in order if m in have] + sorted(have - set(order))


def load_recall(mixer: str, device=None, folder: Path = recall_task.RECALL_DIR) -> AttentionModel:
    from safetensors.torch import load_file

    here = Path(folder) / mixer
    if not (here / "model.safetensors").exists():
        raise ModelUnavailable(f"no recall model for the mixer {mixer!r} in {folder} (have: {available(folder)}); "
                               "train it with: python -m core.cli.train_recall")
    cfg = ModelConfig.from_dict(json.loads((here / "config.json").read_text()))
    net = Transformer(cfg)
    net.load_state_dict(load_file(str(here / "model.safetensors")), strict=True)
    tok = WordTokenizer(recall_task.vocab(), max_len=cfg.max_len)
    meta = json.loads((here / "metrics.json").read_text())
    example = recall_task.make_example(6, random.Random(5)).text()
    return AttentionModel(f"recall-{mixer}", net, tok, device=pick_device(device),
                          description=f"a two-layer decoder with {mixer} token mixing, trained on associative recall",
                          max_new_tokens=1, examples=(example,),
                          info={"mixer": mixer, "accuracy": meta["accuracy"], "steps": meta["steps"]})


def load_softmax(device=None) -> AttentionModel:
    return load_recall("softmax", device=device)


def load_gated_delta(device=None) -> AttentionModel:
    return load_recall("gated_delta", device=device)


def load_mamba2(device=None) -> AttentionModel:
    return load_recall("mamba2", device=device)


def layer_map(trace, layer: int, stack: str = "decoder"):
    """(maps (H, n, n), signed) of one layer of a recall model's trace: a softmax layer's weights
    ({stack}.{layer}.self_attn.weights, signed False) or a token mixer's exact implicit attention
    ({stack}.{layer}.mixer.weights, signed True: its entries may be negative)."""
    n_layers = trace.layers(stack)
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} is out of range: the model has {n_layers} {stack} layers")
    if layer in trace.mixer_layers(stack):
        return trace[tn.mixer(stack, layer, "weights")], True
    return trace[tn.self_attn(stack, layer, "weights")], False


def predictions(trace, example: recall_task.Example) -> list:
    """The model's top next token at each query key of `example` (in its query order), from the
    trace's stored top-k (topk.ids, rank 0; the ids index recall_task.vocab(), the models' words)."""
    if trace.tokens("target") != example.tokens:
        raise ValueError("the trace is not of this example's tokens")
    ids = trace[tn.TOPK_IDS][:, 0]
    vocab = recall_task.vocab()
    return [vocab[int(ids[p])] for p in example.query_positions]
