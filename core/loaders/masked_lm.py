"""Masked-LM heads of encoder checkpoints, and HFModel, the AttentionModel that uses one.

An encoder checkpoint that holds a head (BertForMaskedLM's cls.predictions.*, RoBERTa's
lm_head.*, DistilBERT's vocab_*) gets `model.mlm_head`. Then `model.fill_mask(text, k)`
returns, for each [MASK] / <mask> token, its top-k fill-ins, and every trace of the model
carries the same list as trace.meta["fill_mask"]:
    [{"position": i, "top": [(token, probability), ...]}, ...]
`model.mlm_logits(hidden)` gives the head's logits for final hidden states (n x d).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..api import AttentionModel
from ..device import pick_device
from .. import trace_names as tn
from .checkpoint import Checkpoint, CheckpointError, check_shape
from ..net.config import ModelConfig

# (prefix, dense, norm, decoder weight, decoder bias candidates) of each family's head
MLM_HEADS = {
    "bert": ("cls.predictions.", "transform.dense", "transform.LayerNorm", "decoder.weight", ("bias", "decoder.bias")),
    "roberta": ("lm_head.", "dense", "layer_norm", "decoder.weight", ("bias", "decoder.bias")),
    "distilbert": ("", "vocab_transform", "vocab_layer_norm", "vocab_projector.weight", ("vocab_projector.bias",)),
    "modernbert": ("", "head.dense", "head.norm", "decoder.weight", ("decoder.bias",)),
}
HEAD_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


class MLMHead(nn.Module):
    """logits = LayerNorm(act(h W_t^T + b_t)) E^T + b: BERT's / RoBERTa's / DistilBERT's
    masked-LM head on the final hidden states h (n x d); E is usually the token embedding."""

    def __init__(self, d: int, vocab: int, act: str, eps: float, dense_bias: bool = True, norm_bias: bool = True):
        super().__init__()
        self.dense = nn.Linear(d, d, bias=dense_bias)  # ModernBERT: no biases by default
        self.norm = nn.LayerNorm(d, eps=eps, bias=norm_bias)
        self.decoder = nn.Linear(d, vocab)
        self.act = act

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.dense(h)
        x = F.gelu(x, approximate="tanh") if self.act == "gelu_tanh" else F.gelu(x) if self.act == "gelu" else F.relu(x)
        return self.decoder(self.norm(x))


def read_mlm_head(family: str, hf: dict, cfg: ModelConfig, ckpt: Checkpoint,
                  embed: torch.Tensor) -> Optional[MLMHead]:
    """The family's masked-LM head, read from the checkpoint; None when it holds none."""
    spec = MLM_HEADS.get(family)
    if spec is None:
        return None
    prefix, dense, norm, dec_w, dec_b = spec
    if prefix + dense + ".weight" not in ckpt:
        return None
    act = "gelu" if family == "roberta" else cfg.activation  # RoBERTa's head always uses exact GELU
    if family == "modernbert":  # its own activation (classifier_activation)
        act = HEAD_ACTS.get(hf.get("classifier_activation", "gelu"))
        if act is None:
            raise CheckpointError(f"classifier_activation {hf['classifier_activation']!r} is not supported")
    has = {part: prefix + part + ".bias" in ckpt for part in (dense, norm)}
    head = MLMHead(cfg.d_model, cfg.src_vocab_size, act, cfg.norm_eps, has[dense], has[norm])
    with torch.no_grad():
        head.dense.weight.copy_(ckpt.get(prefix + dense + ".weight"))
        if has[dense]:
            head.dense.bias.copy_(ckpt.get(prefix + dense + ".bias"))
        head.norm.weight.copy_(ckpt.get(prefix + norm + ".weight"))
        if has[norm]:
            head.norm.bias.copy_(ckpt.get(prefix + norm + ".bias"))
        if prefix + dec_w in ckpt:  # an untied (or explicitly stored) output matrix
            w = ckpt.get(prefix + dec_w)
            check_shape(prefix + dec_w, w, [cfg.src_vocab_size, cfg.d_model])
            head.decoder.weight = nn.Parameter(w)
        else:  # tied to the token embedding
            head.decoder.weight = embed
        bias = next((prefix + b for b in dec_b if prefix + b in ckpt), None)
        if bias is None and hf.get("decoder_bias", True) is False:  # ModernBERT without one: a zero bias
            head.decoder.bias.zero_()
            dec_b = ()
        elif bias is None:
            raise CheckpointError(f"the masked-LM head lacks its output bias ({prefix + dec_b[0]!r})")
        for b in dec_b:  # both names may be stored (tied), both count as used
            if prefix + b in ckpt:
                head.decoder.bias.copy_(ckpt.get(prefix + b))
    return head.eval()


