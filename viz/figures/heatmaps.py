"""Figure builders: pure functions from tensors or a Trace to plotly figures.

No Streamlit here, so every function works in Jupyter too. Token labels are escaped
(plotly would otherwise read "<b>" or "<start>" as markup) and axes are numeric with
token tick labels, so repeated tokens ("the ... the") keep their own rows and columns.
"""

from __future__ import annotations

import html
import math
from typing import Optional, Sequence

import numpy as np
import plotly.graph_objects as go

from viz.figures.reduce import thinned
from viz.figures.text import html_text, token_text

ATTN_SCALE = "Blues"
DIVERGING = "RdBu_r"
MAX_TICKS = 64  # beyond this many tokens, label every k-th tick
HOVER_LABEL_CELLS = 40_000  # larger maps name cells through their axes (labels per cell cost ~40 bytes each)
NEG_INF_TEXT_UP_TO = 32  # write '-∞' in masked cells up to this many rows and columns; beyond, cells are
# too small to read it, and plotly draws one SVG text per cell (seconds for a 96 x 96 map)


def safe_label(tok: str) -> str:
    """A token as plain text for plotly (escapes markup once, shows whitespace). Figures built
    by matrix_heatmap / attention_heatmap take the tokens as they are and call this themselves."""
    return html_text(token_text(tok.replace("\t", "\\t")))


def safe_labels(tokens: Sequence[str]) -> list:
    return [safe_label(t) for t in tokens]


def to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float64 if np.asarray(x).dtype == np.float64 else np.float32)


def _ticks(labels: Sequence[str]):
    return thinned(labels, MAX_TICKS)


def matrix_heatmap(
    z,
    y_labels: Optional[Sequence[str]] = None,
    x_labels: Optional[Sequence[str]] = None,
    *,
    title: str = "",
    zmin: Optional[float] = None,
    zmax: Optional[float] = None,
    colorscale: str = ATTN_SCALE,
    x_title: str = "",
    y_title: str = "",
    value_name: str = "value",
    highlight_row: Optional[int] = None,
    show_values: bool = False,
    height: Optional[int] = None,
    neg_inf_text: bool = True,
    hover_labels: bool = True,
    hover_from_axes: bool = False,
    layout: Optional[dict] = None,
) -> go.Figure:
    """A labelled heatmap of any 2-D matrix. -inf cells are drawn blank and read '-inf'.
    hover_labels=False: the hover names cells by index only (no per-cell token labels to send).
    hover_from_axes=True, when every label of each axis is distinct (a long map's block labels):
    the axes are category axes whose values are the labels, and the hover reads a cell's labels
    from them, so n_x + n_y labels are sent instead of two per cell (0.5 MB for a 96 x 96 map).
    A map of more than HOVER_LABEL_CELLS cells (a long input drawn at full resolution) does the
    same with labels made distinct by their position ("bank (12)"), so its hover names the
    tokens too, not only their positions.
    Positions (ticks, the highlighted row) stay numeric: category i sits at i.
    layout: merged into the figure's layout (each of its dicts key by key) before the one
    constructor call, e.g. fixed margins and ticks (cheaper than an update afterwards)."""
    z = to_numpy(z)
    n_y, n_x = z.shape
    y_labels = safe_labels(y_labels) if y_labels is not None else [str(i) for i in range(n_y)]
    x_labels = safe_labels(x_labels) if x_labels is not None else [str(i) for i in range(n_x)]
    finite = np.where(np.isfinite(z), z, np.nan)
    text = None
    if neg_inf_text and max(n_x, n_y) <= NEG_INF_TEXT_UP_TO and np.isneginf(z).any() or show_values:
        text = np.where(np.isneginf(z), "-∞", np.char.mod("%.2f", np.nan_to_num(z, neginf=0.0)))
        if not show_values:
            text = np.where(np.isneginf(z), "-∞", "")
    on_axes = hover_labels and hover_from_axes and len(set(x_labels)) == n_x and len(set(y_labels)) == n_y
    x_values, y_values = x_labels, y_labels
    if hover_labels and not on_axes and n_x * n_y > HOVER_LABEL_CELLS:  # too many cells for labels per cell
        on_axes = True
        x_values = [f"{t} ({i})" for i, t in enumerate(x_labels)]
        y_values = [f"{t} ({i})" for i, t in enumerate(y_labels)]
    if on_axes:
        custom = None
        hover = (f"{y_title or 'row'}: %{{y}}<br>{x_title or 'column'}: %{{x}}<br>{value_name}: %{{z:.4f}}"
                 "<extra></extra>")
    elif hover_labels and n_x * n_y <= HOVER_LABEL_CELLS:  # token names in the hover; beyond this, indices only
        custom = np.dstack(np.meshgrid(np.array(x_labels, dtype=str), np.array(y_labels, dtype=str)))
        hover = (f"{y_title or 'row'}: %{{customdata[1]}} (%{{y}})<br>{x_title or 'column'}: %{{customdata[0]}} "
                 f"(%{{x}})<br>{value_name}: %{{z:.4f}}<extra></extra>")
    else:
        custom = None
        hover = f"{y_title or 'row'} %{{y}}<br>{x_title or 'column'} %{{x}}<br>{value_name}: %{{z:.4f}}<extra></extra>"
    heatmap = dict(z=finite, x=x_values if on_axes else list(range(n_x)), y=y_values if on_axes else list(range(n_y)),
                   zmin=zmin, zmax=zmax, colorscale=colorscale, customdata=custom, hovertemplate=hover, text=text,
                   texttemplate="%{text}" if text is not None else None,
                   # its numbers fit the bar's own margin: plotly need not measure each for overflow
                   colorbar=dict(thickness=12, ticklabeloverflow="allow"))
    if max(n_x, n_y) > 200:
        heatmap["hoverongaps"] = False
    xt, xl = _ticks(x_labels)
    yt, yl = _ticks(y_labels)
    axis_type = "category" if on_axes else None
    extra, layout = layout or {}, dict(
        xaxis=dict(tickvals=xt, ticktext=xl, title=x_title, side="top", tickangle=-45, showgrid=False, type=axis_type),
        yaxis=dict(tickvals=yt, ticktext=yl, title=y_title, autorange="reversed", showgrid=False, type=axis_type),
        title=dict(text=title, x=0, font=dict(size=14)),
        height=height or int(min(900, max(320, 120 + 22 * n_y))),
        margin=dict(l=10, r=10, t=90 if title else 60, b=10),
        plot_bgcolor="#f4f4f4" if np.isneginf(z).any() else None,
    )
    if highlight_row is not None and 0 <= highlight_row < n_y:
        layout["shapes"] = [dict(type="rect", x0=-0.5, x1=n_x - 0.5, y0=highlight_row - 0.5, y1=highlight_row + 0.5,
                                 line=dict(color="#d62728", width=3))]
    for k, v in extra.items():
        layout[k] = {**layout[k], **v} if isinstance(v, dict) and isinstance(layout.get(k), dict) else v
    # one constructor call: each plotly update_* call validates its path anew (docs/decisions.md,
    # "A heatmap is one constructor call")
    return go.Figure(go.Heatmap(**heatmap), layout=layout)


