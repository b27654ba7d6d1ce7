"""The decoder stepper's figures and numbers: pure functions, no Streamlit.

Lecture 10 writes the decoder's masked self-attention as softmax((QᵀK + M)/√p) with
M(i, j) = 0 for j <= i and -inf for j > i; Transformers handout calls the same matrix B (eq. 18) and
walks "Not on your life!" through it under teacher forcing. The core computes
QKᵀ/√d_k + M (the same thing: -inf stays -inf when divided by √d_k), records the mask,
the masked scores and the weights, and these functions draw them for one head:

    look_ahead_mask_figure   M: 0 on and below the diagonal, -∞ above
    masked_scores_figure     QKᵀ/√d_k + M, -∞ cells shown as such
    weights_figure           S' = softmax(...): rows sum to 1, exactly 0 above the diagonal
    cross_attention_figure   decoder rows over the source tokens
    next_token_figure        the top-k next-token distribution, chosen token marked

plus the bookkeeping the page needs (which row is the newest, what each step chose, the
message at the end of generation, the teacher-forcing table). How a step's rows compare with
the decoder run on their prefix alone is viz/ui/prefix_check.py.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go

from viz.ui.prefix_check import has_cross_attention  # noqa: F401 (dv.has_cross_attention)
from viz.figures.heatmaps import (attention_heatmap, fitted_margins, label_margins, matrix_heatmap, safe_label, thin_ticks,
                         tick_labels, to_numpy)

MASK_TEXT_UP_TO = 16  # write 0 / -∞ in the mask's cells up to this many rows
SHOW_VALUES_UP_TO = 8  # write the numbers in the cells (like the notes' tables) up to this many rows
CROSS_VALUES_UP_TO = 8  # cross-attention shares its row with another chart: numbers fit up to 8 source tokens
AXIS_HOVER_ABOVE = 32  # larger maps with distinct labels (a long prefix's blocks) hover from the axes'
# labels instead of two labels per cell (matrix_heatmap's hover_from_axes)
CHOSEN_COLOUR = "#d62728"
FORCED_COLOUR = "#2ca02c"
BAR_COLOUR = "#6baed6"


# ------------------------------------------------------------------ reading a trace
def head_matrix(trace, name: str, head: int, rows_from: int = 0) -> np.ndarray:
    """One head's n_q x n_k matrix of an H x n_q x n_k trace tensor (a 2-D tensor, such as
    the mask, has no head axis), from row `rows_from` on. The head and rows are cut before
    converting, so the other heads (and a long prefix's other rows) are never copied. Where the
    pass's layer is long (core.head_maps.long_layer: its H maps past LONG_LAYER_BYTES), the
    self-attention's maps are computed for this head alone, a tile of rows at a time, and its mask
    from the layer's rule (LayerMaps.mask_rows), so that no layer of H n x n maps is made, or kept
    in the trace's layer cache, for one head's view."""
    from core import head_maps as hm
    from core import trace_names as tn

    where = tn.parse(name)
    base = getattr(trace, "_base", None) or trace  # a step view (Trace.prefix) reads its whole pass's layer
    if where.part == tn.SELF and where.step in ("mask",) + hm.MAPS and hm.long_layer(base, where.stack) \
            and not trace.is_stored(name):
        if where.step == "mask":
            maps = hm.layer_maps(trace, where.stack, where.layer)
            off = maps.mask_rows(rows_from, maps.n)
            return np.zeros((maps.n - rows_from, maps.n), np.float32) if off is None else \
                np.where(off.cpu().numpy(), np.float32(-np.inf), np.float32(0.0))
        if rows_from:  # the rows asked for alone (the all-steps figure reads each step's last rows)
            maps = hm.layer_maps(trace, where.stack, where.layer)
            return to_numpy(maps.tile(head, rows_from, maps.n, where.step)[0])
        return to_numpy(trace.head(name, head))
    t = trace[name]
    t = t if t.ndim == 2 else t[head]
    return to_numpy(t[rows_from:])


MAX_SIDE = 96  # decoder maps longer than this are drawn in blocks


def in_blocks(mask, masked, weights, tokens: Sequence[str], row: int, max_side: int = MAX_SIDE):
    """The stepper's three n x n maps of a long prefix in at most max_side blocks per side:
    weights with keys summed and queries averaged (rows still sum to 1, as on Explore);
    masked scores and the mask as the mean of each block's finite cells (-inf where every
    cell is masked). Returns the three maps, the block labels and the block of `row`."""
    from viz.figures.model_view import block_labels, blocks

    groups = blocks(len(tokens), max_side)
    starts = [g[0] for g in groups]

    def mean_finite(m):
        m = np.asarray(m, dtype=np.float64)
        fin = np.isfinite(m)
        s = np.add.reduceat(np.add.reduceat(np.where(fin, m, 0.0), starts, axis=0), starts, axis=1)
        c = np.add.reduceat(np.add.reduceat(fin.astype(np.float64), starts, axis=0), starts, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(c > 0, s / np.maximum(c, 1), -np.inf)

    w = np.asarray(weights, dtype=np.float64)
    summed = np.add.reduceat(w, starts, axis=1)  # keys summed within a block
    sizes = np.array([len(g) for g in groups], dtype=np.float64)[:, None]
    w_blocks = np.add.reduceat(summed, starts, axis=0) / sizes  # queries averaged
    f = len(groups[0])
    return mean_finite(mask), mean_finite(masked), w_blocks, block_labels(groups, tokens), row // f


def newest_row(trace) -> int:
    """Index of the last decoder input position: the row whose output is the next token."""
    return len(trace.tokens("target")) - 1


def step_row(step: int, prefix_len: int) -> int:
    """Row of the full (teacher-forced) target that step `step` (from 1) adds.

    Step 1 runs on the first prefix_len tokens (<start>, or the whole prompt of a
    decoder-only model), so its newest row is prefix_len - 1; each step adds one row."""
    return prefix_len - 1 + (step - 1)


def n_teacher_steps(n_rows: int, prefix_len: int) -> int:
    """How many steps a teacher-forced target of n_rows decoder inputs holds."""
    return max(1, n_rows - prefix_len + 1)


def generated_tokens(steps) -> List[str]:
    """The token each step chose, in order (the last is <end> when generation ended)."""
    return [s.meta["chosen"] for s in steps]


def generated_ids(steps) -> List[int]:
    return [int(s.meta["chosen_id"]) for s in steps]


def output_tokens(steps) -> List[str]:
    """The generated output without the final <end>: what greedy decoding returns."""
    toks = generated_tokens(steps)
    if steps and steps[-1].meta.get("ended") and toks:
        toks = toks[:-1]
    return toks


def top_k(probs_row, k: int = 10) -> Tuple[List[int], List[float]]:
    """Ids and probabilities of the k most likely tokens of one probability row, best first."""
    p = to_numpy(probs_row).astype(np.float64).ravel()
    k = min(k, p.size)
    idx = np.argsort(-p, kind="stable")[:k]
    return [int(i) for i in idx], [float(p[i]) for i in idx]


def ending_message(n_steps: int, ended: bool, max_new_tokens: Optional[int] = None,
                   end_token: str = "<end>") -> Tuple[str, str]:
    """(level, text) describing how generation stopped: 'success' at <end>, 'warning' at the
    maximum length."""
    if ended:
        return "success", (f"Generation ended: step {n_steps} chose {end_token}, so greedy decoding stops "
                           f"after {n_steps} steps ({n_steps - 1} tokens before {end_token}).")
    limit = f" of {max_new_tokens} new tokens" if max_new_tokens else ""
    return "warning", (f"Generation stopped at the maximum length{limit} after {n_steps} steps "
                       f"without choosing {end_token}.")


# ------------------------------------------------------------------ teacher forcing
def teacher_forcing_rows(probs, input_tokens: Sequence[str], next_tokens: Sequence[Optional[str]],
                         next_ids: Sequence[Optional[int]], argmax_tokens: Sequence[str]):
    """One row per decoder position under teacher forcing (all computed in one pass):
    the input token, the teacher's next token, its probability, and the model's own argmax.

    next_tokens / next_ids: the correct next token of every position (None where unknown,
    e.g. after the last token of a decoder-only continuation); argmax_tokens: the model's
    most likely token at every position. Returns a pandas DataFrame and the mean
    cross-entropy -log p(teacher's token) over the known positions (None if there are none)."""
    import pandas as pd

    p = to_numpy(probs).astype(np.float64)
    rows, nll = [], []
    for i, tok in enumerate(input_tokens):
        nid = next_ids[i] if i < len(next_ids) else None
        p_next = float(p[i, nid]) if nid is not None else None
        if p_next is not None:
            nll.append(-np.log(max(p_next, 1e-45)))
        rows.append({
            "position": i,
            "input": tok,
            "teacher's next": next_tokens[i] if i < len(next_tokens) and next_tokens[i] is not None else "",
            "p(teacher's next)": p_next,
            "model's argmax": argmax_tokens[i],
            "argmax = teacher": (argmax_tokens[i] == next_tokens[i]) if p_next is not None else None,
        })
    frame = pd.DataFrame(rows).set_index("position")
    return frame, (float(np.mean(nll)) if nll else None)


# ------------------------------------------------------------------ token chips
def chip(tok: str) -> str:
    """One token as a markdown code chip: shown literally, never read as markup."""
    tok = tok.replace("`", "ˋ").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f"`{tok}`" if tok.strip() else "`" + "␣" * max(1, len(tok)) + "`"


def chips_markdown(tokens: Sequence[str], current: Optional[int] = None, max_chips: int = 80, cut: int = 0) -> str:
    """Tokens as markdown code chips (never HTML); the `current` one in bold. Long lists keep
    their end (the newest tokens) and start with '…'; `cut` tokens dropped before them (a long
    prompt's start) are marked '… [N tokens cut]' first."""
    toks = list(tokens)
    start = max(0, len(toks) - max_chips)
    parts = [f"*… [{cut:,} tokens cut]*"] if cut else []
    parts += ["…"] if start else []
    for i in range(start, len(toks)):
        c = chip(toks[i])
        parts.append(f"**{c}**" if i == current else c)
    return " ".join(parts)


# ------------------------------------------------------------------ figures
def _tidy(fig: go.Figure, fit: Optional[Tuple[Sequence[str], Sequence[str]]] = None) -> go.Figure:
    """Title above the top axis (its title and token labels), no zero lines through cells.

    Margins are fixed from the labels in `fit` (y labels, x labels; default: the figure's
    own) instead of plotly's automargin. Automargin measures every label and redraws the
    figure when the margins move, which was a third of a decoder step's drawing time; with
    fit = the whole run's tokens the margins also stay put from step to step."""
    y_labels, x_labels = fit or (tick_labels(fig.layout.yaxis), tick_labels(fig.layout.xaxis))
    layout = fitted_margins(fig, y_labels, x_labels)
    layout["xaxis"].update(zeroline=False, title_standoff=4)
    layout["yaxis"].update(zeroline=False)
    fig.update_layout(title=dict(y=0.985, yref="container", yanchor="top"), **layout)  # one call: see matrix_heatmap
    fig.update_traces(textfont=dict(size=11), selector=dict(type="heatmap"))
    return thin_ticks(fig)


def _show_values(n: int, show_values: Optional[bool], up_to: int = SHOW_VALUES_UP_TO) -> bool:
    return n <= up_to if show_values is None else show_values


def look_ahead_mask_figure(mask, tokens: Sequence[str], *, highlight_row: Optional[int] = None,
                           title: str = "Look-ahead mask M", height: Optional[int] = None,
                           fit: Optional[Tuple[Sequence[str], Sequence[str]]] = None) -> go.Figure:
    """The additive mask as the notes draw it: '0' where a query may look (j <= i), '-∞'
    where it may not (j > i); -∞ cells are grey."""
    m = to_numpy(mask)
    fig = matrix_heatmap(m, tokens, tokens, title=title, zmin=0.0, zmax=1.0, colorscale="Blues",
                         x_title="key j", y_title="query i", value_name="M(i, j)",
                         highlight_row=highlight_row, height=height, hover_labels=False)
    if m.shape[0] <= MASK_TEXT_UP_TO:
        text = np.where(np.isneginf(m), "-∞", np.where(m == 0, "0", np.char.mod("%.2g", np.nan_to_num(m))))
        fig.update_traces(text=text, texttemplate="%{text}",
                          hovertemplate="query %{y} · key %{x}<br>M = %{text}<extra></extra>")
    else:  # too small to read: colours only, and no text element per cell for plotly to draw
        fig.update_traces(text=None, texttemplate=None, hovertemplate="query %{y} · key %{x}<br>M = 0 if key ≤ "
                          "query (light), −∞ if key > query (grey)<extra></extra>")
    fig.update_traces(showscale=False, colorscale=[[0, "#eaf2fb"], [1, "#eaf2fb"]])
    fig.update_layout(plot_bgcolor="#c8c8c8")
    return _tidy(fig, fit)


def masked_scores_figure(masked, tokens: Sequence[str], *, highlight_row: Optional[int] = None,
                         show_values: Optional[bool] = None, title: str = "Masked scores QKᵀ/√d_k + M",
                         height: Optional[int] = None,
                         fit: Optional[Tuple[Sequence[str], Sequence[str]]] = None) -> go.Figure:
    """The masked, scaled scores of one head; -∞ cells are drawn blank and read '-∞'."""
    z = to_numpy(masked)
    finite = z[np.isfinite(z)]
    span = float(np.max(np.abs(finite))) if finite.size else 1.0
    span = span or 1.0
    fig = matrix_heatmap(z, tokens, tokens, title=title, zmin=-span, zmax=span, colorscale="RdBu_r",
                         x_title="key j", y_title="query i", value_name="score",
                         highlight_row=highlight_row, show_values=_show_values(z.shape[0], show_values),
                         height=height, hover_from_axes=z.shape[0] > AXIS_HOVER_ABOVE)
    return _tidy(fig, fit)


def weights_figure(weights, tokens: Sequence[str], *, highlight_row: Optional[int] = None,
                   show_values: Optional[bool] = None, title: str = "Weights S' = softmax(QKᵀ/√d_k + M)",
                   height: Optional[int] = None,
                   fit: Optional[Tuple[Sequence[str], Sequence[str]]] = None) -> go.Figure:
    """Softmax of the masked scores: each row sums to 1 and is exactly 0 above the diagonal."""
    w = to_numpy(weights)
    fig = attention_heatmap(w, tokens, tokens, title=title, highlight_row=highlight_row,
                            show_values=_show_values(w.shape[0], show_values), height=height,
                            hover_from_axes=w.shape[0] > AXIS_HOVER_ABOVE)
    fig.update_xaxes(title="key j")
    fig.update_yaxes(title="query i")
    return _tidy(fig, fit)


def cross_attention_figure(weights, target_tokens: Sequence[str], source_tokens: Sequence[str], *,
                           highlight_row: Optional[int] = None, show_values: Optional[bool] = None,
                           title: str = "Cross-attention: decoder rows over the source",
                           height: Optional[int] = None,
                           fit: Optional[Tuple[Sequence[str], Sequence[str]]] = None) -> go.Figure:
    """Cross-attention weights (decoder queries x source keys); the current row outlined."""
    w = to_numpy(weights)
    fig = attention_heatmap(w, target_tokens, source_tokens, title=title, highlight_row=highlight_row,
                            show_values=_show_values(max(w.shape), show_values, CROSS_VALUES_UP_TO), height=height)
    fig.update_xaxes(title="source token (key)")
    fig.update_yaxes(title="decoder input (query)")
    return _tidy(fig, fit)


def next_token_figure(tokens: Sequence[str], probs: Sequence[float], *, chosen: Optional[str] = None,
                      forced: Optional[str] = None, forced_prob: Optional[float] = None,
                      title: str = "Next-token distribution (top k)") -> go.Figure:
    """Horizontal bars of the top-k next tokens, most likely on top.

    chosen: the token greedy decoding picked (red). forced: the teacher's token under
    teacher forcing (green); when it is not among the top k it is added as an extra bar
    with forced_prob."""
    toks = list(tokens)
    ps = [float(p) for p in probs]
    if forced is not None and forced not in toks and forced_prob is not None:
        toks.append(forced)
        ps.append(float(forced_prob))
    colours, notes = [], []
    for t in toks:
        if chosen is not None and t == chosen and forced is not None and t == forced:
            colours.append(CHOSEN_COLOUR)
            notes.append("chosen = teacher")
        elif chosen is not None and t == chosen:
            colours.append(CHOSEN_COLOUR)
            notes.append("chosen")
        elif forced is not None and t == forced:
            colours.append(FORCED_COLOUR)
            notes.append("teacher")
        else:
            colours.append(BAR_COLOUR)
            notes.append("")
    labels = [safe_label(t) for t in toks]
    y = list(range(len(toks)))
    text = [f"{p:.3f}" + (f"  ← {n}" if n else "") for p, n in zip(ps, notes)]
    p_max = max(ps + [0.01])
    # a long bar carries its label inside (right-aligned, white); a short one beside it: never past the plot
    inside = [p > 0.55 * p_max for p in ps]
    fig = go.Figure(go.Bar(
        x=ps, y=y, orientation="h", marker_color=colours, text=text,
        textposition=["inside" if i else "outside" for i in inside], insidetextanchor="end",
        insidetextfont=dict(color="white"), outsidetextfont=dict(color="#333"), textangle=0,
        customdata=labels, hovertemplate="%{customdata}<br>p = %{x:.4f}<extra></extra>", cliponaxis=False,
    ))
    if forced is not None and forced in toks:
        # the teacher's token stays visible even when its bar has no length (p = 0)
        k = toks.index(forced)
        fig.add_trace(go.Scatter(x=[ps[k]], y=[k], mode="markers", name="teacher",
                                 marker=dict(symbol="diamond", size=11, color=FORCED_COLOUR,
                                             line=dict(color="white", width=1)),
                                 hovertemplate=f"teacher's token<br>p = {ps[k]:.4f}<extra></extra>", cliponaxis=False))
    fig.update_yaxes(tickvals=y, ticktext=labels, autorange="reversed", title="token", automargin=False,
                     ticklabeloverflow="allow")
    longest_outside = max([len(t) for t, i in zip(text, inside) if not i] + [0])
    x_max = max(p_max * 1.05, max([p for p, i in zip(ps, inside) if not i] + [0]) + 0.018 * longest_outside * p_max + 0.02)
    fig.update_xaxes(range=[0, x_max], title="probability", automargin=False,
                     ticklabeloverflow="allow")
    # fixed margins (no automargin pass: see _tidy)
    fig.update_layout(title=dict(text=title, x=0, font=dict(size=14)), height=max(260, 70 + 28 * len(toks)),
                      margin=dict(l=label_margins(toks, [])["l"], r=10, t=50, b=50), showlegend=False,
                      plot_bgcolor="white")
    return fig
