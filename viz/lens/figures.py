"""Figures for the Lens page: the logit lens as a layer x position grid, and direct logit
attribution as a layer x head heatmap. Pure functions (pandas, numpy, plotly; no Streamlit)
over what core.analysis.lens and core.analysis.logit_attribution return.

Clicks: as in viz.heads.figures, plotly heatmaps cannot be selected, so the attribution map lays
one invisible square marker over each head's cell (customdata [layer, head, contribution,
attention]); head_pick reads (layer, head, attention) from a clicked one.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from viz.figures.heatmaps import ATTN_SCALE, DIVERGING, safe_label

COLOURS = {"target": "target_prob", "entropy": "entropy", "kl": "kl"}  # the URL's `color` -> the lens column
COLOUR_LABELS = {"target": "target's probability", "entropy": "entropy (nats)", "kl": "KL(output ‖ lens) (nats)"}
TEXT_CELLS = 4_000  # the top-1 token is written in the cells of a grid up to this size (one SVG text each)
KIND_LABEL = {"self_attn": "H", "cross_attn": "×H"}


def lens_matrix(df: pd.DataFrame, column: str) -> Tuple[np.ndarray, List[int], List[int]]:
    """(layers x positions matrix of one column of the lens, the layers, the positions)."""
    layers = sorted(df["layer"].unique().tolist())
    positions = sorted(df["position"].unique().tolist())
    z = np.full((len(layers), len(positions)), np.nan)
    li = {l: i for i, l in enumerate(layers)}
    pi = {p: j for j, p in enumerate(positions)}
    z[[li[l] for l in df["layer"]], [pi[p] for p in df["position"]]] = df[column].to_numpy(dtype=float)
    return z, layers, positions


# One layer convention across the Lens, the attribution, Explore and every CSV: block k (0-based)
# is the k-th transformer layer, its heads L{k}H{h}; the residual stream after block k is
# "after L{k}" (so what L23H3 writes is first read by the lens at "after L23"), the embeddings
# (the stream entering block 0) "embed", -1 in the CSVs' block columns.
CONVENTION = ("Layers are numbered as blocks from 0: **L23H3** is head 3 of block 23, and **after L23** is the residual "
              "stream after block 23, the first the lens reads what L23H3 wrote. **embed** is the stream entering "
              "block 0 (the embeddings), -1 in the CSVs' `after_block` and `block` columns.")


def stream_label(lens_layer: int, n_rows: Optional[int] = None) -> str:
    """The lens row `lens_layer` (core.analysis.lens: 0 = the embeddings, i + 1 = the output of
    block i) by the convention: "embed", "after L{i}"; the last row (of n_rows) is marked as
    the model's output."""
    if lens_layer == 0:
        return "embed"
    out = f"after L{lens_layer - 1}"
    return out + " = output" if n_rows is not None and lens_layer == n_rows - 1 else out


def _hover(row, n_rows: Optional[int] = None) -> str:
    tops = "<br>".join(f"{safe_label(t)} {p:.3f}" for t, p in zip(row.top_tokens, row.top_probs))
    return (f"{stream_label(row.layer, n_rows)} · position {row.position} ({safe_label(row.token)})<br>{tops}<br>"
            f"target {safe_label(row.target)}: {row.target_prob:.3g}<br>entropy {row.entropy:.3f} · KL {row.kl:.3f}")


