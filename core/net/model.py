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

Per-layer attention kinds (cfg.layer_types, Gemma 2/3 and ModernBERT): a sliding ("local")
layer gets the sliding-window mask (decoder: keys sliding_window or more positions back;
encoder: keys more than sliding_window // 2 away either way) and the RoPE base
cfg.rope_theta_local where it is set; a "global" one the full mask and cfg.rope_theta.
`layer_kinds()` lists them (a trace's meta["layer_kinds"]).

Gemma 4's side inputs: a decoder pass makes each layer's per-layer input from the ids and their
embeddings (per_layer_inputs, recorded as embed.decoder.per_layer) and a dict in which the
layers leave their keys and values for the layers that reuse them (side_start); a layer run
alone (run_layer, layer_weights, run_from) is handed them (`side`; side_inputs recomputes a
source layer's keys and values from that layer's input). layer_info says which layer's keys
a layer reuses and which layers' values are their keys.

Token mixers (cfg.layer_types "linear_attention", core/net/mixer.py): such a layer's kind is
'linear'; it takes no mask, window or RoPE (its order is in the rule itself), and its
layer_info names its mixer ("gated_delta") and the fixed-size state it keeps. attn_spec
refuses it (a ValueError: no softmax attention there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from .. import trace_names as tn
from .head_ablation import Ablation
from .hooks import attach
from .attention import (additive, causal_mask, chunked_mask, combine_masks, forbidden, padding_mask,
                        sliding_window_mask)
from .config import ModelConfig
from .layers import Embedding, Layer, RelativePositionBias, make_norm
from .norms import RMSNorm
from .linear import Linear, use_onednn
from .positional import apply_rope, rope_angles
from .recorder import Rec, scoped


@dataclass(frozen=True)
class AttnSpec:
    """What one self-attention layer does beyond Q K^T, answered in one place
    (Transformer.attn_spec) for every caller: the masks, the one-head-a-tile reads of long
    inputs (core/head_maps.py) and the views that describe a layer.

    causal: the look-ahead mask. window: None (full attention) or its width; symmetric: the
    encoder's window (keys more than window // 2 away either way are masked) rather than the
    decoder's (keys window or more positions back). kind: 'local' / 'global' where the config
    names layer kinds. rope_theta: this layer's RoPE base (None without RoPE). softcap: the
    soft-cap of the scaled scores. qk_norm: None / 'head' / 'full'. scale: the factor on
    Q K^T (None: 1/sqrt(d_k)). normed_input: the attention reads Norm(x) (a pre-norm layer
    with a norm before the sub-layer), not x. relative: T5's position bias is added.
    chunk: None, or the chunk of a chunked layer (Llama 4: a query sees its own chunk only).
    rope: the layer rotates q and k (False on a layer without positions). sink: learned sink
    logits. tempered: the scale varies by query position (MultiHeadAttention.q_scale)."""
    stack: str
    layer: int
    causal: bool
    window: Optional[int]
    symmetric: bool
    kind: Optional[str]
    rope_theta: Optional[float]
    softcap: Optional[float]
    qk_norm: Optional[str]
    scale: Optional[float]
    normed_input: bool
    relative: bool
    chunk: Optional[int] = None
    rope: bool = False
    sink: bool = False
    tempered: bool = False

    def forbidden(self, q_pos, k_pos, key_is_pad=None):
        """True where a query at q_pos may not see a key at k_pos in this layer (attention.forbidden)."""
        return forbidden(q_pos, k_pos, self.causal, self.window, self.symmetric, key_is_pad, self.chunk)

    def key_range(self, r0: int, r1: int, n: int):
        """(c0, c1): the keys queries r0..r1-1 may see lie in c0..c1-1 (others masked)."""
        lo, hi = 0, n
        if self.causal:
            hi = min(n, r1)
            if self.window is not None:
                lo = max(0, r0 - self.window + 1)
        elif self.window is not None and self.symmetric:
            lo, hi = max(0, r0 - self.window // 2), min(n, r1 + self.window // 2)
        if self.chunk is not None:  # the chunks of the first and the last query
            lo, hi = max(lo, (r0 // self.chunk) * self.chunk), min(hi, ((r1 - 1) // self.chunk + 1) * self.chunk)
        return lo, hi


class Transformer(nn.Module):
    """Encoder-decoder, encoder-only or decoder-only stack, per ModelConfig.kind."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.has_encoder:
            self.src_embed = Embedding(cfg, cfg.src_vocab_size)
            self.encoder = nn.ModuleList(Layer(cfg, cross=False, index=i) for i in range(cfg.n_layers))
            self.encoder_norm = make_norm(cfg) if cfg.final_norm else None
            if cfg.positional == "relative":
                self.encoder_bias = RelativePositionBias(cfg, bidirectional=True)
        if cfg.has_decoder:
            cross = cfg.kind == "encoder-decoder"
            n_dec = cfg.n_decoder_layers if cross else cfg.n_layers
            self.tgt_embed = Embedding(cfg, cfg.tgt_vocab_size)
            self.decoder = nn.ModuleList(Layer(cfg, cross=cross, index=i) for i in range(n_dec))
            self.decoder_norm = make_norm(cfg) if cfg.final_norm else None
            if cfg.positional == "relative":
                self.decoder_bias = RelativePositionBias(cfg, bidirectional=False)
            out_bias = cfg.bias and not cfg.tie_embeddings if cfg.out_bias is None else cfg.out_bias
            self.out_proj = Linear(cfg.d_model, cfg.tgt_vocab_size, bias=out_bias)
            if cfg.tie_embeddings:
                self.out_proj.weight = self.tgt_embed.tok.weight
            self._init_per_layer_inputs(cfg)
        use_onednn(self)  # small models: linears through oneDNN on packed weights (core/net/linear.py)

    def _angles(self, n: int, offset: int = 0, device=None, layer: Optional[int] = None):
        """RoPE angles of positions offset..offset+n-1 (None without RoPE); a sliding layer
        takes cfg.rope_theta_local (unscaled) where the config sets one."""
        if self.cfg.positional != "rope" or not self.has_rope(layer):
            return None
        dims = self.cfg.rotary_dim or (self.cfg.d_head if layer is None else self.cfg.layer_d_head(layer))  # partial: rotary_dim
        if self.cfg.mla is not None:  # latent attention turns its qk_rope_head_dim features
            dims = int(self.cfg.mla["qk_rope_head_dim"])
        theta, scaling = self._rope_base(layer)
        return rope_angles(n, dims, theta, offset, scaling).to(device=device, dtype=torch.float32)

    def _rope_base(self, layer: Optional[int]):
        """(RoPE base, its scaling) of layer `layer`: a sliding layer's cfg.rope_theta_local
        (unscaled) where the config sets one, else cfg.rope_theta with cfg.rope_scaling."""
        if layer is not None and self.cfg.rope_theta_local is not None and self.layer_kind(layer) == "local":
            return self.cfg.rope_theta_local, None
        return self.cfg.rope_theta, self.cfg.rope_scaling

    def has_rope(self, layer: Optional[int]) -> bool:
        """Whether layer `layer` rotates q and k (False on cfg.nope_layers; None: any RoPE layer)."""
        return self.cfg.positional == "rope" and not (layer is not None and self.cfg.nope_layers
                                                      and layer in self.cfg.nope_layers)

    def layer_kind(self, i: int) -> Optional[str]:
        """'local' (sliding window), 'chunked', 'global' or 'linear' (a token mixer, core/net/mixer.py)
        for layer i where cfg.layer_types is set, else None."""
        types = self.cfg.layer_types
        if not types:
            return None
        return {"sliding_attention": "local", "chunked_attention": "chunked",
                "linear_attention": "linear"}.get(types[i], "global")

    def chunk(self, stack: str, layer: Optional[int] = None) -> Optional[int]:
        """The chunk of a chunked layer of the decoder (Llama 4), else None."""
        if stack != "decoder" or layer is None or self.layer_kind(layer) != "chunked":
            return None
        return self.cfg.attn_chunk

    def layer_info(self, stack: str) -> list:
        """One small dict per layer of `stack` (the contract's layer kinds): mixer "softmax";
        mask "causal" | "sliding W" | "chunked C" | "global" (an encoder's full attention) |
        "local W" (an encoder's symmetric window); positions "rope" | "none" | "sinusoidal" |
        "learned" | "relative"; sink (learned sink logits); qk_norm (None | "head" | "full" |
        "l2"); scale "per position" where temperature tuning sets it, else "fixed"; ffn
        "dense" | "moe" (with experts and top_k); rope_theta where the layer rotates; kv (Gemma 4):
        "own", "k = v", "shared KV from layer j" (with shared_kv: j) or both, and d_head; latent
        "latent rank r" (multi-head latent attention: the cache holds r + d_rope numbers a
        position) and selection "top-k k" (a sparse selection of k keys per query), where so;
        output_gate (heads * sigmoid(x W_g) before W_o: Qwen3.5, Qwen3-Next). A mixer layer:
        mixer its kind ("gated_delta"), kind "linear", mask "causal", positions "none", heads (H
        of its maps) and state (the shapes of the fixed-size state it keeps per sequence). A softmax
        layer with a mixer beside it (Falcon-H1): beside {mixer, heads, state}."""
        out = []
        for i, layer in enumerate(self.layers(stack)):
            ffn = {"ffn": "none" if layer.ffn is None else "moe" if hasattr(layer.ffn, "n_experts") else "dense"}
            if ffn["ffn"] == "moe":
                ffn.update(experts=layer.ffn.n_experts, top_k=layer.ffn.top_k)
            if layer.self_attn is None:
                out.append({"mixer": layer.mixer.kind, "kind": "linear", "mask": "causal", "positions": "none",
                            "sink": False, "qk_norm": None, "scale": "fixed", "output_gate": False,
                            "heads": layer.mixer.n_heads, "state": layer.mixer.state_shapes(), **ffn})
                continue
            w, c = self.window(stack, i), self.chunk(stack, i)
            if stack == "encoder":
                mask = f"local {w}" if w is not None else "global"
            else:
                mask = f"sliding {w}" if w is not None else f"chunked {c}" if c is not None else "causal"
            pos = self.cfg.positional
            rope = pos == "rope" and self.has_rope(i)
            attn = layer.self_attn
            d = {"mixer": "softmax", "mask": mask,
                 "positions": "rope" if rope else "none" if pos in ("rope", "none") else pos,
                 "sink": attn.sinks is not None, "qk_norm": attn.qk_norm,
                 "scale": "per position" if attn.temperature is not None else "fixed",
                 "output_gate": attn.w_gate is not None, **ffn}
            if rope:
                d["rope_theta"] = self._rope_base(i)[0]
            if getattr(attn, "r", None) is not None:  # multi-head latent attention (core/net/latent.py)
                d["latent"] = f"latent rank {attn.r}"
                if attn.topk is not None:
                    d["selection"] = f"top-k {attn.topk}"
            d.update(self._kv_info(stack, attn))
            if layer.mixer is not None:  # Falcon-H1: a mixer beside the attention
                d["beside"] = {"mixer": layer.mixer.kind, "heads": layer.mixer.n_heads,
                               "state": layer.mixer.state_shapes()}
            out.append(d)
        return out

    def layer_kinds(self) -> Optional[list]:
        """Every layer's kind ('local' / 'global' / 'chunked' / 'linear'), or None when the config has no
        layer_types (the per-layer dicts of the contract are layer_info)."""
        return [self.layer_kind(i) for i in range(self.cfg.n_layers)] if self.cfg.layer_types else None

    def window(self, stack: str, layer: Optional[int] = None) -> Optional[int]:
        """The sliding window of a layer of `stack` (None: full attention). Without
        layer_types a window is every decoder layer's (Mistral); with them the sliding
        layers' only (layer None: the global layers')."""
        w = self.cfg.sliding_window
        if w is None:
            return None
        if not self.cfg.layer_types:
            return w if stack == "decoder" else None
        return w if layer is not None and self.layer_kind(layer) == "local" else None

    def attn_spec(self, stack: str, i: int) -> AttnSpec:
        """Layer i of `stack`'s self-attention rules (AttnSpec): the one answer to 'which window,
        which RoPE base, which cap, which norm' that every path reads."""
        cfg = self.cfg
        layer = self.layers(stack)[i]
        if layer.self_attn is None:
            raise ValueError(f"{stack} layer {i} mixes tokens with {layer.mixer.kind!r}, not softmax attention: "
                             "it has no mask, window or query-key scores to describe")
        theta = self._rope_base(i)[0] if cfg.positional == "rope" else None
        attn = layer.self_attn
        return AttnSpec(stack=stack, layer=i, causal=stack == "decoder", window=self.window(stack, i),
                        symmetric=stack == "encoder", kind=self.layer_kind(i),
                        rope_theta=theta if self.has_rope(i) else None,
                        softcap=cfg.attn_softcap, qk_norm=attn.qk_norm, scale=attn.scale,
                        normed_input=layer.reads_norm, relative=cfg.positional == "relative",
                        chunk=self.chunk(stack, i), rope=self.has_rope(i), sink=attn.sinks is not None,
                        tempered=attn.temperature is not None)

    def _per_layer(self, stack: str, make_masks, n_pos: int, offset: int, device):
        """fn(i) -> (masks, angles) of layer i, built once per distinct (window, RoPE base)."""
        made = {}

        def get(i):
            key = (self.window(stack, i), self.chunk(stack, i), self.has_rope(i),
                   self.layer_kind(i) if self.cfg.rope_theta_local is not None else None, self.cfg.layer_d_head(i))
            if key not in made:
                made[key] = (make_masks(i), self._angles(n_pos, offset, device, i))
            return made[key]

        return get

    def layers(self, stack: str) -> nn.ModuleList:
        return self.encoder if stack == "encoder" else self.decoder

    def final_norm(self, stack: str) -> Optional[nn.Module]:
        return self.encoder_norm if stack == "encoder" else self.decoder_norm

    def position_bias(self, stack: str, n: int):
        """T5's relative position bias of a stack for n positions (1, H, n, n), else None."""
        if self.cfg.positional != "relative":
            return None
        return (self.encoder_bias if stack == "encoder" else self.decoder_bias)(n, n)

    def encoder_masks(self, src_pad, n: int, dtype=torch.float32, layer: Optional[int] = None, device=None) -> dict:
        """The encoder's attention masks: padding columns -inf (B, 1, n, n), a sliding layer's
        symmetric window (keys more than window // 2 away), or none."""
        mask = None if src_pad is None else padding_mask(src_pad, n, dtype)[:, None]
        window = self.window("encoder", layer)
        if window is not None:
            i = torch.arange(n, device=device)
            local = additive(forbidden(i, i, window=window, symmetric=True), dtype)[None, None]
            mask = combine_masks(local, mask)
        return {"self_mask": mask}

    def decoder_masks(self, t: int, src_pad=None, tgt_pad=None, device=None, dtype=torch.float32,
                      n_past: int = 0, layer: Optional[int] = None) -> dict:
        """The decoder's masks for t new positions after n_past known ones: the look-ahead
        mask (seed 002's M; left to the fused kernel as is_causal when it is all there is),
        layer `layer`'s sliding window, padding, and the cross-attention's padding mask."""
        n_k = n_past + t
        self_mask, causal = None, False
        window, chunk = self.window("decoder", layer), self.chunk("decoder", layer)
        if tgt_pad is not None or n_past or window is not None or chunk is not None:
            self_mask = causal_mask(t, device=device, dtype=dtype, n_k=n_k)[None, None]  # (1, 1, t, n_k)
            if window is not None:  # Mistral: keys `window` or more positions back are masked too
                self_mask = combine_masks(self_mask, sliding_window_mask(t, window, device, dtype, n_k=n_k))
            if chunk is not None:  # Llama 4: keys outside the query's chunk are masked too
                self_mask = combine_masks(self_mask, chunked_mask(t, chunk, device, dtype, n_k=n_k))
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
        x = self.src_embed(src, scoped(rec, tn.embed_scope("encoder")), token_types=token_types)
        per_layer = self._per_layer("encoder", lambda i: self.encoder_masks(src_pad, n, x.dtype, i, src.device),
                                    n, 0, src.device)
        bias = self.position_bias("encoder", n)
        for i, layer in enumerate(self.encoder):
            masks, angles = per_layer(i)
            x = layer(x, **masks, rec=scoped(rec, tn.layer("encoder", i)), angles=angles, position_bias=bias)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
            if rec:
                rec(tn.final_norm("encoder"), x)
        return x

    def decode(self, tgt, memory=None, src_pad=None, tgt_pad=None, rec: Rec = None,
               ablate: Optional[Ablation] = None, cache: Optional[dict] = None, extra_mask=None):
        """tgt (B, t) decoder input ids (<start> y_1 ...). Returns hidden states (B, t, d).

        cache: a dict kept between calls for greedy decoding: the keys and values of the
        positions already decoded (tgt then holds only the new ids).
        extra_mask: an additive mask added to every self-attention's own (broadcast to
        (B, H, t, n_keys + t)), or fn(layer) -> such a mask or None: the keys a KV-cache
        policy has evicted (core/analysis/evict.py). A caller may also remove keys no later
        query reads from every self-attention's cache: cache["dropped"] (and each layer's
        cache["self_attn"]["dropped"]) counts them; n_keys = n_past - dropped keys remain,
        and the new positions stay n_past.. (no sliding window or position bias then)."""
        t = tgt.shape[1]
        rec = attach(rec, ablate.hooks("decoder") if ablate else {})
        n_past = 0 if cache is None else cache.get("n", 0)
        n_keys = n_past - (0 if cache is None else cache.get("dropped", 0))  # keys each self-attention holds
        x = self.tgt_embed(tgt, scoped(rec, tn.embed_scope("decoder")), offset=n_past)
        side = self.side_start(tgt, x, rec)  # Gemma 4: per-layer inputs, shared keys and values
        per_layer = self._per_layer(
            "decoder", lambda i: self.decoder_masks(t, src_pad, tgt_pad, tgt.device, x.dtype, n_keys, layer=i),
            n_past + t, 0, tgt.device)
        bias = self.position_bias("decoder", n_past + t)
        for i, layer in enumerate(self.decoder):
            masks, angles = per_layer(i)
            extra = extra_mask(i) if callable(extra_mask) else extra_mask
            if extra is not None:  # the layer's own mask (the look-ahead one at least) plus the extra one
                own = masks["self_mask"]
                if own is None:
                    own = causal_mask(t, device=tgt.device, dtype=x.dtype, n_k=n_keys + t)[None, None]
                masks = dict(masks, self_mask=combine_masks(own, extra), self_causal=False)
            c = None if cache is None else cache.setdefault(i, {})
            x = layer(x, memory=memory, **masks, rec=scoped(rec, tn.layer("decoder", i)), angles=angles,
                      cache=c, position_bias=bias, **side)
        if cache is not None:
            cache["n"] = n_past + t
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
            if rec:
                rec(tn.final_norm("decoder"), x)
        return x

    def run_layer(self, stack: str, i: int, x, rec: Rec, memory=None, src_pad=None,
                  ablate: Optional[Ablation] = None, side: Optional[dict] = None):
        """Layer i of `stack` run alone on its input x (B, n, d): how a trace computes the
        inside of a layer it stored only the input and output of. Same masks, positions and
        ablation as encode/decode, so the same layer code gives the same numbers.
        side: what the layer reads besides x (Gemma 4, Transformer.side_inputs)."""
        n = x.shape[1]
        if stack == "encoder":
            masks = self.encoder_masks(src_pad, n, x.dtype, i, x.device)
        else:
            masks = self.decoder_masks(n, src_pad if memory is not None else None, None, x.device, x.dtype, layer=i)
            masks["memory"] = memory
        rec = attach(rec, ablate.hooks(stack, i) if ablate else {})
        return self.layers(stack)[i](x, **masks, rec=rec, angles=self._angles(n, device=x.device, layer=i),
                                     position_bias=self.position_bias(stack, n), **(side or {}))

    def run_from(self, stack: str, i: int, x, rec: Rec = None, memory=None, src_pad=None,
                 cache: Optional[dict] = None, n_past: int = 0, side: Optional[dict] = None):
        """The rest of a pass from the residual stream x (B, t, d) entering layer i of `stack`:
        layers i.. and the stack's final norm (the caller projects). Activation patching
        starts its patched runs here, from a stored stream (the layers below are unchanged).
        Decoders: x holds t positions after n_past earlier ones whose keys and values `cache`
        holds, per layer, as decode's cache does. side (Gemma 4): the per-layer inputs and the
        keys and values of layers below i that layers from i reuse (Transformer.side_inputs)."""
        t = x.shape[1]
        side = dict(side or {})
        if self.needs_side() and "shared" in side:
            side["shared"] = dict(side["shared"])  # the layers from i add theirs to a copy
        if stack == "encoder":
            make = lambda j: self.encoder_masks(src_pad, t, x.dtype, j, x.device)  # noqa: E731
        else:
            make = lambda j: self.decoder_masks(t, src_pad if memory is not None else None, None,  # noqa: E731
                                                x.device, x.dtype, n_past, layer=j)
        per_layer = self._per_layer(stack, make, n_past + t, 0, x.device)  # windows / RoPE bases per layer
        bias = self.position_bias(stack, n_past + t)
        layers = self.layers(stack)
        for j in range(i, len(layers)):
            masks, angles = per_layer(j)
            c = None if cache is None else cache.setdefault(j, {})
            x = layers[j](x, memory=memory, **masks, rec=scoped(rec, tn.layer(stack, j)), angles=angles, cache=c,
                          position_bias=bias, **side)
        norm = self.final_norm(stack)
        return x if norm is None else norm(x)

    def layer_weights(self, stack: str, i: int, x, src_pad=None, what: str = "weights", qk=None,
                      side: Optional[dict] = None):
        """Layer i's self-attention weights alone (B, H, n, n) from its input x, with
        run_layer's masks and positions (ablation acts after the weights: nothing to do).
        what="value_norms": ||a_ij v_j W_o^h|| instead (core/net/multihead.py). qk: the
        layer's (q, k) as a traced pass kept them, (q, k, v) for value_norms, instead of
        projecting x again. side: as for run_layer (a layer that reuses another's keys and
        values reads them there)."""
        n = x.shape[1]
        if qk is None and self.layers(stack)[i].self_attn.kv_source is not None:
            qk = self._shared_qk(stack, i, x, side, what)
        masks = (self.encoder_masks(src_pad, n, x.dtype, i, x.device) if stack == "encoder"
                 else self.decoder_masks(n, None, None, x.device, x.dtype, layer=i))
        layer = self.layers(stack)[i]
        fn = layer.self_value_norms if what == "value_norms" else layer.self_weights
        return fn(x, **masks, angles=self._angles(n, device=x.device, layer=i),
                  position_bias=self.position_bias(stack, n), qk=qk)

    # ------------------------------------------------------------------ Gemma 4
    def _init_per_layer_inputs(self, cfg: ModelConfig) -> None:
        """Gemma 4's per-layer input embeddings (cfg.per_layer_dim): the table, the projection
        of the token embeddings and its norm."""
        p = cfg.per_layer_dim
        self.per_layer_embed = nn.Embedding(cfg.per_layer_vocab or cfg.tgt_vocab_size, cfg.n_layers * p) if p else None
        self.per_layer_proj = Linear(cfg.d_model, cfg.n_layers * p, bias=False) if p else None
        self.per_layer_norm = RMSNorm(p, cfg.norm_eps) if p else None

    def needs_side(self) -> bool:
        return bool(self.cfg.per_layer_dim) or self.cfg.kv_source is not None

    def per_layer_inputs(self, ids, x, rec: Rec = None):
        """Every layer's per-layer input e (B, n, L, p) of ids (B, n) and their embeddings x
        (B, n, d, the token embeddings times sqrt(d)), recorded as embed.decoder.per_layer:
        (RMSNorm(x W_proj d^-1/2) + table[ids] sqrt(p)) 2^-1/2, split per layer."""
        cfg, p = self.cfg, self.cfg.per_layer_dim
        shape = (*ids.shape, cfg.n_layers, p)
        table = self.per_layer_embed(ids).view(shape) * (p ** 0.5)
        proj = self.per_layer_norm((self.per_layer_proj(x) * cfg.d_model ** -0.5).view(shape))
        e = (proj + table) * 2 ** -0.5
        if rec:
            rec(tn.embed("decoder", "per_layer"), e)
        return e

    def side_start(self, ids, x, rec: Rec = None) -> dict:
        """The Gemma 4 inputs of a decoder pass that layers read besides the stream: the
        per-layer inputs (of ids and their embeddings x) and the dict of shared keys and
        values the layers fill; {} for every other model."""
        side = {}
        if self.cfg.per_layer_dim:
            side["per_layer"] = self.per_layer_inputs(ids, x, rec)
        if self.cfg.kv_source is not None:
            side["shared"] = {}
        return side

    def kv_of(self, stack: str, j: int, x):
        """Layer j's keys and values (after its norm and RoPE) from its input x (B, n, d), as a
        pass computes them: what a layer that reuses them reads."""
        attn = self.layers(stack)[j].self_attn
        _, k, v = attn.qkv(self.layers(stack)[j].attn_input(x), self._angles(x.shape[1], device=x.device, layer=j))
        return k, v

    def side_inputs(self, stack: str, i: int, layer_input, per_layer=None) -> dict:
        """What layer i (run alone: run_layer, layer_weights) reads besides its input:
        the per-layer inputs (B, n, L, p) where the model has them, and the keys and values of
        the layer it reuses, from that layer's input layer_input(j) (B, n, d); {} otherwise."""
        side = {}
        if self.cfg.per_layer_dim:
            if per_layer is None:
                raise ValueError("this model adds per-layer inputs to every layer: pass per_layer (B, n, L, p)")
            side["per_layer"] = per_layer
        j = self.layers(stack)[i].self_attn.kv_source
        if j is not None:
            side["shared"] = {j: self.kv_of(stack, j, layer_input(j))}
        return side

    def _shared_qk(self, stack: str, i: int, x, side: Optional[dict], what: str):
        """(q, k[, v]) of layer i that reuses another layer's keys and values: q of its own
        input x (after norm and RoPE), k and v from side["shared"]."""
        attn = self.layers(stack)[i].self_attn
        shared = (side or {}).get("shared") or {}
        if attn.kv_source not in shared:
            raise ValueError(f"layer {i} reuses layer {attn.kv_source}'s keys and values: pass them in side['shared']")
        k, v = shared[attn.kv_source]
        layer = self.layers(stack)[i]
        angles = self._angles(x.shape[1], device=x.device, layer=i)
        q = attn._split(attn.w_q, attn.q_norm, layer.attn_input(x), attn.h)
        if angles is not None:
            q = apply_rope(q, angles[: x.shape[1]], attn.rope_layout)
        return (q, k, v) if what == "value_norms" else (q, k)

    def _kv_info(self, stack: str, attn) -> dict:
        """layer_info's keys and values entry: kv "own" | "k = v" | "shared KV from layer j"
        (+ " (k = v)" where layer j's are), shared_kv (j or None), d_head (the layer's d_k)."""
        j = attn.kv_source
        same = attn.k_is_v if j is None else self.layers(stack)[j].self_attn.k_is_v
        kv = "own" if j is None and not same else "k = v" if j is None else f"shared KV from layer {j}" + (
            " (k = v)" if same else "")
        return {"kv": kv, "shared_kv": j, "d_head": attn.dk}

    def project(self, hidden, rec: Rec = None):
        if self.cfg.logit_scale != 1.0:  # T5 with tied embeddings
            hidden = hidden * self.cfg.logit_scale
        logits = self.out_proj(hidden)  # (B, t, V)
        if self.cfg.final_softcap is not None:  # Gemma 2: c tanh(logits / c)
            c = self.cfg.final_softcap
            logits = torch.tanh(logits / c) * c
        if rec:
            rec(tn.LOGITS, logits)
            rec(tn.PROBS, torch.softmax(logits, dim=-1))
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
