"""The "training step" panel that explore, inside and the decoder stepper share (toy-translate only).

A select slider over the saved checkpoints (URL `step_train`) swaps the model the page runs;
beside it the training curve with the step marked, and below, on the page's sentence, the
cross-attention of the head trained with guided alignment and of the best unsupervised head
at that step, with the known alignment outlined. The panel starts collapsed (open when the URL
names an earlier step) and draws its charts only while open, so a page's first view draws its
own charts first. Not a page: pages call `training_step`.
"""

from __future__ import annotations

from typing import Optional

import streamlit as st

from core import trace_names as tn
from core.toy import toy_steps, toy_task
from viz.figures import training as tv
from viz.ui import charts, models, url_state
from viz.figures.text import clean_text

TOY = "toy-translate"


@st.cache_data(show_spinner=False)
def _metrics():
    return toy_steps.available_steps(), toy_steps.load_metrics(), toy_steps.load_losses()


@st.cache_resource(show_spinner=False, max_entries=64)
def _curve(step: int):
    """The training curve with `step` marked, built once per step: every rerun of the page (a
    decoder Next, a head change) would otherwise build it again."""
    _, metrics, losses = _metrics()
    return tv.training_curve(metrics, step, losses)


@st.cache_resource(show_spinner=False, max_entries=64)
def _alignment_figure(run_key: str, text: str, layer: int, head: int, title: str, _trace, _cells):
    """One head's cross-attention with the alignment outlined, and its argmax hits, built once per
    (weights, sentence, head): the trace and cells follow from run_key and text."""
    w = _trace[tn.cross_attn("decoder", layer, "weights")][head]
    hits, total = tv.argmax_hits(w, _cells)
    return tv.alignment_map(w, _trace.tokens("target"), _trace.tokens("source"), _cells, title=title), hits, total


def _reference(model, text: str):
    """The sentence's words, its reference translation and alignment; None outside the toy grammar."""
    try:
        enc = model.tokenizer.encode(clean_text(text)[0])
        words = [t for t, special in zip(enc.tokens, enc.special) if not special]
        target, alignment = toy_task.translate(words)
    except Exception:  # unknown words, not a sentence of the grammar, empty text
        return None
    return words, target, alignment


def open_key(page: str) -> str:
    """The session key of the page's training panel (True: open)."""
    return f"{page}.training_open"


def training_step(state: url_state.PageState, model_name: str, model, text: str, key: str) -> str:
    """Draw the panel for toy-translate and return the model key the page should run
    (models.model_key: the chosen step's weights); other models: `model_name`, nothing drawn."""
    if model_name != TOY or model is None:
        state.ignored_if_given("step_train", f"only {TOY} has saved training steps")
        return model_name
    steps, metrics, _ = _metrics()
    if len(steps) < 2:
        return model_name
    final = steps[-1]
    step_key = state.seeded_key("step_train", final, parse=lambda v: int(str(v).strip()), valid=lambda v: v in steps,
                          why=f"the saved steps are {', '.join(map(str, steps))}")
    if st.session_state.get(step_key) not in steps:
        st.session_state[step_key] = final
    state.keep(step_key)  # the slider shows the step the page runs, also when it comes back after another model
    if not (text or "").strip():  # the page stops at its empty-text warning: keep the step, draw nothing
        step = st.session_state[step_key]
        state.extra["step_train"] = step
        return models.model_key(model_name, None if step == final else step)
    rows = {r["step"]: r for r in (metrics or {}).get("steps", [])}
    # Collapsed, and drawn only when open (its curve and alignment maps would otherwise be the
    # page's first charts, ahead of its own); a URL with an earlier step opens it.
    first = st.session_state.setdefault(f"{open_key(key)}.first", st.session_state[step_key] != final)
    panel = st.expander("Training step: watch the attention learn", expanded=first, key=open_key(key),
                        on_change="rerun")
    if panel.open is False:  # closed: the step stays chosen (the slider is not drawn, so keep its value)
        step = st.session_state[step_key] = st.session_state[step_key]
        state.extra["step_train"] = step
        return models.model_key(model_name, None if step == final else step)
    with panel:
        left, right = st.columns([1, 2])
        with left:
            step = st.select_slider("Training step", options=steps, key=step_key,
                                    format_func=lambda s: f"{s} (final)" if s == final else str(s),
                                    help="The model after this many parameter updates (batches of 96 sentences). "
                                         "Every view on this page uses these weights.")
            row = rows.get(step)
            if row:
                best = row["best_unsupervised"]
                st.markdown(f"**Step {step}** of {final}: training loss {row.get('train_loss', float('nan')):.3g}, "
                            f"held-out exact match **{row['exact_match']:.1%}**, alignment accuracy of the supervised "
                            f"head **{row['alignment_accuracy']:.1%}** (best unsupervised head: decoder.{best['layer']} "
                            f"head {best['head']}, {best['accuracy']:.1%}; chance "
                            f"{metrics.get('chance_alignment', 0):.1%}).")
            st.caption("Checkpoints before the final one are stored in float16." if step != final else
                       "The final, shipped weights (float32).")
            if metrics and metrics.get("note"):
                st.caption(metrics["note"])
        with right:
            if metrics:
                charts.chart(_curve(step), key=f"{key}-training-curve", width="stretch")
            else:
                st.info("No training metrics found (assets/toy-translate/steps/metrics.json); "
                        "python -m core.cli.train_toy writes them.")
        run_key = models.model_key(model_name, None if step == final else step)
        _alignment_maps(run_key, model, text, row, metrics or {}, key)
    state.extra["step_train"] = step
    return run_key


def _alignment_maps(run_key: str, model, text: str, row: Optional[dict], metrics: dict, key: str) -> None:
    ref = _reference(model, text)
    if ref is None:
        st.info("The alignment maps need a sentence of the toy grammar (try one of the examples): only then is "
                "the true word alignment known.")
        return
    words, target, alignment = ref
    trace = models.get_trace(run_key, text, target=" ".join(target))
    if trace is None:
        return
    if trace.tokens("source") != words:
        st.info("The sentence was changed on its way into the model, so its alignment cannot be outlined.")
        return
    guided = metrics.get("guided") or {"layer": 1, "head": 0}
    heads = [("supervised head (guided alignment)", guided["layer"], guided["head"])]
    if row and row.get("best_unsupervised"):
        b = row["best_unsupervised"]
        heads.append((f"best unsupervised head ({b['accuracy']:.0%} held-out)", b["layer"], b["head"]))
    cells = tv.aligned_cells(len(trace.tokens("target")), alignment)
    st.caption(f"Cross-attention on the reference translation “{' '.join(target)}” (teacher forcing). Row j is the "
               "decoder position that predicts target word j+1; the red boxes are the source words those target "
               "words translate.")
    cols = st.columns(len(heads))
    for i, (col, (label, layer, head)) in enumerate(zip(cols, heads)):
        fig, hits, total = _alignment_figure(run_key, text, layer, head, f"decoder.{layer} head {head}: {label}",
                                             trace, cells)
        with col:
            charts.chart(fig, key=f"{key}-align-{i}", width="stretch")
            st.caption(f"On this sentence: argmax on the aligned word in {hits} of {total} rows.")