def lens_grid(df: pd.DataFrame, colour: str = "target", title: str = "") -> go.Figure:
    """The lens as a layer (rows "embed", "after L0" .. "after L{L-1}" = the model's output) x position
    grid: each cell the lens's top-1 token written in it, coloured by `colour` (COLOURS), the
    top-5 with probabilities on hover."""
    column = COLOURS[colour]
    z, layers, positions = lens_matrix(df, column)
    d = df.sort_values(["layer", "position"])
    shape = z.shape
    top1 = np.array([safe_label(t[0]) for t in d["top_tokens"]], dtype=object).reshape(shape)
    hover = np.array([_hover(r, len(layers)) for r in d.itertuples()], dtype=object).reshape(shape)
    tokens = d[d["layer"] == layers[0]]["token"].tolist()
    if column == "target_prob":
        zmin, zmax, scale = 0.0, 1.0, ATTN_SCALE
    else:
        zmin, zmax, scale = 0.0, float(max(np.nanmax(z), 1e-9)), "Viridis_r" if column == "entropy" else "Magma_r"
    written = z.size <= TEXT_CELLS
    heat = go.Heatmap(z=z, x=list(range(len(positions))), y=list(range(len(layers))), zmin=zmin, zmax=zmax,
                      colorscale=scale, colorbar=dict(thickness=10, len=0.8, title=dict(text=COLOUR_LABELS[colour])),
                      text=top1 if written else None, texttemplate="%{text}" if written else None,
                      textfont=dict(size=10), customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                      hoverongaps=False, xgap=1, ygap=1)
    fig = go.Figure(heat)
    n_l = len(layers)
    fig.update_xaxes(tickvals=list(range(len(positions))),
                     ticktext=[f"{safe_label(t)} ({p})" for t, p in zip(tokens, positions)],
                     side="top", tickangle=-60, showgrid=False)
    step = 1 if n_l <= 16 else 2
    ticks = list(range(0, n_l, step)) + ([n_l - 1] if (n_l - 1) % step else [])
    fig.update_yaxes(tickvals=ticks, ticktext=[stream_label(layers[i], layers[-1] + 1) for i in ticks],
                     autorange="reversed", showgrid=False, title="residual stream")
    fig.update_layout(title=dict(text=title or f"Logit lens: top-1 token at every layer, coloured by the "
                                 f"{COLOUR_LABELS[colour]}", x=0),
                      height=180 + 22 * n_l, margin=dict(l=10, r=10, t=170, b=10), plot_bgcolor="white")
    return fig


# ------------------------------------------------------------------ direct logit attribution
def attribution_layout(df: pd.DataFrame) -> Dict:
    """Rows and columns of the attribution map: rows "embed", L0 .. L(L-1) (and "norm bias" /
    "output bias" where the model has them); columns the heads of each attention, then the
    attention biases, then the MLP. Returns dict(z, rows, cols, heads) where heads lists
    (row, col, layer, head, attn) of each head cell."""
    n_layers = int(df.attrs.get("n_layers", df["layer"].max() + 1))
    kinds = [k for k in ("self_attn", "cross_attn") if ((df["kind"] == "head") & (df["attn"] == k)).any()]
    head_ids = df.loc[df["kind"] == "head", "head"].dropna()
    n_heads = int(head_ids.max()) + 1 if len(head_ids) else 0  # a model of token mixers alone has no heads
    cols: List[Tuple] = [("head", k, h) for k in kinds for h in range(n_heads)]
    cols += [("attn_bias", k, -1) for k in kinds if ((df["kind"] == "attn_bias") & (df["attn"] == k)).any()]
    if (df["kind"] == "mixer").any():  # a token mixer's layer: its whole output, one term (no heads through its norm)
        cols.append(("mixer", "", -1))
    cols.append(("mlp", "", -1))
    extra = [k for k in ("norm_bias", "out_bias") if (df["kind"] == k).any()]
    rows = ["embed"] + [f"L{i}" for i in range(n_layers)] + [k.replace("_", " ") for k in extra]
    z = np.full((len(rows), len(cols)), np.nan)
    col_of = {c: j for j, c in enumerate(cols)}
    heads = []
    for r in df.itertuples():
        if r.kind == "embed":
            z[0, 0] = r.contribution
        elif r.kind in ("norm_bias", "out_bias"):
            z[1 + n_layers + extra.index(r.kind), 0] = r.contribution
        elif r.kind == "head":
            j = col_of[("head", r.attn, r.head)]
            z[1 + r.layer, j] = r.contribution
            heads.append((1 + r.layer, j, r.layer, r.head, r.attn))
        elif r.kind == "attn_bias":
            z[1 + r.layer, col_of[("attn_bias", r.attn, -1)]] = r.contribution
        elif r.kind == "mlp":
            z[1 + r.layer, col_of[("mlp", "", -1)]] = r.contribution
        elif r.kind == "mixer":
            z[1 + r.layer, col_of[("mixer", "", -1)]] = r.contribution
    labels = [f"{KIND_LABEL[c[1]]}{c[2]}" if c[0] == "head" else
              ("attn bias" if c[1] == "self_attn" else "cross bias") if c[0] == "attn_bias" else
              "mixer" if c[0] == "mixer" else "MLP" for c in cols]
    return dict(z=z, rows=rows, cols=labels, heads=heads)


