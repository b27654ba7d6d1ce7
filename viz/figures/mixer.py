"""Figures of a token mixer that is not softmax attention (core/net/mixer.py): a
layer's implicit attention A drawn on a signed, zero-centred diverging scale (the delta rule
subtracts, so negative weights are real), a short convolution's filter (channels x taps), and
the strip of each layer's kind. Pure: tensors in, plotly Figures out."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

SIGNED_SCALE = "RdBu_r"  # blue below zero, white at zero, red above
KIND_NAME = {"softmax": "softmax", "gated_delta": "gated delta", "kimi_delta": "Kimi delta", "mamba2": "Mamba2", "short_conv": "short conv"}


def signed_limit(a: np.ndarray) -> float:
    """The colour scale's half-width: the largest |a| (1e-12 where all are zero)."""
    finite = np.abs(a[np.isfinite(a)])
    return float(max(finite.max() if finite.size else 0.0, 1e-12))


MAX_TICKS = 40  # tick labels per axis of a signed map; past that every k-th
MAX_MAP_PX = 900  # a signed map's plot height at most (28 px a row up to that)


def signed_map(a, q_toks: Sequence[str], k_toks: Sequence[str], title: str) -> go.Figure:
    """A mixer's implicit attention A (n_q x n_k, signed, lower-triangular) as a heatmap centred
    on zero; the hover gives the signed value and says that a negative weight subtracts."""
    a = np.asarray(a, dtype=float)
    lim = signed_limit(a)
    fig = go.Figure(go.Heatmap(
        z=a, x=list(range(a.shape[1])), y=list(range(a.shape[0])), colorscale=SIGNED_SCALE, zmid=0.0,
        zmin=-lim, zmax=lim, colorbar=dict(title="A (signed)"),
        customdata=[[[q, k] for k in k_toks] for q in q_toks],
        hovertemplate="query %{customdata[0]} → key %{customdata[1]}<br>A = %{z:.4f}<br>signed: a negative weight "
                      "subtracts that key's value (the delta rule removes what the state held)<extra></extra>"))
    kstep, qstep = (max(1, math.ceil(len(t) / MAX_TICKS)) for t in (k_toks, q_toks))  # a label per row up to 40
    fig.update_layout(title=title, xaxis=dict(title="key", tickvals=list(range(0, len(k_toks), kstep)),
                                              ticktext=list(k_toks)[::kstep]),
                      yaxis=dict(title="query", tickvals=list(range(0, len(q_toks), qstep)),
                                 ticktext=list(q_toks)[::qstep], autorange="reversed"),
                      height=max(320, min(28 * len(q_toks), MAX_MAP_PX) + 140))
    return fig


