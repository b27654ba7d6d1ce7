"""Helpers for the Explore page: words instead of word pieces, long inputs, large model views.
Pure functions (torch, numpy, plotly; no Streamlit).

Read in words (core.tokens.words): a word's column is the SUM of its pieces' columns (the total
attention to the word), a word's row is the MEAN of its pieces' rows; rows still sum to 1.

Long inputs: a map wider than `max_side` is drawn as contiguous blocks of tokens with the
same rule (keys summed within a block, queries averaged), so each drawn row still sums to
1 and the 0-1 colour scale keeps its meaning. Downloads keep the full matrix.

Large models: the model view can show a range of layers (the row titles and hover keep the
real layer numbers), each map reduced to at most `max_side` per side before it is drawn.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
import torch

from core import trace_names as tn
from core.tokens.tokenizer import WordTokenizer
from core.tokens.words import Groups, merge_attention, word_groups, word_labels
from core.head_maps import derived as per_trace
from viz.figures.grid import map_entropy, tiled_grid_pick, tiled_head_grid
from core.head_maps import layer_summary, long_layer
from viz.figures.reduce import block_size, blocks, reduce_to, tick_indices
from viz.figures.select import SPECIAL_TOKENS, View, attention_matrix, drop_special, layer_note

MAX_HEATMAP_SIDE = 128  # a single heatmap wider than this is drawn in blocks (unless asked otherwise)
MAX_GRID_SIDE = 48  # each thumbnail of the model view at most this many cells per side
MAX_GRID_LAYERS = 12  # deeper models show a range of layers in the model view
HEAD_VIEW_MAX = 96  # the head view (lines between tokens) draws a window of at most this many tokens


# ------------------------------------------------------------------ words
def reads_pieces(model) -> bool:
    """Whether the model's tokenizer splits words into pieces (so 'read in words' applies)."""
    return not isinstance(model.tokenizer, WordTokenizer)


def side_groups(trace, side: str, text: Optional[str] = None) -> Tuple[Groups, List[str]]:
    """Word groups and labels of a token side ('source' or 'target').

    The source (and a decoder-only model's input, which starts with the prompt) has the
    tokenizer's word ids; any other position is its own group."""
    tokens = trace.tokens(side)
    meta = trace.meta
    has_words = side == "source" or meta.get("kind") == "decoder"
    word_ids = list(meta.get("word_ids") or []) if has_words else []
    special = list(meta.get("special") or []) if has_words else []
    groups = word_groups(word_ids[: len(tokens)], len(tokens), special[: len(tokens)])
    offsets = meta.get("offsets") if has_words else None
    return groups, word_labels(groups, tokens, offsets, text if has_words else None)


def view_sides(stack: str, kind: str) -> Tuple[str, str]:
    """(query side, key side) of an attention view."""
    if stack == "encoder":
        return "source", "source"
    return "target", ("source" if kind == "cross_attn" else "target")


def _special_group(groups: Groups, tokens: Sequence[str]) -> List[bool]:
    return [len(g) == 1 and tokens[g[0]] in SPECIAL_TOKENS for g in groups]


def word_matrix(trace, view: View, text: Optional[str] = None, hide_special: bool = False):
    """(W_q x W_k word-level matrix, query labels, key labels) for a view: pieces merged into
    words (keys summed, queries averaged). With hide_special, special tokens are dropped
    and rows renormalised to sum to 1, as viz.figures.select.attention_matrix does for tokens."""
    m, _, _ = attention_matrix(trace, view, hide_special=False)
    q_side, k_side = view_sides(view.stack, view.kind)
    q_groups, q_labels = side_groups(trace, q_side, text)
    k_groups, k_labels = side_groups(trace, k_side, text)
    merged = merge_attention(m, q_groups, k_groups)
    if hide_special:
        return drop_special(merged, q_labels, k_labels, _special_group(q_groups, trace.tokens(q_side)),
                            _special_group(k_groups, trace.tokens(k_side)), renormalise=view.what == "weights")
    return merged, q_labels, k_labels


def word_stack(trace, stack: str, kind: str, layers: Sequence[int], text: Optional[str] = None,
               what: str = "weights") -> List[torch.Tensor]:
    """The H x W_q x W_k word-level weights (or value norms: what="value_norms") of the given layers."""
    q_side, k_side = view_sides(stack, kind)
    q_groups, _ = side_groups(trace, q_side, text)
    k_groups, _ = side_groups(trace, k_side, text)
    return [merge_attention(trace[tn.attn(stack, i, kind, what)], q_groups, k_groups) for i in layers]


# ------------------------------------------------------------------ what each layer is
def layer_notes(model, stack: str, kind: str, n_layers: int) -> List[str]:
    """Each layer's kind in a few words (viz.figures.select.layer_note: "sliding 4 · RoPE",
    "chunked 5 · RoPE", "causal · NoPE · scale by position", "sliding 4 · RoPE · learned sink")
    for a self-attention; cross-attention's layers (they see every source token) and models
    that do not describe their layers get "" each."""
    infos = None
    if kind == "self_attn" and hasattr(model, "layer_kinds"):
        try:
            infos = model.layer_kinds(stack)
        except (ValueError, AttributeError):
            infos = None
    if not infos or len(infos) != n_layers:
        return [""] * n_layers
    return [layer_note(i) for i in infos]