def what_is_attributed(target: str, baseline: Optional[str]) -> str:
    return f"logit({safe_label(target)})" + (f" − logit({safe_label(baseline)})" if baseline else "")


def attribution_heatmap(df: pd.DataFrame, title: str = "", selected: Optional[Tuple[int, int]] = None) -> go.Figure:
    """Direct logit attribution as a layer (rows) x head (columns) heatmap on a diverging scale
    centred at 0; each layer's MLP (and attention bias) is a column of its own, the embeddings
    (and the final norm's shift) a row of their own. A click target over each head's cell
    (customdata [layer, head, contribution, attention])."""
    lay = attribution_layout(df)
    z, rows, cols = lay["z"], lay["rows"], lay["cols"]
    what = what_is_attributed(df.attrs.get("target", "?"), df.attrs.get("baseline"))
    m = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    m = m if m > 0 else 1.0
    row_lab = np.broadcast_to(np.array(rows, dtype=object)[:, None], z.shape)
    col_lab = np.broadcast_to(np.array(cols, dtype=object)[None, :], z.shape)
    heat = go.Heatmap(z=z, x=list(range(len(cols))), y=list(range(len(rows))), zmin=-m, zmax=m, zmid=0,
                      colorscale=DIVERGING, colorbar=dict(thickness=10, len=0.8, title=dict(text="contribution")),
                      customdata=np.stack([row_lab, col_lab], axis=-1), hoverongaps=False, xgap=1, ygap=1,
                      hovertemplate="%{customdata[0]} · %{customdata[1]}<br>adds %{z:+.4f} to " + what
                                    + "<extra></extra>")
    h = lay["heads"]
    custom = [[layer, head, float(z[r, c]), attn] for r, c, layer, head, attn in h]
    targets = go.Scatter(
        x=[c for _, c, *_ in h], y=[r for r, *_ in h], mode="markers", customdata=custom, showlegend=False,
        name="heads", marker=dict(symbol="square", size=14, opacity=0, color="#000000"),
        selected=dict(marker=dict(opacity=0)), unselected=dict(marker=dict(opacity=0)),
        hovertemplate="L%{customdata[0]}H%{customdata[1]} (block %{customdata[0]}, head %{customdata[1]})<br>adds %{customdata[2]:+.4f} to " + what
                      + "<br>click to open this head in Explore<extra></extra>")
    fig = go.Figure([heat, targets])
    n_r = len(rows)
    step = 1 if n_r <= 16 else 2
    ticks = sorted(set(list(range(0, n_r, step)) + [0, n_r - 1] + [i for i, r in enumerate(rows) if not r.startswith("L")]))
    fig.update_yaxes(tickvals=ticks, ticktext=[rows[i] for i in ticks], autorange="reversed", showgrid=False,
                     zeroline=False)
    fig.update_xaxes(tickvals=list(range(len(cols))), ticktext=cols, side="top", tickangle=0 if len(cols) <= 16 else -90,
                     showgrid=False, zeroline=False)
    if selected is not None:
        for r, c, layer, head, attn in h:
            if (layer, head) == tuple(selected) and attn == "self_attn":
                fig.add_shape(type="rect", x0=c - 0.5, x1=c + 0.5, y0=r - 0.5, y1=r + 0.5,
                              line=dict(color="#d62728", width=3))
    fig.update_layout(title=dict(text=title or f"Direct logit attribution to {what}", x=0),
                      height=110 + 20 * n_r, margin=dict(l=10, r=10, t=90, b=10), plot_bgcolor="white",
                      hovermode="closest", dragmode=False)
    return fig