def filter_figure(w, title: str) -> go.Figure:
    """A short convolution's filter (channels x taps; the last tap reads the current token) as a
    signed heatmap centred on zero."""
    w = np.asarray(w, dtype=float)
    lim = signed_limit(w)
    taps = w.shape[1]
    labels = [f"t-{taps - 1 - j}" if j < taps - 1 else "t" for j in range(taps)]
    fig = go.Figure(go.Heatmap(z=w, x=labels, y=list(range(w.shape[0])), colorscale=SIGNED_SCALE, zmid=0.0,
                               zmin=-lim, zmax=lim, colorbar=dict(title="weight"),
                               hovertemplate="channel %{y}, tap %{x}<br>weight %{z:.4f}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="tap (which token it reads)", yaxis_title="channel",
                      yaxis=dict(autorange="reversed"), height=420)
    return fig


def layer_kinds_figure(names: List[str]) -> go.Figure:
    """One cell per layer, coloured and named by its token mixer (softmax / gated delta / Mamba2
    / short conv; kind_labels)."""
    order = sorted(set(names))
    z = [[order.index(n) for n in names]]
    fig = go.Figure(go.Heatmap(z=z, x=[f"L{i}" for i in range(len(names))], y=["mixer"], text=[names],
                               texttemplate="%{text}", showscale=False,
                               colorscale=[[0, "#dbe9f6"], [0.5, "#fde0c5"], [1, "#d9f0d3"]],
                               hovertemplate="layer %{x}: %{text}<extra></extra>"))
    fig.update_layout(title="Each layer's token mixer", height=160, margin=dict(t=40, b=20))
    return fig


def _ref(axis: str, idx: int) -> str:
    """The domain reference of subplot `idx` (from 1) of a make_subplots grid."""
    return f"{axis} domain" if idx == 1 else f"{axis}{idx} domain"


def kind_labels(layer_kinds: List[dict]) -> List[str]:
    """Each layer's label from model.layer_kinds: its token mixer, and a mixer beside its softmax
    attention (Falcon-H1) named after it."""
    out = []
    for k in layer_kinds:
        label = KIND_NAME.get(k.get("mixer", "softmax"), k.get("mixer", "softmax"))
        beside = (k.get("beside") or {}).get("mixer")
        out.append(f"{label} + {KIND_NAME.get(beside, beside)} beside" if beside else label)
    return out


def mixed_model_view(maps: List[Optional[list]], kinds: List[str], selected=None,
                     labels: Optional[List[str]] = None, layers: Optional[List[int]] = None) -> go.Figure:
    """The model view of a model whose layers mix tokens in more than one way: one row per layer
    named by its kind, one map per head; softmax maps on one 0-to-1 scale, a mixer's implicit
    attention on a signed scale centred on zero (its own colour bar), a layer without head maps
    (a short convolution) left empty with a note. `maps[i]`: row i's heads (n x n arrays) or
    None; `layers[i]`: the layer row i draws (default i: one row a layer; a layer with a mixer
    beside its attention, Falcon-H1, has a row for each); `selected`: (row, head) outlined."""
    rows, cols = len(maps), max([len(m) for m in maps if m] or [1])
    layers = list(range(rows)) if layers is None else list(layers)
    names = [f"L{j} · {lab}" for j, lab in zip(layers, labels or [KIND_NAME.get(k, k) for k in kinds])]
    fig = make_subplots(rows=rows, cols=cols, horizontal_spacing=0.01, vertical_spacing=0.02,
                        row_titles=names)
    signed = [np.asarray(w, dtype=float) for m, k in zip(maps, kinds) if m and k != "softmax" for w in m]
    lim = max([signed_limit(w) for w in signed] or [1.0])
    for i, (m, k) in enumerate(zip(maps, kinds)):
        if not m:
            fig.add_annotation(text=f"layer {layers[i]}: {KIND_NAME.get(k, k)}, no head map (its filter is on the map tab)",
                               xref=_ref("x", i * cols + 1), yref=_ref("y", i * cols + 1), x=0, y=0.5,
                               showarrow=False,
                               xanchor="left")
            continue
        for h, w in enumerate(m):
            w = np.asarray(w, dtype=float)
            is_mixer = k != "softmax"
            fig.add_trace(go.Heatmap(
                z=w, coloraxis="coloraxis2" if is_mixer else "coloraxis",
                hovertemplate=(f"layer {layers[i]} head {h} ({KIND_NAME.get(k, k)})<br>query %{{y}} → key %{{x}}<br>"
                               + ("A = %{z:.4f} (signed: a negative weight subtracts)" if is_mixer
                                  else "weight %{z:.4f}") + "<extra></extra>")), row=i + 1, col=h + 1)
            if selected == (i, h):
                fig.add_shape(type="rect", xref=_ref("x", i * cols + h + 1), yref=_ref("y", i * cols + h + 1),
                              x0=0, x1=1, y0=0, y1=1, line=dict(color="red", width=2))
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_layout(
        coloraxis=dict(colorscale="Blues", cmin=0, cmax=1, colorbar=dict(title="softmax", x=1.02, len=0.45, y=0.75)),
        coloraxis2=dict(colorscale=SIGNED_SCALE, cmid=0, cmin=-lim, cmax=lim,
                        colorbar=dict(title="mixer A (signed)", x=1.02, len=0.45, y=0.25)),
        height=max(300, 110 * rows + 80), title="Every layer, marked by its token mixer: softmax maps 0 to 1, "
                                                 "a mixer's implicit attention signed (white is 0)")
    return fig
