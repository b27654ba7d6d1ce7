"""Every step of the decoder stepper in one figure, stepped in the browser.

The page's Previous / Next rerun the stepper's fragment: the server sends five new charts
and plotly.js draws them, which costs a few hundred ms on a slow machine whatever the model
(docs/benchmarks.md, the "floor" rows). This figure holds all steps at once for one layer
and head: M, the masked scores QKᵀ/√d_k + M and the weights S' side by side, and a slider
whose steps restyle the three heatmaps in place (plotly's "update" method), so a step costs
one redraw in the page and no round trip.

Step t shows the maps of the step's own trace (`inference_steps` reads them). Up to WINDOW
positions the axes are as long as the whole run and a step's maps grow by one row and column,
blank where a position does not exist yet; the axis labels name only the tokens the step has
seen, so nothing of the future shows. A longer run (a long prompt) shows each step's last
WINDOW rows, with one first column that sums the weights of every key before them, so the
rows still sum to 1 and an attention sink on the first tokens stays visible. Pure: no Streamlit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np
import plotly.graph_objects as go

from core import trace_names as tn
from viz.figures.heatmaps import ATTN_SCALE, CHAR_PX, DIVERGING, MAX_LABEL_CHARS, safe_labels, to_numpy

WINDOW = 48  # rows shown per step: the whole decoder input up to this long, else its last WINDOW positions
VALUES_UP_TO = 8  # numbers in the cells of the scores and weights up to this many rows
GAPS_UP_TO = 16  # a 1-px gap between cells up to this many rows (beyond, it hides the cells and costs time)
ZWSP = "\u200b"  # zero-width space: keeps repeated tokens apart on a category axis, invisibly
MASK_TEXT_UP_TO = 12  # "0" / "-∞" in the mask's cells up to this many rows (smaller cells: colour only)
PANELS = ("Look-ahead mask M", "Masked scores QKᵀ/√d_k + M", "Weights S' = softmax(…)")
ALLOWED, MASKED = "#eaf2fb", "#b0b0b0"
HOVER = "query %{y} · key %{x}<br>"  # a cell's tokens, read from the category axes


@dataclass
class StepMaps:
    """One step's three maps, n_q x n_k: its queries (the decoder input so far, or the last
    WINDOW positions of it) over its keys (the same positions, after one column that sums the
    keys before the window, if any); the newest row, the token the step chooses, and where
    the rows start in the decoder input."""
    mask: np.ndarray
    masked: np.ndarray
    weights: np.ndarray
    q_labels: Sequence[str]
    k_labels: Sequence[str]
    row: int
    chosen: str
    first: int = 0  # position of the first row
    earlier: int = 0  # keys before the window, summed (weights) / averaged (scores) into column 0


def window(mask, masked, weights, tokens: Sequence[str], chosen: str, size: int = WINDOW) -> StepMaps:
    """A step's maps as StepMaps: n x n (n = len(tokens)), or already only their last
    min(n, size) rows. Whole up to `size` positions; beyond, the last `size` rows, whose keys
    before the window become one column: their weights summed (each row still sums to 1) and
    their scores averaged. Every earlier key is visible to those rows, so that column's M is 0."""
    n = len(tokens)
    s = max(0, n - size)
    mask, masked, weights = (np.asarray(to_numpy(m), dtype=np.float64) for m in (mask, masked, weights))
    mask, masked, weights = (m[s:] if m.shape[0] == n else m for m in (mask, masked, weights))
    if not s:
        return StepMaps(mask, masked, weights, list(tokens), list(tokens), n - 1, chosen)
    with np.errstate(invalid="ignore"):
        earlier_scores = masked[:, :s].mean(axis=1, keepdims=True)
    col = lambda m, c: np.concatenate([c, m[:, s:]], axis=1)  # noqa: E731
    return StepMaps(col(mask, np.zeros((size, 1))), col(masked, earlier_scores),
                    col(weights, weights[:, :s].sum(axis=1, keepdims=True)), list(tokens[s:]),
                    [f"Σ keys 0–{s - 1}"] + list(tokens[s:]), size - 1, chosen, first=s, earlier=s)


def _padded(m: np.ndarray, n_q: int, n_k: int) -> np.ndarray:
    out = np.full((n_q, n_k), np.nan)
    out[: m.shape[0], : m.shape[1]] = m
    return out


def _cells(z: np.ndarray, decimals: int = 4) -> list:
    """Nested lists with None for blank cells (plain JSON, which plotly's restyle reads as is)."""
    return np.where(np.isfinite(z), np.round(z, decimals), None).tolist()


