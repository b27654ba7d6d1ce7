"""The Positions page's figures and numbers, pure: P's curves, PE_i · PE_j and its offsets, the
notes' "Show me the money" recomputed, a model's own X', P and X with their checks, RoPE's
angles and T5's position bias. The formula itself and the P heatmap, which the home path shows
too, are viz/figures/sinusoid.py; the formula is also evaluated here in degrees, to show where
the notes' worked example went wrong. No Streamlit here.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go

import core
from core import trace_names as tn
from viz.figures import sinusoid
from viz.figures.checks import Check, max_abs_diff, tolerance
from viz.figures.heatmaps import DIVERGING, fix_margins, matrix_heatmap, to_numpy
from viz.figures.reduce import tick_indices

MAX_D = 1024
MAX_N = 1024
MAX_SIDE = 256  # heatmaps larger than this per side are shown strided (exact values, fewer cells)

# Transformers handout's "Show me the money": the example word embeddings (inputs of the example, d = 4).
MONEY_TOKENS = ["show", "me", "the", "money"]
MONEY_EMBEDDINGS = np.array(
    [
        [0.12, 0.63, 0.29, 0.41],
        [0.83, 0.34, 0.04, 0.53],
        [0.39, 0.77, 0.64, 0.09],
        [0.41, 0.08, 0.51, 0.87],
    ]
)
# What the notes print for PE_{1,0} (quoted only to point out the discrepancy).
NOTES_PE_1_0 = 0.02


# ------------------------------------------------------------------ the matrix, strided
def pe_degrees(n: int, d: int, base: float = 10000.0) -> np.ndarray:
    """The same formula with the angle i / base^(2j/d) read as DEGREES (what the notes did)."""
    i = np.arange(n, dtype=np.float64)[:, None]
    two_j = np.arange(0, d, 2, dtype=np.float64)[None, :]
    angle = np.deg2rad(i / base ** (two_j / d))
    pe = np.zeros((n, d))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d // 2])
    return pe


def stride_indices(n: int, max_side: int = MAX_SIDE, pairs: bool = False) -> List[int]:
    """Indices kept when a side of n is shown in at most ~max_side cells.

    With pairs=True (dimensions) whole (sin, cos) pairs 2j, 2j+1 are kept, so a stride never
    drops every cosine column."""
    if n <= max_side:
        return list(range(n))
    if pairs:
        out = []
        for j in tick_indices((n + 1) // 2, max_side // 2):
            out += [c for c in (2 * j, 2 * j + 1) if c < n]
        return out
    return tick_indices(n, max_side)


LINE_MARGIN = dict(l=70, r=10, t=50, b=50)  # room for numeric tick labels and the axis titles
LINE_AXES = dict(xaxis_automargin=False, yaxis_automargin=False)  # so plotly does not measure them


def dimension_curves(P, dims: Sequence[int], *, title: str = "") -> go.Figure:
    """Chosen columns of P as curves over position: PE[:, dim] for each dim."""
    z = to_numpy(P)
    n, d = z.shape
    fig = go.Figure()
    for dim in dims:
        if not 0 <= dim < d:
            continue
        j = dim // 2
        kind = "sin" if dim % 2 == 0 else "cos"
        wavelength = 2 * math.pi * 10000 ** (2 * j / d)
        fig.add_trace(go.Scatter(x=list(range(n)), y=z[:, dim], mode="lines+markers" if n <= 128 else "lines",
                                 marker=dict(size=4),
                                 name=f"dim {dim}: {kind}(i·ω_{j}), period {wavelength:,.1f}"))
    fig.update_layout(title=dict(text=title, x=0), height=360, margin=LINE_MARGIN, **LINE_AXES,
                      xaxis_title="position i", yaxis_title="PE[i, dim]", yaxis_range=[-1.1, 1.1],
                      legend=dict(orientation="h", yanchor="top", y=-0.2))
    return fig


# ------------------------------------------------------------------ relative positions
def pe_dot_matrix(P) -> np.ndarray:
    """G = P P^T: G[i, j] = PE_i . PE_j = sum_j cos((i - j) ω_j) for even d, a function of i - j."""
    z = np.asarray(to_numpy(P), dtype=np.float64)
    return z @ z.T


def dot_heatmap(G: np.ndarray, idx: Sequence[int], d: int, *, title: str = "", height: int = 480) -> go.Figure:
    """Heatmap of PE_i . PE_j for the positions idx (rows and columns of G already selected)."""
    labels = [str(i) for i in idx]
    ticks = {"xaxis": sinusoid.axis_ticks(labels, 16), "yaxis": sinusoid.axis_ticks(labels, 16)}
    return matrix_heatmap(G, labels, labels, title=title, zmin=-d / 2, zmax=d / 2, colorscale=DIVERGING,
                          x_title="position j", y_title="position i", value_name="PE_i·PE_j", height=height,
                          hover_from_axes=True, layout=sinusoid.fixed_layout(ticks, None, title))


def dot_by_offset(P, anchors: Sequence[int]) -> Dict[int, Tuple[np.ndarray, np.ndarray]]:
    """For each anchor i: (deltas, PE_i . PE_{i+delta}) for every delta that stays in range."""
    z = np.asarray(to_numpy(P), dtype=np.float64)
    n = z.shape[0]
    out = {}
    for i in anchors:
        if not 0 <= i < n:
            continue
        deltas = np.arange(0, n - i)
        out[i] = (deltas, z[i + deltas] @ z[i])
    return out


def toeplitz_deviation(G: np.ndarray) -> float:
    """max |G[i, j] - G[i+1, j+1]|: zero when every diagonal is constant (depends on i - j only)."""
    if G.shape[0] < 2:
        return 0.0
    return float(np.abs(G[1:, 1:] - G[:-1, :-1]).max())


def offset_figure(curves: Dict[int, Tuple[np.ndarray, np.ndarray]], d: int, *, title: str = "") -> go.Figure:
    fig = go.Figure()
    for i, (deltas, vals) in curves.items():
        fig.add_trace(go.Scatter(x=deltas, y=vals, mode="lines", name=f"i = {i}",
                                 line=dict(width=4 if i == min(curves) else 2, dash=None if i == min(curves) else "dot")))
    fig.add_hline(y=d / 2, line_dash="dash", line_color="grey", annotation_text=f"d/2 = {d / 2:g} (δ = 0)")
    fig.update_layout(title=dict(text=title, x=0), height=480, margin=LINE_MARGIN, **LINE_AXES,
                      xaxis_title="offset δ", yaxis_title="PE_i · PE_{i+δ}",
                      legend=dict(orientation="h", yanchor="top", y=-0.18))
    return fig


# ------------------------------------------------------------------ "Show me the money"
def money_tables(d: int = 4) -> Dict[str, pd.DataFrame]:
    """The notes' example recomputed: inputs x, PE (radians), x + PE, and PE in degrees."""
    n = len(MONEY_TOKENS)
    idx = pd.Index([f"{i} {t}" for i, t in enumerate(MONEY_TOKENS)])
    cols = [str(c) for c in range(d)]
    x = MONEY_EMBEDDINGS[:, :d]
    pe = sinusoid.pe_matrix(n, d)
    return {
        "x": pd.DataFrame(x, index=idx, columns=cols),
        "pe": pd.DataFrame(pe, index=idx, columns=cols),
        "sum": pd.DataFrame(x + pe, index=idx, columns=cols),
        "pe_degrees": pd.DataFrame(pe_degrees(n, d), index=idx, columns=cols),
    }


