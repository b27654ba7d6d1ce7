"""One layer of the model, computed again in float64 numpy from the layer's stored input and
the checkpoint's own weight tensors: the other side of the Inside page's checks
(viz/inside/step_checks.py) and of the Playground's (viz/figures/checks.py's scaled_check).

Nothing here calls the core's forward code. The weights are read from the model's modules as
plain arrays (W_q, W_k, W_v, W_o and their biases, the norms' gains and shifts, the FFN's
matrices); the norms, RoPE (partial rotary included), QK-norm, the masks (look-ahead, padding,
sliding window), the scale, softmax, head ablation, the FFN and the block's arrangement (pre-
or post-norm, norms after the sub-layers, the parallel block) are written out here again. T5's relative position bias is
read from the trace as an input of the attention (its buckets are a model input, not the
formula being checked); so is the output of a Mamba2 mixer beside the attention (Falcon-H1), whose
scan this file does not write out: the attention, the residual sum and the FFN stay checked.

Also written out here: QK-norm (RMSNorm of each head's q and k, or of the whole projection),
soft-capping c tanh(scaled / c) before the mask, the norms after the sub-layers (Gemma 2/3),
per-layer kinds (layer_types: a sliding layer's window, causal or symmetric in an encoder, and
its own RoPE base), a layer without its attention norm (ModernBERT's layer 0) and exact-GELU
GeGLU. Gemma 4: each layer's own head size and key/value heads (read from its weights), K = V
(no W_v: v from W_k), the v-norm, keys and values of an earlier layer (that layer's own
projections on its stored input), proportional RoPE, the per-layer input after the FFN
(`post_norm3`, `residual3`, from the stored `embed.{stack}.per_layer`) and the layer scalar.

And the 2025-26 softmax variants: learned sinks (a logit per head in the softmax that no key
owns; `sink` its share), chunked masks (a query sees its own chunk), layers without positions
(no rotation), Llama 4's temperature tuning (a scale per query position on those layers) and
the gainless L2 QK-norm on the layers that have it. A mixture-of-experts FFN is not written out
here: such a layer raises NoReference.

`reference_layer(trace, stack, i, heads={kind: h})` returns the layer's names as the core
records them ('self_attn.q', 'residual1', 'out', ...): per-head tensors for the heads asked
for (H x n x d_k kept for q, k, v and the maps of those heads only), whole tensors for the rest.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np

from core import trace_names as tn

try:  # exact GELU needs erf; scipy is installed with the project's dependencies
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover
    _erf = np.vectorize(math.erf)


class NoReference(Exception):
    """The layer cannot be recomputed independently (the reason is the message)."""


def _a(t) -> np.ndarray:
    """A tensor (parameter or recorded) as a float64 numpy array."""
    if t is None:
        return None
    return t.detach().to("cpu").double().numpy()


# ------------------------------------------------------------------ building blocks
def layer_norm(x: np.ndarray, gain, shift, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    out = (x - mu) / np.sqrt(var + eps) * gain
    return out if shift is None else out + shift


def rms_norm(x: np.ndarray, gain, eps: float) -> np.ndarray:
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * gain


def norm(module, cfg, x: np.ndarray) -> np.ndarray:
    if getattr(module, "weight", None) is None:  # an identity (ModernBERT's layer 0 has no attention norm)
        return x
    gain = _a(module.weight)
    if cfg.norm == "rmsnorm":
        return rms_norm(x, gain, float(module.eps))
    return layer_norm(x, gain, _a(getattr(module, "bias", None)), float(module.eps))


def linear(module, x: np.ndarray) -> np.ndarray:
    """x W^T + b with the module's own weight (out x in) and bias."""
    out = x @ _a(module.weight).T
    return out if module.bias is None else out + _a(module.bias)


