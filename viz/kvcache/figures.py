"""Figures for the KV cache page: pure functions (numpy, pandas, plotly; no Streamlit) over what
core.analysis.evict returns.

- `kept_map`: one head's attention map (the full model's weights) with the cells of keys the
  policy's cache did not hold greyed out at every query row. Two heatmap traces: "attention"
  (the weights of the keys held, NaN elsewhere) and "evicted" (1 on the evicted cells below
  the diagonal, NaN elsewhere, in grey): the browser test reads the second back.
- `mass_heatmap`: the mean attention mass lost per layer x head.
- `loss_frame`: the text, token by token, shaded by the loss the policy adds (a pandas Styler).
- `ppl_figure`: perplexity against budget for every policy on the same text (StreamingLLM's
  picture), the full model a horizontal line.
- `sink_heatmap`: each head's sink score (the full model's mean attention on the first tokens).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from viz.figures.heatmaps import ATTN_SCALE, safe_label, safe_labels

GREY = "rgb(190, 190, 190)"
POLICY_LABELS = {
    "full": "full cache",
    "window": "window (no sinks)",
    "streaming": "StreamingLLM (sinks + window)",
    "h2o": "H2O (heavy hitters + recent)",
    "tova": "TOVA (drop the lowest weight)",
    "snapkv": "SnapKV (prompt compressed once)",
}
POLICY_COLOURS = {"window": "#d62728", "streaming": "#1f77b4", "h2o": "#2ca02c", "tova": "#9467bd",
                  "snapkv": "#ff7f0e", "full": "black"}
MAP_ROWS = 256  # query rows of one head's map drawn at a time (a long text is read a block at a time)


def evicted_cells(kept: np.ndarray, r0: int, c1: Optional[int] = None) -> np.ndarray:
    """1.0 where a query row (r0 + r) was allowed key j by causality (j <= r0 + r) but the cache
    did not hold it, NaN elsewhere: the grey layer of kept_map. kept: (rows, n) bool."""
    rows, n = kept.shape
    c1 = n if c1 is None else c1
    causal = np.arange(c1)[None, :] <= (r0 + np.arange(rows))[:, None]
    out = np.full((rows, c1), np.nan)
    out[causal & ~kept[:, :c1]] = 1.0
    return out


def kept_map(weights: np.ndarray, kept: np.ndarray, tokens: Sequence[str], r0: int = 0, title: str = "") -> go.Figure:
    """One head's map for query rows r0 .. r0 + rows - 1 over keys 0 .. c1 - 1 (weights and kept
    (rows, c1)): the weights where the cache held the key, grey where it had evicted it."""
    weights = np.asarray(weights, dtype=float)
    rows, c1 = weights.shape
    kept = np.asarray(kept, dtype=bool)[:, :c1]
    grey = evicted_cells(kept, r0, c1)
    shown = np.where(kept, weights, np.nan)
    x = list(range(c1))
    y = list(range(r0, r0 + rows))
    labels = safe_labels(tokens)
    hover = [[f"query {i} {labels[i]!s} · key {j} {labels[j]!s}" for j in x] for i in y] if rows * c1 <= 40_000 else None
    fig = go.Figure()
    fig.add_trace(go.Heatmap(z=shown, x=x, y=y, colorscale=ATTN_SCALE, zmin=0, zmax=float(np.nanmax(weights)) or 1.0,
                             name="attention", colorbar=dict(title="weight"), hoverongaps=False,
                             text=hover, hovertemplate="%{text}<br>held, weight %{z:.4f}<extra></extra>"
                             if hover else "query %{y} · key %{x}<br>weight %{z:.4f}<extra></extra>"))
    fig.add_trace(go.Heatmap(z=grey, x=x, y=y, colorscale=[[0, GREY], [1, GREY]], showscale=False, name="evicted",
                             customdata=np.where(np.isnan(grey), np.nan, weights), hoverongaps=False,
                             hovertemplate="query %{y} · key %{x}<br>evicted: the full model gave it %{customdata:.4f}"
                                           "<extra></extra>"))
    fig.update_layout(title=title, height=min(900, 260 + 2 * rows), margin=dict(l=60, r=20, t=50, b=50),
                      xaxis=dict(title="key position"), yaxis=dict(title="query position", autorange="reversed"))
    return fig


def mass_heatmap(mass: np.ndarray, title: str = "Attention mass lost (mean over the text)") -> go.Figure:
    mass = np.asarray(mass, dtype=float)
    fig = go.Figure(go.Heatmap(z=mass, x=list(range(mass.shape[1])), y=list(range(mass.shape[0])), colorscale="Reds",
                               zmin=0, colorbar=dict(title="mass"),
                               hovertemplate="layer %{y} · head %{x}<br>mass lost %{z:.4f}<extra></extra>"))
    fig.update_layout(title=title, height=min(700, 200 + 16 * mass.shape[0]), xaxis=dict(title="head", dtick=1),
                      yaxis=dict(title="layer", autorange="reversed"), margin=dict(l=60, r=20, t=50, b=50))
    return fig


def sink_heatmap(sink: np.ndarray, n_sinks: int) -> go.Figure:
    fig = mass_heatmap(sink, title=f"Sink score: the full model's mean attention on the first {n_sinks} token(s)")
    fig.update_traces(colorscale="Purples", zmax=1.0,
                      hovertemplate="layer %{y} · head %{x}<br>on the first tokens %{z:.3f}<extra></extra>")
    return fig


def loss_difference(df: pd.DataFrame) -> np.ndarray:
    """The loss the policy adds at each position, in nats: logprob_full - logprob (NaN at the end)."""
    return (df["logprob_full"] - df["logprob"]).to_numpy(dtype=float)


def loss_frame(df: pd.DataFrame, per_row: int = 16):
    """The text as rows of `per_row` tokens, each token shaded by the loss the policy adds when it
    predicts the next token (red: worse than the full cache, blue: better), as a pandas Styler."""
    diff = loss_difference(df)
    toks = [safe_label(t) for t in df["token"]]
    top = float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 0.0
    n = len(toks)
    rows = [toks[i:i + per_row] + [""] * max(0, i + per_row - n) for i in range(0, n, per_row)]
    vals = [list(diff[i:i + per_row]) + [np.nan] * max(0, i + per_row - n) for i in range(0, n, per_row)]
    frame = pd.DataFrame(rows, index=[int(df["position"].iloc[i]) for i in range(0, n, per_row)])
    v = pd.DataFrame(vals, index=frame.index)

    def shade(col):
        out = []
        for x in v[col.name]:
            if not np.isfinite(x) or top <= 0:
                out.append("")
                continue
            a = min(1.0, abs(x) / top)
            rgb = "214, 39, 40" if x > 0 else "31, 119, 180"
            out.append(f"background-color: rgba({rgb}, {0.85 * a:.3f}); color: {'white' if a > 0.6 else 'black'}")
        return out

    return frame.style.apply(shade, axis=0)


def loss_figure(df: pd.DataFrame) -> go.Figure:
    """The loss difference and the mass lost along the text."""
    diff = loss_difference(df)
    pos = df["position"].to_numpy()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=pos, y=diff, mode="lines", name="loss added (nats)", line=dict(color="#d62728"),
                             text=safe_labels(df["token"]), hovertemplate="%{x} %{text}: %{y:+.3f} nats<extra></extra>"))
    fig.add_trace(go.Scatter(x=pos, y=df["mass_lost"], mode="lines", name="attention mass lost", yaxis="y2",
                             line=dict(color="grey")))
    fig.update_layout(height=300, margin=dict(l=60, r=60, t=30, b=40), xaxis=dict(title="position"),
                      yaxis=dict(title="logprob full − policy"), legend=dict(orientation="h"),
                      yaxis2=dict(title="mass lost", overlaying="y", side="right", rangemode="tozero"))
    return fig


def ppl_figure(sweep: pd.DataFrame, full: float, title: str = "Perplexity against budget") -> go.Figure:
    """sweep: rows (policy, budget, perplexity). Log axes, the full cache a dashed line."""
    fig = go.Figure()
    for policy, g in sweep.groupby("policy", sort=False):
        g = g.sort_values("budget")
        fig.add_trace(go.Scatter(x=g["budget"], y=g["perplexity"], mode="lines+markers", name=POLICY_LABELS.get(policy, policy),
                                 line=dict(color=POLICY_COLOURS.get(policy))))
    fig.add_hline(y=full, line=dict(color="black", dash="dash"), annotation_text=f"full cache {full:.2f}")
    fig.update_layout(title=title, height=380, xaxis=dict(title="budget (keys per query)", type="log"),
                      yaxis=dict(title="perplexity", type="log"), margin=dict(l=60, r=20, t=50, b=50))
    return fig


def sweep_table(results: Dict[tuple, pd.DataFrame]) -> pd.DataFrame:
    """{(policy, budget): evict's frame} -> rows (policy, budget, perplexity, perplexity_full,
    mean_kl, mean_mass_lost)."""
    rows = []
    for (policy, budget), df in results.items():
        rows.append(dict(policy=policy, budget=budget, perplexity=df.attrs["perplexity"],
                         perplexity_full=df.attrs["perplexity_full"], mean_kl=float(df["kl"].mean()),
                         mean_mass_lost=float(df["mass_lost"].mean())))
    return pd.DataFrame(rows, columns=["policy", "budget", "perplexity", "perplexity_full", "mean_kl", "mean_mass_lost"])


def sinks_effect(window: pd.DataFrame, streaming: pd.DataFrame) -> pd.DataFrame:
    """What removing the sinks does at one budget: the window (no sinks) against StreamingLLM."""
    rows = []
    for name, df in (("with sinks (streaming)", streaming), ("sinks removed (window)", window)):
        rows.append({"cache": name, "perplexity": df.attrs["perplexity"], "full": df.attrs["perplexity_full"],
                     "mean KL (nats)": float(df["kl"].mean()), "mean mass lost": float(df["mass_lost"].mean())})
    return pd.DataFrame(rows)
