"""Figures for watching toy-translate learn: its training curve and alignment maps.

Pure functions (no Streamlit): the curve of loss, held-out exact match and alignment
accuracy against the training step, with the step being shown marked; a cross-attention map
with the known word alignment outlined; and which target rows are aligned to which source
words (core.toy.toy_task knows the alignment of any sentence of its grammar).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from viz.figures.heatmaps import attention_heatmap, fix_margins

LOSS_COLOUR, EXACT_COLOUR, ALIGN_COLOUR, BEST_COLOUR, STEP_COLOUR = "#7f7f7f", "#1f77b4", "#2ca02c", "#ff7f0e", "#d62728"
OUTLINE = "#d62728"


def smooth(values: Sequence[float], window: int = 25) -> np.ndarray:
    """A trailing mean over `window` updates (the first ones average what there is)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or window <= 1:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    idx = np.arange(1, v.size + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def training_curve(metrics: Dict, step: Optional[int] = None, losses: Optional[Dict] = None,
                   height: int = 330) -> go.Figure:
    """Loss (left axis, log scale) and held-out exact match / alignment accuracy (right axis,
    0 to 1) against the training step, one marker per saved checkpoint; `step` drawn as a
    vertical line. `metrics` is core.toy.toy_steps.load_metrics(); `losses` its per-update losses."""
    rows = metrics.get("steps", [])
    xs = [r["step"] for r in rows]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    if losses and losses.get("ce"):
        w = float(metrics.get("align_weight", 0.5))
        total = np.asarray(losses["ce"]) + w * np.asarray(losses["align"])
        fig.add_trace(go.Scatter(x=list(range(total.size)), y=smooth(total), mode="lines", name="training loss (mean of 25 updates)",
                                 line=dict(color=LOSS_COLOUR, width=1.5),
                                 hovertemplate="update %{x}<br>loss %{y:.4f}<extra></extra>"), secondary_y=False)
    with_loss = [r for r in rows if "train_loss" in r]
    fig.add_trace(go.Scatter(x=[r["step"] for r in with_loss], y=[r["train_loss"] for r in with_loss],
                             mode="markers", name="training loss at the checkpoint",
                             marker=dict(color=LOSS_COLOUR, size=7, symbol="circle-open"),
                             hovertemplate="step %{x}<br>loss %{y:.4f}<extra></extra>"), secondary_y=False)
    fig.add_trace(go.Scatter(x=xs, y=[r["exact_match"] for r in rows], mode="lines+markers",
                             name="held-out exact match", line=dict(color=EXACT_COLOUR),
                             hovertemplate="step %{x}<br>exact match %{y:.3f}<extra></extra>"), secondary_y=True)
    fig.add_trace(go.Scatter(x=xs, y=[r["alignment_accuracy"] for r in rows], mode="lines+markers",
                             name="alignment accuracy (supervised head)", line=dict(color=ALIGN_COLOUR),
                             hovertemplate="step %{x}<br>alignment %{y:.3f}<extra></extra>"), secondary_y=True)
    best = [(r["step"], r["best_unsupervised"]) for r in rows if r.get("best_unsupervised")]
    if best:
        fig.add_trace(go.Scatter(x=[s for s, _ in best], y=[b["accuracy"] for _, b in best], mode="lines+markers",
                                 name="alignment accuracy (best unsupervised head)",
                                 line=dict(color=BEST_COLOUR, dash="dot"),
                                 customdata=[f"decoder.{b['layer']} head {b['head']}" for _, b in best],
                                 hovertemplate="step %{x}<br>%{customdata}: %{y:.3f}<extra></extra>"), secondary_y=True)
    chance = metrics.get("chance_alignment")
    if chance is not None:
        fig.add_hline(y=chance, line=dict(color=ALIGN_COLOUR, dash="dash", width=1), secondary_y=True,
                      annotation_text=f"chance {chance:.2f}", annotation_position="bottom right")
    if step is not None:
        fig.add_vline(x=step, line=dict(color=STEP_COLOUR, width=2),
                      annotation_text=f"step {step}", annotation_position="top")
    fig.update_yaxes(title_text="training loss", type="log", secondary_y=False, showgrid=False)
    fig.update_yaxes(title_text="exact match / alignment", range=[-0.02, 1.05], tickmode="linear", tick0=0,
                     dtick=0.2, tickformat=".0%", secondary_y=True)
    fig.update_xaxes(title_text="training step (parameter updates)")
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=40, b=10),
                      legend=dict(orientation="h", yanchor="bottom", y=1.08, x=0, font=dict(size=11)))
    return fig


def aligned_cells(target_rows: int, alignment: Sequence[int]) -> List[Tuple[int, int]]:
    """(row, column) of every known alignment in a teacher-forced cross-attention map whose
    rows are <start> y_1 .. y_T: row j predicts target word j+1, which translates source word
    alignment[j] (-1 or missing: no source word)."""
    return [(j, int(a)) for j, a in enumerate(alignment) if j < target_rows and a is not None and a >= 0]


def alignment_map(weights, query_tokens: Sequence[str], key_tokens: Sequence[str],
                  cells: Sequence[Tuple[int, int]] = (), *, title: str = "", height: Optional[int] = None) -> go.Figure:
    """A cross-attention map (n_q x n_k, rows: decoder positions, columns: source words) with
    the known alignment outlined: one box per (row, column) in `cells`."""
    fig = attention_heatmap(weights, query_tokens, key_tokens, title=title, height=height)
    for r, c in cells:
        fig.add_shape(type="rect", x0=c - 0.5, x1=c + 0.5, y0=r - 0.5, y1=r + 0.5,
                      line=dict(color=OUTLINE, width=2.5), name="alignment")
    return fix_margins(fig, query_tokens, key_tokens, min_top=70)


def argmax_hits(weights, cells: Sequence[Tuple[int, int]]) -> Tuple[int, int]:
    """How many aligned rows have their argmax on the aligned source word (hits, rows):
    core.toy.evaluate's alignment accuracy on one sentence."""
    w = np.asarray(weights.detach().cpu().float() if hasattr(weights, "detach") else weights)
    hits = sum(int(np.argmax(w[r]) == c) for r, c in cells)
    return hits, len(cells)
