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
- `learned_sink_table` / `_figure` / `_verdict`: a model with learned sinks (gpt-oss): each
  layer's learned sink mass beside the attention on the first tokens, and whether, by those
  numbers, the learned sink replaces StreamingLLM's sinks.
"""

from __future__ import annotations


from typing import Dict, Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from core import trace_names as tn
from viz.figures.heatmaps import ATTN_SCALE, safe_label, safe_labels
from viz.figures.reduce import tick_indices

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
    """mass: (layers, heads). Both axes tick at whole layers and heads, labelled with their numbers."""
    mass = np.asarray(mass, dtype=float)
    n_layers, n_heads = mass.shape
    fig = go.Figure(go.Heatmap(z=mass, x=list(range(n_heads)), y=list(range(n_layers)), colorscale="Reds",
                               zmin=0, colorbar=dict(title="mass"),
                               hovertemplate="layer %{y} · head %{x}<br>mass lost %{z:.4f}<extra></extra>"))
    rows, cols = tick_indices(n_layers, 16), tick_indices(n_heads, 32)
    fig.update_layout(title=title, height=min(700, 200 + 16 * n_layers),
                      xaxis=dict(title="head", tickvals=cols, ticktext=[str(h) for h in cols]),
                      yaxis=dict(title="layer", autorange="reversed", tickvals=rows, ticktext=[str(l) for l in rows]),
                      margin=dict(l=60, r=20, t=50, b=50))
    return fig


def sink_heatmap(sink: np.ndarray, n_sinks: int) -> go.Figure:
    fig = mass_heatmap(sink, title=f"Sink score: the full model's mean attention on the first {n_sinks} token(s)")
    fig.update_traces(colorscale="Purples", zmax=1.0,
                      hovertemplate="layer %{y} · head %{x}<br>on the first tokens %{z:.3f}<extra></extra>")
    return fig


def loss_difference(df: pd.DataFrame) -> np.ndarray:
    """The loss the policy adds at each position, in nats: logprob_full - logprob (NaN at the end)."""
    return (df["logprob_full"] - df["logprob"]).to_numpy(dtype=float)


LINE_CHARS = 100  # the text's line length, in characters, before it wraps
LINE_PX = 22  # a line's height


def loss_text_figure(df: pd.DataFrame, line_chars: int = LINE_CHARS) -> go.Figure:
    """The text as it reads, wrapped like a paragraph, each token on a cell as wide as its text
    and shaded by the loss the policy adds when it predicts the next token (red: worse than the
    full cache, blue: better; position and value on hover). A newline token ends its line (shown
    as ↵). Every token whole: nothing is cut to fit a column."""
    diff = loss_difference(df)
    top = float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 1.0
    x0, line, col = [], [], 0
    shown, widths = [], []
    row = 0
    for tok in df["token"]:
        t = str(tok)
        text = t.replace("\n", "↵").replace("\t", "⇥")
        w = max(1, len(text))
        if col and col + w > line_chars:
            row, col = row + 1, 0
        x0.append(col)
        line.append(row)
        widths.append(w)
        shown.append(safe_label(text) if text.strip() else "␣" * w)
        col += w
        if "\n" in t:
            row, col = row + 1, 0
    lines = (line[-1] + 1) if line else 1
    z = np.where(np.isfinite(diff), diff, 0.0)
    fig = go.Figure(go.Bar(
        y=line, x=widths, base=x0, orientation="h", width=0.9, text=shown, textposition="inside",
        insidetextanchor="middle", textangle=0, constraintext="none", cliponaxis=False,
        marker=dict(color=z, cmin=-top, cmax=top, colorscale=[[0, "rgb(31,119,180)"], [0.5, "white"],
                                                             [1, "rgb(214,39,40)"]], line=dict(width=0),
                    colorbar=dict(title="nats", thickness=10)),
        customdata=np.stack([df["position"].to_numpy(), diff], axis=-1),
        hovertemplate="%{text} (position %{customdata[0]}): %{customdata[1]:+.3f} nats<extra></extra>",
        textfont=dict(family="monospace", size=12, color="black")))
    fig.update_layout(height=40 + LINE_PX * lines, margin=dict(l=10, r=10, t=10, b=10), bargap=0,
                      uniformtext=dict(minsize=12, mode="show"), plot_bgcolor="white",
                      xaxis=dict(visible=False, range=[-0.5, line_chars + 0.5], fixedrange=True),
                      yaxis=dict(visible=False, autorange="reversed", fixedrange=True))
    return fig


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


def log_range(values, pad: float = 0.08) -> list:
    """A log axis's range (log10 units, as plotly takes it) that fits these values, padded a little."""
    v = np.asarray([x for x in values if np.isfinite(x) and x > 0], dtype=float)
    if not v.size:
        return [0.0, 1.0]
    lo, hi = float(np.log10(v.min())), float(np.log10(v.max()))
    span = max(hi - lo, 0.1)
    return [lo - pad * span, hi + pad * span]