CHAR_PX = 7.5  # an upper bound on the width of a character of plotly's 12 px tick labels
MAX_LABEL_CHARS = 30  # margins fit labels up to this long; longer ones may be cut at the edge


def label_margins(y_labels: Sequence[str], x_labels: Sequence[str]) -> dict:
    """Left and top margins (px) that fit these y tick labels (left) and x tick labels (on
    top, at -45°), with the axis titles and a figure title above them."""
    def longest(labels):
        return min(MAX_LABEL_CHARS, max((len(html.unescape(safe_label(t))) for t in labels), default=1))
    left = 10 + 22 + int(CHAR_PX * longest(y_labels)) + 8
    top = 40 + 22 + int(CHAR_PX * longest(x_labels) * 0.71 + 9) + 8
    return {"l": left, "t": top}


def fix_margins(fig: go.Figure, y_labels: Optional[Sequence[str]] = None,
                x_labels: Optional[Sequence[str]] = None, min_top: int = 115) -> go.Figure:
    """A heatmap from matrix_heatmap with fixed margins instead of plotly's automargin.

    Automargin measures every tick label and draws the figure again whenever the margins
    move (and checks each label for overflow, which forces a page layout per label); both are
    skipped here (what they cost: docs/decisions.md, "Charts are drawn once"). The margins come from
    the labels given (default: the figure's own tick labels); pass the labels of the
    longest input to come (e.g. a decoder's whole run) and they stay put as the map grows."""
    y_labels = tick_labels(fig.layout.yaxis) if y_labels is None else y_labels
    x_labels = tick_labels(fig.layout.xaxis) if x_labels is None else x_labels
    fig.update_layout(fitted_margins(fig, y_labels, x_labels, min_top))
    return thin_ticks(fig)


UNMEASURED_AXIS = dict(automargin=False, ticklabeloverflow="allow")  # margins fixed: plotly measures no tick label