def step_data(s: StepMaps, n_q: int, n_k: int) -> dict:
    """The three heatmaps' z, text and axis labels for one step, on n_q x n_k cells (blank beyond
    the step's). The labels travel with the data: category axes, so a step restyles the traces
    alone (a relayout of each axis's ticks would cost plotly a second redraw)."""
    m = _padded(np.where(np.isneginf(s.mask), 1.0, 0.0), n_q, n_k)  # 0: may look (light), 1: -∞ (grey)
    sc = _padded(np.where(np.isfinite(s.masked), s.masked, np.nan), n_q, n_k)
    sc_neg = _padded(np.isneginf(s.masked).astype(float), n_q, n_k) == 1
    z = [_cells(m, 0), _cells(sc), _cells(_padded(s.weights, n_q, n_k))]
    text = [None, None, None]
    if n_q <= MASK_TEXT_UP_TO:
        text[0] = [["" if v is None else ("-∞" if v == 1 else "0") for v in row] for row in z[0]]
    if n_q <= VALUES_UP_TO:
        text[1] = [["-∞" if neg else ("" if v is None else f"{v:.2f}") for v, neg in zip(row, nrow)]
                   for row, nrow in zip(z[1], sc_neg)]
        text[2] = [["" if v is None else f"{v:.2f}" for v in row] for row in z[2]]
    return {"z": z, "text": text, "x": [_distinct(s.k_labels, n_k)] * 3, "y": [_distinct(s.q_labels, n_q)] * 3}


def steps_figure(steps: List[StepMaps], *, where: str = "", active: int = 0, height: int = 560) -> go.Figure:
    """All steps in one figure with a slider (see the module's docstring). `active`: the step
    (from 0) shown first. The scores share one colour scale over every step, so a colour means
    the same number at every step."""
    if not steps:
        raise ValueError("steps_figure needs at least one step")
    n_q, n_k = max(len(s.q_labels) for s in steps), max(len(s.k_labels) for s in steps)
    finite = np.concatenate([s.masked[np.isfinite(s.masked)] for s in steps] + [np.zeros(1)])
    span = float(np.max(np.abs(finite))) or 1.0
    data = [step_data(s, n_q, n_k) for s in steps]
    gap = 0.07
    width = (1 - 2 * gap) / 3
    domains = [(i * (width + gap), i * (width + gap) + width) for i in range(3)]
    first = data[active]
    gap_px = 1 if n_q <= GAPS_UP_TO else 0  # white lines between cells while cells are wide enough
    common = dict(x=first["x"][0], y=first["y"][0], xgap=gap_px, ygap=gap_px, texttemplate="%{text}",
                  textfont=dict(size=11 if n_q <= VALUES_UP_TO else 9))
    traces = [
        go.Heatmap(z=first["z"][0], text=first["text"][0], zmin=0, zmax=1, showscale=False,
                   colorscale=[[0, ALLOWED], [1, MASKED]], xaxis="x", yaxis="y",
                   hovertemplate=HOVER + "M = " + ("%{text}" if n_q <= MASK_TEXT_UP_TO else "0 (light) or −∞ (grey)")
                   + "<extra></extra>", **common),
        go.Heatmap(z=first["z"][1], text=first["text"][1], zmin=-span, zmax=span, colorscale=DIVERGING,
                   xaxis="x2", yaxis="y2", colorbar=dict(x=domains[1][1] + 0.005, thickness=10, len=0.8),
                   hovertemplate=HOVER + "score %{z:.4f}<extra></extra>", **common),
        go.Heatmap(z=first["z"][2], text=first["text"][2], zmin=0, zmax=1, colorscale=ATTN_SCALE,
                   xaxis="x3", yaxis="y3", colorbar=dict(x=1.005, thickness=10, len=0.8),
                   hovertemplate=HOVER + "weight %{z:.4f}<extra></extra>", **common),
    ]
    # Fixed margins that fit the run's longest labels (x at -45°): with plotly's automargin each
    # step would measure every tick label and draw again when a margin moved.
    longest = lambda labels: min(MAX_LABEL_CHARS, max(len(lab) for lab in labels))  # noqa: E731
    x_px = int(CHAR_PX * longest([lab for s in steps for lab in s.k_labels]) * 0.71) + 12
    left = int(CHAR_PX * longest([lab for s in steps for lab in s.q_labels])) + 16
    layout = dict(height=height, margin=dict(l=left, r=40, t=x_px + 70, b=70), plot_bgcolor="white",
                  title=dict(text=_title(steps, active, where), x=0, y=0.985, yref="container", yanchor="top",
                             font=dict(size=14)),
                  annotations=[dict(text=t, x=(d0 + d1) / 2, y=1.0, xref="paper", yref="paper", yshift=x_px + 12,
                                    showarrow=False, font=dict(size=13)) for t, (d0, d1) in zip(PANELS, domains)],
                  shapes=[_row_box(i, steps[active]) for i in range(3)],
                  sliders=[dict(active=active, currentvalue=dict(prefix="Step "), pad=dict(t=10),
                                steps=[dict(method="update", label=str(t + 1),
                                            args=[d, _step_layout(steps, t, where)])
                                       for t, d in enumerate(data)])])
    for i, (d0, d1) in enumerate(domains):
        suffix = "" if i == 0 else str(i + 1)
        layout[f"xaxis{suffix}"] = dict(domain=[d0, d1], anchor=f"y{suffix}", side="top", tickangle=-45,
                                        type="category", ticks="", showgrid=False, zeroline=False,
                                        range=[-0.5, n_k - 0.5], constrain="domain", automargin=False,
                                        ticklabeloverflow="allow")
        layout[f"yaxis{suffix}"] = dict(anchor=f"x{suffix}", type="category", ticks="",
                                        showgrid=False, zeroline=False, range=[n_q - 0.5, -0.5],
                                        scaleanchor=f"x{suffix}", constrain="domain", constraintoward="top",
                                        showticklabels=i == 0, automargin=False, ticklabeloverflow="allow")
    return go.Figure(traces, layout=layout)


