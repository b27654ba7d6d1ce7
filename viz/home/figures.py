"""The small figure each stop of the home path draws for the student's sentence (the notes'
example first where the stop has one). Pure (Trace -> plotly Figure); the stops are
viz/home/path.py, the page viz/home/page.py.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import plotly.graph_objects as go

from core import trace_names as tn
from core.head_maps import profiles
from core.net.cost import mixing_cost
from core.net.attention import causal_mask
from viz.figures import by_hand
from viz.figures.heatmaps import attention_heatmap, fixed_margins_layout, mask_heatmap, matrix_heatmap
from viz.figures.select import attention_views
from viz.figures.sinusoid import pe_matrix, positional_heatmap

SMALL = 300  # height of a stop's figure (px), for a few tokens
ROW_PX = 18  # a token row's height at least, so that a long sentence's labels do not overlap


def _fitted(fig: go.Figure, y_labels, x_labels) -> go.Figure:
    """Margins that fit the tick labels, with the title above the key axis's labels (not on them),
    and a height that leaves each token row ROW_PX however tall the labels make the top margin."""
    layout = fixed_margins_layout(y_labels, x_labels, title=True)
    m = layout["margin"]
    layout["height"] = int(max(fig.layout.height or SMALL, m["t"] + m["b"] + ROW_PX * len(y_labels)))
    return fig.update_layout(layout)


def figure_height(n_rows: int) -> int:
    """A token map's height: SMALL for a few tokens, growing by ROW_PX a row past that (labels
    at plotly's 12 px need ~15 px each), up to 900."""
    return int(min(900, max(SMALL, 150 + ROW_PX * n_rows)))


MAX_PROFILE_TOKENS = 2048  # stop 5's and 7's head profiles are read a tile at a time; past this the stop says so


def hand_figure() -> Tuple[go.Figure, dict]:
    """Stop 1: the notes' "help me!" weights, computed from its Q, K and V."""
    ex = by_hand.help_me_example()
    Q, K, V = (by_hand.to_matrix(ex[m], m)[0] for m in ("Q", "K", "V"))
    out = by_hand.attention_by_hand(Q, K, V)
    w = out["weights"]
    fig = matrix_heatmap(w, y_labels=by_hand.row_labels(ex["Q"], "q"),
                         x_labels=by_hand.row_labels(ex["K"], "k"), zmin=0, zmax=1,
                         title="softmax(Q Kᵀ / √16): the weights of “help me!”", show_values=True, height=SMALL,
                         x_title="key", y_title="query", value_name="weight")
    return fig, out


def own_weights_figure(trace) -> Tuple[go.Figure, str]:
    """Stop 1, after the notes' example: the same weighted average on the user's sentence, the
    weights of the model's first attention, layer 0, head 0."""
    stack, kind = first_attention(trace)
    i = first_softmax_layer(trace, stack, kind)
    w = trace.head(tn.attn(stack, i, kind, "weights"), 0)
    q_tok = trace.tokens("target" if stack == "decoder" else "source")
    k_tok = trace.tokens("source" if kind == "cross_attn" or stack == "encoder" else "target")
    where = f"{stack} layer {i}'s {'self' if kind == 'self_attn' else 'cross'}-attention, head 0"
    fig = attention_heatmap(w, q_tok, k_tok, title=f"your sentence: the weights of {where}",
                            height=figure_height(len(q_tok)), show_values=len(q_tok) <= 8 and len(k_tok) <= 8)
    return fig, where


def own_positions_figure(trace) -> Optional[go.Figure]:
    """Stop 3, after the notes' sinusoids: the positional vectors the model itself adds to your
    sentence's tokens (its trace's embed.{stack}.positions), or None where it adds none (RoPE,
    relative biases)."""
    stack = "encoder" if "encoder" in trace.stacks() else "decoder"
    name = tn.embed(stack, "positions")
    if name not in trace:
        return None
    P = trace[name].detach().double().numpy()
    d = max(2, min(64, P.shape[1]))
    return positional_heatmap(P[:, :d], title=f"the model's own positions on your sentence, {P.shape[0]} positions × "
                                              f"its first {d} features", height=SMALL)


def first_attention(trace) -> Tuple[str, str]:
    """The first attention of the model (encoder self-attention where there is one)."""
    return attention_views(trace)[0]


def first_softmax_layer(trace, stack: str, kind: str = "self_attn") -> int:
    """The first layer of `stack` whose `kind` is softmax attention (layer 0 unless the first
    layers mix tokens otherwise: Gated DeltaNet, Mamba2, a short convolution)."""
    return next(i for i in range(trace.layers(stack)) if tn.attn(stack, i, kind, "weights") in trace)


