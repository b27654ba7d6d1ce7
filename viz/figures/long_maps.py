"""Views made for long documents (Explore's "Long document" tab and its long-input heatmap).
Pure functions (numpy, torch, plotly; no Streamlit); the numbers come from core.head_maps
(block means, span mass, head profiles, full-resolution blocks) and core.analysis.surprisal.

- spans: the text cut into sentences (or the user's paragraphs, at blank lines); every token
  belongs to the span where its first character lies (`split_spans`);
- the sentence x sentence map of attention mass (`span_figure`), and the text with each
  sentence shaded by the attention it receives from a chosen sentence (`shaded_frame`, a
  table Streamlit draws: no HTML is built from the user's text);
- head profiles (`profile_figure`): every layer x head's mean attention distance, mass on
  the first token and mass within the last LOCAL tokens, as heatmaps;
- the overview of one head's map (`overview_figure`: its pooled map, keys summed within a
  block so rows still sum to 1) and the full-resolution blocks a box dragged over it opens
  (`box_cells`, `zoom_rows`);
- surprisal (`surprisal_figure`): the input's tokens in reading order, coloured by -log2 p
  under the model, the entropy of the prediction on hover.
"""

from __future__ import annotations

import bisect
import re
from typing import List, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.head_maps import LOCAL
from viz.figures.heatmaps import ATTN_SCALE, UNMEASURED_AXIS, label_margins, safe_label
from viz.figures.reduce import tick_indices

SENTENCE_END = re.compile(r"(?<=[.!?…。！？])[\"'”’)\]]*\s+|\n+")
PARAGRAPH_END = re.compile(r"\n\s*\n")
LABEL_CHARS = 36  # characters of a span's text in its label
MAX_SPANS = 200  # more spans than this are merged in runs (the map has a click target per cell)


