"""Every step of the decoder stepper in one figure, stepped in the browser.

The page's Previous / Next rerun the stepper's fragment: the server sends five new charts
and plotly.js draws them, which costs a few hundred ms on a slow machine whatever the model
(docs/benchmarks.md, the "floor" rows). This figure holds all steps at once for one layer
and head: M, the masked scores QKᵀ/√d_k + M and the weights S' side by side on axes as long
as the whole run, and a slider whose steps restyle the three heatmaps in place (plotly's
"update" method), so a step costs one redraw in the page and no round trip.

Step t shows the maps of the step's own trace (the caller passes them), padded with blank
cells for the positions that do not exist yet; the axis labels name only the tokens the step
has seen, so nothing of the future shows. Pure: no Streamlit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import plotly.graph_objects as go

from viz.figures import ATTN_SCALE, DIVERGING, safe_labels, to_numpy

UP_TO = 48  # positions (prefix + generated) up to which every step fits in one figure
VALUES_UP_TO = 8  # numbers in the cells of the scores and weights up to this many positions
MASK_TEXT_UP_TO = 12  # "0" / "-∞" in the mask's cells up to this many positions (smaller cells: colour only)
PANELS = ("Look-ahead mask M", "Masked scores QKᵀ/√d_k + M", "Weights S' = softmax(…)")
ALLOWED, MASKED = "#eaf2fb", "#b0b0b0"


@dataclass
class StepMaps:
    """One step: its three n x n maps (n = the decoder input so far), its tokens, its newest
    row and the token it chooses."""
    mask: np.ndarray
    masked: np.ndarray
    weights: np.ndarray
    tokens: Sequence[str]
    row: int
    chosen: str


def fits(n_positions: int) -> bool:
    return n_positions <= UP_TO


def _padded(m: np.ndarray, side: int) -> np.ndarray:
    out = np.full((side, side), np.nan)
    out[: m.shape[0], : m.shape[1]] = m
    return out


def _cells(z: np.ndarray, decimals: int = 4) -> list:
    """Nested lists with None for blank cells (plain JSON, which plotly's restyle reads as is)."""
    return np.where(np.isfinite(z), np.round(z, decimals), None).tolist()


def _texts(cells: np.ndarray, fmt) -> list:
    return [["" if v is None else fmt(v) for v in row] for row in cells]


def step_data(s: StepMaps, side: int) -> dict:
    """The three heatmaps' z (and text) for one step, on `side` x `side` axes."""
    n = len(s.tokens)
    mask = to_numpy(s.mask)[:n, :n]
    masked = to_numpy(s.masked)[:n, :n]
    weights = to_numpy(s.weights)[:n, :n]
    m = _padded(np.where(np.isneginf(mask), 1.0, 0.0), side)  # 0: may look (light), 1: -∞ (grey)
    sc = _padded(np.where(np.isfinite(masked), masked, np.nan), side)
    sc_neg = _padded(np.isneginf(masked).astype(float), side) == 1
    w = _padded(weights, side)
    z = [_cells(m, 0), _cells(sc), _cells(w)]
    text = [None, None, None]
    if side <= MASK_TEXT_UP_TO:
        text[0] = [["" if v is None else ("-∞" if v == 1 else "0") for v in row] for row in z[0]]
    if side <= VALUES_UP_TO:
        text[1] = [["-∞" if neg else ("" if v is None else f"{v:.2f}") for v, neg in zip(row, nrow)]
                   for row, nrow in zip(z[1], sc_neg)]
        text[2] = _texts(z[2], lambda v: f"{v:.2f}")
    return {"z": z, "text": text}


def steps_figure(steps: List[StepMaps], *, where: str = "", active: int = 0, height: int = 560) -> go.Figure:
    """All steps in one figure with a slider (see the module's docstring). `active`: the step
    (from 0) shown first. The scores share one colour scale over every step, so a colour means
    the same number at every step."""
    if not steps:
        raise ValueError("steps_figure needs at least one step")
    side = max(len(s.tokens) for s in steps)
    if not fits(side):
        raise ValueError(f"{side} positions do not fit one figure of every step (up to {UP_TO})")
    finite = np.concatenate([to_numpy(s.masked)[np.isfinite(to_numpy(s.masked))] for s in steps] + [np.zeros(1)])
    span = float(np.max(np.abs(finite))) or 1.0
    data = [step_data(s, side) for s in steps]
    gap = 0.07
    width = (1 - 2 * gap) / 3
    domains = [(i * (width + gap), i * (width + gap) + width) for i in range(3)]
    first = data[active]
    pos = list(range(side))
    common = dict(x=pos, y=pos, xgap=1, ygap=1, texttemplate="%{text}",
                  textfont=dict(size=11 if side <= VALUES_UP_TO else 9))
    traces = [
        go.Heatmap(z=first["z"][0], text=first["text"][0], zmin=0, zmax=1, showscale=False,
                   colorscale=[[0, ALLOWED], [1, MASKED]], xaxis="x", yaxis="y",
                   hovertemplate="query %{y} · key %{x}<br>M = %{text}<extra></extra>" if side <= MASK_TEXT_UP_TO
                   else "query %{y} · key %{x}<br>M = 0 (light) or −∞ (grey)<extra></extra>", **common),
        go.Heatmap(z=first["z"][1], text=first["text"][1], zmin=-span, zmax=span, colorscale=DIVERGING,
                   xaxis="x2", yaxis="y2", colorbar=dict(x=domains[1][1] + 0.005, thickness=10, len=0.8),
                   hovertemplate="query %{y} · key %{x}<br>score %{z:.4f}<extra></extra>", **common),
        go.Heatmap(z=first["z"][2], text=first["text"][2], zmin=0, zmax=1, colorscale=ATTN_SCALE,
                   xaxis="x3", yaxis="y3", colorbar=dict(x=1.005, thickness=10, len=0.8),
                   hovertemplate="query %{y} · key %{x}<br>weight %{z:.4f}<extra></extra>", **common),
    ]
    layout = dict(height=height, margin=dict(l=10, r=40, t=120, b=70), plot_bgcolor="white",
                  title=dict(text=_title(steps, active, where), x=0, y=0.985, yref="container", yanchor="top",
                             font=dict(size=14)),
                  annotations=[dict(text=t, x=(d0 + d1) / 2, y=1.0, xref="paper", yref="paper", yshift=70,
                                    showarrow=False, font=dict(size=13)) for t, (d0, d1) in zip(PANELS, domains)],
                  shapes=[_row_box(i, steps[active].row, len(steps[active].tokens)) for i in range(3)],
                  sliders=[dict(active=active, currentvalue=dict(prefix="Step "), pad=dict(t=10),
                                steps=[dict(method="update", label=str(t + 1),
                                            args=[{k: v for k, v in d.items()}, _step_layout(steps, t, side, where)])
                                       for t, d in enumerate(data)])])
    for i, (d0, d1) in enumerate(domains):
        suffix = "" if i == 0 else str(i + 1)
        ticks = _tick_text(steps[active].tokens, side)
        layout[f"xaxis{suffix}"] = dict(domain=[d0, d1], anchor=f"y{suffix}", side="top", tickangle=-45,
                                        tickvals=pos, ticktext=ticks, showgrid=False, zeroline=False,
                                        range=[-0.5, side - 0.5], constrain="domain")
        layout[f"yaxis{suffix}"] = dict(anchor=f"x{suffix}", tickvals=pos, ticktext=ticks, showgrid=False,
                                        zeroline=False, range=[side - 0.5, -0.5], scaleanchor=f"x{suffix}",
                                        constrain="domain", constraintoward="top", showticklabels=i == 0)
    return go.Figure(traces, layout=layout)


def _title(steps: List[StepMaps], t: int, where: str) -> str:
    s = steps[t]
    return (f"Step {t + 1} of {len(steps)}{' · ' + where if where else ''}: row {s.row} "
            f"({safe_labels([s.tokens[s.row]])[0]}) is the newest, and the step chooses "
            f"{safe_labels([s.chosen])[0]}")


def _tick_text(tokens: Sequence[str], side: int) -> list:
    return safe_labels(tokens) + [""] * (side - len(tokens))


def _row_box(panel: int, row: int, n: int) -> dict:
    """The outline of the newest row, over the step's n keys."""
    suffix = "" if panel == 0 else str(panel + 1)
    return dict(type="rect", xref=f"x{suffix}", yref=f"y{suffix}", x0=-0.5, x1=n - 0.5, y0=row - 0.5,
                y1=row + 0.5, line=dict(color="#d62728", width=2))


def _step_layout(steps: List[StepMaps], t: int, side: int, where: str) -> dict:
    ticks = _tick_text(steps[t].tokens, side)
    out = {"title.text": _title(steps, t, where)}
    for i in range(3):
        suffix = "" if i == 0 else str(i + 1)
        out[f"xaxis{suffix}.ticktext"] = ticks
        out[f"yaxis{suffix}.ticktext"] = ticks
        out[f"shapes[{i}].y0"] = steps[t].row - 0.5
        out[f"shapes[{i}].y1"] = steps[t].row + 0.5
        out[f"shapes[{i}].x1"] = len(steps[t].tokens) - 0.5
    return out


def slider_step(fig: go.Figure, t: int) -> dict:
    """The restyle of step t (from 0) as the browser applies it: {"z": [M, scores, weights], "text": [...]}."""
    return fig.layout.sliders[0].steps[t].args[0]


def inference_steps(steps: Sequence, *, layer: int, head: int) -> List[StepMaps]:
    """StepMaps of greedy decoding, each from the step's own trace (`core`'s Model.steps)."""
    from viz.decoder import head_matrix, newest_row

    name = f"decoder.{layer}.self_attn."
    return [StepMaps(head_matrix(tr, name + "mask", head), head_matrix(tr, name + "masked", head),
                     head_matrix(tr, name + "weights", head), tr.tokens("target"), newest_row(tr), tr.meta["chosen"])
            for tr in steps]


__all__ = ["StepMaps", "UP_TO", "fits", "step_data", "steps_figure", "slider_step", "inference_steps"]
