"""Figures and helpers for the patching page: core.analysis.patch's `restored` as a layer x
position map (tokens on the axis) or a layer x head map, a click target per cell, and the
clean/corrupt pair helpers ("swap one word"). Pure functions (pandas, numpy, plotly; no
Streamlit).

Clicks: plotly heatmaps cannot be selected (see viz.figures.grid), so each cell carries an invisible
square marker whose customdata is [layer, head (-1 for a position), position (-1 for a head),
restored]; cell_pick reads (layer, head, position) from a clicked one.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from viz.figures.heatmaps import CHAR_PX, DIVERGING, safe_labels

IOI_CLEAN = "When Mary and John went to the store, John gave a drink to"
IOI_CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
IOI_ANSWER, IOI_WRONG = " Mary", " John"

WHAT_LABELS = {
    "resid_pre": "residual stream entering the layer (resid_pre)",
    "attn_out": "attention output (attn_out)",
    "mlp_out": "feed-forward output (mlp_out)",
    "head": "one head's output, every position (head)",
}

_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")


def words(text: str) -> List[str]:
    """The words of a sentence, in order (letters only), as "swap one word" offers them."""
    return [m.group(0) for m in _WORD.finditer(text or "")]


def swap_word(text: str, index: int, new: str) -> str:
    """`text` with its index-th word (as `words` counts them) replaced by `new`."""
    for k, m in enumerate(_WORD.finditer(text or "")):
        if k == index:
            return text[: m.start()] + new + text[m.end():]
    raise ValueError(f"the sentence has {len(words(text))} words, not {index + 1}")


def default_corrupt(text: str) -> str:
    """A corrupted prompt for a sentence that names people (the indirect-object pattern): the
    last capitalised word (not the first word) that was named before is swapped for the other
    name; with two names but no repeat, the last name is swapped for the first. Otherwise the
    sentence itself (the page asks for a corrupted prompt)."""
    ms = list(_WORD.finditer(text or ""))
    names = [m for m in ms[1:] if m.group(0)[0].isupper()]
    distinct = list(dict.fromkeys(m.group(0) for m in names))
    if len(distinct) < 2:
        return text
    last = names[-1]
    repeated = [m for m in names if m.group(0) in {n.group(0) for n in names if n.start() < m.start()}]
    target = repeated[-1] if repeated else last
    other = next(n for n in distinct if n != target.group(0))
    return text[: target.start()] + other + text[target.end():]


# word -> a word of the same kind, for a corrupted prompt that differs in one word (swapped_corrupt)
SWAPS = {"he": "she", "she": "he", "his": "her", "her": "his", "him": "her", "man": "woman", "woman": "man",
         "boy": "girl", "girl": "boy", "dog": "cat", "cat": "dog", "small": "large", "large": "small", "old": "young",
         "young": "old", "big": "small", "good": "bad", "bad": "good", "France": "Italy", "Paris": "Rome",
         "Italy": "France", "Rome": "Paris", "Mary": "John", "John": "Mary", "day": "night", "night": "day",
         "morning": "evening", "evening": "morning", "red": "blue", "blue": "red", "river": "road", "road": "river",
         "opens": "closes", "closes": "opens", "bread": "cake", "six": "ten", "ten": "six", "first": "last"}
FALLBACK_WORDS = ("dog", "cat", "house", "river", "red", "old", "day")


def swapped_corrupt(text: str, n_tokens) -> Optional[Tuple[str, int, str, str]]:
    """A corrupted prompt that differs from `text` in one word and has as many tokens
    (n_tokens(text) -> the count): (corrupt, word index (from 0, as `words`), old, new), the
    last word that SWAPS knows first, then the last words with FALLBACK_WORDS; None if none fits."""
    ws = words(text)
    n = n_tokens(text)
    tries = [(i, SWAPS[w]) for i, w in reversed(list(enumerate(ws))) if w in SWAPS]
    tries += [(i, f) for i in reversed(range(len(ws))) for f in FALLBACK_WORDS if f != ws[i]][:40]
    for i, new in tries:
        out = swap_word(text, i, new)
        if out != text and n_tokens(out) == n:
            return out, i, ws[i], new
    return None


def restored_matrix(df: pd.DataFrame) -> np.ndarray:
    """layers x positions (or x heads for what="head") of `restored`."""
    col = "head" if (df["head"] >= 0).any() else "position"
    n_layers, n_cols = int(df["layer"].max()) + 1, int(df[col].max()) + 1
    z = np.full((n_layers, n_cols), np.nan)
    z[df["layer"].to_numpy(), df[col].to_numpy()] = df["restored"].to_numpy()
    return z


def row_label(layer: int, what: str = "") -> str:
    """A patching row by the layer convention (viz.lens.figures.CONVENTION): the residual stream
    entering block k is "into Lk" (the lens's "after L{k-1}", "embed" for k = 0); a block's
    own output is "Lk"."""
    if what == "resid_pre":
        return f"into L{layer} (embed)" if layer == 0 else f"into L{layer} (after L{layer - 1})"
    return f"L{layer}"


def restored_heatmap(df: pd.DataFrame, tokens: Optional[Sequence[str]] = None, title: str = "",
                     selected: Optional[Tuple[int, int]] = None, what: str = "") -> go.Figure:
    """`restored` of a patching table as a heatmap: layers top to bottom, positions (labelled
    with `tokens`) or heads left to right, on a diverging scale centred at 0 (1 = the clean
    run's preference fully restored, negative = pushed further towards the corrupted one).
    A click target per cell; `selected` (layer, head or position) is outlined. Rows are named
    by row_label (`what` = "resid_pre": the stream entering each block, "into Lk")."""
    heads = bool((df["head"] >= 0).any())
    z = restored_matrix(df)
    n_layers, n_cols = z.shape
    if heads:
        labels = [f"H{h}" for h in range(n_cols)]
        what_col = "head %{x}"
    else:
        toks = list(tokens) if tokens is not None else [str(p) for p in range(n_cols)]
        labels = [f"{lab} ({p})" for p, lab in enumerate(safe_labels(toks[:n_cols]))]
        what_col = "position %{x}"
    finite = np.abs(z[np.isfinite(z)])
    top = float(max(1.0, finite.max() if finite.size else 1.0))
    heat = go.Heatmap(z=z, x=list(range(n_cols)), y=list(range(n_layers)), zmin=-top, zmax=top, zmid=0,
                      colorscale=DIVERGING, colorbar=dict(thickness=10, len=0.8, title="restored"),
                      hoverongaps=False,
                      text=[[row_label(l, what)] * n_cols for l in range(n_layers)],
                      hovertemplate="%{text} · " + what_col + "<br>restored %{z:.3f}<extra></extra>")
    layer_idx, col_idx = np.meshgrid(np.arange(n_layers), np.arange(n_cols), indexing="ij")
    li, ci = layer_idx.ravel(), col_idx.ravel()
    custom = np.stack([li, ci if heads else -np.ones_like(ci), -np.ones_like(ci) if heads else ci,
                       np.nan_to_num(z.ravel(), nan=0.0)], axis=1)
    cell = 22 if n_layers > 12 else 34
    where = "%{text}"
    targets = go.Scatter(
        x=ci.tolist(), y=li.tolist(), mode="markers", customdata=custom.tolist(), showlegend=False, name="cells",
        text=[row_label(int(l), what) + " · " + (f"head {c}" if heads else labels[c]) for l, c in zip(li, ci)],
        marker=dict(symbol="square", size=cell - 4, opacity=0, color="#000000"),
        selected=dict(marker=dict(opacity=0)), unselected=dict(marker=dict(opacity=0)),
        hovertemplate=where + "<br>restored %{customdata[3]:.3f}<br>click to open this layer"
                      + (" and head" if heads else "") + " in Explore<extra></extra>")
    fig = go.Figure([heat, targets])
    if heads:
        fig.update_xaxes(tickvals=list(range(n_cols)), ticktext=labels, side="top", tickangle=0)
    else:
        fig.update_xaxes(tickvals=list(range(n_cols)), ticktext=labels, side="top", tickangle=-60)
    fig.update_xaxes(showgrid=False, zeroline=False)
    rows = list(range(0, n_layers, 1 if n_layers <= 12 else 2))
    rows += [n_layers - 1] if rows[-1] != n_layers - 1 else []  # the last block always named
    fig.update_yaxes(tickvals=rows, ticktext=[row_label(l, what) for l in rows],
                     autorange="reversed", showgrid=False, zeroline=False,
                     title="residual stream entering the block" if what == "resid_pre" else "block")
    if selected is not None:
        l, c = selected
        fig.add_shape(type="rect", x0=c - 0.5, x1=c + 0.5, y0=l - 0.5, y1=l + 0.5, line=dict(color="#111111", width=3))
    longest = max((len(s) for s in labels), default=4)
    top_margin = 60 + (0 if heads else int(min(longest, 30) * CHAR_PX * 0.87))
    fig.update_layout(title=dict(text=title, x=0), height=top_margin + 30 + cell * n_layers,
                      margin=dict(l=10, r=10, t=top_margin, b=10), plot_bgcolor="white", hovermode="closest",
                      dragmode=False)
    return fig


def cell_pick(point: dict) -> Optional[Tuple[int, int, int]]:
    """(layer, head, position) of a clicked cell of restored_heatmap (-1 where it has none), or None."""
    cd = point.get("customdata")
    if isinstance(cd, (list, tuple)) and len(cd) >= 3:
        try:
            return int(cd[0]), int(cd[1]), int(cd[2])
        except (TypeError, ValueError):
            return None
    return None


def top_cells(df: pd.DataFrame, k: int = 5) -> pd.DataFrame:
    """The k cells that restore the most (largest `restored`)."""
    return df.dropna(subset=["restored"]).nlargest(k, "restored")


def bottom_cells(df: pd.DataFrame, k: int = 5) -> pd.DataFrame:
    """The k cells that work most against the answer (the most negative `restored`, only
    negative ones)."""
    d = df.dropna(subset=["restored"])
    return d[d["restored"] < 0].nsmallest(k, "restored")