def layer_sinks(trace, stack: str, kind: str, layers: Sequence[int], max_side: int = MAX_GRID_SIDE):
    """The learned sinks of the chosen layers for the model view (each H x b_q: a sink's mass
    per head and query, queries averaged in blocks as reduce_stack averages the maps' rows),
    or None where the layers have no learned sink."""
    names = [tn.attn(stack, i, kind, "sink") for i in layers]
    if kind != "self_attn" or not all(n in trace for n in names):
        return None
    return [reduce_to(torch.as_tensor(trace[n])[..., None], max_side)[..., 0] for n in names]


# ------------------------------------------------------------------ long inputs
def block_labels(groups: Groups, labels: Sequence[str]) -> List[str]:
    out = []
    for g in groups:
        if len(g) == 1:
            out.append(labels[g[0]])
        else:
            out.append(f"{labels[g[0]]}… [{g[0]}–{g[-1]}]")
    return out


def reduce_map(matrix, q_labels: Sequence[str], k_labels: Sequence[str], max_side: int = MAX_HEATMAP_SIDE):
    """A (..., n_q, n_k) attention map drawn in at most max_side blocks per side: keys
    summed within a block, queries averaged (rows still sum to 1). Returns (z, block query
    labels, block key labels, query block size, key block size); unchanged when small."""
    m = torch.as_tensor(matrix)
    n_q, n_k = m.shape[-2], m.shape[-1]
    if n_q <= max_side and n_k <= max_side:
        return m, list(q_labels), list(k_labels), 1, 1
    qg, kg = blocks(n_q, max_side), blocks(n_k, max_side)
    z = reduce_to(m, max_side)
    return z, block_labels(qg, q_labels), block_labels(kg, k_labels), len(qg[0]), len(kg[0])


def head_view_window(n_q: int, n_k: int, start: int, size: int = HEAD_VIEW_MAX) -> Tuple[slice, slice]:
    """The queries and keys a head view draws for a window of `size` positions from `start`
    (clamped so the window fits each side; a side that fits is drawn whole)."""
    def side(n):
        lo = min(max(0, int(start)), max(0, n - size))
        return slice(lo, min(n, lo + size))
    return side(n_q), side(n_k)


def reduce_stack(weights_by_layer: Sequence, max_side: int = MAX_GRID_SIDE) -> List[torch.Tensor]:
    """Each H x n_q x n_k map reduced like reduce_map (so thumbnails keep the 0-1 scale)."""
    return [reduce_to(torch.as_tensor(w), max_side) for w in weights_by_layer]


# ------------------------------------------------------------------ model view of a layer range
def default_layer_range(n_layers: int, max_layers: int = MAX_GRID_LAYERS) -> Tuple[int, int]:
    return 0, min(n_layers, max_layers) - 1


