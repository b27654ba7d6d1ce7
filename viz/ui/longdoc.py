"""Explore's long-document parts (Streamlit): the time warning and progress bar of a long
trace, the overview + zoom heatmap that replaces a full map past core.head_maps.LONG_LAYER_BYTES,
and the "Long document" tab (spans, head profiles, surprisal). Figures: viz.figures.long_maps;
numbers: core.head_maps and core.analysis.surprisal (one head and a tile of rows at a time).

What these views compute after the trace passes the admission gate too (`work`: costed from
shapes by viz.ui.gate.maps_bytes and surprisal_bytes, admitted ahead of the waiting traces,
since the page already holds its trace).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Optional

import numpy as np
import streamlit as st
import torch

from core.analysis.surprisal import surprisal
from core.analysis.spans import block, span_mass
from core.head_maps import long_layer, profiles
from viz.figures import long_maps as lm
from core.head_maps import derived as per_trace
from viz.figures.heatmaps import attention_heatmap, fix_margins
from viz.figures.reduce import block_size
from viz.figures.text import clean_text
from viz.ui import admission, charts, downloads
from viz.ui import gate as vg

SURPRISAL_WINDOW = 640  # tokens drawn at once in the surprisal grid (one SVG text per token)
OVERVIEW_SIDE = 128  # the overview's blocks per side (as a long token map is drawn)
ZOOM_TOKENS = 400  # the most tokens a side of a zoom (spans, overview blocks) draws
WARN_SECONDS = 15.0  # a trace expected to take longer than this is announced first
MIN_TOKENS = 1000  # shorter inputs are never announced (no calibration run for them)
CALIBRATION_TOKENS = (128, 512)  # two timed passes at each length (the faster kept)
ATTN_SPEEDUP = 1.45  # causal attention's FLOPs ran ~1.45x faster than the linear layers' (smollm2, one thread,
#                      traced passes of 512-4,096 tokens on this CPU: fitted a n + b n^2 against the FLOP counts)
_CALIBRATING = threading.Lock()
_COST: dict = {}  # model name -> (tokens, seconds, seconds per FLOP or None): a measured traced pass
SECTIONS = {"spans": "Spans", "profiles": "Head profiles", "surprisal": "Surprisal"}  # the Long document tab's tabs


def is_long(trace, stack: str, kind: str) -> bool:
    return long_layer(trace, stack, kind)


@contextmanager
def work(trace, what: str, stack: str = "decoder", maps: int = 1):
    """Run a long input's view work (`what`: "surprisal", or what reads `maps` heads' maps one
    at a time) once the admission gate admits it: its cost from shapes (gate.maps_bytes,
    gate.surprisal_bytes), its first time estimate from its FLOPs (then the gate's measurements),
    ahead of the waiting traces (the page holds its trace already). A trace with no model
    (loaded from a file) computes nothing heavy and passes."""
    model = trace.model
    if model is None:
        yield
        return
    cfg = model.config
    n = len(trace.tokens("source" if stack == "encoder" else "target")) or len(trace.tokens("source"))
    if what == "surprisal":
        cost, flop = vg.surprisal_bytes(cfg, n), 2.0 * n * cfg.tgt_vocab_size * cfg.d_model
    else:
        d_k = cfg.d_head or cfg.d_model // cfg.n_heads
        cost, flop = vg.maps_bytes(cfg, n), 4.0 * n * n * d_k * max(1, maps)
    name = trace.meta.get("model") or getattr(model, "name", "model")
    with admission.admitted(cost, flop * admission.SECONDS_PER_FLOP, f"{name} {what}, {n:,} tokens",
                            kind=vg.kind_of(what, name),
                            first=True):
        yield


# ------------------------------------------------------------------ before and during a long trace
def flops(model, n: int) -> float:
    """FLOPs of a traced pass over n tokens, as a cost model: every weight once per token (2 x the
    parameters: projections, FFN, output layer; an untied embedding table counts too, a slight
    over-count) and causal attention's QK^T and AV (2 x 2 x n/2 keys x H d_k per layer per token,
    divided by ATTN_SPEEDUP)."""
    c = model.config
    params = sum(p.numel() for p in model.net.parameters())
    d_attn = c.n_heads * (c.d_head or c.d_model // c.n_heads)
    layers = (c.n_decoder_layers or c.n_layers) if model.kind != "encoder" else c.n_layers
    return float(n) * (2.0 * params + 2.0 * d_attn * layers * n / ATTN_SPEEDUP)


def expected_seconds(model, n: int, cost: tuple) -> float:
    """The traced pass's expected time at n tokens from a measured cost (tokens, seconds, seconds
    per FLOP): with a slope (two calibration passes, so the fixed per-pass overhead is left out),
    seconds + slope x the extra FLOPs; without one (a long pass measured), in proportion to FLOPs."""
    at, seconds, slope = (tuple(cost) + (None,))[:3]
    if slope is None or slope <= 0:
        return seconds * flops(model, n) / flops(model, at)
    return seconds + slope * (flops(model, n) - flops(model, at))


def trace_seconds(model, model_name: str, n: int) -> float:
    """A trace's first time estimate for the admission gate: the long-trace cost model, from this
    model's cost measured in this process (measured now, once, for a long input: a waiting
    session is told its wait before any trace has ended), else a rough rate for a short one (the
    gate then corrects it by the times it measures)."""
    cost = _COST.get(model_name)
    if cost is None and n >= MIN_TOKENS:
        cost = calibrate(model, model_name)
    if cost is not None:
        return expected_seconds(model, n, cost)
    return flops(model, n) * admission.SECONDS_PER_FLOP


def calibrated(model_name: str) -> bool:
    """Whether trace_seconds estimates this model's traces from a pass measured in this process."""
    return model_name in _COST


