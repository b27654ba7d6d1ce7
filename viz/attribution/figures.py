"""Figures of the attribution page: the sentence coloured by each method's scores (one row per
method), the deletion curves, and scores rolled up from pieces to words. Pure functions over
core.analysis.input_attribution's frames; no Streamlit.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from core.tokens.words import word_groups
from viz.figures.heatmaps import safe_labels

LABELS = {
    "grad_x_input": "gradient × input",
    "integrated_gradients": "integrated gradients",
    "occlusion": "occlusion",
    "attention": "attention (last layer)",
    "rollout": "rollout",
    "flow": "flow",
    "value_norm": "value norms (last layer)",
    "random": "random (mean of seeded draws)",
}
DIVERGING = [[0.0, "#2166ac"], [0.5, "#f7f7f7"], [1.0, "#b2182b"]]  # signed: blue < 0 < red
SEQUENTIAL = [[0.0, "#f7f7f7"], [1.0, "#b2182b"]]  # non-negative: white .. red
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f"]


def label(method: str) -> str:
    return LABELS.get(method, method)


def word_scores(scores: Sequence[float], tokens: Sequence[str], word_ids: Sequence, special: Sequence[bool]
                ) -> Tuple[np.ndarray, List[str]]:
    """Scores rolled up to words: a word's score is the sum of its pieces' (special tokens stay
    their own word); labels are the pieces joined."""
    groups = word_groups(list(word_ids), len(tokens), list(special) if special else None)
    scores = np.asarray(scores, dtype=np.float64)
    return (np.array([scores[g].sum() for g in groups]), ["".join(tokens[i] for i in g) for g in groups])


def row_range(scores: np.ndarray, signed: bool) -> Tuple[float, float]:
    """One row's colour range: symmetric about 0 for signed scores, 0 .. max otherwise."""
    top = float(np.max(np.abs(scores))) if len(scores) else 0.0
    top = top if top > 0 else 1.0
    return (-top, top) if signed else (0.0, top)


def coloured_text(rows: Dict[str, Tuple[Sequence[float], Sequence[str]]], signed: Sequence[str],
                  title: str = "", notes: Optional[Dict[str, str]] = None) -> go.Figure:
    """The sentence as coloured text, one row per method (method -> (scores, labels)): each row
    one heatmap trace with its own colour scale (diverging about 0 for signed methods, white to
    red otherwise), the token written in its cell, the exact score on hover. `notes` add text to
    a row's name (e.g. integrated gradients' completeness error)."""
    fig = go.Figure()
    methods = list(rows)
    width = max((len(lbls) for _, lbls in rows.values()), default=1)
    for r, m in enumerate(methods):
        scores, labels = rows[m]
        z = np.asarray(scores, dtype=np.float64)
        lo, hi = row_range(z, m in signed)
        name = label(m) + (f" · {notes[m]}" if notes and m in notes else "")
        fig.add_trace(go.Heatmap(
            z=[z.tolist()], x=list(range(len(z))), y=[r], text=[safe_labels([str(t) for t in labels])],
            texttemplate="%{text}", textfont={"size": 13}, zmin=lo, zmax=hi,
            colorscale=DIVERGING if m in signed else SEQUENTIAL, showscale=False, xgap=2, ygap=6,
            customdata=[[m] * len(z)], meta=m,
            name=name, hovertemplate="%{text}<br>score %{z:.4g}<extra>" + label(m) + "</extra>"))
    fig.update_layout(title=title, height=70 + 58 * len(methods), margin=dict(l=10, r=10, t=50 if title else 10, b=10),
                      plot_bgcolor="white")
    fig.update_xaxes(visible=False, range=[-0.5, width - 0.5])
    # numeric rows named by ticks (plotly.js fails on several one-row heatmaps on a category axis)
    fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=list(range(len(methods))), automargin=True,
                     ticktext=[label(m) + (f" · {notes[m]}" if notes and m in notes else "") for m in methods],
                     showgrid=False, zeroline=False)
    return fig


def deletion_figure(curves: pd.DataFrame, target: str = "", order: Optional[Sequence[str]] = None,
                    random_sd: Optional[Sequence[float]] = None) -> go.Figure:
    """Deletion curves: p(target) as the most important tokens (by each method) are replaced by
    the baseline token's embedding, one line per method. A faithful ranking drops fast.
    `random_sd`: the spread of the random draws at each k, drawn as a band of ± 2 standard
    deviations about random's mean curve."""
    fig = go.Figure()
    methods = list(order) if order is not None else list(dict.fromkeys(curves["method"]))
    if random_sd is not None and "random" in methods:
        c = curves[curves["method"] == "random"].sort_values("k")
        sd = np.asarray(random_sd, dtype=float)[c["k"].to_numpy()]
        mean = c["prob"].to_numpy(dtype=float)
        xs = c["fraction"].tolist()
        fig.add_trace(go.Scatter(
            x=xs + xs[::-1], y=np.clip(mean + 2 * sd, 0, 1).tolist() + np.clip(mean - 2 * sd, 0, 1)[::-1].tolist(),
            fill="toself", fillcolor="rgba(127,127,127,0.18)", line={"width": 0}, hoverinfo="skip",
            name="random ± 2 sd", meta="random-band"))
    for i, m in enumerate(methods):
        c = curves[curves["method"] == m].sort_values("k")
        fig.add_trace(go.Scatter(
            x=c["fraction"].tolist(), y=c["prob"].tolist(), mode="lines+markers", name=label(m),
            line={"color": COLOURS[i % len(COLOURS)], "dash": "dot" if m == "random" else "solid"},
            customdata=c["k"].tolist(),
            hovertemplate="%{customdata} tokens replaced<br>p = %{y:.4f}<extra>" + label(m) + "</extra>"))
    fig.update_layout(title=f"Deletion curves: p({target!r}) as the top tokens are replaced" if target else
                      "Deletion curves", xaxis_title="fraction of tokens replaced (most important first)",
                      yaxis_title="p(target)", height=420, margin=dict(l=10, r=10, t=50, b=10),
                      legend={"orientation": "v"})
    fig.update_yaxes(rangemode="tozero")
    return fig


def table_for_display(table: pd.DataFrame) -> pd.DataFrame:
    """The faithfulness table with readable method names, most faithful first: the rank (ties
    share it, written "2=": not an order), the margin over random ± random's standard
    deviation, and the verdict against random."""
    out = table[["method", "comprehensiveness", "sufficiency", "difference"]].copy()
    out.insert(0, "rank", [f"{r}=" if t else str(r) for r, t in zip(table["rank"], table["tied"])])
    out.insert(2, "what", [label(m) for m in out["method"]])
    out["margin over random"] = [("" if m == "random" else f"{mg:+.4f}") + f" ± {sd:.4f}"
                                 for m, mg, sd in zip(table["method"], table["margin"], table["random_sd"])]
    out["verdict"] = table["verdict"].tolist()
    return out


def scores_csv(frames: Dict[str, pd.DataFrame]) -> str:
    """Every method's scores as one CSV: method, position, token, score."""
    parts = []
    for m, df in frames.items():
        d = df[["position", "token", "score"]].copy()
        d.insert(0, "method", m)
        parts.append(d)
    return pd.concat(parts, ignore_index=True).to_csv(index=False)