def head_pick(point: dict) -> Optional[Tuple[int, int, str]]:
    """(layer, head, attention) of a clicked head cell of attribution_heatmap, or None."""
    cd = point.get("customdata")
    if isinstance(cd, (list, tuple)) and len(cd) >= 4:
        try:
            return int(cd[0]), int(cd[1]), str(cd[3])
        except (TypeError, ValueError):
            return None
    return None


def attribution_table(df: pd.DataFrame) -> pd.DataFrame:
    """Direct logit attribution as a CSV table by the convention (CONVENTION): `block` (the
    block a head, MLP or attention bias belongs to; -1 for the embeddings and the final norm's
    and output's biases), `head` (-1 where not a head) and a `label` ("embed", "L23H3",
    "L23 MLP"), no bare "layer"."""
    out = df.rename(columns={"layer": "block"}).copy()

    def name(r) -> str:
        if r.kind == "head":
            return f"L{r.block}{'×' if r.attn == 'cross_attn' else ''}H{r.head}"
        if r.kind == "mlp":
            return f"L{r.block} MLP"
        if r.kind == "attn_bias":
            return f"L{r.block} {'cross ' if r.attn == 'cross_attn' else ''}attn bias"
        return {"embed": "embed", "norm_bias": "final norm bias", "out_bias": "output bias"}.get(r.kind, r.kind)

    out.insert(0, "label", [name(r) for r in out.itertuples()])
    return out


def head_label(layer: int, head: int) -> str:
    return f"L{int(layer)}H{int(head)}"


def top_heads(df: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The n heads with the largest contribution (most for the target over the baseline)."""
    return df[df["kind"] == "head"].nlargest(n, "contribution")


def bottom_heads(df: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The n heads that work most against the target (the most negative contributions; only
    negative ones)."""
    heads = df[(df["kind"] == "head") & (df["contribution"] < 0)]
    return heads.nsmallest(n, "contribution")


# ------------------------------------------------------------------ the sum against the model's own logit
def rtol_of(dtype: str) -> float:
    """The tolerance of the sum check, relative to max(1, |logit|): as the Inside page's checks."""
    from viz.figures.checks import RTOL

    return RTOL.get(str(dtype), 1e-4)


def own_logit(trace, df: pd.DataFrame) -> float:
    """The model's own logit (difference) at the attributed position, read from the traced pass:
    its stored final hidden state through the output projection (the trace's `logits` row),
    not from the attribution."""
    p, t, b = df.attrs["position"], df.attrs["target_id"], df.attrs["baseline_id"]
    row = trace.runner.logits(trace, rows=slice(p, p + 1))[0].double()
    return float(row[t] - (row[b] if b is not None else 0.0))


def sum_check(df: pd.DataFrame, own: float, dtype: str = "torch.float32") -> Tuple[bool, float, float]:
    """(holds, sum of the contributions, tolerance): the sum of the rows against the model's own
    logit (difference) `own` (own_logit), within rtol x max(1, |own|)."""
    total = float(df["contribution"].sum())
    tol = rtol_of(dtype) * max(1.0, abs(own))
    return bool(math.isfinite(total) and abs(total - own) <= tol), total, tol


def lens_table(df: pd.DataFrame) -> pd.DataFrame:
    """The lens as a flat table for a CSV download: the top-k lists joined with ' | '; the
    row named by the convention (CONVENTION): `after_block` (-1 = the embeddings, k = the
    stream after block k) and `stream` ("embed", "after L{k}"), no bare "layer"."""
    out = df.copy()
    n_rows = int(df["layer"].max()) + 1 if len(df) else None
    out.insert(0, "stream", [stream_label(int(v), n_rows) for v in df["layer"]])
    out.insert(0, "after_block", df["layer"].astype(int) - 1)
    out = out.drop(columns=["layer"])
    out["top_tokens"] = [" | ".join(t) for t in df["top_tokens"]]
    out["top_ids"] = [" | ".join(map(str, t)) for t in df["top_ids"]]
    out["top_probs"] = [" | ".join(f"{p:.6g}" for p in t) for t in df["top_probs"]]
    return out