def fixed_margins_layout(y_labels: Sequence[str], x_labels: Sequence[str], title: bool, min_top: int = 0) -> dict:
    """A heatmap's layout without plotly's automargin, for matrix_heatmap(layout=...): margins
    that fit these tick labels (label_margins), the axes not measured, and the figure's title
    pinned to the top band that label_margins keeps for it (plotly centres it in the top margin
    otherwise, on the axis title)."""
    m = label_margins(y_labels, x_labels)
    out = dict(margin=dict(l=m["l"], t=max(min_top, m["t"], 90 if title else 60), r=10, b=10),
               xaxis=dict(UNMEASURED_AXIS), yaxis=dict(UNMEASURED_AXIS))
    if title:
        out["title"] = dict(yref="container", y=1, yanchor="top", pad=dict(t=14))
    return out


def tick_labels(axis) -> list:
    """An axis's tick labels as the tokens read (markup escapes undone)."""
    return [html.unescape(t) for t in (axis.ticktext or [])]


def fitted_margins(fig: go.Figure, y_labels: Sequence[str], x_labels: Sequence[str], min_top: int = 115) -> dict:
    """fix_margins' layout update, as one dict (margins, and every axis without automargin) for
    a caller to merge with its own into one update_layout call."""
    m = label_margins(y_labels, x_labels)
    # the margins fit the labels, so plotly need not measure each one for overflow either
    axes = {ax.plotly_name: dict(UNMEASURED_AXIS) for ax in (*fig.select_xaxes(), *fig.select_yaxes())}
    return dict(margin=dict(l=m["l"], t=max(min_top, m["t"], fig.layout.margin.t or 0), r=10, b=10), **axes)


LABEL_PX = 15  # a tick label's line height at plotly's default 12 px font
MIN_PLOT_WIDTH = 560  # the narrowest a heatmap's plot area is drawn (half a wide page, less margins)


def thin_ticks(fig: go.Figure, width: Optional[int] = None) -> go.Figure:
    """Keep every k-th tick label so that none overlap: the query axis by the plot's height,
    the key axis (labels at -45°) by its width (`width`, else the narrowest it is drawn)."""
    m = fig.layout.margin
    if fig.layout.height:
        _thin_axis(fig.layout.yaxis, fig.layout.height - (m.t or 0) - (m.b or 0), LABEL_PX)
    _thin_axis(fig.layout.xaxis, (width or MIN_PLOT_WIDTH) - (m.l or 0) - (m.r or 0), LABEL_PX * 1.3)
    return fig


def _thin_axis(ax, length_px: float, label_px: float) -> None:
    vals, text = list(ax.tickvals or []), list(ax.ticktext or [])
    if len(vals) < 2 or length_px <= 0:
        return
    span = max(vals) - min(vals) + 1  # cells spanned by the labelled ticks
    gap = length_px / span * (vals[1] - vals[0])  # pixels between two labels now
    step = int(np.ceil(label_px / gap)) if gap < label_px else 1
    if step > 1:
        ax.tickvals, ax.ticktext = vals[::step], text[::step]


def attention_heatmap(
    weights,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    *,
    title: str = "",
    fixed_scale: bool = True,
    highlight_row: Optional[int] = None,
    show_values: bool = False,
    height: Optional[int] = None,
    log_scale: bool = False,
    hover_from_axes: bool = False,
    layout: Optional[dict] = None,
    value_name: str = "weight",
) -> go.Figure:
    """Attention weights (n_q x n_k): rows are queries, columns keys; 0-1 colour scale by default.
    value_name: what a cell is called on hover and on the colour bar ("norm" for value norms).

    log_scale: colour by log10(weight), floored at LOG_FLOOR (1e-5), with the colour bar
    labelled in weights. Long prompts of decoder LMs put most weight on the first token (an
    "attention sink"); on a linear scale everything else is then the same dark colour."""
    w = to_numpy(weights)
    if log_scale:
        lo = math.log10(LOG_FLOOR)
        z = np.log10(np.maximum(w, LOG_FLOOR))
        fig = matrix_heatmap(z, query_tokens, key_tokens, title=title, zmin=lo if fixed_scale else None,
                             zmax=0.0 if fixed_scale else None, x_title="key", y_title="query",
                             value_name=f"log₁₀ {value_name}", highlight_row=highlight_row, height=height, neg_inf_text=False,
                             hover_from_axes=hover_from_axes, layout=layout)
        ticks = list(range(int(lo), 1))
        fig.update_traces(colorbar=dict(thickness=12, tickvals=ticks, ticktext=[f"1e{t}" if t else "1" for t in ticks],
                                        title=dict(text=f"{value_name} (log)", side="right")))
        return fig
    return matrix_heatmap(
        w,
        query_tokens,
        key_tokens,
        title=title,
        zmin=0.0 if fixed_scale else None,
        zmax=1.0 if fixed_scale else None,
        x_title="key",
        y_title="query",
        value_name=value_name,
        highlight_row=highlight_row,
        show_values=show_values,
        height=height,
        hover_from_axes=hover_from_axes,
        layout=layout,
    )