def split_spans(text: str, offsets: Sequence[Sequence[int]], mode: str = "sentences"
                ) -> Tuple[List[int], List[Tuple[int, int]], List[str]]:
    """(span of each token, each span's (first char, end char), each span's label). Spans are
    sentences (ends at . ! ? followed by space, or a line break) or paragraphs (blank lines).
    A token belongs where its first non-space character lies; tokens with no characters (special
    tokens) or only spaces join the span of the token before them. Runs of
    spans are merged when there are more than MAX_SPANS; empty spans are dropped."""
    pat = PARAGRAPH_END if mode == "paragraphs" else SENTENCE_END
    starts = [0] + [m.end() for m in pat.finditer(text) if 0 < m.end() < len(text)]
    starts = sorted(set(starts))
    if len(starts) > MAX_SPANS:
        step = -(-len(starts) // MAX_SPANS)
        starts = starts[::step]
    raw = []
    prev = 0
    for t, off in enumerate(offsets):
        a, b = (int(off[0]), int(off[1])) if off is not None and len(off) == 2 else (0, 0)
        piece = text[a:b]
        a += len(piece) - len(piece.lstrip())  # a token's leading space belongs before the sentence it starts
        s = prev if b <= a else max(0, bisect.bisect_right(starts, a) - 1)
        s = max(s, prev)  # never go back (a token inside a span that started earlier)
        raw.append(s)
        prev = s
    used = sorted(set(raw))
    index = {s: k for k, s in enumerate(used)}
    span_of = [index[s] for s in raw]
    ends = starts[1:] + [len(text)]
    ranges = [(starts[s], ends[s]) for s in used]
    labels = [f"{k}: {_short(text[a:b])}" for k, (a, b) in enumerate(ranges)]
    return span_of, ranges, labels


def _short(s: str) -> str:
    s = " ".join(s.split())
    return s if len(s) <= LABEL_CHARS else s[: LABEL_CHARS - 1] + "…"


def span_token_ranges(span_of: Sequence[int]) -> List[Tuple[int, int]]:
    """(first token, last token + 1) of each span."""
    out: List[List[int]] = []
    for t, s in enumerate(span_of):
        if s == len(out):
            out.append([t, t + 1])
        else:
            out[s][1] = t + 1
    return [tuple(r) for r in out]


def span_figure(mass, labels: Sequence[str], title: str = "", selected: Optional[Sequence[int]] = None,
                log_scale: bool = False) -> go.Figure:
    """The S x S attention mass between spans (rows: the querying span, columns: the span
    attended to; rows sum to 1), hover naming both spans and the mass. log_scale: coloured by
    log10(mass) from 1e-5 (the first sentence, an attention sink, takes most of many rows).
    selected: (first row, last row, first col, last col), as box_cells gives it, outlined.
    One heatmap, no click targets: a box dragged over it (Streamlit's box selection, `box_cells`)
    picks spans. Invisible WebGL markers, one per cell, cost the browser a WebGL context and
    their index (~0.25 s of one main-thread task on a CPU-rendered page), the heatmap alone ~0.08 s.
    Fixed margins (no automargin: plotly would measure the tick labels and draw twice)."""
    z = np.asarray(mass, dtype=np.float64)
    s = z.shape[0]
    names = [safe_label(label) for label in labels]
    custom = np.dstack([*np.meshgrid(np.array(names, dtype=object), np.array(names, dtype=object)), z.astype(object)])
    shown, lo, hi = (np.log10(np.maximum(z, 1e-5)), -5.0, 0.0) if log_scale else (z, 0.0, float(max(1e-9, z.max())))
    fig = go.Figure([go.Heatmap(
        z=shown, x=list(range(s)), y=list(range(s)), zmin=lo, zmax=hi, colorscale=ATTN_SCALE, customdata=custom,
        colorbar=dict(thickness=12, title=dict(text="log₁₀ mass" if log_scale else "mass", side="right")),
        hovertemplate="from %{customdata[1]}<br>to %{customdata[0]}<br>attention mass: %{customdata[2]:.4f}<br>"
                      "drag a box over cells to zoom to their tokens<extra></extra>")])
    every = max(1, -(-s // 40))
    fixed = dict(UNMEASURED_AXIS, showgrid=False, tickvals=list(range(0, s, every)))
    fig.update_layout(
        title=dict(text=title, x=0, y=1.0, yanchor="top", pad=dict(t=8), font=dict(size=14)),
        height=int(min(760, max(360, 160 + 14 * s))), dragmode="select",
        xaxis=dict(title="attended span (keys)", side="top", **fixed),
        yaxis=dict(title="querying span", autorange="reversed", **fixed),
        margin=dict(l=label_margins([str(s - 1)], [])["l"], r=10, t=130, b=10))
    if selected is not None:
        a0, a1, b0, b1 = selected
        fig.add_shape(type="rect", x0=b0 - 0.5, x1=b1 + 0.5, y0=a0 - 0.5, y1=a1 + 0.5,
                      line=dict(color="#d62728", width=3))
    return fig


def box_cells(selection: dict, s: int) -> Optional[Tuple[int, int, int, int]]:
    """(first row, last row, first col, last col) of the cells under a box dragged over an s x s
    map drawn with cell k at k (span_figure, overview_figure; Streamlit's selection:
    {"box": [{"x": [x0, x1], "y": [y0, y1]}]}): every cell the box touches, clamped to the map;
    None without a box."""
    try:
        box = selection["box"][0]
        xs, ys = [float(v) for v in box["x"]], [float(v) for v in box["y"]]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    if not xs or not ys:
        return None

    def cell(v: float) -> int:  # cell k covers [k - 0.5, k + 0.5)
        return int(min(s - 1, max(0, np.floor(v + 0.5))))

    return cell(min(ys)), cell(max(ys)), cell(min(xs)), cell(max(xs))


def shaded_frame(text: str, ranges: Sequence[Tuple[int, int]], values: Sequence[float], chosen: int):
    """The text as a table, one row per span in reading order, each row's text shaded by `values`
    (the attention it receives from span `chosen`, whose row is marked): a pandas Styler, which
    Streamlit draws without any HTML of ours."""
    import pandas as pd

    vals = np.asarray(values, dtype=np.float64)
    top = float(vals.max()) if len(vals) else 0.0
    frame = pd.DataFrame({"span": np.arange(len(ranges)),
                          "text": [" ".join(text[a:b].split()) for a, b in ranges],
                          "mass from the chosen span": vals})

    def shade(row):
        v = row["mass from the chosen span"]
        a = 0.0 if top <= 0 else float(np.clip(v / top, 0.0, 1.0))
        style = f"background-color: rgba(8, 81, 156, {0.85 * a:.3f}); color: {'white' if a > 0.55 else 'black'}"
        mark = "font-weight: bold" if row["span"] == chosen else ""
        return ["", f"{style}; {mark}", mark]

    return frame.style.apply(shade, axis=1).format({"mass from the chosen span": "{:.4f}"})


def profile_figure(prof: dict, first_layer: int = 0, title: str = "") -> go.Figure:
    """Three L x H heatmaps: mean attention distance (tokens), mass on the first token (the
    sink) and mass within the last LOCAL tokens (local vs global heads)."""
    panels = [("distance", "mean attention distance (tokens)", "Viridis", None),
              ("first", "mass on the first token", ATTN_SCALE, 1.0),
              ("local", f"mass within {LOCAL} tokens", ATTN_SCALE, 1.0)]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[1] for p in panels], horizontal_spacing=0.08)
    for c, (key, label, scale, top) in enumerate(panels, start=1):
        z = np.asarray(prof[key], dtype=np.float64)
        n_l, n_h = z.shape
        fig.add_trace(go.Heatmap(
            z=z, x=list(range(n_h)), y=list(range(first_layer, first_layer + n_l)), colorscale=scale, zmin=0.0,
            zmax=top, colorbar=dict(thickness=10, x=0.285 + 0.357 * (c - 1), len=0.9),
            hovertemplate=f"layer %{{y}} · head %{{x}}<br>{label}: %{{z:.3f}}<extra></extra>"), row=1, col=c)
        heads, rows = tick_indices(n_h, 32), tick_indices(n_l, 16)  # whole heads and layers, by their numbers
        fig.update_xaxes(title_text="head", row=1, col=c, tickvals=heads, ticktext=[str(h) for h in heads])
        fig.update_yaxes(autorange="reversed", row=1, col=c, title_text="layer" if c == 1 else None,
                         tickvals=[first_layer + r for r in rows], ticktext=[str(first_layer + r) for r in rows])
    n_l = np.asarray(prof["distance"]).shape[0]
    fig.update_layout(title=dict(text=title, x=0, font=dict(size=14)), height=int(min(900, 220 + 18 * n_l)),
                      margin=dict(l=10, r=10, t=90, b=10))
    return fig


def overview_figure(pooled, size: int, n: int, title: str = "", log_scale: bool = False,
                    fixed_scale: bool = True, selected: Optional[Sequence[int]] = None) -> go.Figure:
    """One head's pooled map (block means, nb x nb) drawn with keys summed within each block
    (mean x the block's width), so each drawn row sums to 1 as the token map's rows do; hover
    names each block's token range. A box dragged over blocks (box_cells) opens them at full
    resolution (zoom_rows); selected: the open box (first row, last row, first col, last col),
    outlined. One heatmap with fixed margins: no click targets (an invisible WebGL marker per
    block cost a WebGL context and ~8,000 markers at 8,000 tokens, ~0.2 s of the browser's first
    draw) and no automargin (tick labels measured and the figure drawn twice)."""
    p = np.asarray(pooled, dtype=np.float64)
    nb = p.shape[-1]
    z = overview_values(p, size, n)
    rng = [f"{b * size}–{min(n, (b + 1) * size) - 1}" for b in range(nb)]
    zz, zmax, label = (np.log10(np.maximum(z, 1e-5)), 0.0, "log₁₀ weight") if log_scale else (z, 1.0, "weight")
    custom = np.dstack([*np.meshgrid(np.array(rng, dtype=object), np.array(rng, dtype=object)), zz.astype(object)])
    fig = go.Figure([go.Heatmap(
        z=zz, x=list(range(nb)), y=list(range(nb)), zmin=(-5.0 if log_scale else 0.0) if fixed_scale else None,
        zmax=zmax if fixed_scale else None, colorscale=ATTN_SCALE, colorbar=dict(thickness=12), customdata=custom,
        hovertemplate="queries %{customdata[1]}<br>keys %{customdata[0]}<br>" + label +
                      " (keys summed, queries averaged): %{customdata[2]:.4f}<br>"
                      "drag a box over blocks to open them at full resolution<extra></extra>")])
    every = max(1, -(-nb // 16))
    ticks = list(range(0, nb, every))
    text = [str(b * size) for b in ticks]
    fixed = dict(UNMEASURED_AXIS, showgrid=False, tickvals=ticks, ticktext=text)
    fig.update_layout(
        title=dict(text=title, x=0, y=1.0, yanchor="top", pad=dict(t=8), font=dict(size=14)), height=640,
        dragmode="select", xaxis=dict(title=f"keys (blocks of {size} tokens)", side="top", **fixed),
        yaxis=dict(title=f"queries (blocks of {size} tokens)", autorange="reversed", **fixed),
        margin=dict(l=label_margins(text, [])["l"], r=10, t=130, b=10))
    if selected is not None:
        a0, a1, b0, b1 = selected
        fig.add_shape(type="rect", x0=b0 - 0.5, x1=b1 + 0.5, y0=a0 - 0.5, y1=a1 + 0.5,
                      line=dict(color="#d62728", width=2))
    return fig


def overview_values(pooled, size: int, n: int) -> np.ndarray:
    """What overview_figure draws (keys summed within a block): for tests and CSV downloads."""
    p = np.asarray(pooled, dtype=np.float64)
    widths = np.array([min(size, n - b * size) for b in range(p.shape[-1])], dtype=np.float64)
    return p * widths[None, :]


def zoom_rows(box: Sequence[int], size: int, n: int, most: Optional[int] = None
              ) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """The token ranges ((query first, end), (key first, end)) of the overview blocks in box
    (first row, last row, first col, last col), each side cut to its first `most` tokens."""
    a0, a1, b0, b1 = box
    r0, r1 = a0 * size, min(n, (a1 + 1) * size)
    c0, c1 = b0 * size, min(n, (b1 + 1) * size)
    if most is not None:
        r1, c1 = min(r1, r0 + most), min(c1, c0 + most)
    return (r0, r1), (c0, c1)


SURPRISAL_TOP = 16.0  # bits at which the colour saturates


SURPRISAL_ROW = 16  # tokens per row of the surprisal grid


def surprisal_figure(tokens: Sequence[str], surprisal: Sequence[float], entropy: Sequence[float], start: int = 0,
                     count: int = 640, per_row: int = SURPRISAL_ROW, title: str = "") -> go.Figure:
    """Tokens start .. start + count - 1 in reading order, per_row to a row, each cell coloured by
    the token's surprisal (-log2 p, bits; white at 0, dark red at SURPRISAL_TOP and above) and
    labelled with the token; hover: surprisal, the entropy of the prediction, the position."""
    n = len(tokens)
    stop = min(n, start + count)
    rows = -(-(stop - start) // per_row)
    z = np.full((rows, per_row), np.nan)
    label = np.full((rows, per_row), "", dtype=object)
    custom = np.full((rows, per_row, 3), np.nan)
    for t in range(start, stop):
        r, c = divmod(t - start, per_row)
        z[r, c] = surprisal[t]
        label[r, c] = safe_label(tokens[t])
        custom[r, c] = (t, surprisal[t], entropy[t])
    fig = go.Figure(go.Heatmap(
        z=z, text=label, texttemplate="%{text}", textfont=dict(size=11), customdata=custom, zmin=0.0,
        zmax=SURPRISAL_TOP, colorscale="Reds", xgap=1, ygap=1, hoverongaps=False,
        colorbar=dict(thickness=12, title=dict(text="bits", side="right")),
        hovertemplate="token %{customdata[0]} %{text}<br>surprisal %{customdata[1]:.2f} bits<br>"
                      "entropy of the prediction %{customdata[2]:.2f} bits<extra></extra>"))
    fig.update_layout(title=dict(text=title, x=0, font=dict(size=14)), height=int(min(2400, 110 + 26 * rows)),
                      xaxis=dict(visible=False), yaxis=dict(autorange="reversed", tickvals=list(range(rows)),
                                                            ticktext=[str(start + r * per_row) for r in range(rows)],
                                                            title="first token of the row", showgrid=False),
                      margin=dict(l=10, r=10, t=60, b=10))
    return fig