def _timed_pass(model, n: int) -> float:
    cfg = model.config  # ids within every vocabulary the pass reads (a tiny checkpoint's has a few hundred)
    vocab = min(v for v in (cfg.src_vocab_size, cfg.tgt_vocab_size) if v) if (cfg.src_vocab_size or cfg.tgt_vocab_size) else 11
    ids = [10 + i % max(1, vocab - 10) for i in range(n)]
    t0 = time.perf_counter()
    if model.kind == "decoder":
        model._run_traced(None, ids)
    elif model.kind == "encoder":
        model._run_traced(ids[: model.config.max_len], None)
    else:
        model._run_traced(ids[: model.config.max_len], ids[:8])
    return time.perf_counter() - t0


def calibrate(model, model_name: str) -> tuple:
    """The model's measured cost (tokens, seconds, seconds per FLOP): the longest traced pass of
    this model measured in this process, else passes run now at the two CALIBRATION_TOKENS
    lengths, whose difference gives the cost of a FLOP without the per-pass overhead."""
    with _CALIBRATING:  # once per model: sessions arriving together wait for the first one's passes
        if model_name not in _COST:
            _calibrate(model, model_name)
    return _COST[model_name]


def _calibrate(model, model_name: str) -> None:
    if model_name not in _COST:
        short, long_ = (min(t, model.max_input_tokens) for t in CALIBRATION_TOKENS)
        # each twice, the faster kept: the first pass of a process also allocates and starts threads, and
        # another process on the machine stretches one pass more than both
        t_short = min(_timed_pass(model, short), _timed_pass(model, short))
        t_long = min(_timed_pass(model, long_), _timed_pass(model, long_))
        slope = (t_long - t_short) / max(1.0, flops(model, long_) - flops(model, short))
        floor = 0.5 * t_long / flops(model, long_)  # a noisy difference (a busy machine) falls back to a ratio
        _COST[model_name] = (long_, t_long, slope if slope >= floor else None)