def scores_figure(trace) -> Tuple[go.Figure, str]:
    stack, kind = first_attention(trace)
    i = first_softmax_layer(trace, stack, kind)
    where = f"{stack} layer {i}'s {'self' if kind == 'self_attn' else 'cross'}-attention"
    s = trace.head(tn.attn(stack, i, kind, "scaled"), 0)
    q_tok = trace.tokens("target" if stack == "decoder" else "source")
    k_tok = trace.tokens("source" if kind == "cross_attn" or stack == "encoder" else "target")
    fig = matrix_heatmap(s, y_labels=q_tok, x_labels=k_tok,
                         title=f"scaled scores, {where}, head 0", height=figure_height(len(q_tok)), x_title="key", y_title="query",
                         value_name="score")
    return _fitted(fig, q_tok, k_tok), where


def positions_figure(n: int, d: int) -> go.Figure:
    d = max(4, min(64, d - d % 2))  # the first 64 features are enough to see the waves
    return positional_heatmap(pe_matrix(n, d), title=f"sinusoidal PE, {n} positions × {d} features", height=SMALL)


def mask_figure(trace) -> Tuple[go.Figure, str]:
    """Stop 4: the decoder's own masked self-attention where the model has a decoder, else the
    look-ahead mask a decoder would use on this many tokens."""
    if "decoder" in trace.stacks() and trace.layers("decoder"):
        i = first_softmax_layer(trace, "decoder")
        w = trace.head(tn.self_attn("decoder", i, "weights"), 0)
        tok = trace.tokens("target") or trace.tokens("source")
        fig = _fitted(attention_heatmap(w, tok, tok, title=f"decoder layer {i}, head 0: weights under the look-ahead "
                                        "mask", height=figure_height(len(tok))), tok, tok)
        return fig, (f"Below: your sentence's decoder self-attention, layer {i}, head 0: every weight above the "
                     "diagonal is 0.")
    n = len(trace.tokens("source"))
    m = causal_mask(n).numpy()
    tok = trace.tokens("source")
    fig = _fitted(mask_heatmap(m, tok, tok, title="the look-ahead mask M for your sentence",
                               height=figure_height(len(tok))), tok, tok)
    return fig, (f"{trace.meta.get('model', 'This model')} is an encoder: every token sees every other, so it has "
                 "no such mask. Below: the mask a decoder would add on your sentence's tokens.")


def head_profile(trace) -> Optional[dict]:
    """Stops 5 and 7: every head's mean row entropy and previous-token weight, read a tile of rows
    at a time (core.head_maps.profiles), for the model's first self-attention stack."""
    stack = "encoder" if "encoder" in trace.stacks() else "decoder"
    n = len(trace.tokens("source" if stack == "encoder" else "target") or trace.tokens("source"))
    if n > MAX_PROFILE_TOKENS:
        return None
    return {"stack": stack, **{k: v.numpy() for k, v in profiles(trace, stack).items()}}


def grid_figure(values: np.ndarray, title: str, value_name: str, zmax: Optional[float] = None) -> go.Figure:
    L, H = values.shape
    return matrix_heatmap(values, y_labels=[f"L{i}" for i in range(L)], x_labels=[f"H{h}" for h in range(H)],
                          zmin=0, zmax=zmax, title=title, height=max(SMALL, 22 * L + 90), x_title="head",
                          y_title="layer", value_name=value_name, colorscale="Viridis")


def cost_figure(n: int, d: int, d_k: int) -> go.Figure:
    """Stop 6: the notes' O(N² D) + O(N D²) against a linear mixer's O(N D d_k) + O(N D²), per
    layer, from 1 token to 32k (or twice the sentence), your sentence's length marked on both curves."""
    N = np.unique(np.round(np.geomspace(1, max(32768, 2 * n), 80)).astype(int))  # the sentence's N lies on the curves
    c = mixing_cost(N, d, d_k)
    fig = go.Figure()
    for key, name, dash in (("softmax", "softmax attention: 2N²D + 4ND²", "solid"),
                            ("linear", f"linear mixer: 2N·D·d_k + 4ND² (d_k = {d_k})", "dash")):
        fig.add_trace(go.Scatter(x=N, y=c[key], name=name, mode="lines", line=dict(dash=dash),
                                 hovertemplate="N = %{x:,}<br>%{y:.3s} multiply-adds<extra>" + key + "</extra>"))
    mine = mixing_cost(np.array([n]), d, d_k)
    fig.add_trace(go.Scatter(x=[n, n], y=[mine["linear"][0], mine["softmax"][0]], mode="markers+text",
                             name=f"your sentence (N = {n})", marker=dict(size=9, color="black"),
                             text=["", f"N = {n}"], textposition="top center",
                             hovertemplate="N = %{x}<br>%{y:.3s} multiply-adds<extra>your sentence</extra>"))
    fig.update_xaxes(type="log", title="tokens N", dtick=1)  # a label per decade (1, 10, 100, ...), none between
    fig.update_yaxes(type="log", title="multiply-adds per layer", dtick=1)
    fig.update_layout(title=f"one layer's cost, D = {d}", height=SMALL + 60,
                      legend=dict(orientation="h", y=-0.3), margin=dict(t=50, b=110))
    return fig