def rope_inv_freq(d_k: int, theta: float, scaling: Optional[dict] = None) -> np.ndarray:
    """theta^(-2j/d_k), rescaled as the config says (linear; llama3's three bands)."""
    inv = theta ** (-np.arange(0, d_k, 2, dtype=np.float64) / d_k)
    if not scaling:
        return inv
    if scaling.get("type") == "proportional":  # Gemma 4: the first int(p d_k / 2) pairs turn, the rest stand
        turning = int(float(scaling.get("partial", 1.0)) * d_k // 2)
        return np.where(np.arange(inv.shape[0]) < turning, inv, 0.0) / float(scaling.get("factor", 1.0))
    factor = float(scaling["factor"])
    if scaling.get("type") == "linear":
        return inv / factor
    if scaling.get("type") == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * np.pi / inv
        out = inv.copy()
        long_ = wavelen > old / low
        out[long_] = inv[long_] / factor
        mid = (wavelen >= old / high) & (wavelen <= old / low)
        smooth = (old / wavelen[mid] - low) / (high - low)
        out[mid] = (1 - smooth) * inv[mid] / factor + smooth * inv[mid]
        return out
    raise NoReference(f"RoPE scaling {scaling.get('type')!r} has no reference here")


def rope(x: np.ndarray, n_pos: int, cfg, local: bool = False) -> np.ndarray:
    """Rotate the feature pairs of x (..., n, d_k) at positions 0..n-1 (the layout of cfg); a
    local layer with its own base (rope_theta_local) takes it, unscaled."""
    d_k = x.shape[-1]
    r = getattr(cfg, "rotary_dim", None) or d_k
    if r < d_k:  # partial rotary: the first r features rotate, the rest pass unchanged
        return np.concatenate([rope(x[..., :r], n_pos, cfg, local), x[..., r:]], axis=-1)
    theta, scaling = cfg.rope_theta, cfg.rope_scaling
    if local and getattr(cfg, "rope_theta_local", None) is not None:
        theta, scaling = cfg.rope_theta_local, None
    ang = np.arange(n_pos, dtype=np.float64)[:, None] * rope_inv_freq(d_k, theta, scaling)[None]
    cos, sin = np.cos(ang), np.sin(ang)
    if cfg.rope_layout == "half":
        h = d_k // 2
        a, b = x[..., :h], x[..., h:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = b * cos + a * sin
    return out


def mask(n_q: int, n_k: int, causal: bool = False, window: Optional[int] = None, key_pad=None,
         chunk: Optional[int] = None) -> np.ndarray:
    """Additive n_q x n_k mask: -inf where query i may not see key j (queries are the last n_q
    of n_k positions): keys after the query (causal), `window` or more positions back
    (sliding window; without causal, an encoder's: more than window // 2 away either way),
    keys outside the query's own chunk of `chunk` positions (Llama 4), padding keys."""
    i = np.arange(n_k - n_q, n_k)[:, None]
    j = np.arange(n_k)[None, :]
    blocked = np.zeros((n_q, n_k), dtype=bool)
    if causal:
        blocked |= j > i
    if window is not None and causal:
        blocked |= i - j >= window
    elif window is not None:
        blocked |= np.abs(i - j) > window // 2
    if chunk is not None:
        blocked |= (i // chunk) != (j // chunk)
    if key_pad is not None:
        blocked |= np.asarray(key_pad, dtype=bool)[None, :]
    return np.where(blocked, -np.inf, 0.0)


def softmax(x: np.ndarray, sink: Optional[float] = None) -> np.ndarray:
    """Row softmax; with a learned sink logit, over the row and the sink, and only the row's
    part returned (it sums to 1 - the sink's share)."""
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    if sink is not None:
        top = np.maximum(top, sink)
    e = np.exp(x - top)
    return e / (e.sum(-1, keepdims=True) + (0.0 if sink is None else np.exp(sink - top)))


def activation(kind: str, a: np.ndarray, gate: Optional[np.ndarray]) -> np.ndarray:
    def gelu_tanh(z):
        return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))

    def silu(z):
        return z / (1 + np.exp(-z))

    if kind == "relu":
        return np.maximum(a, 0.0)
    if kind == "gelu":
        return 0.5 * a * (1 + _erf(a / math.sqrt(2)))
    if kind == "gelu_tanh":
        return gelu_tanh(a)
    if kind == "silu":
        return silu(a)
    if kind == "geglu_tanh":
        return gelu_tanh(a) * gate
    if kind == "geglu":
        return 0.5 * a * (1 + _erf(a / math.sqrt(2))) * gate
    if kind == "swiglu":
        return silu(a) * gate
    raise NoReference(f"activation {kind!r} has no reference here")


# ------------------------------------------------------------------ attention and a layer
def _heads(mod, lin, norm_name: str, x: np.ndarray, n_heads: int, d_k: int, qk_norm, eps: float):
    """(x W + b as heads x n x d_k after QK-norm, the same before it)."""
    flat = linear(lin, x)
    split = lambda y: y.reshape(x.shape[0], n_heads, d_k).transpose(1, 0, 2)  # noqa: E731
    if qk_norm is None:
        return split(flat), None
    gain = 1.0 if qk_norm == "l2" else _a(getattr(mod, norm_name).weight)  # l2: an RMSNorm without a gain
    if qk_norm == "full":
        return split(rms_norm(flat, gain, eps)), split(flat)
    return rms_norm(split(flat), gain, eps), split(flat)


def keys_values(mod, cfg, x_kv: np.ndarray, use_rope: bool, local: bool = False, qk_norm="cfg") -> Dict[str, np.ndarray]:
    """An attention's own keys and values (H_kv x n x d_k): k_pre_norm (QK-norm), k_pre_rope
    (RoPE), k, v. v = x W_v, or x W_k where the attention has no W_v (Gemma 4's K = V: the
    key projection before its norm and RoPE); RMS-normed without a gain where the model norms
    its values (Gemma 4). qk_norm: this layer's QK-norm ("cfg": the config's)."""
    d_k = mod.w_q.weight.shape[0] // cfg.n_heads
    hkv = mod.w_k.weight.shape[0] // d_k
    n_k = x_kv.shape[0]
    qk_norm = getattr(cfg, "qk_norm", None) if qk_norm == "cfg" else qk_norm
    k, k_pre = _heads(mod, mod.w_k, "k_norm", x_kv, hkv, d_k, qk_norm, float(cfg.norm_eps))
    v_lin = mod.w_v if getattr(mod, "w_v", None) is not None else mod.w_k
    v = linear(v_lin, x_kv).reshape(n_k, hkv, d_k).transpose(1, 0, 2)
    if getattr(cfg, "v_norm", False):
        v = rms_norm(v, 1.0, float(cfg.norm_eps))
    out = {"k_pre_norm": k_pre} if qk_norm is not None else {}
    if use_rope:
        out["k_pre_rope"] = k
        k = rope(k, n_k, cfg, local)
    out.update(k=k, v=v)
    return out


def attention(mod, cfg, x_q: np.ndarray, x_kv: np.ndarray, m: np.ndarray, use_rope: bool, bias=None,
              keep=(), off=(), ablation: str = "zero", local: bool = False, qk_norm="cfg", sinks=None,
              temperature: Optional[dict] = None,
              shared: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
    """One multi-head attention: q, k, v (H or H_kv x n x d_k), the maps of the heads in `keep`
    ({head: {scores, scaled, [capped,] masked, weights[, sink]}}), every head's output and
    Concat(heads) W_o. qk_norm: this layer's QK-norm ("cfg": the config's); sinks: H learned
    sink logits; temperature: {"scale": a, "floor": f}, query p's scale times
    1 + a log(1 + floor((p + 1) / f)) (queries at positions 0..n_q-1). shared: the k and v of
    the layer whose keys and values this one reuses (Gemma 4), from keys_values of that layer;
    else the attention's own. An output gate (mod.w_gate, Qwen3.5) multiplies each head's
    output by sigmoid(x_q W_g) (kept as "gate", H x n_q x d_k) before W_o."""
    h = cfg.n_heads
    d_k = mod.w_q.weight.shape[0] // h
    n_q = x_q.shape[0]
    out: Dict[str, np.ndarray] = {}
    qk_norm = getattr(cfg, "qk_norm", None) if qk_norm == "cfg" else qk_norm
    q, q_pre = _heads(mod, mod.w_q, "q_norm", x_q, h, d_k, qk_norm, float(cfg.norm_eps))
    if qk_norm is not None:
        out["q_pre_norm"] = q_pre
    kv = keys_values(mod, cfg, x_kv, use_rope, local, qk_norm) if shared is None else {"k": shared["k"], "v": shared["v"]}
    out.update({n: t for n, t in kv.items() if n not in ("k", "v")})
    k, v = kv["k"], kv["v"]
    hkv = k.shape[0]
    if use_rope:
        out["q_pre_rope"] = q
        q = rope(q, n_q, cfg, local)
    out.update(q=q, k=k, v=v, mask=m)
    scale = 1.0 / math.sqrt(d_k) if cfg.attn_scale is None else float(cfg.attn_scale)
    if temperature is not None:  # a column: one scale per query
        p = np.arange(n_q, dtype=np.float64)
        scale = scale * (1.0 + float(temperature["scale"]) * np.log1p(np.floor((p + 1.0) / float(temperature["floor"]))))
        scale = scale[:, None]
    cap = getattr(cfg, "attn_softcap", None)
    heads = np.empty((h, n_q, d_k))
    for hd in range(h):  # one head at a time: only the heads asked for keep their n_q x n_k maps
        g = hd // (h // hkv)
        scores = q[hd] @ k[g].T
        scaled = scores * scale
        capped = scaled if cap is None else cap * np.tanh(scaled / cap)
        masked = capped + m + (0.0 if bias is None else bias[hd])
        weights = softmax(masked, None if sinks is None else float(sinks[hd]))
        heads[hd] = weights @ v[g]
        if hd in keep:
            out[f"maps{hd}"] = {"scores": scores, "scaled": scaled, "masked": masked, "weights": weights}
            if sinks is not None:
                out[f"maps{hd}"]["sink"] = 1.0 - weights.sum(-1)
            if cap is not None:
                out[f"maps{hd}"]["capped"] = capped
    out["heads"] = heads
    mixed = heads.copy()
    for hd in off or ():
        mixed[hd] = heads[hd].mean(0, keepdims=True) if ablation == "mean" else 0.0
    if getattr(mod, "w_gate", None) is not None:  # the output gate (Qwen3.5): sigmoid(x_q W_g), per head and feature
        gate = 1.0 / (1.0 + np.exp(-linear(mod.w_gate, x_q)))
        out["gate"] = gate.reshape(n_q, h, d_k).transpose(1, 0, 2)
        mixed = mixed * out["gate"]
    out["out"] = linear(mod.w_o, mixed.transpose(1, 0, 2).reshape(n_q, h * d_k))
    return out


def ffn(mod, cfg, x: np.ndarray) -> Dict[str, np.ndarray]:
    gate = linear(mod.w_3, x) if mod.w_3 is not None else None
    hidden = activation(cfg.activation, linear(mod.w_1, x), gate)
    return {"hidden": hidden, "out": linear(mod.w_2, hidden)}


def reference_layer(trace, stack: str, i: int, heads: Optional[Dict[str, int]] = None) -> Dict[str, object]:
    """Layer i of `stack` in float64 numpy from its stored input and the model's weights.

    heads: {attention kind: head} whose n_q x n_k maps to keep. Raises NoReference (with the
    reason) where the trace has no model or the model has a part this file does not write out."""
    runner = getattr(trace, "runner", None)
    model = getattr(runner, "model", None)
    if model is None:
        raise NoReference("this trace has no model to recompute from (loaded from a file)")
    net, cfg = model.net, model.config
    if getattr(cfg, "mla", None) is not None:
        raise NoReference("multi-head latent attention (DeepSeek) is not written out here past its compression "
                          "(the Inside page checks that, X to the latent to K and V, step by step)")
    layer = net.layers(stack)[i]
    heads = heads or {}
    x = _a(trace.layer_input(stack, i))
    n = x.shape[0]
    pad = getattr(runner, "src_pad", None)
    pad = None if pad is None else _a(pad)[0].astype(bool)
    abl = getattr(runner, "ablate", None)
    memory = None
    if stack == "decoder" and cfg.kind == "encoder-decoder":
        memory = _a(trace[tn.stack_output(trace, "encoder")])
    rope_ = cfg.positional == "rope"
    bias = None
    if cfg.positional == "relative":
        name = tn.self_attn(stack, i, "position_bias")
        if name not in trace:
            raise NoReference("the trace does not hold T5's position bias for this layer")
        bias = _a(trace[name])
    decoder = stack == "decoder"
    if getattr(cfg, "moe", None) and hasattr(layer.ffn, "n_experts"):
        raise NoReference("this layer's FFN is a mixture of experts, which the numpy reference does not write out")
    types = getattr(cfg, "layer_types", None)
    local = bool(types) and types[i] == "sliding_attention"
    chunk = cfg.attn_chunk if types and types[i] == "chunked_attention" else None
    nope = i in (getattr(cfg, "nope_layers", None) or [])  # a layer without positions: never rotated
    qk_layers = getattr(cfg, "qk_norm_layers", None)
    qk_norm = getattr(cfg, "qk_norm", None) if qk_layers is None or i in qk_layers else None
    if types:  # per-layer kinds: the sliding layers alone have the window
        window = cfg.sliding_window if local else None
    else:  # one window for every decoder layer (Mistral)
        window = cfg.sliding_window if decoder else None
    masks = {"self_attn": mask(n, n, causal=decoder, window=window, key_pad=None if decoder else pad, chunk=chunk)}
    if memory is not None:
        masks["cross_attn"] = mask(n, memory.shape[0], key_pad=pad)
    out: Dict[str, object] = {}
    pre_norms = layer.pre and getattr(cfg, "pre_sublayer_norm", True)
    post_norms = layer.pre and getattr(cfg, "post_sublayer_norm", False)
    parallel = getattr(cfg, "parallel_block", False)
    x_in = x  # the parallel block: every sub-layer reads the layer's input
    shared = _shared_kv(trace, net, cfg, stack, layer, pre_norms, rope_)
    for j, sub in enumerate(layer.sublayers(), start=1):
        src = x_in if parallel else x
        normed = norm(layer.norms[j - 1], cfg, src) if pre_norms else None
        y = normed if pre_norms else src
        if sub == tn.FFN:
            res = ffn(layer.ffn, cfg, y)
        else:
            mod = getattr(layer, sub)
            kv = y if sub == "self_attn" else memory
            off = (abl.heads(stack, i, sub) if abl else None) or ()
            own = sub == "self_attn"
            res = attention(mod, cfg, y, kv, masks[sub], rope_ and own and not nope,
                            bias if own else None, keep=(heads[sub],) if sub in heads else (),
                            off=off, ablation=getattr(abl, "mode", "zero"), local=local and own, qk_norm=qk_norm,
                            sinks=_a(mod.sinks) if own and getattr(cfg, "attn_sinks", False) else None,
                            temperature=cfg.attn_temperature if own and nope and getattr(cfg, "attn_temperature", None)
                            else None, shared=shared if own else None)
        out.update({tn.local(sub, k): v for k, v in res.items()})
        if layer.pre:
            f = res["out"]
            if sub == "self_attn" and getattr(layer, "beside", False):
                # Falcon-H1: its Mamba2 mixer adds beside the attention; this file does not write the
                # scan out, so its output is the one recorded (the attention and the rest stay checked)
                f = f + _a(trace[tn.mixer(stack, i, "out")])
            if pre_norms:
                out[f"norm{j}"] = normed
            if post_norms:  # a norm on the sub-layer's output before the residual add
                f = norm(layer.post_norms[j - 1], cfg, f)
                out[f"post_norm{j}"] = f
            x = x + f
            out[f"residual{j}"] = x
        else:
            r = x + res["out"]
            out[f"residual{j}"] = r
            x = norm(layer.norms[j - 1], cfg, r)
            out[f"norm{j}"] = x
    if getattr(layer, "ple_gate", None) is not None:  # Gemma 4: the per-layer input, after the FFN
        e = _a(trace[tn.embed(stack, "per_layer")])[:, i]  # (n, p)
        f = norm(layer.ple_norm, cfg, linear(layer.ple_proj, activation("gelu_tanh", linear(layer.ple_gate, x), None) * e))
        out["post_norm3"] = f
        x = x + f
        out["residual3"] = x
    if getattr(layer, "layer_scalar", None) is not None:  # Gemma 4: the whole stream times a learned scalar
        x = x * _a(layer.layer_scalar)
    out["out"] = x
    return out


def _shared_kv(trace, net, cfg, stack: str, layer, pre_norms: bool, rope_: bool) -> Optional[Dict[str, np.ndarray]]:
    """The k and v of the layer whose keys and values `layer` reuses (Gemma 4), from that
    layer's stored input, its own norm and projections (keys_values); None for a layer with its own."""
    j = getattr(layer.self_attn, "kv_source", None)
    if j is None:
        return None
    src = net.layers(stack)[j]
    x = _a(trace.layer_input(stack, j))
    y = norm(src.norms[0], cfg, x) if pre_norms else x
    types = getattr(cfg, "layer_types", None)
    local = bool(types) and types[j] == "sliding_attention"
    return keys_values(src.self_attn, cfg, y, rope_, local)
