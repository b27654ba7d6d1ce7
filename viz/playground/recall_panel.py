"""The Playground's tab 7, Recall: the same two-layer decoder trained on multi-query associative
recall (Zoology, Arora et al. 2023) with each token mixer (core/toy/recall_task.py,
core/toy/recall_model.py; the shipped ones are the registry's "recall-<mixer>" models), run on one
sequence of `rc_pairs` key-value pairs drawn from `rc_seed`. For the chosen query (`rc_query`,
in the order the keys are asked) each model's map of layer `rc_layer` is drawn with the key
that holds the answer outlined (viz/playground/recall_figures.py), beside its prediction; then the
accuracy curve each training run measured, with each model's accuracy on 64 sequences of
this many pairs measured now."""

from __future__ import annotations

import random

import streamlit as st
import torch

import core
from core.toy import recall_model, recall_task
from viz.figures.recall import curve_words, mixer_name, recall_curve_figure
from viz.playground import recall_figures as recall_figs
from viz.ui import charts, explore_links, models

LIVE_SEQUENCES = 64  # sequences per live accuracy (one batched forward pass per model)


def model_names() -> list:
    """The shipped recall models' registry names, in the task's order."""
    return [f"recall-{m}" for m in recall_model.available() if f"recall-{m}" in core.MODELS]


@st.cache_data(show_spinner=False, max_entries=64)
def live_accuracy(name: str, n_pairs: int, seed: int) -> float:
    """The model's accuracy on LIVE_SEQUENCES sequences of n_pairs pairs drawn from `seed`."""
    model = models.get_model(name)
    with torch.inference_mode():
        return recall_task.accuracy(lambda ids: model.net(None, ids.to(model.device)).cpu(), n_pairs,
                                    LIVE_SEQUENCES, seed)


def where(col: int, key: int, tokens) -> str:
    """Words for a column of the query's row: the answer's key, its value, or a position."""
    if col == key:
        return "the answer's key"
    if col == key + 1:
        return "the answer's value"
    return f"position {col} ({tokens[col]})"


def recall(keys: dict) -> None:
    """Tab 7: the sequence's controls, each shipped model's map with the answer's key outlined,
    and the accuracy curve."""
    st.markdown("**Multi-query associative recall** (Zoology, Arora et al. 2023): the context lists key-value "
                "pairs, then asks every key again; after each asked key the model must say the value that "
                "followed it. The same two-layer decoder was trained on it once per token mixer. Softmax attention "
                "can look the key up; a mixer with a fixed-size state must have kept every pair in that state. "
                "The maps below are exact: a mixer's is its implicit attention A (heads = A V), signed.")
    names = model_names()
    if not names:
        st.warning("No recall model is shipped (assets/recall/): train one with `python -m core.cli.train_recall`.")
        return
    c = st.columns(4)
    n_pairs = int(c[0].slider("Key-value pairs", 2, recall_task.MAX_PAIRS, key=keys["rc_pairs"]))
    seed = int(c[1].number_input("Sequence seed", 0, 10_000, key=keys["rc_seed"]))
    layer = int(c[2].radio("Layer", [0, 1], horizontal=True, key=keys["rc_layer"]))
    query = int(c[3].slider("Query", 0, n_pairs - 1, key=keys["rc_query"],
                            help="which asked key, in the order the queries come"))
    example = recall_task.make_example(n_pairs, random.Random(seed))
    q, k = example.query_positions[query], example.answer_key_positions[query]
    key_tok, answer = example.tokens[q], example.answers[query]
    st.markdown(f"The sequence ({len(example.tokens)} tokens; context, then queries): `{example.text()}`  \n"
                f"Query {query}: the key **{key_tok}** at position {q}; it was given at position {k} with the value "
                f"**{answer}** (position {k + 1}). Outlined in every head: the answer's key (solid) and its value "
                "(dotted), in the query's row.")
    for name in names:
        mixer = name.removeprefix("recall-")
        trace = models.get_trace(name, example.text())
        if trace is None:
            continue
        maps, signed = recall_model.layer_map(trace, layer)
        said = recall_model.predictions(trace, example)
        right = sum(p == a for p, a in zip(said, example.answers))
        verdict = "right" if said[query] == answer else "wrong"
        st.markdown(f"#### {mixer_name(mixer)} (`{name}`)\n"
                    f"Predicts **{said[query]}** after **{key_tok}**: {verdict}"
                    f"{'' if verdict == 'right' else f' (the answer is {answer})'}. "
                    f"On this sequence: {right} of {n_pairs} queries right.")
        st.markdown(f"Largest {'|A|' if signed else 'weight'} in the query's row, layer {layer}: "
                    + "; ".join(f"head {h}: {where(int(c), k, example.tokens)}"
                                for h, c in enumerate(maps[:, q, : q + 1].abs().argmax(-1))) + ".")
        what = "its exact implicit attention A (signed)" if signed else "softmax weights"
        charts.chart(recall_figs.recall_map_figure(maps.numpy(), example.tokens, q, k, signed=signed,
                                                   title=f"{name}: layer {layer}, {what}"),
                     key=f"playground-recall-{mixer}", width="stretch")
        explore_links.link(st, f"Open {name} on this sequence in Explore (layer {layer}, head 0)",
                           explore_links.explore_params(name, example.text(), "decoder", layer, 0),
                           icon=":material/open_in_new:")
    st.markdown("#### Accuracy as the pairs grow")
    live = {}
    for name in names:
        try:
            live[name.removeprefix("recall-")] = (n_pairs, live_accuracy(name, n_pairs, seed))
        except Exception as exc:  # a model that cannot run: the shipped curve alone
            st.warning(f"{name}: accuracy not measured ({exc})")
    fig = recall_curve_figure(recall_task.shipped_curves(), live)
    if fig is not None:
        charts.chart(fig, key="playground-recall-curve", width="stretch")
    st.caption(f"Lines: each model's accuracy on 256 held-out sequences per pair count, as its training run measured "
               f"it (assets/recall/<mixer>/metrics.json). Crosses: measured now on {LIVE_SEQUENCES} sequences of "
               f"{n_pairs} pairs drawn from seed {seed}. "
               + ", ".join(f"{mixer_name(m)} {acc:.0%}" for m, (_, acc) in live.items()) + ".")
    st.caption("Reading the maps: where a softmax model's second layer puts its largest weight on the answer's value, "
               "one after its key, its first layer has copied each key into the position after it (a previous-token "
               "head), and the query finds the key there. A fixed state has no such lookup: it must have written every "
               "pair into the same fixed-size state, and each pair added shares it. The shipped curves: "
               + curve_words(recall_task.shipped_curves()))
