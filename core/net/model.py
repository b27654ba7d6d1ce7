"""The transformer of the lecture notes, configurable to the pretrained variants.

Transformer stacks the layers of core/net/layers.py (post-norm as in seed 001 / 003, or
pre-norm as in Llama) into an encoder-decoder, an encoder or a decoder (ModelConfig.kind),
builds their masks and positions, and projects to the vocabulary.

Every intermediate passes through a named recording point. Recording is opt-in: with
`rec=None` (the default) nothing is kept and attention takes the fused kernel. Names are
the Trace contract of docs/design.md; a Recorder (core/net/recorder.py) keeps batch item 0
(traces are unbatched). An Ablation (core/net/head_ablation.py) switches heads off in every layer through
the hook points of core/net/hooks.py, where any value of the pass can be replaced.
`run_layer` runs one layer on its stored input: how a trace computes a layer's inside
when it is looked at (core/trace.py).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .head_ablation import Ablation
from .hooks import attach
from .attention import causal_mask, combine_masks, padding_mask, sliding_window_mask
from .config import ModelConfig
from .layers import Embedding, Layer, RelativePositionBias, make_norm
from .positional import rope_angles
from .recorder import Rec, scoped


class Transformer(nn.Module):
    """Encoder-decoder, encoder-only or decoder-only stack, per ModelConfig.kind."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.has_encoder:
            self.src_embed = Embedding(cfg, cfg.src_vocab_size)
            self.encoder = nn.ModuleList(Layer(cfg, cross=False) for _ in range(cfg.n_layers))
            self.encoder_norm = make_norm(cfg) if cfg.final_norm else None
            if cfg.positional == "relative":
                self.encoder_bias = RelativePositionBias(cfg, bidirectional=True)
        if cfg.has_decoder:
            cross = cfg.kind == "encoder-decoder"
            n_dec = cfg.n_decoder_layers if cross else cfg.n_layers
            self.tgt_embed = Embedding(cfg, cfg.tgt_vocab_size)
            self.decoder = nn.ModuleList(Layer(cfg, cross=cross) for _ in range(n_dec))
            self.decoder_norm = make_norm(cfg) if cfg.final_norm else None
            if cfg.positional == "relative":
                self.decoder_bias = RelativePositionBias(cfg, bidirectional=False)
            out_bias = cfg.bias and not cfg.tie_embeddings if cfg.out_bias is None else cfg.out_bias
            self.out_proj = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=out_bias)
            if cfg.tie_embeddings:
                self.out_proj.weight = self.tgt_embed.tok.weight

    def _angles(self, n: int, offset: int = 0, device=None):
        if self.cfg.positional != "rope":
            return None
        a = rope_angles(n, self.cfg.d_head, self.cfg.rope_theta, offset, self.cfg.rope_scaling)
        return a.to(device=device, dtype=torch.float32)

    def layers(self, stack: str) -> nn.ModuleList:
        return self.encoder if stack == "encoder" else self.decoder

    def final_norm(self, stack: str) -> Optional[nn.Module]:
        return self.encoder_norm if stack == "encoder" else self.decoder_norm

    def position_bias(self, stack: str, n: int):
        """T5's relative position bias of a stack for n positions (1, H, n, n), else None."""
        if self.cfg.positional != "relative":
            return None
        return (self.encoder_bias if stack == "encoder" else self.decoder_bias)(n, n)

    def encoder_masks(self, src_pad, n: int, dtype=torch.float32) -> dict:
        """The encoder's attention masks: padding columns -inf (B, 1, n, n), or none."""
        return {"self_mask": None if src_pad is None else padding_mask(src_pad, n, dtype)[:, None]}

    def decoder_masks(self, t: int, src_pad=None, tgt_pad=None, device=None, dtype=torch.float32,
                      n_past: int = 0) -> dict:
        """The decoder's masks for t new positions after n_past known ones: the look-ahead
        mask (seed 002's M; left to the fused kernel as is_causal when it is all there is),
        padding, and the cross-attention's padding mask."""
        n_k = n_past + t
        self_mask, causal = None, False
        window = self.cfg.sliding_window
        if tgt_pad is not None or n_past or window is not None:
            self_mask = causal_mask(t, device=device, dtype=dtype, n_k=n_k)[None, None]  # (1, 1, t, n_k)
            if window is not None:  # Mistral: keys `window` or more positions back are masked too
                self_mask = combine_masks(self_mask, sliding_window_mask(t, window, device, dtype, n_k=n_k))
            if tgt_pad is not None:
                self_mask = combine_masks(self_mask, padding_mask(tgt_pad, t, dtype)[:, None])
        else:
            causal = True
        cross_mask = None if src_pad is None else padding_mask(src_pad, t, dtype)[:, None]  # (B, 1, t, n)
        return {"self_mask": self_mask, "cross_mask": cross_mask, "self_causal": causal}

    def encode(self, src, src_pad=None, rec: Rec = None, token_types=None, ablate: Optional[Ablation] = None):
        """src (B, n) ids, src_pad (B, n) bool (True = padding). Returns memory (B, n, d)."""
        n = src.shape[1]
        rec = attach(rec, ablate.hooks("encoder") if ablate else {})
        x = self.src_embed(src, scoped(rec, "embed.encoder"), token_types=token_types)
        masks = self.encoder_masks(src_pad, n, x.dtype)
        angles = self._angles(n, device=src.device)
        bias = self.position_bias("encoder", n)
        for i, layer in enumerate(self.encoder):
            x = layer(x, **masks, rec=scoped(rec, f"encoder.{i}"), angles=angles, position_bias=bias)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
            if rec:
                rec("encoder.final_norm", x)
        return x

    def decode(self, tgt, memory=None, src_pad=None, tgt_pad=None, rec: Rec = None,
               ablate: Optional[Ablation] = None, cache: Optional[dict] = None):
        """tgt (B, t) decoder input ids (<start> y_1 ...). Returns hidden states (B, t, d).

        cache: a dict kept between calls for greedy decoding: the keys and values of the
        positions already decoded (tgt then holds only the new ids)."""
        t = tgt.shape[1]
        rec = attach(rec, ablate.hooks("decoder") if ablate else {})
        n_past = 0 if cache is None else cache.get("n", 0)
        x = self.tgt_embed(tgt, scoped(rec, "embed.decoder"), offset=n_past)
        masks = self.decoder_masks(t, src_pad, tgt_pad, tgt.device, x.dtype, n_past)
        angles = self._angles(n_past + t, device=tgt.device)
        bias = self.position_bias("decoder", n_past + t)
        for i, layer in enumerate(self.decoder):
            c = None if cache is None else cache.setdefault(i, {})
            x = layer(x, memory=memory, **masks, rec=scoped(rec, f"decoder.{i}"), angles=angles,
                      cache=c, position_bias=bias)
        if cache is not None:
            cache["n"] = n_past + t
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
            if rec:
                rec("decoder.final_norm", x)
        return x

    def run_layer(self, stack: str, i: int, x, rec: Rec, memory=None, src_pad=None,
                  ablate: Optional[Ablation] = None):
        """Layer i of `stack` run alone on its input x (B, n, d): how a trace computes the
        inside of a layer it stored only the input and output of. Same masks, positions and
        ablation as encode/decode, so the same layer code gives the same numbers."""
        n = x.shape[1]
        if stack == "encoder":
            masks = self.encoder_masks(src_pad, n, x.dtype)
        else:
            masks = self.decoder_masks(n, src_pad if memory is not None else None, None, x.device, x.dtype)
            masks["memory"] = memory
        rec = attach(rec, ablate.hooks(stack, i) if ablate else {})
        return self.layers(stack)[i](x, **masks, rec=rec, angles=self._angles(n, device=x.device),
                                     position_bias=self.position_bias(stack, n))

    def layer_weights(self, stack: str, i: int, x, src_pad=None, qk=None):
        """Layer i's self-attention weights alone (B, H, n, n) from its input x, with
        run_layer's masks and positions (ablation acts after the weights: nothing to do).
        qk: the layer's (q, k) as a traced pass kept them, instead of projecting x again."""
        n = x.shape[1]
        masks = (self.encoder_masks(src_pad, n, x.dtype) if stack == "encoder"
                 else self.decoder_masks(n, None, None, x.device, x.dtype))
        return self.layers(stack)[i].self_weights(x, **masks, angles=self._angles(n, device=x.device),
                                                  position_bias=self.position_bias(stack, n), qk=qk)

    def project(self, hidden, rec: Rec = None):
        if self.cfg.logit_scale != 1.0:  # T5 with tied embeddings
            hidden = hidden * self.cfg.logit_scale
        logits = self.out_proj(hidden)  # (B, t, V)
        if rec:
            rec("logits", logits)
            rec("probs", torch.softmax(logits, dim=-1))
        return logits

    def forward(self, src=None, tgt=None, src_pad=None, tgt_pad=None, rec: Rec = None, token_types=None,
                ablate: Optional[Ablation] = None):
        """Encoder-decoder: logits for tgt given src. Encoder-only: final hidden states.
        Decoder-only: logits for tgt."""
        memory = self.encode(src, src_pad, rec, token_types, ablate) if self.cfg.has_encoder else None
        if not self.cfg.has_decoder:
            return memory
        hidden = self.decode(tgt, memory, src_pad, tgt_pad, rec, ablate)
        return self.project(hidden, rec)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