def money_note() -> str:
    """The discrepancy between the notes and the formula, with numbers computed here."""
    rad = sinusoid.pe_matrix(4, 4)
    deg = pe_degrees(4, 4)
    return (
        f"The notes print PE₁,₀ = {NOTES_PE_1_0}. The formula in radians gives sin(1) = {rad[1, 0]:.4f} "
        f"(and cos(1) = {rad[1, 1]:.4f}, not 1). {NOTES_PE_1_0} is sin(1°) = {deg[1, 0]:.4f} rounded: the notes "
        f"evaluated the angles in degrees. Even in degrees PE₂,₀ = sin(2°) = {deg[2, 0]:.4f} and "
        f"PE₃,₀ = sin(3°) = {deg[3, 0]:.4f}. In radians the four positions are far apart "
        f"(PE₃,₀ = sin(3) = {rad[3, 0]:.4f}, PE₃,₁ = cos(3) = {rad[3, 1]:.4f}), which is what makes them "
        "distinguishable; in degrees they would barely differ."
    )


# ------------------------------------------------------------------ the model's own positions
def embed_stack(trace) -> Optional[str]:
    """'encoder' when the trace has encoder embeddings, else 'decoder' (decoder-only models)."""
    for stack in tn.STACKS:
        if tn.embed(stack, "sum") in trace:
            return stack
    return None


def model_positions(trace) -> dict:
    """The model's X' (token embeddings), P (positions, None when not additive) and X (layer-0 input)."""
    stack = embed_stack(trace)
    if stack is None:
        raise ValueError("this trace has no embeddings")
    cfg = trace.meta.get("config", {})
    tokens = trace.tokens("source" if stack == "encoder" else "target")
    tok = trace[tn.embed(stack, "tokens")].double().numpy()
    pos_name = tn.embed(stack, "positions")
    P = trace[pos_name].double().numpy() if pos_name in trace else None
    X = trace[tn.embed(stack, "sum")].double().numpy()
    info = {
        "stack": stack,
        "tokens": tokens,
        "tokens_emb": tok,
        "P": P,
        "X": X,
        "scheme": cfg.get("positional", "sinusoidal" if P is not None else "none"),
        "embed_scale": bool(cfg.get("embed_scale", False)),
        "embed_norm": bool(cfg.get("embed_norm", False)),
        "types": tn.embed(stack, "types") in trace,
        "sinusoid_layout": cfg.get("sinusoid_layout", "interleaved"),
        "d": X.shape[1],
    }
    info["checks"] = position_checks(trace, info) if P is not None else []
    return info