LOG_FLOOR = 1e-5  # the smallest weight a log colour scale tells apart

SINK_LABEL = "sink"
SINK_LINE = "#d62728"  # the line that sets a learned sink's column apart from the keys


def add_sink_column(fig: go.Figure, sink, *, log_scale: bool = False) -> go.Figure:
    """A learned sink (gpt-oss: the probability of a head's sink logit, which no key owns) drawn
    as a column of its own right of an attention heatmap's keys: one empty column between, a
    red line before it, the tick "sink", and a hover that says what it is. `sink` holds one
    value per row (n_q), the map's rows plus it sum to 1. The column takes the map's colour
    scale (log10 with log_scale, as attention_heatmap draws it)."""
    heat = fig.data[0]
    s = to_numpy(sink).reshape(-1)
    n_q = len(heat.y)
    if len(s) != n_q:
        raise ValueError(f"the sink has {len(s)} values, the map {n_q} rows")
    category = fig.layout.xaxis.type == "category"
    n_k = len(heat.x)
    x = [SINK_LABEL] if category else [n_k + 1]
    z = np.log10(np.maximum(s, LOG_FLOOR)) if log_scale else s
    if heat.zmin is None or heat.zmax is None:  # a colour scale per map: one scale over the keys and the sink
        both = np.concatenate([np.asarray(heat.z, dtype=float).reshape(-1), z])
        both = both[np.isfinite(both)]
        heat.zmin, heat.zmax = float(both.min()), float(both.max())
    hover = ("query %{y}<br>learned sink: the softmax's share that no key owns<br>sink mass: "
             + ("%{text}" if log_scale else "%{z:.4f}") + "<extra></extra>")
    fig.add_trace(go.Heatmap(z=z[:, None], x=x, y=list(heat.y), zmin=heat.zmin, zmax=heat.zmax,
                             colorscale=heat.colorscale, showscale=False, name=SINK_LABEL, hovertemplate=hover,
                             text=np.char.mod("%.4f", s)[:, None] if log_scale else None))
    edge = n_k - 0.5 if category else n_k  # numeric axes: in the empty column between the keys and the sink
    fig.add_shape(type="line", x0=edge, x1=edge, y0=0, y1=1, yref="y domain", line=dict(color=SINK_LINE, width=2))
    if not category and fig.layout.xaxis.ticktext:  # token ticks: "sink" is one more
        ax = fig.layout.xaxis
        fig.update_xaxes(tickvals=list(ax.tickvals) + [n_k + 1], ticktext=list(ax.ticktext) + [SINK_LABEL],
                         range=[-0.5, n_k + 1.5])
    elif not category:  # plotly's own numbered ticks: the column is named above the plot
        fig.update_xaxes(range=[-0.5, n_k + 1.5])
        fig.add_annotation(x=n_k + 1, y=1, yref="y domain", yanchor="bottom", text=SINK_LABEL, showarrow=False)
    fig.update_yaxes(zeroline=False)  # it would show through the empty column
    return fig


def add_mask_overlay(fig: go.Figure, mask) -> go.Figure:
    """The cells a layer's mask forbids (its additive mask is -inf there: look-ahead, sliding
    window, chunk) shaded grey over an attention heatmap of numeric axes, with a hover that
    says the mask forbids the cell."""
    m = to_numpy(mask)
    heat = fig.data[0]
    if m.shape != (len(heat.y), len(heat.x)):
        raise ValueError(f"the mask is {m.shape[0]} x {m.shape[1]}, the map {len(heat.y)} x {len(heat.x)}")
    shade = np.where(np.isneginf(m), 1.0, np.nan)
    fig.add_trace(go.Heatmap(z=shade, x=list(heat.x), y=list(heat.y), zmin=0, zmax=1, showscale=False, name="mask",
                             colorscale=[[0, "rgba(90,90,90,0.45)"], [1, "rgba(90,90,90,0.45)"]], hoverongaps=False,
                             hovertemplate="query %{y} · key %{x}: forbidden by the mask<extra></extra>"))
    return fig