def before_trace(model, model_name: str, text: str):
    """For an input whose traced pass is expected to take more than WARN_SECONDS: a warning
    with the expected time (calibrate + expected_seconds) and a progress callback drawing a bar
    that counts the time left from the layers done; else None. Tokenizes the text (cheap); runs
    nothing else but, once per model and process, the short calibration passes."""
    if model is None or not text:
        return None
    try:
        n = min(len(model.tokenizer.encode(clean_text(text)[0]).ids), model.max_input_tokens)
    except Exception:
        return None
    if n < MIN_TOKENS:
        return None
    cost = calibrate(model, model_name)
    expected = expected_seconds(model, n, cost)
    if expected < WARN_SECONDS:
        return None
    at, seconds = cost[0], cost[1]
    note = st.empty()  # the warning goes when the run ends (models.get_trace empties .note and .bar)
    note.warning(f"This input is {n:,} tokens long: the traced pass will take about {_human(expected)} on this "
                 f"machine (measured here: {1000 * seconds / at:.1f} ms per token at {at:,} tokens; attention's share "
                 "of the time grows with the length, and a busy machine takes longer). The views then read one head "
                 "and a tile of rows at a time.")
    bar = st.progress(0.0, text="Running the model…")
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        spent = time.perf_counter() - t0
        left = f", about {_human(spent / done * (total - done))} left" if 0 < done < total else ""
        bar.progress(min(1.0, done / max(1, total)), text=f"Running the model: layer {done + 1} of {total}{left}"
                     if done < total else "Done")
        if done >= total and n > _COST.get(model_name, (0, 0))[0]:  # the cost measured at this length
            _COST[model_name] = (n, spent, None)

    def finish() -> None:
        """The run ended: the warning and the bar go; a caption says what the pass took against
        what was expected (a busy machine can take several times the estimate)."""
        bar.empty()
        spent = time.perf_counter() - t0
        note.caption(f"This input is {n:,} tokens long: the traced pass took {_human(spent)} on this machine "
                     f"(expected about {_human(expected)}, from {1000 * seconds / at:.1f} ms per token measured at "
                     f"{at:,} tokens).")

    progress.bar = bar
    progress.note = note
    progress.finish = finish
    return progress


def announce(model, model_name: str, text: str):
    """What models.get_trace calls before a traced pass it has to compute: before_trace."""
    return lambda: before_trace(model, model_name, text)


def _human(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} minutes"


# ------------------------------------------------------------------ overview + zoom of one head's map
def _heads(view, n_heads: int):
    return list(range(n_heads)) if view.head is None else [view.head]


def _blocks(trace, view):
    """(tokens, block size) of the overview of this view's map."""
    n = len(trace.tokens("target" if view.stack == "decoder" else "source"))
    return n, block_size(n, OVERVIEW_SIDE)


def overview(trace, view, n_heads: int, log_scale: bool = False, fixed_scale: bool = True, selected=None):
    """(figure, size, n, pooled nb x nb) of one head's (or the mean of heads') pooled map."""
    n, size = _blocks(trace, view)
    heads = _heads(view, n_heads)
    with work(trace, "overview", view.stack, len(heads)):
        p = trace.pooled(view.name, size, heads=heads).mean(0)
    fig = lm.overview_figure(p, size, n, title=f"{view.label()} · overview, blocks of {size} tokens",
                             log_scale=log_scale, fixed_scale=fixed_scale, selected=selected)
    return fig, size, n, p


def _open_box(got, nb: int):
    """The overview box kept in the session (first row, last row, first col, last col), on this map."""
    try:
        box = tuple(int(v) for v in got)
    except (TypeError, ValueError):
        return 0, 0, 0, 0
    if len(box) != 4:
        return 0, 0, 0, 0
    a0, a1, b0, b1 = (min(max(0, v), nb - 1) for v in box)
    return min(a0, a1), max(a0, a1), min(b0, b1), max(b0, b1)


