"""Encoder-decoder checkpoints from a Hugging Face folder: Marian, BART and T5.

    model = core.loaders.hf_seq2seq.load(Path("opus-mt-en-de"))      # -> AttentionModel
    trace = model.trace("The cat sat on the mat.", target="Die Katze saß auf der Matte.")

A folder holds config.json (its model_type picks the family), the weights as *.safetensors
(one file, or shards listed in model.safetensors.index.json) and the tokenizer. Tensors are
read through safetensors' memory map, one at a time, and converted to float32 (the
computation dtype on every device; on CUDA the float32 network is moved to the GPU). Pickle
(pytorch_model.bin) is never loaded: such a folder gets a message saying how to convert it.
A tensor the family needs that is missing, has the wrong shape, or a tensor left over that
nothing reads, is an error that names it -- never a silently random layer.

Families (marian, bart, t5), their configs and weight names: core/loaders/seq2seq_families.py;
their tokenizers: core/loaders/seq2seq_tokenizers.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

import torch

from ..api import AttentionModel
from .checkpoint import CheckpointError, open_checkpoint, read_config
from ..device import pick_device
from ..net.model import Transformer
from ..net.positional import sinusoidal_encoding
from .seq2seq_families import (
    BART_IGNORE, BART_IGNORE_LEARNED, T5_IGNORE, Row, bart_config, bart_table, t5_config, t5_table,
)
from .seq2seq_tokenizers import tokenizers_for

FAMILIES = ("marian", "bart", "t5")

EXAMPLES = [
    "The cat sat on the mat.",
    "The animal didn't cross the street because it was too tired.",
    "I would like a cup of coffee, please.",
]


# ------------------------------------------------------------------------------ files
class _Weights:
    """The checkpoint's tensors by name, a leading "model." dropped; core.loaders.checkpoint reads them
    on demand from the memory-mapped safetensors files (never a pickle)."""

    def __init__(self, folder: Path):
        self._ckpt = open_checkpoint(folder, auto_class="AutoModelForSeq2SeqLM")
        self.where: Dict[str, str] = {(key[len("model."):] if key.startswith("model.") else key): key
                                      for key in self._ckpt.names()}

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def names(self) -> List[str]:
        return list(self.where)

    def get(self, name: str) -> torch.Tensor:
        return self._ckpt.get(self.where[name], dtype=None)


def _fill(net: Transformer, weights: _Weights, table: List[Row], ignore: re.Pattern) -> None:
    """Put the checkpoint's tensors into `net` (built on the meta device), or say which are
    missing, of the wrong shape, or left over."""
    want = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    state: Dict[str, torch.Tensor] = {}
    used, missing, wrong = set(), [], []
    read: Dict[str, torch.Tensor] = {}  # a tensor read once, shared where the model ties it
    for ours, theirs, fn in table:
        name = next((n for n in theirs if n in weights), None)
        if name is None:
            missing.append(theirs[0])
            continue
        used.add(name)
        if name not in read:
            read[name] = weights.get(name).to(torch.float32)
        t = read[name]
        t = fn(t) if fn is not None else t
        if tuple(t.shape) != want[ours]:
            wrong.append(f"{name} {tuple(t.shape)} (expected {want[ours]})")
            continue
        state[ours] = t
    left = [n for n in weights.names() if n not in used and not ignore.match(n)]
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if wrong:
        problems.append(f"tensors of the wrong shape: {', '.join(wrong)}")
    if left:
        problems.append(f"tensors this loader does not know (another architecture?): {', '.join(left[:8])}"
                        + (f" and {len(left) - 8} more" if len(left) > 8 else ""))
    if problems:
        raise CheckpointError("the checkpoint does not fit its config.json: " + "; ".join(problems))
    unfilled = sorted(set(want) - set(state))
    if unfilled:  # a table that forgets a parameter is a bug here, not in the checkpoint
        raise RuntimeError(f"parameters not filled from the checkpoint: {unfilled}")
    net.load_state_dict(state, strict=True, assign=True)


# ------------------------------------------------------------------------------ loading
def load_net(folder: Path) -> Transformer:
    """Our Transformer with the folder's weights (float32)."""
    folder = Path(folder)
    hf = read_config(folder)
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise CheckpointError(
            f"model_type {family!r} is not an encoder-decoder family read here ({', '.join(FAMILIES)})")
    weights = _Weights(folder)  # first: a pickle-only folder hears about converting, whatever its config
    try:
        cfg = t5_config(hf) if family == "t5" else bart_config(hf, family)
    except KeyError as e:
        raise CheckpointError(f"{folder / 'config.json'} lacks {e.args[0]!r}") from None
    if family == "t5":
        table, ignore = t5_table(cfg), T5_IGNORE
    else:
        table = bart_table(cfg, family)
        ignore = BART_IGNORE if family == "marian" else BART_IGNORE_LEARNED
    with torch.device("meta"):  # no random init of weights that are overwritten anyway
        net = Transformer(cfg)
    _fill(net, weights, table, ignore)
    if cfg.positional == "sinusoidal":  # the non-persistent table was built on meta too
        for emb in (net.src_embed, net.tgt_embed):
            emb.pe = sinusoidal_encoding(cfg.max_len, cfg.d_model, layout=cfg.sinusoid_layout)
    return net


def load(folder: Path, device=None) -> AttentionModel:
    """A Marian, BART or T5 checkpoint folder as an AttentionModel (encoder-decoder)."""
    folder = Path(folder)
    hf = read_config(folder)
    net = load_net(folder)
    family = hf["model_type"]
    src_tok, tgt_tok = tokenizers_for(folder, family, hf, net.cfg)
    pad = net.cfg.pad_id
    start = hf.get("decoder_start_token_id")
    start = pad if start is None else start
    end = hf.get("eos_token_id")
    end = tgt_tok.eos_id if end is None else end
    size = sum({p.data_ptr(): p.numel() for p in net.parameters()}.values())  # tied tables once
    return AttentionModel(
        folder.name,
        net,
        src_tok,
        target_tokenizer=tgt_tok,
        device=pick_device(device),
        description=f"{family} encoder-decoder from {folder.name} ({net.cfg.n_layers}+{net.cfg.n_decoder_layers} "
        f"layers, {net.cfg.n_heads} heads, d={net.cfg.d_model})",
        start_id=start,
        end_id=end,
        max_new_tokens=min(64, net.cfg.max_len - 1),
        examples=EXAMPLES,
        info={"checkpoint": str(folder), "family": family, "parameters": size},
    )