# Okabe-Ito's colour-blind-safe set first (told apart even as faint lines), then darker tones
HEAD_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000", "#8C6D31",
                "#7B4173", "#637939", "#843C39", "#393B79", "#BCBD22", "#17BECF", "#7F7F7F", "#E7298A"]
HEAD_LINE_GAP = 0.06  # lines start and end this far (in x) from the token labels, so they never cross them


def head_view(
    weights,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    *,
    heads: Optional[Sequence[int]] = None,
    threshold: float = 0.02,
    title: str = "",
) -> go.Figure:
    """bertviz-style head view: queries on the left, keys on the right, a line per
    (query, key) pair with opacity = weight, one colour per head."""
    w = to_numpy(weights)  # H x n_q x n_k
    n_heads, n_q, n_k = w.shape
    heads = list(range(n_heads)) if heads is None else [h for h in heads if 0 <= h < n_heads]
    fig = go.Figure()
    for h in heads:
        colour = HEAD_COLOURS[h % len(HEAD_COLOURS)]
        qi, ki = np.nonzero(w[h] > threshold)
        # one trace per opacity band keeps the figure small and the lines readable
        for lo, hi in [(0.0, 0.15), (0.15, 0.4), (0.4, 0.7), (0.7, 1.01)]:
            sel = (w[h][qi, ki] > lo) & (w[h][qi, ki] <= hi)
            if not sel.any():
                continue
            xs, ys = [], []
            for a, b in zip(qi[sel], ki[sel]):
                xs += [HEAD_LINE_GAP, 1 - HEAD_LINE_GAP, None]
                ys += [a, b, None]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=colour, width=2),
                                     opacity=min(1.0, (lo + hi) / 2 + 0.2), hoverinfo="skip",
                                     name=f"head {h}", legendgroup=f"h{h}", showlegend=lo == 0.0 or not fig.data))
    qlab, klab = safe_labels(query_tokens), safe_labels(key_tokens)
    fig.add_trace(go.Scatter(x=[0] * n_q, y=list(range(n_q)), mode="text", text=qlab, textposition="middle left",
                             hoverinfo="skip", showlegend=False))
    fig.add_trace(go.Scatter(x=[1] * n_k, y=list(range(n_k)), mode="text", text=klab, textposition="middle right",
                             hoverinfo="skip", showlegend=False))
    fig.update_xaxes(visible=False, range=[-0.6, 1.6])
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_layout(height=min(1400, max(300, 60 + 24 * max(n_q, n_k))), title=dict(text=title, x=0),
                      margin=dict(l=10, r=10, t=40, b=10), plot_bgcolor="white", legend=dict(orientation="h"))
    return fig


def attention_frame(weights, query_tokens: Sequence[str], key_tokens: Sequence[str]):
    """The shown attention matrix as a pandas DataFrame (for CSV download)."""
    import pandas as pd

    w = to_numpy(weights)
    rows = [f"{i}:{t}" for i, t in enumerate(query_tokens)]
    cols = [f"{j}:{t}" for j, t in enumerate(key_tokens)]
    return pd.DataFrame(w, index=pd.Index(rows, name="query"), columns=cols)


MASK_ALLOWED, MASK_MASKED = "#4a7fb5", "#d9d9d9"  # the two colours of a mask (allowed / masked)


def mask_heatmap(mask, query_tokens: Sequence[str], key_tokens: Sequence[str], *, title: str = "",
                 height: Optional[int] = None) -> go.Figure:
    """An additive attention mask (0 where a query may look, −∞ where it may not) in two colours
    with a two-entry legend, "allowed (0)" and "masked (−∞)": a mask has two values, so a
    continuous colour bar would only mislead (plotly scales a lone 0 to −0.4…0.4)."""
    m = to_numpy(mask)
    allowed = np.isfinite(m)
    fig = matrix_heatmap(allowed.astype(float), query_tokens, key_tokens, title=title, zmin=0.0, zmax=1.0,
                         colorscale=[[0.0, MASK_MASKED], [0.5, MASK_MASKED], [0.5, MASK_ALLOWED], [1.0, MASK_ALLOWED]],
                         x_title="key", y_title="query", value_name="allowed (1) or masked (0)", height=height,
                         neg_inf_text=False)
    fig.update_traces(showscale=False)
    for name, colour in (("allowed (0)", MASK_ALLOWED), ("masked (−∞)", MASK_MASKED)):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, showlegend=True, hoverinfo="skip",
                                 marker=dict(symbol="square", size=14, color=colour, line=dict(color="#888", width=1))))
    fig.update_layout(legend=dict(orientation="h", x=1, xanchor="right", y=-0.02, yanchor="top"), showlegend=True)
    return fig