def heatmap_tab(trace, view, q_toks, k_toks, n_heads: int, *, model_name: str, per_map: bool, log_scale: bool,
                key: str = "explore") -> None:
    """The overview of the selected map (its pooled block means) and, below, the full-resolution
    blocks a box dragged over it opens (default: the first block)."""
    n, size = _blocks(trace, view)
    nb = -(-n // size)
    zoom_key = f"{key}.zoom"
    box = _open_box(st.session_state.get(zoom_key, (0, 0, 0, 0)), nb)
    fig = overview(trace, view, n_heads, log_scale, fixed_scale=not per_map, selected=box)[0]

    def pick() -> None:
        sel = st.session_state.get(f"{key}-heatmap")
        got = lm.box_cells((sel or {}).get("selection") or {}, nb)
        if got is not None:
            st.session_state[zoom_key] = got

    st.info(f"Long input ({n:,} tokens): one head's map is {n:,} × {n:,} cells, so it is drawn as {nb} × {nb} "
            f"blocks of {size} × {size} tokens, each the block's mean weight with the keys summed, so rows still sum "
            "to 1 (computed a tile of rows of one head at a time, never the whole layer). Drag a box over blocks to "
            f"open them at full resolution below (at most {ZOOM_TOKENS} tokens a side; a box is 12 pixels a side at "
            "least: zoom in first with the chart's zoom tool to pick one block).")
    charts.chart(fig, key=f"{key}-heatmap", on_select=pick, selection_mode="box", width="stretch",
                 name=downloads.map_name(model=model_name, stack=view.stack, kind=view.kind, layer=view.layer,
                                  head=view.head, suffix="-overview"))
    (r0, r1), (c0, c1) = lm.zoom_rows(box, size, n, ZOOM_TOKENS)
    cut = lm.zoom_rows(box, size, n) != ((r0, r1), (c0, c1))
    with work(trace, "zoom", view.stack, len(_heads(view, n_heads))):
        z = block(trace, view.name, (r0, r1), (c0, c1), _heads(view, n_heads))
    title = f"{view.label()} · queries {r0}–{r1 - 1} × keys {c0}–{c1 - 1} (full resolution)"
    zfig = fix_margins(attention_heatmap(z, q_toks[r0:r1], k_toks[c0:c1], title=title, fixed_scale=False,
                                         log_scale=log_scale), q_toks[r0:r1], k_toks[c0:c1], min_top=90)
    charts.chart(zfig, key=f"{key}-zoom", width="stretch",
                 name=downloads.map_name(model=model_name, stack=view.stack, kind=view.kind, layer=view.layer,
                                  head=view.head, suffix=f"-q{r0}-k{c0}"))
    st.caption("The blocks' real weights, coloured on their own scale (their rows are parts of rows of the "
               "whole map: they sum to less than 1 where the query looks outside them)." + (
                   f" The box covers more than {ZOOM_TOKENS} tokens a side: its first {ZOOM_TOKENS} are drawn."
                   if cut else ""))
    downloads.offer(trace, z, q_toks[r0:r1], k_toks[c0:c1], model=model_name, stack=view.stack, kind=view.kind,
             layer=view.layer, head=view.head, key=f"{key}-zoom-dl", suffix=f"-q{r0}-k{c0}")


def pooled_layers(trace, stack: str, kind: str, layers, text: str, words: bool, long_input: bool,
                  what: str = "weights"):
    """viz.figures.model_view.pooled_layers, with a progress bar for a long input (one head at a time)."""
    from viz.figures import model_view

    bar = st.progress(0.0, text="Pooling the maps layer by layer…") if long_input else None
    with (work(trace, "model view", stack, len(layers) * trace.n_heads(stack)) if long_input else nullcontext()), \
            st.spinner("Computing the maps layer by layer…"):
        pooled = model_view.pooled_layers(trace, stack, kind, layers, text, words, what=what, progress=bar and (
            lambda k, t: bar.progress(k / t, text=f"Pooling the maps one head at a time: layer {k + 1} of {t}")))
    if bar is not None:
        bar.empty()
    return pooled


def head_view_weights(trace, view, n_heads: int, qs: slice, ks: slice) -> torch.Tensor:
    """Every head's weights on a window (H x |qs| x |ks|), each head's rows computed alone."""
    with work(trace, "head view", view.stack, n_heads):
        return torch.stack([block(trace, view.name, (qs.start, qs.stop), (ks.start, ks.stop), [h])
                            for h in range(n_heads)])


# ------------------------------------------------------------------ the Long document tab
def long_tab(trace, text: str, view, n_heads: int, n_layers: int, *, model_name: str, key: str = "explore",
             log_scale: bool = False, section_key: Optional[str] = None) -> None:
    """Spans, head profiles and (decoders) surprisal, for any length; section_key: the session key
    of the open section (url_switches.tab over SECTIONS, so the URL names it)."""
    stack, kind = view.stack, view.kind
    if kind != "self_attn":
        st.info("The long-document views read self-attention; pick a self-attention map above.")
        return
    tokens = trace.tokens("target" if stack == "decoder" else "source")
    # lazy: only the open section runs and is drawn (the surprisal grid and the profiles used to be built and
    # drawn hidden beside the span map, in the browser's same main-thread task)
    sec_spans, sec_prof, sec_surp = st.tabs(list(SECTIONS.values()), key=section_key or f"{key}.section",
                                            on_change="rerun")
    with sec_spans:
        if sec_spans.open is not False:
            _spans_section(trace, text, view, tokens, model_name=model_name, key=key, log_scale=log_scale)
    with sec_prof:
        if sec_prof.open is not False:
            _profiles_section(trace, view, n_heads, n_layers, len(tokens), model_name=model_name, key=key)
    with sec_surp:
        if sec_surp.open is not False:
            _surprisal_section(trace, tokens, model_name=model_name, key=key)


def _spans_section(trace, text: str, view, tokens, *, model_name: str, key: str, log_scale: bool) -> None:
    """The span x span map of attention mass, the zoom a box dragged over it opens, the text shaded by a
    span's attention."""
    stack = view.stack
    offsets = trace.meta.get("offsets") or []
    n = len(tokens)
    cleaned = clean_text(text)[0]
    mode = st.radio("Spans", ["sentences", "paragraphs"], horizontal=True, key=f"{key}.span_mode",
                    help="Sentences end at . ! ? or a line break; paragraphs at a blank line.")
    offs = list(offsets[:n]) + [(0, 0)] * max(0, n - len(offsets))
    span_of, ranges, labels = lm.split_spans(cleaned, offs, mode)
    s = len(ranges)
    which = "the mean of the layer's heads" if view.head is None else f"head {view.head}"
    st.caption(f"{n:,} tokens in {s} {mode}. Attention mass between them for layer {view.layer}, {which} (the "
               "picker above): a row is a querying span, its cells the share of its weight (averaged over its "
               "tokens) that goes to each span; rows sum to 1. Drag a box over cells to see those spans' tokens "
               "(a box is 12 pixels a side at least: on a dense map, zoom in first with the chart's zoom tool).")
    heads = None if view.head is None else [view.head]
    mass = _span_mass(trace, view.name, span_of, heads)
    sel_key = f"{key}.span_cell"
    from_key = f"{key}.span_from.{mode}.{s}"  # a new text or split gets its own picker (default: the last)

    def pick() -> None:
        got = lm.box_cells((st.session_state.get(f"{key}-spans") or {}).get("selection") or {}, s)
        if got is not None:
            st.session_state[sel_key] = got
            st.session_state[from_key] = got[0]  # shade the text by the box's first row

    cell = st.session_state.get(sel_key)
    cell = tuple(cell) if cell is not None and len(cell) == 4 and max(cell) < s else None  # a box on this map
    charts.chart(lm.span_figure(mass, labels, title=f"{view.label()} · {mode} × {mode}", selected=cell,
                                log_scale=log_scale),
                 key=f"{key}-spans", on_select=pick, selection_mode="box", width="stretch",
                 name=f"{model_name}-{stack}-L{view.layer}-{mode}")
    if cell is not None:
        _span_zoom(trace, view, tokens, span_of, cell, heads, mode, model_name=model_name, key=key)
    chosen = st.selectbox(f"Shade the text by the attention each {mode[:-1]} receives from", list(range(s)),
                          index=min(s - 1, cell[0]) if cell else s - 1, format_func=lambda k: labels[k],
                          key=from_key)
    st.dataframe(lm.shaded_frame(cleaned, ranges, mass[chosen].tolist(), chosen), hide_index=True,
                 width="stretch", height=min(600, 40 + 35 * s), key=f"{key}-shaded")


def _span_zoom(trace, view, tokens, span_of, cell, heads, mode: str, *, model_name: str, key: str) -> None:
    """The full-resolution weights of the boxed spans' tokens (at most ZOOM_TOKENS a side)."""
    a0, a1, b0, b1 = cell
    tr = lm.span_token_ranges(span_of)
    (r0, r1), (c0, c1) = (tr[a0][0], tr[a1][1]), (tr[b0][0], tr[b1][1])
    cut = r1 - r0 > ZOOM_TOKENS or c1 - c0 > ZOOM_TOKENS
    r1, c1 = min(r1, r0 + ZOOM_TOKENS), min(c1, c0 + ZOOM_TOKENS)
    with work(trace, "span zoom", view.stack, len(heads) if heads else trace.n_heads(view.stack)):
        z = block(trace, view.name, (r0, r1), (c0, c1), heads)
    word = mode[:-1]
    what = (f"{word} {a0}" if a0 == a1 else f"{mode} {a0}–{a1}") + " → " + (f"{word} {b0}" if b0 == b1 else f"{mode} {b0}–{b1}")
    fig = fix_margins(attention_heatmap(z, tokens[r0:r1], tokens[c0:c1], fixed_scale=False,
                                        title=f"{what}: tokens {r0}–{r1 - 1} × {c0}–{c1 - 1}"),
                      tokens[r0:r1], tokens[c0:c1], min_top=90)
    if cut:
        st.caption(f"The box covers more than {ZOOM_TOKENS} tokens a side: its first {ZOOM_TOKENS} are drawn.")
    charts.chart(fig, key=f"{key}-span-zoom", width="stretch", name=f"{model_name}-span-{a0}-{b0}")


def _profiles_section(trace, view, n_heads: int, n_layers: int, n: int, *, model_name: str, key: str) -> None:
    """Every layer x head's mean attention distance, sink mass and local mass (on a toggle past 1,024 tokens)."""
    stack = view.stack
    size = 128
    st.caption(f"Every layer × head on this input: where its attention goes, read one head and {size} query rows "
               "at a time. Mean attention distance Σ_j a_ij |i − j| averaged over queries; mass on the first token "
               "(the attention sink); mass within the last 64 tokens (local heads near 1, global ones low).")
    if st.toggle("Compute every head's profile", key=f"{key}.profiles", value=n <= 1024,
                 help=f"{n_layers} layers × {n_heads} heads: about as long as one traced pass on a long input."):
        bar = st.progress(0.0, text="Profiling heads…")
        prof = {}
        rows = []
        with work(trace, "head profiles", stack, n_layers * n_heads):
            for i in range(n_layers):
                bar.progress(i / n_layers, text=f"Profiling heads: layer {i + 1} of {n_layers}")
                rows.append(profiles(trace, stack, size=size, layers=[i]))
        bar.empty()
        for k in rows[0]:
            prof[k] = torch.cat([r[k] for r in rows]).numpy()
        charts.chart(lm.profile_figure(prof, title=f"{stack} self-attention: head profiles ({n:,} tokens)"),
                     key=f"{key}-profiles", width="stretch", name=f"{model_name}-head-profiles")


def _surprisal_section(trace, tokens, *, model_name: str, key: str) -> None:
    """Each token coloured by its surprisal under a decoder, SURPRISAL_WINDOW tokens at a time."""
    n = len(tokens)
    if trace.meta.get("kind") != "decoder":
        st.info("Surprisal is what a decoder (a model that predicts the next token) makes of each token: "
                "pick a decoder such as smollm2.")
    else:
        with work(trace, "surprisal") if ("surprisal",) not in per_trace(trace) else nullcontext():
            got = surprisal(trace)
        s_bits = got["surprisal"]
        st.caption(f"Each token coloured by its surprisal −log₂ p(token | the tokens before it) under "
                   f"{model_name} (white 0 bits, dark red {lm.SURPRISAL_TOP:.0f} or more); hover a token for its "
                   f"surprisal and the entropy of the prediction it was drawn from. Mean "
                   f"{np.nanmean(s_bits):.2f} bits per token.")
        start = 0
        if n > SURPRISAL_WINDOW:
            start = st.slider("First token shown", 0, n - 1, 0, step=lm.SURPRISAL_ROW, key=f"{key}.surp_from",
                              help=f"{SURPRISAL_WINDOW} tokens are drawn at a time; move along the text.")
        charts.chart(lm.surprisal_figure(tokens, s_bits, got["entropy"], start, SURPRISAL_WINDOW,
                                         title=f"surprisal under {model_name}, tokens {start}–"
                                               f"{min(n, start + SURPRISAL_WINDOW) - 1} of {n:,}"),
                     key=f"{key}-surprisal", width="stretch", name=f"{model_name}-surprisal")


def _span_mass(trace, name: str, span_of, heads) -> np.ndarray:
    key = ("span_mass", name, tuple(span_of), None if heads is None else tuple(heads))
    memo = per_trace(trace)
    if key not in memo:
        stack = name.split(".")[0]
        with work(trace, "spans", stack, len(heads) if heads else trace.n_heads(stack)), \
                st.spinner("Summing attention between spans, one head and a tile of rows at a time…"):
            memo[key] = span_mass(trace, name, span_of, heads).numpy()
    return memo[key]