def _embedding(trace, stack: str):
    """The model's embedding module for `stack` (core.net.layers.Embedding), or None without a model."""
    net = getattr(trace.model, "net", None)
    return getattr(net, "src_embed" if stack == "encoder" else "tgt_embed", None)


def _model_position_table(trace, info: dict) -> Optional[np.ndarray]:
    """The model's own P for these positions, read from its checkpoint: the formula in numpy for
    sinusoidal positions, the rows of the learned table (from the configured offset) otherwise.
    None for a trace without its model (loaded from .npz) when the positions are learned."""
    n, d = info["P"].shape
    if info["scheme"] == "sinusoidal":
        return sinusoid.pe_matrix(n, d, info["sinusoid_layout"])
    emb = _embedding(trace, info["stack"])
    if emb is None or getattr(emb, "pos", None) is None:
        return None
    offset = int(trace.meta.get("config", {}).get("position_offset", 0))
    return emb.pos.weight.detach().double().cpu().numpy()[offset: offset + n]


def position_checks(trace, info: dict) -> list:
    """The model's positions checked against a second computation (viz.figures.checks.Check each):
    its recorded P against the formula in numpy (sinusoidal) or its checkpoint's table; and its
    recorded layer-0 input X against X' + that P (+ token types), then the embedding LayerNorm
    in numpy where the model has one (BERT). Tolerance 1e-4 x max(1, |value|), as the Inside page's."""
    stack, P, X = info["stack"], info["P"], info["X"]
    own = _model_position_table(trace, info)
    if own is None:
        return []
    what = ("the sinusoid formula, computed again in float64 numpy" if info["scheme"] == "sinusoidal"
            else "the rows of the checkpoint's position table")
    checks = [Check(f"the recorded P equals {what}", max_abs_diff(P, own), tolerance(own))]
    x = info["tokens_emb"] + own + (trace[tn.embed(stack, "types")].double().numpy() if info["types"] else 0.0)
    label = "the recorded layer-0 input X equals X′ + P"
    if info["embed_norm"]:
        emb = _embedding(trace, stack)
        if emb is None or emb.norm is None:
            return checks
        g, b = (t.detach().double().cpu().numpy() for t in (emb.norm.weight, emb.norm.bias))
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        x = (x - mu) / np.sqrt(var + emb.norm.eps) * g + b
        label = "the recorded layer-0 input X equals LayerNorm(X′ + P + token types), in numpy"
    checks.append(Check(label, max_abs_diff(X, x), tolerance(X)))
    return checks


def toeplitz_check(G: np.ndarray):
    """Section 3's claim as a check: every diagonal of PE·PEᵀ is constant (tolerance 1e-9 x its
    largest entry, float64)."""
    return Check("PE_i · PE_k is the same along every diagonal (neighbouring diagonal entries compared)",
                 toeplitz_deviation(G), 1e-9 * max(1.0, float(np.abs(G).max())))


def rope_angle_matrix(n: int, d_k: int, theta: float) -> np.ndarray:
    """RoPE rotation angle (radians, mod 2π) of each position and feature pair: n x d_k/2."""
    return np.mod(core.rope_angles(n, d_k, theta).numpy(), 2 * math.pi)


def rope_angle_figure(angles: np.ndarray, labels: Sequence[str]) -> go.Figure:
    """rope_angle_matrix's angles as a heatmap: one row per position (labelled), one column per feature pair."""
    return fix_margins(matrix_heatmap(angles, list(labels), [str(j) for j in range(angles.shape[1])],
                                      title="RoPE rotation angle (radians, mod 2π) per position and feature pair",
                                      zmin=0, zmax=6.2832, colorscale="Twilight", x_title="feature pair j",
                                      y_title="position: token", value_name="angle"))


