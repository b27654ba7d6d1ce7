"""Head ablation: switching attention heads off, for the model and for recomputed layers.

    model.trace(text, ablate=[("decoder", 3, 4)], ablation="zero")

AttentionModel turns `ablate` / `ablation` into an Ablation. An Ablation is a set of
functions on the hook points `{stack}.{i}.{attn}.heads` (core/net/hooks.py) that zero (or
replace by their mean) the heads' slices of Concat(heads) before W_o; Transformer.encode /
decode / run_layer attach them to whatever recorder the pass has.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .. import trace_names as tn
from .hooks import HookFn

ATTENTION_KINDS = ("self_attn", "cross_attn")


class Ablation:
    """Heads switched off: their slice of Concat(head_1..head_H) is zeroed ("zero") or
    replaced by its mean over the query positions ("mean") before W_o.

    heads: (stack, layer, head) for self-attention, or (stack, layer, head, "cross_attn").
    """

    MODES = ("zero", "mean")

    def __init__(self, heads: Sequence = (), mode: str = "zero"):
        if mode not in self.MODES:
            raise ValueError(f"ablation must be one of {self.MODES}, not {mode!r}")
        by_site: Dict[Tuple[str, int, str], List[int]] = {}
        for item in heads:
            stack, layer, head = item[0], int(item[1]), int(item[2])
            kind = item[3] if len(item) > 3 else "self_attn"
            if stack not in ("encoder", "decoder") or kind not in ATTENTION_KINDS:
                raise ValueError(f"cannot ablate {item!r}: use (stack, layer, head[, kind])")
            by_site.setdefault((stack, layer, kind), []).append(head)
        self.mode = mode
        self.sites = {k: sorted(set(v)) for k, v in by_site.items()}

    def __bool__(self) -> bool:
        return bool(self.sites)

    def heads(self, stack: str, layer: int, kind: str) -> Optional[List[int]]:
        return self.sites.get((stack, layer, kind))

    def check(self, net) -> "Ablation":
        """Itself, after a ValueError for a site whose layer has no such attention: a layer whose
        token mixer is not softmax attention (core/net/mixer.py) has no heads before a W_o to
        switch off here (a layer with a mixer beside its attention, Falcon-H1, has: its attention's)."""
        for (s, l, kind) in self.sites:
            layers = net.layers(s) if (s == "encoder" and net.cfg.has_encoder) or (
                s == "decoder" and net.cfg.has_decoder) else []
            if not 0 <= l < len(layers):
                raise ValueError(f"cannot ablate a head of {s} layer {l}: the model has no such layer")
            mixer = getattr(layers[l], "mixer", None)
            if mixer is not None and kind == "self_attn" and layers[l].self_attn is None:
                raise ValueError(f"cannot ablate a head of {s} layer {l}: it mixes tokens with {mixer.kind!r}, "
                                 "not softmax attention")
        return self

    def key(self) -> tuple:
        """A hashable description (for caches): sorted sites and the mode."""
        return (self.mode,) + tuple((s, l, k, tuple(h)) for (s, l, k), h in sorted(self.sites.items()))

    def hooks(self, stack: str, layer: Optional[int] = None) -> Dict[str, HookFn]:
        """The hook functions of one stack (full names), or of one of its layers (names
        relative to the layer: "self_attn.heads")."""
        out = {}
        for (s, l, kind), heads in self.sites.items():
            if s != stack or (layer is not None and l != layer):
                continue
            name = tn.local(kind, "heads") if layer is not None else tn.attn(s, l, kind, "heads")
            out[name] = _switch_off(heads, self.mode)
        return out


def _switch_off(heads: List[int], mode: str) -> HookFn:
    """heads (B, H, n, d_k) with the listed heads zeroed, or replaced by their mean over
    the query positions (mode "mean")."""

    def fn(t: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(t.shape[1], 1, 1, dtype=t.dtype, device=t.device)
        keep[heads] = 0
        if mode == "mean":
            return t * keep + t.mean(dim=2, keepdim=True) * (1 - keep)
        return t * keep

    return fn
