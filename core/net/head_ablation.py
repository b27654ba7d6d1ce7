"""Head ablation: switching attention heads off, for the model and for recomputed layers.

    model.trace(text, ablate=[("decoder", 3, 4)], ablation="zero")

AttentionModel turns `ablate` / `ablation` into an Ablation; Transformer.encode / decode /
run_layer pass each layer `off_kwargs(ablate, stack, i)`, and MultiHeadAttention zeroes
(or replaces by their mean) the heads' slices of Concat(heads) before W_o.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

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

    def key(self) -> tuple:
        """A hashable description (for caches): sorted sites and the mode."""
        return (self.mode,) + tuple((s, l, k, tuple(h)) for (s, l, k), h in sorted(self.sites.items()))

    def layer(self, stack: str, layer: int) -> Optional[Dict[str, List[int]]]:
        """{attention kind: heads off} for one layer, or None when nothing is off there."""
        out = {k: self.sites[(stack, layer, k)] for k in ATTENTION_KINDS if (stack, layer, k) in self.sites}
        return out or None


def off_kwargs(ablate: Optional[Ablation], stack: str, i: int) -> dict:
    """Keyword arguments that switch a layer's ablated heads off (none without ablation)."""
    off = ablate.layer(stack, i) if ablate else None
    return {"off": off, "ablation": ablate.mode} if off else {}