def layer_range_around(layer: int, n_layers: int, max_layers: int = MAX_GRID_LAYERS) -> Tuple[int, int]:
    """max_layers layers (or all) with `layer` in the middle, shifted to fit the model."""
    width = min(n_layers, max_layers)
    lo = min(max(0, layer - width // 2), n_layers - width)
    return lo, lo + width - 1


def clamp_range(value, n_layers: int) -> Tuple[int, int]:
    """A (first, last) layer range made valid for a model with n_layers layers."""
    try:
        lo, hi = int(value[0]), int(value[1])
    except (TypeError, ValueError, IndexError):
        return default_layer_range(n_layers)
    lo, hi = min(max(lo, 0), n_layers - 1), min(max(hi, 0), n_layers - 1)
    return (lo, hi) if lo <= hi else (hi, lo)


def pool_maps(weights_by_layer: Iterable, max_side: int = MAX_GRID_SIDE):
    """Thumbnails of the model view from full maps, one layer at a time (an iterable, so a
    caller can compute each layer's maps only when it is pooled and drop them after):
    (each layer's H x b_q x b_k thumbnail, each layer's H mean row entropies of the FULL
    maps, the full (n_q, n_k))."""
    maps, entropy, full = [], [], None
    for w in weights_by_layer:
        w = torch.as_tensor(w)
        full = full or (w.shape[-2], w.shape[-1])
        entropy.append(map_entropy(w))
        maps.append(reduce_stack([w], max_side)[0])
    return maps, entropy, full


def pooled_layers(trace, stack: str, kind: str, layers: Sequence[int], text: Optional[str] = None,
                  words: bool = False, max_side: int = MAX_GRID_SIDE, what: str = "weights", progress=None):
    """pool_maps over the chosen layers of a trace, computed layer by layer (never all L x H
    full maps at once) and kept with the trace (core.head_maps.derived), so redrawing the model view does
    no model work. what: "weights" or "value_norms" (then each layer's maps are divided by that
    layer's largest norm, so the grid's 0..1 colour scale shows them). A long input
    (core.head_maps.long_layer) is pooled one head and a tile of rows at a time (trace's
    layer_summary: block means times each key block's width = keys summed, rows averaged, the
    same numbers) and never holds even one layer's maps. progress(done, total)."""
    key = ("pooled", stack, kind, tuple(layers), words, max_side, text if words else None) + (
        (what,) if what != "weights" else ())
    memo = per_trace(trace)
    if key not in memo and not words and what == "weights" and long_layer(trace, stack, kind):
        n = len(trace.tokens(view_sides(stack, kind)[0]))
        f = block_size(n, max_side)
        widths = torch.tensor([len(g) for g in blocks(n, max_side)], dtype=torch.float32)
        maps, entropy = [], []
        for k, i in enumerate(layers):
            if progress is not None:
                progress(k, len(layers))
            m, prof = layer_summary(trace, stack, i, f)
            maps.append(m * widths[None, None, :])
            entropy.append(np.array(prof["entropy"]))
        memo[key] = (maps, entropy, (n, n))
    if key not in memo:
        got = (d[tn.local(kind, what)] for d in trace.each_layer(stack, [tn.local(kind, what)], layers))
        if what != "weights":
            got = (w / w.max().clamp_min(1e-30) for w in got)
        if words:
            q_side, k_side = view_sides(stack, kind)
            q_groups, k_groups = side_groups(trace, q_side, text)[0], side_groups(trace, k_side, text)[0]
            got = (merge_attention(w, q_groups, k_groups) for w in got)
        memo[key] = pool_maps(got, max_side)
    return memo[key]


def grid_figure(weights_by_layer: Iterable, first_layer: int, *,
                selected: Optional[Tuple[int, int]] = None, max_side: int = MAX_GRID_SIDE, title: str = "",
                pooled=None, notes: Optional[Sequence[str]] = None, sinks=None) -> go.Figure:
    """The model view of layers first_layer, first_layer + 1, ...: every map reduced to at
    most max_side blocks per side (reduce_stack), then tiled into one heatmap
    (viz.figures.grid.tiled_head_grid) with the real layer numbers on its rows and in its hover;
    selected = (layer, head) is outlined. The hover's entropy is that of the full maps.
    pooled: pool_maps's result (then weights_by_layer is not read). notes: each drawn layer's
    kind (layer_notes), written beside its row. sinks: layer_sinks's result, each map's learned
    sink drawn as a column of its own right of its keys."""
    maps, entropy, (n_q_full, n_k_full) = pooled if pooled is not None else pool_maps(weights_by_layer, max_side)
    n_q, n_k = maps[0].shape[-2], maps[0].shape[-1]
    qpos = kpos = None
    if n_q < n_q_full or n_k < n_k_full:
        qpos = [g[0] for g in blocks(n_q_full, max_side)]
        kpos = [g[0] for g in blocks(n_k_full, max_side)]
    return tiled_head_grid(maps, first_layer=first_layer, selected=selected, q_positions=qpos, k_positions=kpos,
                           title=title, entropy=entropy, notes=notes, sinks=sinks)


def grid_pick(point: dict) -> Optional[Tuple[int, int]]:
    """(layer, head) of a clicked point of grid_figure (a selection point from the browser);
    None when the click landed on no map."""
    return tiled_grid_pick(point)


def fit_block_ticks(fig: go.Figure, max_ticks: int = 32, top_margin: int = 150) -> go.Figure:
    """A heatmap of blocks: at most max_ticks labelled ticks on the (top) key axis, and room
    above the map for those longer labels so they clear the title."""
    ax = fig.layout.xaxis
    vals, text = list(ax.tickvals or []), list(ax.ticktext or [])
    if len(vals) > max_ticks:
        keep = tick_indices(len(vals), max_ticks)
        ax.tickvals, ax.ticktext = [vals[i] for i in keep], [text[i] for i in keep]
    fig.update_layout(margin=dict(t=max(top_margin, fig.layout.margin.t or 0)),
                      title=dict(y=1.0, yanchor="top", pad=dict(t=8)))
    return fig


def selected_figure(matrix, q_labels: Sequence[str], k_labels: Sequence[str], label: str, *, fixed_scale: bool = True,
                    log_scale: bool = False, sink=None) -> go.Figure:
    """The selected map under the model view: reduce_map's blocks, 420 px high. sink: the
    map's learned sink (n_q), drawn as a column of its own where the map is drawn cell for cell."""
    from viz.figures.heatmaps import add_sink_column, attention_heatmap, fix_margins

    z, zq, zk, fq, fk = reduce_map(matrix, q_labels, k_labels)
    fig = fix_margins(attention_heatmap(z, zq, zk, title="selected: " + label, fixed_scale=fixed_scale, height=420,
                                        log_scale=log_scale), zq, zk, min_top=90)
    if sink is not None and fq == 1 and fk == 1:
        add_sink_column(fig, sink, log_scale=log_scale)
    return fig