def _title(steps: List[StepMaps], t: int, where: str) -> str:
    s = steps[t]
    shown = "" if not s.earlier else (f" (rows {s.first}–{s.first + len(s.q_labels) - 1}; column 0 sums "
                                      f"keys 0–{s.earlier - 1})")
    return (f"Step {t + 1} of {len(steps)}{' · ' + where if where else ''}: row {s.first + s.row} "
            f"({safe_labels([s.q_labels[s.row]])[0]}) is the newest, and the step chooses "
            f"{safe_labels([s.chosen])[0]}{shown}")


def _distinct(labels: Sequence[str], n: int) -> list:
    """n category names: the labels, a repeated one made distinct by zero-width spaces (so two
    "the" keep two columns and both read "the"), then blank names for positions not there yet."""
    out, seen = [], {}
    for label in safe_labels(labels):
        k = seen.get(label, 0)
        seen[label] = k + 1
        out.append(label + ZWSP * k)
    return out + [ZWSP * (i + 1) for i in range(n - len(out))]


def _row_box(panel: int, s: StepMaps) -> dict:
    """The outline of the newest row, over the step's keys."""
    suffix = "" if panel == 0 else str(panel + 1)
    return dict(type="rect", xref=f"x{suffix}", yref=f"y{suffix}", x0=-0.5, x1=len(s.k_labels) - 0.5,
                y0=s.row - 0.5, y1=s.row + 0.5, line=dict(color="#d62728", width=2))


def _step_layout(steps: List[StepMaps], t: int, where: str) -> dict:
    out = {"title.text": _title(steps, t, where)}
    for i in range(3):
        box = _row_box(i, steps[t])
        for k in ("x1", "y0", "y1"):
            out[f"shapes[{i}].{k}"] = box[k]
    return out


def slider_step(fig: go.Figure, t: int) -> dict:
    """The restyle of step t (from 0) as the browser applies it: {"z": [M, scores, weights],
    "text": [...], "x": [...], "y": [...]}."""
    return fig.layout.sliders[0].steps[t].args[0]


def inference_steps(steps: Sequence, *, layer: int, head: int, size: int = WINDOW) -> List[StepMaps]:
    """StepMaps of greedy decoding, each from the step's own trace (`core`'s Model.steps),
    windowed to its last `size` rows (see `window`)."""
    from viz.decoder.figures import head_matrix

    out = []
    for tr in steps:
        tokens = tr.tokens("target")
        s = max(0, len(tokens) - size)
        rows = [head_matrix(tr, tn.self_attn("decoder", layer, k), head, rows_from=s) for k in ("mask", "masked", "weights")]
        out.append(window(*rows, tokens, tr.meta["chosen"], size))
    return out


__all__ = ["StepMaps", "WINDOW", "window", "step_data", "steps_figure", "slider_step", "inference_steps"]