def ppl_figure(sweep: pd.DataFrame, full: float, title: str = "Perplexity against budget") -> go.Figure:
    """sweep: rows (policy, budget, perplexity). Log axes whose ranges follow the data, the budgets
    labelled as the numbers chosen, the full cache a dashed line (a trace, meta "full-cache", in
    the legend: plotly reads an annotation's y on a log axis as a power of 10)."""
    fig = go.Figure()
    for policy, g in sweep.groupby("policy", sort=False):
        g = g.sort_values("budget")
        fig.add_trace(go.Scatter(x=g["budget"], y=g["perplexity"], mode="lines+markers", name=POLICY_LABELS.get(policy, policy),
                                 line=dict(color=POLICY_COLOURS.get(policy))))
    budgets = sorted({int(b) for b in sweep["budget"]})
    if budgets:
        fig.add_trace(go.Scatter(x=[budgets[0], budgets[-1]], y=[full, full], mode="lines", meta="full-cache",
                                 name=f"full cache ({full:.2f})", line=dict(color="black", dash="dash"),
                                 hovertemplate=f"full cache: {full:.3f}<extra></extra>"))
    x_range = log_range(budgets, pad=0.05) if budgets else None
    fig.update_layout(title=title, height=380,
                      xaxis=dict(title="budget (keys per query)", type="log", tickvals=budgets,
                                 ticktext=[str(b) for b in budgets], range=x_range, minor=dict(showgrid=False)),
                      yaxis=dict(title="perplexity", type="log", range=log_range(list(sweep["perplexity"]) + [full])),
                      margin=dict(l=60, r=20, t=50, b=50))
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


LEARNED_COLOUR, FIRST_COLOUR = "#d62728", "#7b4173"


def learned_sink_table(trace, sink_scores: np.ndarray) -> Optional[pd.DataFrame]:
    """A model with learned sinks (gpt-oss): per layer, the learned sink's mass (the trace's
    `.sink`, mean over heads and queries) beside the full model's attention on StreamingLLM's
    first-token sinks (`sink_scores`, evict's L x H, mean over heads). None without learned
    sinks."""
    layers = sink_scores.shape[0]
    names = [tn.attn("decoder", i, tn.SELF, "sink") for i in range(layers)]
    if not all(n in trace for n in names):
        return None
    learned = [float(trace[n].double().mean()) for n in names]
    return pd.DataFrame({"layer": list(range(layers)), "learned sink": learned,
                         "first tokens": np.asarray(sink_scores, dtype=float).mean(1)})


def learned_sink_verdict(table: pd.DataFrame, n_first: int) -> str:
    """Whether the learned sink replaces StreamingLLM's first-token sinks, as the numbers say:
    it does where, on average over the layers, it takes more of each row than the first
    tokens receive and it does so in at least half of the layers."""
    learned, first = float(table["learned sink"].mean()), float(table["first tokens"].mean())
    more = int((table["learned sink"] > table["first tokens"]).sum())
    L = len(table)
    toks = f"the first {n_first} token{'s' if n_first != 1 else ''}"
    if learned > first and 2 * more >= L:
        return (f"Here the learned sink replaces them: in {more} of {L} layers it takes more of each row than "
                f"{toks} receive ({learned:.3f} of a row on average, against {first:.3f}), so the share a model "
                "without it would park on the first tokens goes to a logit that needs no cache slot.")
    return (f"Here the learned sink does not replace them: {toks} still receive {first:.3f} of a row on average, "
            f"against {learned:.3f} for the learned sink (which takes more in only {more} of {L} layers), so a cache "
            "that drops those tokens still loses attention.")


def learned_sink_figure(table: pd.DataFrame, n_first: int) -> go.Figure:
    """learned_sink_table as grouped bars per layer."""
    fig = go.Figure([
        go.Bar(x=table["layer"], y=table["learned sink"], name="learned sink (no key)", marker_color=LEARNED_COLOUR,
               hovertemplate="layer %{x}<br>learned sink: %{y:.3f} of a row<extra></extra>"),
        go.Bar(x=table["layer"], y=table["first tokens"], name=f"first {n_first} token(s) (StreamingLLM's sinks)",
               marker_color=FIRST_COLOUR,
               hovertemplate="layer %{x}<br>on the first tokens: %{y:.3f} of a row<extra></extra>")])
    fig.update_layout(barmode="group", height=320, title=dict(text="Learned sink against the first tokens: mean share "
                                                                   "of a row, per layer (mean over heads and queries)",
                                                              x=0, font=dict(size=14)),
                      xaxis=dict(title="layer", dtick=1), yaxis=dict(title="share of a row", rangemode="tozero"),
                      legend=dict(orientation="h", y=-0.25), margin=dict(l=10, r=10, t=50, b=10))
    return fig
