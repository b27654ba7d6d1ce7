"""The home page at /: a path through the lecture notes' ideas, in their order, on one sentence
the student can change. One stop at a time (its number in the URL, `stop`): a few sentences,
one small live figure for the sentence, and a link that opens the full page on the same
sentence and model. The stops: viz/home/path.py; their figures: viz/home/figures.py."""

import numpy as np
import streamlit as st

from core.net.cost import mixing_cost
from core.toy import recall_task

from viz.figures.recall import curve_words, recall_curve_figure
from viz.home import figures as home_figures
from viz.home import path as hp
from viz.ui import charts, models, registry, url_state, vocab, widgets

EXAMPLES = {  # each example opens on the model that reads it (no <unk>): the notes' "bank" pair is English
    "the small dog sees the cat": ("toy-translate", "the small dog sees the cat"),
    "bank (river)": ("minilm", widgets.NOTES_EXAMPLES["bank (river)"]),
    "bank (cash)": ("minilm", widgets.NOTES_EXAMPLES["bank (cash)"]),
    "When Mary and John…": ("smollm2", "When Mary and John went to the store, John gave a drink to"),
}

widgets.header("home")
state = url_state.PageState("home", fields=("model", "text", "stop"))
stop_key = url_state.int_from_url(state, "stop", 1, 1, len(hp.STOPS), of="the path")


def _example(choice) -> None:
    model_name, sentence = choice
    if model_name in models.model_names():
        st.session_state[state.key("model")] = model_name
    st.session_state[text_key] = sentence


model_name, model, text_col = widgets.model_header(state)
if model is None:
    st.stop()
text_key = state.seeded_key("text", "the small dog sees the cat")
with text_col:
    text = widgets.text_box("Sentence", text_key, help="Every stop's figure is drawn for this sentence.")
available = {label: v for label, v in EXAMPLES.items() if v[0] in models.model_names()}
st.caption("Examples (each opens on the model that reads it):")
cols = st.columns(len(available))
for i, (label, choice) in enumerate(available.items()):
    cols[i].button(label, key=f"home-example-{i}", on_click=_example, args=(choice,), width="stretch",
                   help=f"{choice[1]} — on {choice[0]}")

stop = st.session_state[stop_key]
nav = st.columns([1, 6, 1])


def _go(to: int) -> None:
    st.session_state[stop_key] = to


nav[0].button("← Previous", key="home-prev", on_click=_go, args=(stop - 1,), disabled=stop <= 1, width="stretch")
nav[1].radio("Stop", list(range(1, len(hp.STOPS) + 1)), key=stop_key, horizontal=True, label_visibility="collapsed",
             format_func=lambda i: f"{i}. {hp.STOPS[i - 1].title.split(',')[0]}")
nav[2].button("Next →", key="home-next", on_click=_go, args=(stop + 1,), disabled=stop >= len(hp.STOPS),
              width="stretch")
stop = st.session_state[stop_key]
spec = hp.STOPS[stop - 1]
url = dict(model=model_name, text=text, stop=stop if stop != 1 else None)

trace = models.get_trace(model_name, text)
if trace is None:
    state.end_here(**url)
state.publish(**url)
state.show_messages()
if not trace.attention_kinds(trace.stacks()[-1]) and not trace.attention_kinds(trace.stacks()[0]):
    widgets.no_softmax_info(model_name, trace, "The path")
    st.stop()
vocab.offer_reader(state, model_name, trace, key="home-reader")

st.subheader(f"{stop}. {spec.title}")
fig = own = None  # the stop's figure, and where it has one, the same idea on the user's sentence after it
own_text = ""
if stop == 1:
    fig, hand = home_figures.hand_figure()
    st.markdown(spec.text)
    s, w = hand["scaled"][0], hand["weights"][0]
    st.caption(f"Computed here: the scores of “help” are {hand['scores'][0][0]:g} and {hand['scores'][0][1]:g}, scaled "
               f"{s[0]:g} and {s[1]:g}; softmax gives {w[0]:.2f} and {w[1]:.2f} (they sum to {w.sum():g}).")
    own, own_where = home_figures.own_weights_figure(trace)
    own_text = (f"Then your sentence: {model_name}'s weights in {own_where}. Each row is one token's weighted "
                "average over the tokens it looks at, and sums to 1, like “help”'s row above.")
