"""LayerRunner: what recomputes the names a trace does not store, on the model that made
it (core/trace.py): a layer's every intermediate, a layer's self-attention weights alone,
and the logits of the stored final hidden states.
"""

from __future__ import annotations

import itertools
import threading
import uuid
import weakref
from typing import Dict, List, Optional

import torch

from .net.head_ablation import Ablation
from .net.recorder import Recorder
from . import trace_names as tn
from .trace import Trace, layer_of


class LayerRunner:
    """Recomputes what a trace does not store, on the model that made it (core/trace.py).

    layer(trace, stack, i): every name of layer i, from one explicit run of that layer on
    its stored input, with the pass's padding and ablation. logits(trace, rows): the
    output projection of the stored final hidden states."""

    def __init__(self, model: "AttentionModel", src_pad=None, ablate: Optional[Ablation] = None,  # noqa: F821 (core.api.AttentionModel; core.api imports this module)
                 qk: Optional[Dict[str, torch.Tensor]] = None):
        """qk: each self-attention's q and k (after RoPE) and v as the traced pass computed them,
        by trace name, kept for short inputs (core/api.py's QK_KEEP_BYTES): a weights read then
        costs Q K^T and the softmax alone, a value_norms read that and v's sizes."""
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
            memory = trace[tn.stack_output(trace, "encoder")].to(dev)[None]
        pad = None if self.src_pad is None else self.src_pad.to(dev)
        rec = Recorder()
        net.run_layer(stack, i, x, rec.scope(tn.layer(stack, i)), memory=memory, src_pad=pad, ablate=self.ablate,
                      side=self._side(trace, stack, i))
        return {n: t.to("cpu") for n, t in rec.tensors.items()}

    def _side(self, trace: Trace, stack: str, i: int) -> dict:
        """What layer i reads besides its stored input (Gemma 4; {} for other models): the
        stored per-layer inputs, and the keys and values of the layer it reuses, recomputed
        from that layer's stored input (Transformer.side_inputs)."""
        net, dev = self.model.net, self.model.device
        if not net.needs_side():
            return {}
        per_layer = None
        if net.cfg.per_layer_dim:
            per_layer = trace[tn.embed(stack, "per_layer")].to(dev)[None]
        return net.side_inputs(stack, i, lambda j: trace.layer_input(stack, j).to(dev)[None], per_layer)

    @torch.inference_mode()
    def self_weights(self, trace: Trace, stack: str, i: int, what: str = "weights") -> torch.Tensor:
        """Layer i's self-attention weights alone (H x n x n), from its stored input;
        what="value_norms": its value norms ||a_ij v_j W_o^h|| alone."""
        net, dev = self.model.net, self.model.device
        x = trace.layer_input(stack, i).to(dev)[None]
        pad = None if self.src_pad is None or stack == "decoder" else self.src_pad.to(dev)
        # the q, k (and v) a traced pass kept (short inputs): Q K^T and the softmax (and v's sizes) only
        kept = [self.qk.get(tn.self_attn(stack, i, s)) for s in ("q", "k", "v")[: 3 if what == "value_norms" else 2]]
        qk = None if any(t is None for t in kept) else tuple(t.to(dev)[None] for t in kept)
        side = self._side(trace, stack, i) if qk is None else None
        return net.layer_weights(stack, i, x, pad, what, qk=qk, side=side)[0].to("cpu")

    @torch.inference_mode()
    def logits(self, trace: Trace, rows: slice = slice(None)) -> torch.Tensor:
        net = self.model.net
        name = tn.stack_output(trace, "decoder")
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
                    names += tn.layer_names(stack, i, net.layers(stack)[i].recorded_names())
                continue
            if n == tn.TOPK_IDS:
                names += list(tn.OUTPUTS)
            names.append(n)
        return names

    def __reduce__(self):
        """Pickled, a runner is a reference to its model in this process, never the weights:
        unpickled where that model is alive it is the same runner; elsewhere a MissingModel
        that names the model (core/trace.py, Trace.__getstate__)."""
        return (_unpickle, (model_ref(self.model), self.model.name, self.src_pad, self.ablate))


class MissingModel:
    """The runner of an unpickled trace whose model is not loaded in this process: the trace
    keeps its stored names, and asking for any other says which model it needs."""

    model = None

    def __init__(self, model_name: str, src_pad=None, ablate: Optional[Ablation] = None):
        self.model_name, self.src_pad, self.ablate = model_name, src_pad, ablate

    def _missing(self, *_, **__):
        raise KeyError(f"this trace was unpickled without its model: recomputing a name it does not store needs "
                       f"{self.model_name!r} loaded in this process (or a trace saved with Trace.save)")

    layer = self_weights = logits = _missing

    def __reduce__(self):
        return (MissingModel, (self.model_name, self.src_pad, self.ablate))


_PROCESS = uuid.uuid4().hex  # references from another process never match this one's models
_COUNT = itertools.count(1)
_LOCK = threading.Lock()
_REFS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its reference
_MODELS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()  # reference -> model, while it lives


def model_ref(model) -> str:
    """A reference to a live model that a pickle can carry: unique to this process and this
    model object (never reused for another model, as id() could be)."""
    with _LOCK:
        ref = _REFS.get(model)
        if ref is None:
            ref = _REFS[model] = f"{_PROCESS}:{next(_COUNT)}"
            _MODELS[ref] = model
        return ref


def _unpickle(ref: str, name: str, src_pad, ablate):
    model = _MODELS.get(ref)
    return LayerRunner(model, src_pad, ablate) if model is not None else MissingModel(name, src_pad, ablate)
