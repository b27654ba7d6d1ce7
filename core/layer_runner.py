"""LayerRunner: what recomputes the names a trace does not store, on the model that made
it (core/trace.py): a layer's every intermediate, a layer's self-attention weights alone,
and the logits of the stored final hidden states.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from .net.head_ablation import Ablation
from .net.recorder import Recorder
from .trace import Trace, layer_of


class LayerRunner:
    """Recomputes what a trace does not store, on the model that made it (core/trace.py).

    layer(trace, stack, i): every name of layer i, from one explicit run of that layer on
    its stored input, with the pass's padding and ablation. logits(trace, rows): the
    output projection of the stored final hidden states."""

    def __init__(self, model: "AttentionModel", src_pad=None, ablate: Optional[Ablation] = None,
                 qk: Optional[Dict[str, torch.Tensor]] = None):
        """qk: each self-attention's q and k (after RoPE) as the traced pass computed them, by
        trace name, kept for short inputs (core/api.py's QK_KEEP_BYTES): a weights read then
        costs Q K^T and the softmax alone."""
        self.model, self.src_pad, self.ablate = model, src_pad, ablate
        self.qk = dict(qk or {})

    @property
    def nbytes(self) -> int:
        """Bytes of the q and k kept (counted with the trace: core.trace.nbytes_of)."""
        return sum(t.numel() * t.element_size() for t in self.qk.values())

    @torch.inference_mode()
    def layer(self, trace: Trace, stack: str, i: int) -> Dict[str, torch.Tensor]:
        net, dev = self.model.net, self.model.device
        x = trace.layer_input(stack, i).to(dev)[None]  # (1, n, d)
        memory = None
        if stack == "decoder" and net.cfg.kind == "encoder-decoder":
            memory = trace[_encoder_output(trace)].to(dev)[None]
        pad = None if self.src_pad is None else self.src_pad.to(dev)
        rec = Recorder()
        net.run_layer(stack, i, x, rec.scope(f"{stack}.{i}"), memory=memory, src_pad=pad, ablate=self.ablate)
        return {n: t.to("cpu") for n, t in rec.tensors.items()}

    @torch.inference_mode()
    def self_weights(self, trace: Trace, stack: str, i: int) -> torch.Tensor:
        """Layer i's self-attention weights alone (H x n x n), from its stored input."""
        net, dev = self.model.net, self.model.device
        x = trace.layer_input(stack, i).to(dev)[None]
        pad = None if self.src_pad is None or stack == "decoder" else self.src_pad.to(dev)
        q, k = (self.qk.get(f"{stack}.{i}.self_attn.{s}") for s in "qk")
        qk = None if q is None or k is None else (q.to(dev)[None], k.to(dev)[None])
        return net.layer_weights(stack, i, x, pad, qk=qk)[0].to("cpu")

    @torch.inference_mode()
    def logits(self, trace: Trace, rows: slice = slice(None)) -> torch.Tensor:
        net = self.model.net
        name = "decoder.final_norm" if "decoder.final_norm" in trace else f"decoder.{trace.layers('decoder') - 1}.out"
        return net.project(trace[name][rows].to(self.model.device)).to("cpu")

    def ordered_names(self, stored: Dict[str, torch.Tensor]) -> List[str]:
        """Every name a trace can give, in forward order: the stored ones, each layer's
        recorded names in place, logits and probs after the decoder's last stored name."""
        net, names, seen = self.model.net, [], set()
        for n in stored:
            where = layer_of(n)
            if where is not None:
                if where not in seen:
                    seen.add(where)
                    stack, i = where
                    names += [f"{stack}.{i}.{s}" for s in net.layers(stack)[i].recorded_names()]
                continue
            if n == "topk.ids":
                names += ["logits", "probs"]
            names.append(n)
        return names


def _encoder_output(trace: Trace) -> str:
    return "encoder.final_norm" if "encoder.final_norm" in trace else f"encoder.{trace.layers('encoder') - 1}.out"