elif stop == 2:
    fig, where = home_figures.scores_figure(trace)
    st.markdown(spec.text.format(where=where))
elif stop == 3:
    n = len(trace.tokens("source"))
    fig = home_figures.positions_figure(n, model.config.d_model)
    st.markdown(spec.text.format(n=n))
    st.caption(f"{model_name}'s own positions: {model.config.positional} "
               f"({'added to the embeddings' if model.config.positional in ('sinusoidal', 'learned') else 'applied inside each head' if model.config.positional == 'rope' else 'none added'}); "
               "the Positions page shows them.")
    own = home_figures.own_positions_figure(trace)
    if own is not None:
        own_text = (f"Then your sentence: the position vectors {model_name} itself adds to its {n} tokens "
                    f"({model.config.positional}).")
    else:
        st.caption(f"{model_name} adds no position vector to the tokens, so there is none of its own to draw here: "
                   "its positions act inside each head (the Positions page shows how).")
elif stop == 4:
    fig, mask_where = home_figures.mask_figure(trace)
    st.markdown(spec.text.format(mask_where=mask_where))
elif stop == 6:
    n = len(trace.tokens("source") or trace.tokens("target"))  # the sentence's own tokens
    d = model.config.d_model
    d_k = model.config.d_head
    c = mixing_cost(np.array([n]), d, d_k)
    memory = (f"At your {n} tokens a KV cache would hold {int(c['cache'][0]):,} numbers per layer; a state of "
              f"{int(c['state'][0]):,} holds them at any length.")
    st.markdown(spec.text.format(model=model_name, d=d, memory=memory))
    fig = home_figures.cost_figure(n, d, d_k)
    own = recall_curve_figure(recall_task.shipped_curves(), height=home_figures.SMALL + 60)
    own_text = ("What that costs: a fixed state must keep every key it will be asked about. The same two-layer "
                "decoder, trained here on multi-query associative recall (Zoology, Arora et al. 2023) with each "
                "mixer, asked for the value of every key in its context: softmax attention looks the key up; a "
                "fixed state must share itself among the pairs. On held-out sequences, "
                + curve_words(recall_task.shipped_curves()))
else:
    prof = home_figures.head_profile(trace)
    st.markdown(spec.text)
    if prof is None:
        st.info(f"Your sentence is longer than {home_figures.MAX_PROFILE_TOKENS:,} tokens: this stop's figure is left "
                "out; the linked page reads long inputs a tile at a time.")
    elif stop == 5:
        fig = home_figures.grid_figure(prof["entropy"], f"mean row entropy (bits), {prof['stack']} self-attention",
                             "entropy (bits)")
    else:
        fig = home_figures.grid_figure(prof["previous"], f"previous-token weight, {prof['stack']} self-attention",
                             "mean weight on the previous token", zmax=1.0)
if fig is not None:
    if own is not None:
        st.caption("First the notes' count, for this model:" if stop == 6 else "First the notes' example:")
    charts.chart(fig, key="home-fig", width="stretch", name=f"{model_name}-path-stop{stop}")
if own is not None:
    st.caption(own_text)
    charts.chart(own, key="home-own-fig", width="stretch", name=f"{model_name}-path-stop{stop}-yours")

# each link opens a page that applies to this model, or names the model it switches to and why
switch_kinds = {m: models.model_kind(m) for m in hp.SWITCH_TO if models.model_available(m)}
has_mlm = getattr(model, "mlm_head", None) is not None


def _link(key: str, label: str, params: dict) -> None:
    to, why = hp.link_target(key, model_name, model.kind, has_mlm, switch_kinds)
    if to is None:
        st.caption(label + why)
        return
    st.page_link(registry.page(key).file, label=f"{label}{why} →", query_params={**params, "model": to, "text": text},
                 icon=registry.page(key).icon)


_link(spec.page, spec.link, dict(spec.params))
for key, what in spec.extra:
    _link(key, f"{registry.page(key).title}: {what}", {})