def position_bias(trace) -> Optional[dict]:
    """T5's relative position bias on the user's sentence (None for other models): the bias
    of the first stack (H x n x n, shared by its layers) and, per head, its value by the
    distance j - i (the bias depends on nothing else, so each diagonal is constant)."""
    stack = embed_stack(trace)
    name = tn.self_attn(stack, 0, "position_bias") if stack else None
    if name is None or name not in trace:
        return None
    B = trace[name].double().numpy()  # H x n_q x n_k
    n_q, n_k = B.shape[1:]
    dist = np.arange(-(n_q - 1), n_k)  # j - i
    by_dist = np.stack([np.array([np.diagonal(B[h], offset=int(o))[0] for o in dist]) for h in range(B.shape[0])])
    spread = max(float(np.ptp(np.diagonal(B[h], offset=int(o)))) for h in range(B.shape[0]) for o in dist)
    return {"stack": stack, "name": name, "bias": B, "distance": dist, "by_distance": by_dist,
            "diagonal_spread": spread, "tokens": trace.tokens("source" if stack == "encoder" else "target")}


def bias_by_distance_figure(info: dict, *, title: str = "", height: int = 380) -> go.Figure:
    """One line per head: the bias added to a score, against the distance j - i of key and query."""
    fig = go.Figure()
    for h, row in enumerate(info["by_distance"]):
        fig.add_trace(go.Scatter(x=info["distance"], y=row, mode="lines+markers", name=f"head {h}",
                                 hovertemplate=f"head {h}<br>j − i = %{{x}}<br>bias = %{{y:.3f}}<extra></extra>"))
    fig.update_layout(title=title, height=height, xaxis_title="distance j − i (key − query)",
                      yaxis_title="bias added to the score", margin=dict(l=60, r=20, t=50, b=50))
    return fig


def bias_heatmap(info: dict, head: int, labels: Sequence[str]) -> go.Figure:
    """One head's position bias (position_bias's `info`) as a query x key heatmap."""
    title = f"Position bias of head {head} ({info['stack']}), trace name {info['name']}"
    return fix_margins(matrix_heatmap(info["bias"][head], list(labels), list(labels), title=title,
                                      colorscale=DIVERGING, x_title="key j", y_title="query i", value_name="bias",
                                      height=int(min(640, 220 + 18 * len(labels)))))


def learned_dot_figure(G: np.ndarray, labels: Sequence[str]) -> go.Figure:
    """P_i · P_j of a model's learned positions (pe_dot_matrix of its P), labelled by token."""
    return fix_margins(matrix_heatmap(G, list(labels), list(labels), title="learned positions: P_i · P_j",
                                      colorscale=DIVERGING, x_title="position j", y_title="position i",
                                      value_name="P_i·P_j", height=460))


NOPE_COLOUR, ROPE_COLOUR = "#E69F00", "#0072B2"


def layer_positions(kinds: Sequence[dict]) -> pd.DataFrame:
    """Each layer's positions from model.layer_kinds(stack): layer, positions ("RoPE" where it
    rotates its queries and keys, "NoPE" where it has no positions), its RoPE base (None
    without), its mask and whether its scale varies by position (Llama 4's temperature)."""
    rows = [{"layer": i, "positions": "RoPE" if k.get("positions") == "rope" else "NoPE" if k.get("positions") == "none"
             else str(k.get("positions")), "RoPE base": k.get("rope_theta"), "mask": k.get("mask", ""),
             "scale": k.get("scale", "fixed")} for i, k in enumerate(kinds)]
    return pd.DataFrame(rows, columns=["layer", "positions", "RoPE base", "mask", "scale"])


def layer_positions_figure(table: pd.DataFrame, model_name: str = "") -> go.Figure:
    """layer_positions as one bar per layer: blue where the layer rotates (RoPE, its base
    written on the bar), orange where it has no positions (NoPE)."""
    colours = [ROPE_COLOUR if p == "RoPE" else NOPE_COLOUR if p == "NoPE" else "#7f7f7f" for p in table["positions"]]
    text = [f"RoPE θ={b:g}" if p == "RoPE" and b is not None else p
            for p, b in zip(table["positions"], table["RoPE base"])]
    hover = [f"layer {r.layer}: {t}<br>mask: {r.mask}<br>scale: {r.scale}<extra></extra>"
             for r, t in zip(table.itertuples(), text)]
    fig = go.Figure(go.Bar(x=[f"L{i}" for i in table["layer"]], y=[1] * len(table), marker_color=colours, text=text,
                           textposition="inside", insidetextanchor="middle", textangle=-90 if len(table) > 8 else 0,
                           hovertemplate=hover, customdata=list(table["positions"])))
    n_nope = int((table["positions"] == "NoPE").sum())
    title = (f"{model_name}: which layers rotate q and k (RoPE, blue) and which have no positions (NoPE, orange)"
             + (f" · {n_nope} of {len(table)} NoPE" if n_nope else ""))
    fig.update_layout(title=dict(text=title, x=0, font=dict(size=14)), height=220, bargap=0.08,
                      yaxis=dict(visible=False, range=[0, 1]), xaxis=dict(title="layer", type="category"),
                      margin=dict(l=10, r=10, t=50, b=40), showlegend=False)
    return fig
