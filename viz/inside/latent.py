"""Multi-head latent attention (DeepSeek V3) on the Inside page, step by step (pure: a Trace in,
steps, checks and figures out).

    X          the layer's input after its norm (n x d)
    c_KV       [c | k_R] = X W_DKV; c_KV = RMSNorm(c) (n x r): the latent, what the cache keeps
    K_nope, V  c_KV W_UK^h, c_KV W_UV^h: head h's keys (d_nope) and values (d_v), rebuilt from the latent
    k_rope     RoPE(X W_KR) (n x d_rope): one rotated key that every head shares (X W_KR unrotated
               in a layer without positions: Kimi Linear's; layer_rotates)
    q          X W_q (or RMSNorm(X W_DQ) W_UQ), per head [q_nope | RoPE(q_rope)]
    k          [K_nope | k_rope], per head

Each step is recomputed here in float64 numpy from the layer's stored input and the model's
weights (DeepSeek's RoPE pairs (x0, x1), (x2, x3), ... written out below, not the core's
rotation) and compared with the recorded tensor at the Inside page's tolerance (a Check).
`selection_maps` gives a sparse layer's (V3.2) selection beside the dense softmax it replaced."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import plotly.graph_objects as go

from core import trace_names as tn
from viz.figures.checks import NUMPY, Check, max_abs_diff, rtol_of, tolerance
from viz.figures.reference import NoReference, _a, linear, norm, rms_norm


@dataclass
class LatentStep:
    """One step of the compression: its title, formula (LaTeX), the matrix drawn (rows: tokens),
    the trace name it is checked against and its checks."""

    key: str
    title: str
    latex: str
    explain: str
    matrix: np.ndarray
    name: Optional[str]
    checks: List[Check]


def _pairs_rope(x: np.ndarray, theta: float, factor: float = 1.0) -> np.ndarray:
    """DeepSeek's rotation of x (n, d_rope) at positions 0..n-1: pair (x_2i, x_2i+1) turned by
    p theta^(-2i/d_rope), the result laid out as halves (every pair's first, then every second)."""
    n, d = x.shape
    ang = np.arange(n, dtype=np.float64)[:, None] * (theta ** (-np.arange(0, d, 2, dtype=np.float64) / d))[None]
    a, b = x[:, 0::2], x[:, 1::2]
    cos, sin = np.cos(ang), np.sin(ang)
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1) * factor


def _rotate(x: np.ndarray, cfg, interleave: bool) -> np.ndarray:
    if cfg.rope_scaling:
        raise NoReference(f"RoPE scaling {cfg.rope_scaling.get('type')!r} is not written out for latent attention here")
    if interleave:
        return _pairs_rope(x, float(cfg.rope_theta))
    h = x.shape[-1] // 2  # already halves: turn (x_i, x_{i+h}) as the pair i
    return _pairs_rope(np.stack([x[:, :h], x[:, h:]], axis=-1).reshape(x.shape), float(cfg.rope_theta))


def layer_rotates(trace, stack: str, layer: int) -> bool:
    """Whether the latent layer turns its rope part by RoPE (False: a layer without positions,
    Kimi Linear's, whose shared key part and q's last d_rope features pass unrotated)."""
    model = getattr(getattr(trace, "runner", None), "model", None)
    return model is None or bool(getattr(model.net.layers(stack)[layer], "rope", True))


