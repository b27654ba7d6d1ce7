"""Token mixers that are not softmax attention: the framework every such layer plugs into.

A layer whose config entry in `layer_types` is "linear_attention" (ModelConfig.mixer_layers())
has `layer.mixer` (a Mixer) where other layers have `layer.self_attn`; its sub-layers are
["mixer", "ffn"] and it records under `{stack}.{i}.mixer.*` (docs/design.md, "Token mixers"):

    .q, .k     H x n x d_k   as the rule reads them (after its convolution, activation, norm, scale)
    .v         H x n x d_v   the values it mixes
    .decay     H x n         the per-step log decay (a gated delta rule's g; Mamba2's delta_t A_h);
               H x n x d_k   Kimi Delta Attention's: one log decay per key channel
    .beta      H x n         the delta rule's write strength (gated and Kimi delta rules)
    .weights   H x n x n     the exact implicit attention A: heads[h, t] = sum_s A[h, t, s] v[h, s]
                             (+ skip), lower-triangular and signed; a map, computed when read
    .skip      H x n x d_v   the part of heads that mixes no values (Mamba2's D x); absent where zero
    .heads     H x n x d_v   the per-head output before the mixer's own norm, gate and out-projection
    .out       n x d         after its out-projection

`.heads` and `.out` are hook points (core/net/hooks.py), as an attention's are. A mixer records
only the names its kind has (`recorded_names()`); `.weights` only under a recorder that records
maps (core/net/recorder.py: a traced pass does not; a layer looked at is run again with maps).

A kind is a Mixer subclass named in KINDS (kind -> "module:Class" under core.net), built by
`make_mixer(cfg, index)` from cfg.mixer = {"kind": ..., its own sizes}. It implements:

    forward(x (B, n, d), rec=None, cache=None) -> (B, n, d)
        cache None: the parallel (chunked) form. cache a dict: the mixer reads and writes its
        fixed-size state there (the convolution's last inputs, the recurrent state) so that
        greedy decoding feeds one token at a time, each step in the recurrent form (a prompt
        of several tokens may take the parallel form from the kept state). The forms give
        the same numbers to float32 rounding (tests/parity/test_mixers.py measures it).
    weights(x (B, n, d)) -> (B, H, n, n)
        the exact implicit attention of its input, without the out-projection: what
        `.weights` records, computed alone (the model view reads it layer by layer).
    recorded_names() -> [step, ...]
        the names it records under `mixer.`, in order.
    state_shapes() -> {name: shape}
        the fixed-size state a cache keeps per sequence (what replaces a KV cache).

`kind` (a class attribute) is what Transformer.layer_info reports as the layer's mixer;
`n_heads` the H of its maps. Analyses that need a query-key product or a KV cache refuse a
mixer layer with a ValueError saying why (MIXER_REASONS).
"""

from __future__ import annotations

import importlib
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from .config import ModelConfig
from .recorder import Rec

# kind -> "module:Class" under core.net; a new kind is a module and one line here
KINDS: Dict[str, str] = {
    "gated_delta": "gated_delta:GatedDeltaNet",
    "kimi_delta": "kimi_delta:KimiDeltaAttention",
    "mamba2": "mamba2:Mamba2Mixer",
    "short_conv": "short_conv:ShortConvMixer",
}

# why an analysis cannot run on a mixer layer, by analysis (the ValueError's words)
MIXER_REASONS = {
    "score_attribution": "a gated delta rule's (or any mixer's) map is not a query-key product: "
                         "there are no scores to decompose",
    "kv_cache": "a mixer keeps a fixed-size state, not a cache of keys and values: "
                "there is nothing to evict",
    "softmax": "its implicit attention is signed and its rows do not sum to 1: it is no softmax",
}


class Mixer(nn.Module):
    """The interface of a token mixer (see the module docstring)."""

    kind: str = ""
    n_heads: int = 0

    def forward(self, x: torch.Tensor, rec: Rec = None, cache: Optional[dict] = None) -> torch.Tensor:
        raise NotImplementedError

    def weights(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def recorded_names(self) -> List[str]:
        raise NotImplementedError

    def state_shapes(self) -> Dict[str, Tuple[int, ...]]:
        raise NotImplementedError


def make_mixer(cfg: ModelConfig, index: int) -> Mixer:
    """The mixer of layer `index` from cfg.mixer; a ValueError naming the kinds for an unknown one."""
    spec = cfg.mixer or {}
    kind = spec.get("kind")
    if kind not in KINDS:
        raise ValueError(f"mixer kind {kind!r} is not known: expected one of {sorted(KINDS)}")
    module, cls = KINDS[kind].split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)(cfg, index)


def refuse_mixer(layer, why: str, where: str = "") -> None:
    """Raise the ValueError of MIXER_REASONS[why] when `layer` (a core.net.layers.Layer) has a
    mixer, instead of softmax attention or beside it (Falcon-H1); `where` names the layer in the
    message."""
    mixer = getattr(layer, "mixer", None)
    if mixer is not None:
        at = f" ({where})" if where else ""
        how = (f"mixes tokens with {mixer.kind!r}, not softmax attention" if getattr(layer, "self_attn", None) is None
               else f"mixes tokens with {mixer.kind!r} beside its softmax attention")  # Falcon-H1
        raise ValueError(f"layer{at} {how}: {MIXER_REASONS[why]}")


def check_softmax_heads(net, stack: str, upto: int, what: str) -> None:
    """A ValueError when an analysis that reads each earlier write into the stream as softmax
    heads through W_o (score attribution, circuits, path patching: `what`) meets, in layers
    0..upto of `stack`, a token mixer (its write is no sum of heads) or an output gate (each
    head's write is scaled by its gate before W_o, which these decompositions do not read)."""
    for j, layer in enumerate(list(net.layers(stack))[: upto + 1]):
        mixer = getattr(layer, "mixer", None)
        if mixer is not None:
            side = " beside its attention" if getattr(layer, "self_attn", None) is not None else ""  # Falcon-H1
            raise ValueError(f"{what} reads softmax heads: {stack} layer {j} mixes tokens with {mixer.kind!r}{side} "
                             f"({MIXER_REASONS['score_attribution']}, and its write into the stream is not split "
                             "into heads)")
        attn = getattr(layer, "self_attn", None)
        if attn is not None and attn.w_gate is not None:
            raise ValueError(f"{what} reads each head's write as heads W_o: {stack} layer {j} gates its heads "
                             "(heads * sigmoid(x W_g) before W_o), which this decomposition does not include")
