"""What one step of the decoder stepper shows, under its controls (viz/decoder/page.py).

`show_step` draws the step's decoder input, the three n x n maps of the look-ahead mask
(M, the masked scores, the weights: in blocks for long prefixes), the cross-attention and the
next-token bars; under teacher forcing also the check that the rows equal inference on the same
prefix. The maps come from the traces the page already holds (the steps of one traced pass and,
in teacher forcing, the trace of the whole target); the check alone runs the model, once per
step shown and cached (models.prefix_check): the decoder on the step's prefix by itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import streamlit as st

from core import trace_names as tn
from viz.decoder import figures as decoder_figures
from viz.decoder import steps as decoder_steps
from viz.ui import prefix_check as pc
from viz.figures.model_view import blocks
from viz.ui import charts, models

THREE_UP_TO, TWO_UP_TO = 4, 24  # matrices three to a row up to this many tokens, then two, then one


@dataclass
class StepView:
    """The trace a step reads and what it predicts."""
    tr: object  # the step's Trace (inference) or the whole target's (teacher forcing)
    row: int  # the step's row: the newest decoder input
    q_tokens: List[str]
    next_tokens: List[str]
    next_probs: list
    chosen: str
    forced: Optional[str] = None  # teacher forcing: the teacher's next token ...
    forced_prob: Optional[float] = None  # ... and the model's probability of it
    dec_ids: Optional[list] = None  # teacher forcing: the decoder input ids (the trace's own)
    ends_with: Optional[int] = None  # the teacher's token after the last input (<end>), if known
    next_ids: Optional[list] = None  # the ids of next_tokens
    forced_id: Optional[int] = None  # the teacher's next token's id


def _inference(tr, step: int, prefix_len: int, decoder_only: bool, cut: int = 0) -> StepView:
    row = decoder_figures.newest_row(tr)
    v = StepView(tr, row, tr.tokens("target"), tr.tokens("next"), decoder_figures.to_numpy(tr[tn.NEXT_PROBS]).tolist(),
                 tr.meta["chosen"], next_ids=[int(i) for i in decoder_figures.to_numpy(tr[tn.NEXT_IDS]).ravel()])
    n_gen = len(v.q_tokens) - prefix_len
    st.markdown(f"**Decoder input at step {step}** ({'prompt + ' if decoder_only else ''}{n_gen} generated "
                f"token{'s' if n_gen != 1 else ''}), current token in bold, then the token it chooses:")
    st.markdown(decoder_figures.chips_markdown(v.q_tokens, current=row, cut=cut) + " → " + decoder_figures.chips_markdown([v.chosen]))
    return v


def _teacher(model, full, step: int, prefix_len: int, decoder_only: bool, cut: int = 0) -> StepView:
    q_tokens = full.tokens("target")
    row = decoder_figures.step_row(step, prefix_len)
    probs_row = full[tn.PROBS][row]
    ids, p = decoder_figures.top_k(probs_row, 10)
    next_tokens = model.alternative_strings(ids)
    # the teacher's next token: the next decoder input, or <end> after the last one (an
    # encoder-decoder whose target was not cut at the maximum length)
    dec_ids = full.meta.get("target_ids")
    ends_with = None if decoder_only or full.meta.get("target_truncated") else model.end_id
    forced_id = None
    if dec_ids is not None:
        forced_id = dec_ids[row + 1] if row + 1 < len(dec_ids) else ends_with
    v = StepView(full, row, q_tokens, next_tokens, p, next_tokens[0], dec_ids=dec_ids, ends_with=ends_with,
                 next_ids=list(ids), forced_id=forced_id)
    if forced_id is not None:
        v.forced, v.forced_prob = model.target_strings([forced_id])[0], float(probs_row[forced_id])
    st.markdown(f"**Teacher forcing:** the decoder gets all {len(q_tokens)} input tokens at once; step {step} is "
                f"row {row} (bold), whose output predicts the next token:")
    st.markdown(decoder_figures.chips_markdown(q_tokens, current=row, cut=cut)
                + (" → teacher's next: " + decoder_figures.chips_markdown([v.forced]) if v.forced is not None else ""))
    return v


def show_step(model, steps: list, full, *, step: int, layer: int, head: int, prefix_len: int,
              decoder_only: bool, cut: int = 0, run_key: tuple = ()) -> tuple:
    """Draw step `step` (from 1) at this layer and head; `full` is the teacher-forced trace
    or None (inference), traced by get_trace(*run_key) (model key, prompt, target); `cut`:
    tokens cut from the start of a long prompt, marked before the decoder input. Returns
    (trace, the drawn weights, the query tokens) for the downloads."""
    v = _inference(steps[step - 1], step, prefix_len, decoder_only, cut) if full is None else \
        _teacher(model, full, step, prefix_len, decoder_only, cut)
    tr, row, q_tokens = v.tr, v.row, v.q_tokens
    mask = decoder_figures.head_matrix(tr, tn.self_attn("decoder", layer, "mask"), head)
    masked = decoder_figures.head_matrix(tr, tn.self_attn("decoder", layer, "masked"), head)
    weights = decoder_figures.head_matrix(tr, tn.self_attn("decoder", layer, "weights"), head)
    n = len(q_tokens)
    where = f"layer {layer} · head {head}"
    shown_tokens, shown_row = q_tokens, row
    if n > decoder_figures.MAX_SIDE:  # long prompts: the three n x n maps in blocks (the newest row's block outlined)
        mask, masked, shown_weights, shown_tokens, shown_row = decoder_figures.in_blocks(mask, masked, weights, q_tokens, row)
        st.caption(f"{n} positions are drawn in {len(shown_tokens)} blocks per side: weights summed over each block "
                   "of keys and averaged over its queries (rows still sum to 1); scores and the mask averaged over "
                   "each block's cells (−∞ where all are masked). Hover gives each block's range; Explore shows any "
                   "map.")
    else:
        shown_weights = weights
    # Margins fit the labels of the longest decoder input of this run, so they stay put from
    # step to step (viz.decoder.figures._tidy); the maps themselves grow with the step.
    run_tokens = q_tokens if full is not None else steps[-1].tokens("target")
    fit_self = (run_tokens, run_tokens) if shown_tokens is q_tokens else (shown_tokens, shown_tokens)
    height = int(min(900, max(360, 170 + 34 * n)))
    per_row = 3 if n <= THREE_UP_TO else 2 if n <= TWO_UP_TO else 1
    maps = dict(highlight_row=shown_row, height=height, fit=fit_self)
    drawn: dict = {}  # what each figure drew, read back from it for the check (pc.Drawn)

    def draw(what: str, fig, key: str) -> None:
        drawn[what] = fig
        charts.chart(fig, key=key, width="stretch")

    def mask_panel() -> None:
        draw("mask", decoder_figures.look_ahead_mask_figure(mask, shown_tokens, title=f"Look-ahead mask M ({n}×{n})", **maps),
             "decoder-mask")
        st.caption("M(i, j) = 0 if j ≤ i, −∞ if j > i (Lecture 10's M, Transformers handout's B): the same in every "
                   "layer and head.")

    def masked_panel() -> None:
        draw("masked", decoder_figures.masked_scores_figure(masked, shown_tokens, title=f"Masked scores QKᵀ/√d_k + M · {where}",
                                               **maps), "decoder-masked")
        st.caption("Scaled scores plus the mask: −∞ wherever a query would see a later token (adding M before or "
                   "after dividing by √d_k gives the same matrix).")

    def weights_panel() -> None:
        draw("weights", decoder_figures.weights_figure(shown_weights, shown_tokens, title=f"Weights S' = softmax(…) · {where}",
                                          **maps), "decoder-weights")
        newest = (f"The outlined row {row} ({decoder_figures.chip(q_tokens[row])}) is the newest position; its output gives the "
                  f"next token." if full is None else f"The outlined row {row} ({decoder_figures.chip(q_tokens[row])}) is the one "
                  f"step {step} of inference adds.")
        st.caption("softmax of each row: every row sums to 1 and is exactly 0 above the diagonal, so no token "
                   "attends to a later one. " + newest)

    def cross_panel() -> None:
        if not decoder_figures.has_cross_attention(tr):
            st.info("Decoder-only model: the prompt is the prefix and there is no encoder, so there is no "
                    "cross-attention. Everything the model knows about the prompt comes through the masked "
                    "self-attention.")
            return
        src = tr.tokens("source")
        cross = decoder_figures.head_matrix(tr, tn.cross_attn("decoder", layer, "weights"), head)
        draw("cross", decoder_figures.cross_attention_figure(cross, q_tokens, src, highlight_row=row, height=height,
                                                fit=(run_tokens, src), title=f"Cross-attention over the source · {where}"),
             "decoder-cross")
        best = int(np.argmax(cross[row]))
        st.caption(f"Queries from the decoder, keys and values from the encoder's output (Lecture 10). "
                   f"Row {row} ({decoder_figures.chip(q_tokens[row])}) looks most at source token {best} "
                   f"({decoder_figures.chip(src[best])}, weight {cross[row, best]:.2f}).")

    def next_panel() -> None:
        title = (f"Next token after step {step} (top {len(v.next_tokens)})" if full is None
                 else f"Row {row}'s next-token distribution (top {len(v.next_tokens)})")
        draw("bars", decoder_figures.next_token_figure(v.next_tokens, v.next_probs, chosen=v.chosen, forced=v.forced,
                                          forced_prob=v.forced_prob, title=title), "decoder-next")
        st.caption(f"Linear layer + softmax over the vocabulary (Lecture 10); greedy decoding takes the most likely "
                   f"token (red) and appends it to the input of step {step + 1}." if full is None else
                   "Red: the model's most likely token; green: the teacher's token, which the next row gets as "
                   "input whatever the model preferred.")

    layout = {  # rows of panels: the equation M -> QKᵀ/√d_k + M -> softmax reads left to right
        3: [[mask_panel, masked_panel, weights_panel], [cross_panel, next_panel]],
        2: [[mask_panel, masked_panel], [weights_panel, cross_panel], [next_panel]],
        1: [[p] for p in (mask_panel, masked_panel, weights_panel, cross_panel, next_panel)],
    }[per_row]
    for panels in layout:
        cols = st.columns(max(len(panels), min(per_row, 2))) if per_row > 1 else [st.container()]
        for col, panel in zip(cols, panels):
            with col:
                panel()
    seen = _drawn(drawn, v, layer=layer, head=head, n=n)
    if full is not None:
        _teacher_check(model, steps, full, v, step=step, prefix_len=prefix_len, run_key=run_key, drawn=seen)
    else:
        _inference_check(steps[step - 1], step=step, run_key=run_key, drawn=seen)
    return tr, weights, q_tokens


def _drawn(figures: dict, v: StepView, *, layer: int, head: int, n: int) -> pc.Drawn:
    """What the step's figures drew, read back from them (each heatmap's z, the bars' lengths): the
    arrays the check holds against the decoder run on the prefix alone."""
    maps = {what: np.asarray(fig.data[0].z, dtype=np.float64) for what, fig in figures.items() if what != "bars"}
    bars = []
    if "bars" in figures:
        ids = list(v.next_ids or [])
        drawn_p = [float(p) for p in figures["bars"].data[0].x]
        if len(drawn_p) > len(ids) and v.forced_id is not None:  # the teacher's token, added below the top k
            ids.append(int(v.forced_id))
        bars = list(zip(ids, drawn_p))
    groups = blocks(n, decoder_figures.MAX_SIDE) if n > decoder_figures.MAX_SIDE else None
    return pc.Drawn(layer, head, v.row + 1, maps, groups=groups, bars=bars, top=len(v.next_ids or []))


def _inference_check(view, *, step: int, run_key: tuple, drawn: Optional[pc.Drawn] = None) -> None:
    """The step view drawn above (a view of the one traced pass model.steps makes) against the
    decoder run on this step's input alone, in a forward pass of its own, within a stated
    tolerance: its self- (and cross-) attention weights in every layer and head, and its
    next-token probabilities."""
    if not run_key or view.meta.get("target_ids") is None:
        st.warning("This step does not say which model and input made it, so it cannot be checked against the "
                   "decoder run on its prefix alone.")
        return
    run_model = models.get_model(run_key[0])
    if run_model is None:
        return
    try:
        check = models.step_check(run_key[0], run_key[1], step, drawn.digest() if drawn else "", run_model, view,
                                  drawn)
    except Exception as exc:  # the check's own pass failed: say so, never a traceback
        st.error(f"Could not run the decoder on this step's prefix alone to check the step: {exc}")
        return
    n = check.n_rows
    parts = ", ".join(f"{k} {d:.1e}" for k, d in check.diffs.items())
    what = (f"the maps and next-token probabilities drawn for step {step} (rows 0–{n - 1} of one pass over the whole "
            f"generation) against the decoder run on these {n} tokens alone, over all {check.n_layers} layers and "
            f"{check.n_heads} heads")
    if check.ok:
        st.success(f"Step view check: {what}: largest |Δ| = {check.worst:.1e} ≤ {check.tol:.0e} ({parts}).")
    else:
        st.error(f"Step view check failed: {what}: largest |Δ| = {check.worst:.1e} > {check.tol:.0e} at {check.where} "
                 f"({parts}).")


def generation_check(model, steps: list, run_key: tuple) -> None:
    """Greedy generation through the KV cache (the tokens the steps show) against greedy
    decoding without the cache, the decoder run on the whole prefix at every step: the same
    token ids, the next-token logits within a stated tolerance."""
    if not run_key:
        return
    run_model = models.get_model(run_key[0])
    if run_model is None:
        return
    shown = tuple(int(s.meta["chosen_id"]) for s in steps)
    try:
        check = models.generation_check(run_key[0], run_key[1], shown, run_model,
                                        n_prompt=int(steps[0].meta.get("prefix_len", 1)),
                                        n_source=len(steps[0].tokens("source")) if model.kind == "encoder-decoder" else 0)
    except Exception as exc:  # the check's own runs failed: say so, never a traceback
        st.error(f"Could not generate again without the KV cache to check the output: {exc}")
        return
    what = (f"the {len(shown)} tokens generated through the KV cache against greedy decoding with no cache (the decoder "
            f"run on the whole prefix at every step)")
    first = check.first_difference
    if check.ok:
        st.success(f"KV-cache check: {what}: the same token ids; next-token logits largest |Δ| = {check.worst:.1e} "
                   f"≤ {check.tol:.0e}.")
    elif first is not None:
        st.error(f"KV-cache check failed: {what}: the tokens differ from step {first} on "
                 f"({model.target_strings(check.shown_ids[first - 1:first])} through the cache, "
                 f"{model.target_strings(check.uncached_ids[first - 1:first])} without); next-token logits largest |Δ| = "
                 f"{check.worst:.1e} at {check.where}.")
    else:
        st.error(f"KV-cache check failed: {what}: the same token ids, but next-token logits largest |Δ| = "
                 f"{check.worst:.1e} > {check.tol:.0e} at {check.where}.")


def _teacher_check(model, steps: list, full, v: StepView, *, step: int, prefix_len: int, run_key: tuple,
                   drawn: Optional[pc.Drawn] = None) -> None:
    """Teacher forcing = inference on the same prefix: the step's rows of the whole target's pass
    against the decoder run on that prefix alone (its own forward pass), within a stated
    tolerance; and every position's next-token probabilities at once."""
    n = v.row + 1
    greedy_input = steps[-1].tokens("target") + ([] if steps[-1].meta.get("ended") else [steps[-1].meta["chosen"]])
    full_toks = full.tokens("target")
    if full_toks[:n] != greedy_input[:n]:
        k = next((i for i, (a, b) in enumerate(zip(full_toks, greedy_input)) if a != b),
                 min(len(full_toks), len(greedy_input)))
        st.info(f"Your target and the greedy output differ from decoder input {k} on, so this step's prefix is "
                f"your target's, not what inference generated: the check below runs the decoder on this prefix. "
                f"Press “Use the greedy output” to step through the model's own output.")
    check = None
    if not run_key or v.dec_ids is None:
        st.warning("This trace does not say which model and decoder input made it, so its rows cannot be "
                   "checked against the decoder run on their prefix alone.")
    else:
        run_model = models.get_model(run_key[0])
        try:
            check = models.prefix_check(*run_key, n, drawn.digest() if drawn else "", run_model, full,
                                        drawn) if run_model is not None else None
        except Exception as exc:  # the check's own pass failed: say so, never a traceback
            st.error(f"Could not run the decoder on this step's prefix alone to check the rows: {exc}")
    if check is not None:
        parts = ", ".join(f"{k} {d:.1e}" for k, d in check.diffs.items())
        what = (f"rows 0–{n - 1} of the whole target's pass against the decoder run on those {n} tokens alone "
                f"(what inference computes at step {step} on this prefix, in a forward pass of its own), over all {check.n_layers} layers and "
                f"{check.n_heads} heads")
        if check.ok:
            st.success(f"Teacher forcing = inference on the same prefix: {what}: max |Δ| = {check.worst:.1e} "
                       f"≤ {check.tol:.0e} ({parts}).")
        else:
            st.error(f"Teacher forcing does not match inference on the same prefix: {what}: max |Δ| = "
                     f"{check.worst:.1e} > {check.tol:.0e} at {check.where} ({parts}).")
    if v.dec_ids is None:
        return
    dec_ids = v.dec_ids
    argmax_all = model.alternative_strings(decoder_figures.to_numpy(full[tn.PROBS]).argmax(-1).tolist())
    start_row = prefix_len - 1
    next_ids = [dec_ids[i + 1] if i + 1 < len(dec_ids) else v.ends_with for i in range(len(dec_ids))]
    frame, ce = decoder_figures.teacher_forcing_rows(
        full[tn.PROBS][start_row:], v.q_tokens[start_row:],
        [model.target_strings([j])[0] if j is not None else None for j in next_ids[start_row:]],
        next_ids[start_row:], argmax_all[start_row:])
    frame.index = frame.index + start_row
    with st.expander("Every position at once (what training computes in one pass)", expanded=False):
        if ce is not None:
            n_known = int(frame["p(teacher's next)"].notna().sum())
            st.markdown(f"Cross-entropy −log p(teacher's token), averaged over {n_known} positions: **{ce:.3f}** nats.")
        st.dataframe(frame, width="stretch")


def show_all_steps(steps: list, *, layer: int, head: int, step: int) -> None:
    """Every inference step at this layer and head in one figure (viz/decoder/steps.py), its
    slider starting at `step`: moving it redraws the three maps in the page, no rerun."""
    maps = decoder_steps.inference_steps(steps, layer=layer, head=head)
    fig = decoder_steps.steps_figure(maps, where=f"layer {layer} · head {head}", active=min(step, len(maps)) - 1)
    charts.chart(fig, key="decoder-steps", width="stretch")
    grows = ("the maps grow by one row and column per step, blank cells are positions not generated yet"
             if not maps[-1].earlier else f"each step shows its last {decoder_steps.WINDOW} rows, and the first "
             "column sums the weights of every key before them (so rows still sum to 1: a first-token "
             "“attention sink” shows there) and averages their scores")
    st.caption(f"All {len(maps)} steps of this run, each from its own step's trace. Move the slider under the "
               f"maps (or click a step's number): {grows}; the outlined row is the step's newest position, whose "
               "output picks the next token. Switch the toggle off for the cross-attention, the next-token bars "
               "and the downloads of one step.")