def latent_steps(trace, stack: str, layer: int, head: int) -> List[LatentStep]:
    """The compression X -> c_KV -> K_nope, V (+ k_rope, q) of head `head` in layer `layer`,
    each recomputed in numpy and checked against the trace. Raises NoReference (with why) where
    the trace has no model or the layer is not latent attention."""
    model = getattr(getattr(trace, "runner", None), "model", None)
    if model is None:
        raise NoReference("this trace has no model to recompute from (loaded from a file)")
    cfg = model.config
    if getattr(cfg, "mla", None) is None:
        raise NoReference(f"{model.name} has no latent attention")
    lay = model.net.layers(stack)[layer]
    mod = lay.self_attn
    x = _a(trace.layer_input(stack, layer))
    xn = norm(lay.norms[0], cfg, x) if lay.pre and getattr(cfg, "pre_sublayer_norm", True) else x
    n, h = xn.shape[0], mod.h
    r, d_nope, d_rope, d_v = mod.r, mod.d_nope, mod.d_rope, mod.dk
    if getattr(mod, "factor", 1.0) != 1.0:
        raise NoReference("YaRN's attention factor is not written out for latent attention here")
    rotates = layer_rotates(trace, stack, layer)
    turn = (lambda t: _rotate(t, cfg, mod.interleave)) if rotates else (lambda t: t)  # noqa: E731
    kva = linear(mod.w_kva, xn)
    c = rms_norm(kva[:, :r], _a(mod.kv_a_norm.weight), float(mod.kv_a_norm.eps))
    k_rope = turn(kva[:, r:])
    kvb = linear(mod.w_kvb, c).reshape(n, h, d_nope + d_v)
    k_nope, v = kvb[:, head, :d_nope], kvb[:, head, d_nope:]
    if mod.rq is None:
        qf, q_from = linear(mod.w_q, xn), "X W_q"
    else:
        cq = rms_norm(linear(mod.w_qa, xn), _a(mod.q_a_norm.weight), float(mod.q_a_norm.eps))
        qf, q_from = linear(mod.w_qb, cq), r"\mathrm{RMSNorm}(X W_{DQ}) W_{UQ}"
    qh = qf.reshape(n, h, d_nope + d_rope)[:, head]
    q = np.concatenate([qh[:, :d_nope], turn(qh[:, d_nope:])], axis=-1)
    rtol = rtol_of(trace)
    rec = {p: _a(trace[tn.attn(stack, layer, tn.SELF, p)]) for p in ("latent", "q", "k", "v")}

    def check(label, mine, recorded):
        return Check(f"{label} ({NUMPY}) equals the recorded tensor", max_abs_diff(recorded, mine), tolerance(mine, rtol))

    k_all = rec["k"][:, :, d_nope:]
    shared = Check("every head's rotated key is the same k_rope", float(np.abs(k_all - k_all[:1]).max()), 0.0)
    name = lambda p: tn.attn(stack, layer, tn.SELF, p)  # noqa: E731
    cache = r + d_rope
    full = h * (d_nope + d_rope + d_v)
    return [
        LatentStep("x", "X, the layer's input after its norm", r"X \in \mathbb{R}^{n \times d}",
                   f"{n} tokens x d = {xn.shape[1]}: what every projection below reads.", xn, None, []),
        LatentStep("latent", "c_KV, the latent: all the cache keeps of the keys and values",
                   r"c_{KV} = \mathrm{RMSNorm}(X W_{DKV}) \in \mathbb{R}^{n \times r}",
                   f"r = {r} numbers a position (kv_lora_rank), the same for every head: with k_rope the cache holds "
                   f"r + d_rope = {cache} numbers a position and layer, where multi-head attention of these sizes "
                   f"holds H (d_k + d_v) = {full}.", c, name("latent"), [check("c_KV = RMSNorm(X W_DKV)", c, rec["latent"])]),
        LatentStep("k_nope", f"K_nope of head {head}, rebuilt from the latent",
                   rf"K^{{{head}}}_{{nope}} = c_{{KV}} W_{{UK}}^{{{head}}} \in \mathbb{{R}}^{{n \times {d_nope}}}",
                   f"Head {head}'s rows of W_UK read the {r}-number latent back up to d_nope = {d_nope} features "
                   "(no positions in them).", k_nope, name("k"),
                   [check(f"K_nope = c_KV W_UK (head {head})", k_nope, rec["k"][head, :, :d_nope])]),
        LatentStep("v", f"V of head {head}, rebuilt from the latent",
                   rf"V^{{{head}}} = c_{{KV}} W_{{UV}}^{{{head}}} \in \mathbb{{R}}^{{n \times {d_v}}}",
                   f"The values come from the same latent through other rows of W_UKV: d_v = {d_v}.", v, name("v"),
                   [check(f"V = c_KV W_UV (head {head})", v, rec["v"][head])]),
        LatentStep("k_rope", "k_rope: one rotated key every head shares",
                   rf"k_{{rope}} = \mathrm{{RoPE}}(X W_{{KR}}) \in \mathbb{{R}}^{{n \times {d_rope}}}",
                   f"RoPE cannot pass through the latent (a rotation between W_UK and q would depend on the "
                   f"position), so d_rope = {d_rope} rotated features sit beside it, computed once for all {h} heads.",
                   k_rope, name("k"), [check("k_rope = RoPE(X W_KR)", k_rope, rec["k"][head, :, d_nope:]), shared])
        if rotates else
        LatentStep("k_rope", "k_rope: one key part every head shares, not rotated (no positions)",
                   rf"k_{{rope}} = X W_{{KR}} \in \mathbb{{R}}^{{n \times {d_rope}}}",
                   f"This layer has no positions: the d_rope = {d_rope} features beside the latent are a key part "
                   f"shared by all {h} heads, never rotated (Kimi Linear's latent layers).",
                   k_rope, name("k"), [check("k_rope = X W_KR", k_rope, rec["k"][head, :, d_nope:]), shared]),
        LatentStep("q", f"q of head {head}: [q_nope | RoPE(q_rope)]",
                   rf"q^{{{head}}} = [\,q_{{nope}} \mid \mathrm{{RoPE}}(q_{{rope}})\,],\ [q_{{nope}} \mid q_{{rope}}] = {q_from}",
                   f"q · k = q_nope · K_nope + q_rope · k_rope: the first part reads the latent, the second the "
                   f"positions; scale {mod.scale:.4g}.", q, name("q"), [check(f"q (head {head})", q, rec["q"][head])])
        if rotates else
        LatentStep("q", f"q of head {head}: [q_nope | q_rope], nothing rotated",
                   rf"q^{{{head}}} = [\,q_{{nope}} \mid q_{{rope}}\,] = {q_from}",
                   f"q · k = q_nope · K_nope + q_rope · k_rope: the first part reads the latent, the second the "
                   f"shared key part; no positions anywhere; scale {mod.scale:.4g}.", q, name("q"),
                   [check(f"q (head {head})", q, rec["q"][head])]),
    ]