def mlm_names(family: str, ckpt: Checkpoint) -> List[str]:
    """The checkpoint names of the family's masked-LM head (which count as used)."""
    spec = MLM_HEADS.get(family)
    if spec is None:
        return []
    prefix, dense, norm, dec_w, dec_b = spec
    return [prefix + n for n in (dense + ".weight", dense + ".bias", norm + ".weight", norm + ".bias", dec_w) + dec_b]


class HFModel(AttentionModel):
    """An AttentionModel loaded from a checkpoint folder; encoders with a masked-LM head also
    fill in [MASK] / <mask> tokens (fill_mask, trace.meta["fill_mask"])."""

    mlm_head: Optional[MLMHead] = None

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The masked-LM head's logits (n x V) for final hidden states (n x d)."""
        if self.mlm_head is None:
            raise ValueError(f"{self.name} has no masked-LM head")
        with torch.inference_mode():
            head = self.mlm_head.to(self.device)
            return head(hidden.to(self.device, torch.float32)).cpu()

    def _fills(self, hidden: torch.Tensor, ids: List[int], k: int) -> List[dict]:
        mask_id = getattr(self.tokenizer, "mask_id", None)
        pos = [i for i, t in enumerate(ids) if mask_id is not None and t == mask_id]
        if self.mlm_head is None or not pos:
            return []
        probs = torch.softmax(self.mlm_logits(hidden[pos]), dim=-1)
        top = torch.topk(probs, min(k, probs.shape[-1]))
        return [{"position": p, "top": [(self.tokenizer.token_str(i), float(v)) for i, v in zip(ti.tolist(), tv.tolist())]}
                for p, ti, tv in zip(pos, top.indices, top.values)]

    def fill_mask(self, text: str, k: int = 5) -> List[dict]:
        """Top-k fill-ins for each mask token in `text`: [{"position", "top": [(token, p)]}]."""
        enc = self.encode(text)
        with torch.inference_mode():
            hidden = self.net(self._ids(enc.ids))[0]
        return self._fills(hidden, list(enc.ids), k)

    def trace(self, text: str, *args, **kwargs):
        """AttentionModel.trace, plus meta["fill_mask"] when the text holds mask tokens."""
        tr = super().trace(text, *args, **kwargs)
        if self.mlm_head is not None and self.kind == "encoder":
            mask_str = self.tokenizer.token_str(self.tokenizer.mask_id)
            toks = tr.tokens("source")
            if mask_str in toks:
                ids = [self.tokenizer.mask_id if t == mask_str else -1 for t in toks]
                last = (tn.final_norm("encoder") if tn.final_norm("encoder") in tr
                        else tn.out("encoder", self.config.n_layers - 1))
                hidden = tr[last]
                tr.meta["fill_mask"] = self._fills(torch.as_tensor(hidden, dtype=torch.float32), ids, 5)
        return tr


def local_model(name: str, net, tok, device, what: str, path: Path, family: str, n: int, t0: float, kind: str,
                start_id=None, end_id=None, **info) -> "HFModel":
    """A model read from a local file or folder (a checkpoint here, a GGUF file in
    core/loaders/gguf_file.py) as the app shows it: `what` and its parameter count as the description,
    up to 32 new tokens, the examples of its kind, and where it came from and how long it
    took (since t0) in `info`."""
    return HFModel(
        name,
        net,
        tok,
        device=pick_device(device),
        description=f"{what} ({human_size(n)} parameters)",
        start_id=start_id,
        end_id=end_id,
        max_new_tokens=32,
        examples=EXAMPLES.get(kind, []),
        info={"path": str(path), "family": family, "parameters": n, "load_s": round(time.perf_counter() - t0, 3),
              **info},
    )


EXAMPLES = {
    "encoder": ["The animal didn't cross the street because it was too tired.", "Attention is all you need."],
    "decoder": ["The capital of France is", "The cat sat on the mat because it was tired."],
}


def human_size(n: int) -> str:
    for unit, k in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= k:
            return f"{n / k:.1f}{unit}".replace(".0", "")
    return str(n)