def latent_figure(step: LatentStep, tokens) -> go.Figure:
    """A step's matrix, tokens as rows, features as columns."""
    m = step.matrix
    fig = go.Figure(go.Heatmap(z=m, x=[f"{j}" for j in range(m.shape[1])], y=[f"{i}:{t}" for i, t in enumerate(tokens)],
                               colorscale="RdBu", zmid=0.0, hovertemplate="%{y} · feature %{x}: %{z:.4f}<extra></extra>"))
    fig.update_layout(height=80 + 22 * m.shape[0], margin=dict(l=10, r=10, t=30, b=10), title=step.title,
                      yaxis=dict(autorange="reversed"), xaxis_title="feature")
    return fig


def gate_figure(gate: np.ndarray, tokens, layer: int) -> go.Figure:
    """An output gate (H x n x d_k, sigmoid values) as the mean over features per head and position."""
    g = np.asarray(gate, dtype=np.float64)
    if g.ndim != 3:
        raise ValueError(f"the gate must be heads x positions x features, not shape {g.shape}")
    z = g.mean(-1)
    fig = go.Figure(go.Heatmap(z=z, x=[f"{i}:{t}" for i, t in enumerate(tokens)], y=[f"head {h}" for h in range(z.shape[0])],
                               zmin=0.0, zmax=1.0, colorscale="Viridis",
                               hovertemplate="%{y} · %{x}: mean sigmoid %{z:.3f}<extra></extra>"))
    fig.update_layout(title=f"Layer {layer}'s output gate: mean of sigmoid(x W_g) over each head's features",
                      height=120 + 30 * z.shape[0], margin=dict(l=10, r=10, t=40, b=10), yaxis=dict(autorange="reversed"))
    return fig
